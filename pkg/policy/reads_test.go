package policy

import "testing"

// ReadsRun is true only for a call that a rule whose condition names `run` matches: the
// gateway reads the run's steps from its store for those calls alone.
func TestReadsRun(t *testing.T) {
	s := compile(t, `policy: p
rules:
  - name: three-deletions
    match: { tools: ["memory.delete_*"] }
    condition: 'run.counts.exists(k, k.startsWith("memory.delete_") && run.counts[k] > 3)'
    effect: deny
    reason: too many deletions
  - name: cards
    condition: has_card_number(args)
    effect: deny
    reason: a card number
`)
	for tool, want := range map[string]bool{"memory.delete_entities": true, "memory.read_graph": false} {
		if got := s.ReadsRun(tool, nil); got != want {
			t.Errorf("ReadsRun(%s) = %v, want %v", tool, got, want)
		}
	}
	if !s.ReadsVariable("run") || s.ReadsVariable("environment") {
		t.Error("ReadsVariable: run is read, environment is not")
	}
	var none *Set
	if none.ReadsRun("memory.delete_entities", nil) || none.ReadsVariable("run") {
		t.Error("a nil set reads nothing")
	}
}
