package engine

import (
	"context"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestDecisionCategory: every check of Decide names its category, in each mode; an allowed
// call has none; with several violations (advise) the first one's category is kept.
func TestDecisionCategory(t *testing.T) {
	cases := []struct {
		call Call
		want Category
	}{
		{call("fs.unknown", nil), CategoryNoManifest}, // enforce only; see below
		{call("fs.draft", nil), CategoryDraft},
		{call("fs.admin", nil), CategoryScope},
		{call("fs.after", nil), CategoryRequires},
		{call("fs.schema", map[string]any{"path": 3}), CategorySchema},
		{call("fs.drift", map[string]any{"path": "a"}), CategoryDrift},
		{call("fs.denied", nil), CategoryAllowDeny},
		{call("fs.keyed", nil), CategoryDuplicate},
		{call("pay.charge", nil), CategoryApproval},
		{call("fs.read", nil), ""},
	}
	for _, mode := range []Mode{Enforce, Advise, Observe} {
		f := newFixture(t, mode, "")
		for _, tc := range cases {
			want := tc.want
			if mode != Enforce && want == CategoryNoManifest {
				want = "" // advise and observe run unclassified tools without a violation
			}
			d := f.e.Decide(context.Background(), tc.call)
			if d.Category != want {
				t.Errorf("%s %s: category %q, want %q (%+v)", mode, tc.call.Tool, d.Category, want, d)
			}
		}
		// The second identical keyed call is a held duplicate.
		args := map[string]any{"id": 1}
		_ = f.e.Decide(context.Background(), call("fs.keyed", args))
		if d := f.e.Decide(context.Background(), call("fs.keyed", args)); d.Category != CategoryDuplicate {
			t.Errorf("%s: held key: category %q (%+v)", mode, d.Category, d)
		}
	}

	st := store.NewMemory(nil)
	defer st.Close()
	ms := []*manifest.Manifest{mf("fs.x", manifest.ReadOnly, "other:perm", func(m *manifest.Manifest) {
		m.Status = manifest.Draft
	})}
	e, err := New(Config{Manifests: ms, Mode: Advise, Permissions: []string{"fs:read"}, Deny: []string{"fs.*"},
		Store: st, Tools: []Tool{{Name: "fs.x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := e.Decide(context.Background(), Call{Run: "r", Tool: "fs.x"}); len(d.Violations) != 3 || d.Category != CategoryDraft {
		t.Errorf("advise with three violations: category %q, violations %q", d.Category, d.Violations)
	}
}
