package engine

import (
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestBannerSeedExample is the seed's example (seed "MCP gateway", Observe first): the
// filesystem connector's nine tools, no manifests, no mode named.
func TestBannerSeedExample(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	var tools []Tool
	for _, n := range []string{"fs.write_file", "fs.read_file", "fs.edit_file", "fs.create_directory", "fs.list_directory",
		"fs.directory_tree", "fs.move_file", "fs.search_files", "fs.get_file_info"} {
		tools = append(tools, Tool{Name: n})
	}
	e, err := New(Config{Store: st, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	if !e.AutoObserve() {
		t.Fatal("no manifests and no mode: automatic observe")
	}
	want := `Reversi gateway running in observe mode.
WARN fs.create_directory - no manifest; treated as a change that could not be undone
WARN fs.directory_tree - no manifest; treated as a change that could not be undone
WARN fs.edit_file - no manifest; treated as a change that could not be undone
WARN fs.get_file_info - no manifest; treated as a change that could not be undone
WARN fs.list_directory - no manifest; treated as a change that could not be undone
WARN fs.move_file - no manifest; treated as a change that could not be undone
WARN fs.read_file - no manifest; treated as a change that could not be undone
WARN fs.search_files - no manifest; treated as a change that could not be undone
WARN fs.write_file - no manifest; treated as a change that could not be undone
0 classified, 0 unclassified reads, 9 unclassified changes, 0 destructive without a manifest.
9 tools have no manifest. They run (nothing is blocked) and are journaled as unclassified.
Draft manifests with: reversi suggest-manifest.
`
	if got := e.Banner(); got != want {
		t.Fatalf("banner:\n%s\nwant:\n%s", got, want)
	}
}

// TestBannerEveryClass: OK (effect and status), NOTE, WARN and BLOCK, and the enforce texts.
func TestBannerEveryClass(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	tools := []Tool{{Name: "crm.lookup", ReadOnlyHint: true}, {Name: "db.query", ReadOnlyHint: true},
		{Name: "db.drop", DestructiveHint: true, ReadOnlyHint: true}, {Name: "db.insert"}}
	ms := []*manifest.Manifest{mf("crm.lookup", manifest.ReadOnly, "crm:read", func(m *manifest.Manifest) { m.Status = manifest.Deprecated })}
	cases := []struct {
		reads UnclassifiedReads
		tail  string
	}{
		{ReadsBlock, "3 tools have no manifest. They are blocked in enforce mode.\n"},
		{ReadsObserve, "3 tools have no manifest. They are blocked, except server-claimed reads, which run in a shadow observe run (unverified).\n"},
	}
	for _, tc := range cases {
		e, err := New(Config{Store: st, Tools: tools, Manifests: ms, UnclassifiedReads: tc.reads})
		if err != nil {
			t.Fatal(err)
		}
		c := e.Classify()
		if c.Classified != 1 || c.UnclassifiedReads != 1 || c.UnclassifiedChanges != 2 || c.Destructive != 1 {
			t.Fatalf("%+v", c)
		}
		want := "Reversi gateway running in enforce mode.\n" +
			"OK crm.lookup - read_only, deprecated\n" +
			"BLOCK db.drop - no manifest and the server says it is destructive\n" +
			"WARN db.insert - no manifest; treated as a change that could not be undone\n" +
			"NOTE db.query - no manifest; the server says it is read-only (unverified)\n" +
			"1 classified, 1 unclassified reads, 2 unclassified changes, 1 destructive without a manifest.\n" +
			tc.tail + "Draft manifests with: reversi suggest-manifest.\n"
		if got := e.Banner(); got != want {
			t.Fatalf("banner:\n%s\nwant:\n%s", got, want)
		}
	}
}

// TestBannerAllClassified: no advice lines when every tool has a manifest; one tool is singular.
func TestBannerAllClassified(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	e, _ := New(Config{Store: st, Tools: []Tool{{Name: "a"}}, Manifests: []*manifest.Manifest{mf("a", manifest.Idempotent, "p")}})
	want := "Reversi gateway running in enforce mode.\nOK a - idempotent, approved\n" +
		"1 classified, 0 unclassified reads, 0 unclassified changes, 0 destructive without a manifest.\n"
	if got := e.Banner(); got != want {
		t.Fatalf("%q", got)
	}
	one, _ := New(Config{Store: st, Mode: Advise, Tools: []Tool{{Name: "b"}}})
	want = "Reversi gateway running in advise mode.\nWARN b - no manifest; treated as a change that could not be undone\n" +
		"0 classified, 0 unclassified reads, 1 unclassified changes, 0 destructive without a manifest.\n" +
		"1 tool has no manifest. It runs (nothing is blocked) and is journaled as unclassified.\n" +
		"Draft manifests with: reversi suggest-manifest.\n"
	if got := one.Banner(); got != want {
		t.Fatalf("%q", got)
	}
}
