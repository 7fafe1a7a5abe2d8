package engine

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestPreviewMatchesDecide: for calls without approval or duplicate key, Preview gives the
// very Decision Decide gives, in every mode.
func TestPreviewMatchesDecide(t *testing.T) {
	calls := []Call{
		call("fs.read", map[string]any{"path": "/x"}),
		call("fs.draft", nil),
		call("fs.old", nil),
		call("fs.admin", nil),
		call("fs.after", nil),
		call("fs.schema", map[string]any{"path": 3}),
		call("fs.drift", map[string]any{"path": "/x"}),
		call("fs.denied", nil),
		call("fs.unknown", nil),
		call("fs.ro", nil),
	}
	for _, mode := range []Mode{Enforce, Advise, Observe} {
		for _, reads := range []UnclassifiedReads{ReadsBlock, ReadsObserve} {
			f := newFixture(t, mode, reads)
			for _, c := range calls {
				p, d := f.e.Preview(context.Background(), c), f.e.Decide(context.Background(), c)
				if !reflect.DeepEqual(p, d) {
					t.Errorf("%s/%s %s:\npreview %+v\n decide %+v", mode, reads, c.Tool, p, d)
				}
			}
		}
	}
}

// TestPreviewApprovalHasNoSideEffects: previewing a call that needs approval queues nothing,
// reports a pending request, and never consumes an approved one.
func TestPreviewApprovalHasNoSideEffects(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	st := store.NewMemory(func() time.Time { return now })
	defer st.Close()
	e, err := New(Config{Manifests: testManifests(), Store: st, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	args := map[string]any{"amount": 25}
	queue := func() []store.Approval {
		list, err := st.ListApprovals(ctx, store.ApprovalFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return list
	}

	p := e.Preview(ctx, call("pay.charge", args))
	if p.Action != NeedsApproval || p.ApprovalID != "" || p.Reason != PreviewApprovalText("pay.charge") ||
		!p.ApprovalRequired || p.Approval == nil || p.Approval.Roles[0] != "finance" {
		t.Fatalf("preview before any request: %+v", p)
	}
	if q := queue(); len(q) != 0 {
		t.Fatalf("preview queued %+v", q)
	}
	d := e.Decide(ctx, call("pay.charge", args)) // queues the request
	if p := e.Preview(ctx, call("pay.charge", args)); p.Action != NeedsApproval || p.ApprovalID != d.ApprovalID ||
		p.Reason != PendingApprovalText("pay.charge", d.ApprovalID) {
		t.Fatalf("preview with a pending request: %+v", p)
	}
	if _, err := st.Decide(ctx, d.ApprovalID, store.Decision{By: "bob", Roles: []string{"finance"}, Approve: true}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if p := e.Preview(ctx, call("pay.charge", args)); p.Action != Allow || p.ApprovalID != d.ApprovalID {
			t.Fatalf("preview with an approved request: %+v", p)
		}
	}
	if a, _ := st.GetApproval(ctx, d.ApprovalID); !a.Consumed.IsZero() {
		t.Fatalf("preview consumed the approval: %+v", a)
	}
	if q := queue(); len(q) != 1 {
		t.Fatalf("queue after previews: %+v", q)
	}
	// The real call still gets the approval the previews left alone.
	if ok := e.Decide(ctx, call("pay.charge", args)); ok.Action != Allow || ok.ApprovalID != d.ApprovalID {
		t.Fatalf("the real call after previews: %+v", ok)
	}
}

// TestPreviewDuplicateKey: previewing claims no key, and reports a key another call holds.
func TestPreviewDuplicateKey(t *testing.T) {
	f := newFixture(t, Enforce, "")
	ctx := context.Background()
	args := map[string]any{"id": 7}
	p := f.e.Preview(ctx, call("fs.keyed", args))
	if p.Action != Allow || p.KeyClaimed || p.Key == "" {
		t.Fatalf("preview: %+v", p)
	}
	if _, held, _ := f.st.HeldKey(ctx, p.Key); held {
		t.Fatal("preview claimed the key")
	}
	d := f.e.Decide(ctx, call("fs.keyed", args))
	if !d.KeyClaimed {
		t.Fatalf("decide: %+v", d)
	}
	h, _, _ := f.st.HeldKey(ctx, d.Key)
	p = f.e.Preview(ctx, call("fs.keyed", args))
	if p.Action != Block || p.Reason != DuplicateText("fs.keyed", h) || p.KeyClaimed {
		t.Fatalf("preview of a duplicate: %+v", p)
	}
	// Advise: the duplicate is a would_block, still without a claim.
	a := newFixture(t, Advise, "")
	a.st.ClaimKey(ctx, d.Key, "other-run", 1)
	if p := a.e.Preview(ctx, call("fs.keyed", args)); p.Action != Allow || !p.WouldBlock || p.KeyClaimed {
		t.Fatalf("advise preview of a duplicate: %+v", p)
	}
}

func TestCheckArguments(t *testing.T) {
	f := newFixture(t, Enforce, "")
	if !f.e.Exposed("fs.schema") || f.e.Exposed("fs.nothing") {
		t.Fatal("Exposed")
	}
	if p, unchecked := f.e.CheckArguments("fs.schema", map[string]any{"path": "/a"}); p != "" || unchecked {
		t.Fatalf("valid: %q %v", p, unchecked)
	}
	if p, _ := f.e.CheckArguments("fs.schema", map[string]any{"path": 1, "x": true}); p == "" {
		t.Fatal("invalid arguments passed")
	}
	if p, _ := f.e.CheckArguments("fs.schema", nil); p == "" {
		t.Fatal("missing required path passed")
	}
	if p, unchecked := f.e.CheckArguments("fs.read", map[string]any{"any": 1}); p != "" || !unchecked {
		t.Fatalf("no schema: %q %v", p, unchecked)
	}
	if p, _ := f.e.CheckArguments("fs.nothing", nil); p != "no upstream exposes fs.nothing" {
		t.Fatalf("unknown tool: %q", p)
	}
}
