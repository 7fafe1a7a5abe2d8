package engine

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// Tests of the call path of seed "MCP gateway" (../shared/seeds/003_0ebd38203277749f.txt):
// Modes, What happens to a call, Schema validation, Schema drift, Timeout and retry.

func ms(v int64) *int64 { return &v }

func mf(tool string, eff manifest.Effect, perm string, opts ...func(*manifest.Manifest)) *manifest.Manifest {
	m := &manifest.Manifest{Tool: tool, Effect: eff, Permission: perm, Version: 1, Status: manifest.Approved}
	for _, o := range opts {
		o(m)
	}
	return m
}

var pathSchema = map[string]any{
	"type":                 "object",
	"properties":           map[string]any{"path": map[string]any{"type": "string"}},
	"required":             []any{"path"},
	"additionalProperties": false,
}

func testManifests() []*manifest.Manifest {
	return []*manifest.Manifest{
		mf("fs.read", manifest.ReadOnly, "fs:read", func(m *manifest.Manifest) {
			m.TimeoutMs = ms(10000)
			m.Retry = &manifest.Retry{Attempts: 3, BaseMs: 200, MaxMs: 5000}
		}),
		mf("fs.write", manifest.Reversible, "fs:write", func(m *manifest.Manifest) {
			m.Retry = &manifest.Retry{Attempts: 3, BaseMs: 200, MaxMs: 5000} // ignored: not retryable
			m.TimeoutMs = ms(1500)
		}),
		mf("fs.draft", manifest.ReadOnly, "fs:read", func(m *manifest.Manifest) { m.Status = manifest.Draft }),
		mf("fs.old", manifest.ReadOnly, "fs:read", func(m *manifest.Manifest) {
			m.Status, m.ReplacedBy = manifest.Deprecated, "fs.read"
		}),
		mf("fs.admin", manifest.Idempotent, "admin:all"),
		mf("fs.after", manifest.Idempotent, "fs:write", func(m *manifest.Manifest) {
			m.Requires = []manifest.Requirement{{Tool: "fs.read", Status: manifest.RequirementSucceeded}}
		}),
		mf("fs.schema", manifest.ReadOnly, "fs:read"),
		mf("fs.drift", manifest.ReadOnly, "fs:read", func(m *manifest.Manifest) { m.SchemaHash = "000000000000" }),
		mf("fs.denied", manifest.ReadOnly, "fs:read"),
		mf("fs.keyed", manifest.Idempotent, "fs:write", func(m *manifest.Manifest) {
			m.Idempotency = &manifest.Idempotency{Key: "k-{{args.id}}", Scope: "run"}
		}),
		mf("pay.charge", manifest.Irreversible, "pay:write", func(m *manifest.Manifest) {
			m.Approval = manifest.Approval{Required: true, Rules: &manifest.ApprovalRules{
				Roles: []string{"finance"}, Quorum: 1, OnTimeout: "deny", TimeoutMs: ms(60000)}}
		}),
	}
}

func testTools() []Tool {
	return []Tool{
		{Name: "fs.read"}, {Name: "fs.write"}, {Name: "fs.draft"}, {Name: "fs.old"},
		{Name: "fs.admin"}, {Name: "fs.after"}, {Name: "fs.denied"}, {Name: "fs.keyed"},
		{Name: "pay.charge"},
		{Name: "fs.schema", InputSchema: pathSchema},
		{Name: "fs.drift", InputSchema: pathSchema},
		{Name: "fs.unknown"},
		{Name: "fs.ro", ReadOnlyHint: true},
	}
}

type fixture struct {
	st *store.Memory
	e  *Engine
}

func newFixture(t *testing.T, mode Mode, reads UnclassifiedReads, succeeded ...string) fixture {
	t.Helper()
	st := store.NewMemory(nil)
	t.Cleanup(func() { _ = st.Close() })
	e, err := New(Config{
		Manifests:         testManifests(),
		Mode:              mode,
		UnclassifiedReads: reads,
		Permissions:       []string{"fs:read", "fs:write", "pay:write"},
		Deny:              []string{"fs.den*"},
		Tools:             testTools(),
		Store:             st,
		Succeeded: func(_ context.Context, run, tool string) bool {
			return run == "run-1" && contains(succeeded, tool)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return fixture{st: st, e: e}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func call(tool string, args map[string]any) Call {
	return Call{Run: "run-1", Actor: "alice", Tool: tool, Args: args}
}

// TestDecideRules checks every rule that is a violation, in each mode: enforce blocks with
// the reason, advise runs with the advisory text, observe runs with nothing added; advise and
// observe are journaled would_block.
func TestDecideRules(t *testing.T) {
	cases := []struct {
		name   string
		call   Call
		reason string
	}{
		{"draft", call("fs.draft", nil),
			"the manifest for fs.draft is a draft: a reviewer must approve it before the tool can be called"},
		{"scope", call("fs.admin", nil),
			"fs.admin needs the permission admin:all, which is outside this session's scope"},
		{"requires", call("fs.after", nil),
			"fs.after requires fs.read to have succeeded earlier in the run"},
		{"input schema", call("fs.schema", map[string]any{"path": 3}),
			"arguments do not match the tool's input schema: /path: got number, want string"},
		{"input schema missing argument", call("fs.schema", nil),
			"arguments do not match the tool's input schema: /: missing property 'path'"},
		{"schema drift", call("fs.drift", map[string]any{"path": "a"}), SchemaDriftText},
		{"deny", call("fs.denied", nil), `fs.denied is denied by the gateway's deny rule "fs.den*"`},
		{"duplicate key cannot be built", call("fs.keyed", map[string]any{"id": map[string]any{"x": 1}}),
			"the duplicate-call key cannot be built: argument id is not a plain value"},
		{"duplicate key argument missing", call("fs.keyed", nil),
			"the duplicate-call key cannot be built: argument id is missing"},
	}
	for _, tc := range cases {
		for _, mode := range []Mode{Enforce, Advise, Observe} {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				f := newFixture(t, mode, "")
				d := f.e.Decide(context.Background(), tc.call)
				if !reflect.DeepEqual(d.Violations, []string{tc.reason}) || d.Reason != tc.reason {
					t.Fatalf("violations %q, reason %q; want %q", d.Violations, d.Reason, tc.reason)
				}
				if d.Mode != mode || d.Run != "run-1" {
					t.Fatalf("mode %s run %s", d.Mode, d.Run)
				}
				switch mode {
				case Enforce:
					if d.Action != Block || d.WouldBlock || d.Advisory != "" || d.JournalDecision() != "block" {
						t.Fatalf("enforce: %+v", d)
					}
					if d.BlockedText() != "Blocked by Reversi: "+tc.reason {
						t.Fatalf("blocked text %q", d.BlockedText())
					}
				case Advise:
					if d.Action != Allow || !d.WouldBlock || d.JournalDecision() != "would_block" {
						t.Fatalf("advise: %+v", d)
					}
					if d.Advisory != "Reversi advisory (nothing was blocked): "+tc.reason {
						t.Fatalf("advisory %q", d.Advisory)
					}
				case Observe:
					if d.Action != Allow || !d.WouldBlock || d.Advisory != "" || d.JournalDecision() != "would_block" {
						t.Fatalf("observe: %+v", d)
					}
				}
			})
		}
	}
}

// TestDecideUnclassified: a tool without a manifest is blocked in enforce mode, except a
// server-claimed read with unclassified_reads: observe (shadow run `<run>-reads`); in advise
// and observe it runs, noted as unclassified.
func TestDecideUnclassified(t *testing.T) {
	cases := []struct {
		name       string
		mode       Mode
		reads      UnclassifiedReads
		tool       string
		action     Action
		reason     string
		run        string
		decideMode Mode
		notes      []string
	}{
		{"enforce change", Enforce, ReadsBlock, "fs.unknown", Block, NoManifestText("fs.unknown"), "run-1", Enforce, nil},
		{"enforce read, reads block", Enforce, ReadsBlock, "fs.ro", Block, NoManifestText("fs.ro"), "run-1", Enforce, nil},
		{"enforce read, reads default", Enforce, "", "fs.ro", Block, NoManifestText("fs.ro"), "run-1", Enforce, nil},
		{"enforce change, reads observe", Enforce, ReadsObserve, "fs.unknown", Block, NoManifestText("fs.unknown"), "run-1", Enforce, nil},
		{"enforce read, reads observe", Enforce, ReadsObserve, "fs.ro", Allow, "", "run-1-reads", Observe, []string{UnclassifiedReadNote}},
		{"not offered upstream, reads observe", Enforce, ReadsObserve, "fs.gone", Block, NoManifestText("fs.gone"), "run-1", Enforce, nil},
		{"advise", Advise, ReadsBlock, "fs.unknown", Allow, "", "run-1", Advise, []string{UnclassifiedNote}},
		{"observe", Observe, ReadsBlock, "fs.unknown", Allow, "", "run-1", Observe, []string{UnclassifiedNote}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.mode, tc.reads)
			d := f.e.Decide(context.Background(), call(tc.tool, nil))
			if d.Action != tc.action || d.Reason != tc.reason || d.Run != tc.run || d.Mode != tc.decideMode ||
				!reflect.DeepEqual(d.Notes, tc.notes) || !d.Unclassified || d.WouldBlock || d.Manifest != nil {
				t.Fatalf("got %+v", d)
			}
			if tc.run == "run-1-reads" && (!d.Shadow || d.JournalDecision() != "allow") {
				t.Fatalf("shadow run: %+v", d)
			}
		})
	}
	if NoManifestText("x.y") != "there is no manifest for x.y: a tool without a manifest is blocked in enforce mode" {
		t.Fatal(NoManifestText("x.y"))
	}
}

// TestShadowRunIsObserve: the checks after the manifest still run in the shadow run, as
// observe (would_block, no text).
func TestShadowRunIsObserve(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	e, err := New(Config{Manifests: testManifests(), UnclassifiedReads: ReadsObserve, Store: st,
		Tools: []Tool{{Name: "db.query", ReadOnlyHint: true, InputSchema: pathSchema}}})
	if err != nil {
		t.Fatal(err)
	}
	d := e.Decide(context.Background(), call("db.query", map[string]any{"path": true}))
	want := "arguments do not match the tool's input schema: /path: got boolean, want string"
	if d.Action != Allow || !d.WouldBlock || d.Reason != want || d.Run != "run-1-reads" || d.Advisory != "" {
		t.Fatalf("got %+v", d)
	}
}

// TestDecideAllowed: calls that break no rule, with the manifest's timeout and retry (retry
// only for read_only and idempotent) and the deprecation note.
func TestDecideAllowed(t *testing.T) {
	cases := []struct {
		name    string
		call    Call
		timeout time.Duration
		retry   *manifest.Retry
		notes   []string
	}{
		{"read with timeout and retry", call("fs.read", nil), 10 * time.Second,
			&manifest.Retry{Attempts: 3, BaseMs: 200, MaxMs: 5000}, nil},
		{"reversible: retry ignored", call("fs.write", nil), 1500 * time.Millisecond, nil, nil},
		{"deprecated", call("fs.old", nil), 0, nil, []string{"manifest deprecated; use fs.read"}},
		{"requires met", call("fs.after", nil), 0, nil, nil},
		{"schema ok and no drift hash", call("fs.schema", map[string]any{"path": "a"}), 0, nil, nil},
	}
	for _, tc := range cases {
		for _, mode := range []Mode{Enforce, Advise, Observe} {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				f := newFixture(t, mode, "", "fs.read")
				d := f.e.Decide(context.Background(), tc.call)
				if d.Action != Allow || d.WouldBlock || d.Reason != "" || len(d.Violations) != 0 || d.Advisory != "" {
					t.Fatalf("got %+v", d)
				}
				if d.Timeout != tc.timeout || !reflect.DeepEqual(d.Retry, tc.retry) || !reflect.DeepEqual(d.Notes, tc.notes) {
					t.Fatalf("timeout %v retry %+v notes %q", d.Timeout, d.Retry, d.Notes)
				}
				if d.Manifest == nil || d.Manifest.Tool != tc.call.Tool || d.JournalDecision() != "allow" {
					t.Fatalf("manifest %+v decision %s", d.Manifest, d.JournalDecision())
				}
				if !strings.HasPrefix(d.ArgsDigest, "sha256:") || len(d.ArgsDigest) != 71 {
					t.Fatalf("digest %q", d.ArgsDigest)
				}
			})
		}
	}
}

// TestAdviseCollectsEveryViolation: advise and observe run every check; enforce stops at the
// first.
func TestAdviseCollectsEveryViolation(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	ms := []*manifest.Manifest{mf("fs.x", manifest.ReadOnly, "other:perm", func(m *manifest.Manifest) {
		m.Status = manifest.Draft
		m.SchemaHash = "ffffffffffff"
	})}
	for _, mode := range []Mode{Enforce, Advise} {
		e, err := New(Config{Manifests: ms, Mode: mode, Permissions: []string{"fs:read"}, Allow: []string{"db.*"},
			Store: st, Tools: []Tool{{Name: "fs.x", InputSchema: pathSchema}}})
		if err != nil {
			t.Fatal(err)
		}
		d := e.Decide(context.Background(), Call{Run: "r", Actor: "a", Tool: "fs.x", Args: map[string]any{"path": "p"}})
		all := []string{
			"the manifest for fs.x is a draft: a reviewer must approve it before the tool can be called",
			"fs.x needs the permission other:perm, which is outside this session's scope",
			SchemaDriftText,
			"fs.x is not matched by the gateway's allow rules",
		}
		if mode == Enforce {
			all = all[:1]
		}
		if !reflect.DeepEqual(d.Violations, all) || d.Reason != strings.Join(all, "; ") {
			t.Fatalf("%s: violations %q reason %q", mode, d.Violations, d.Reason)
		}
	}
}

// TestSessionPermissionsOverride: a session's own scope replaces the engine's.
func TestSessionPermissionsOverride(t *testing.T) {
	f := newFixture(t, Enforce, "")
	c := call("fs.admin", nil)
	c.Permissions = []string{"admin:all"}
	if d := f.e.Decide(context.Background(), c); d.Action != Allow {
		t.Fatalf("got %+v", d)
	}
	c = call("fs.read", nil)
	c.Permissions = []string{}
	if d := f.e.Decide(context.Background(), c); d.Reason != ScopeText("fs.read", "fs:read") {
		t.Fatalf("got %+v", d)
	}
}

// TestDefaultScope: with no permissions configured the scope is every permission in the
// manifests.
func TestDefaultScope(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	e, err := New(Config{Manifests: testManifests(), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"admin:all", "fs:read", "fs:write", "pay:write"}
	if !reflect.DeepEqual(e.Scope(), want) {
		t.Fatalf("scope %q", e.Scope())
	}
	if d := e.Decide(context.Background(), call("fs.admin", nil)); d.Action != Allow {
		t.Fatalf("got %+v", d)
	}
}

// TestDuplicateKey: the first call claims the key; a second is a duplicate (blocked in
// enforce, would_block otherwise) until the key is released.
func TestDuplicateKey(t *testing.T) {
	for _, mode := range []Mode{Enforce, Advise, Observe} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFixture(t, mode, "")
			ctx := context.Background()
			args := map[string]any{"id": 7}
			first := f.e.Decide(ctx, call("fs.keyed", args))
			wantKey := "fs.keyed\x00run:run-1\x00k-7"
			if first.Action != Allow || first.WouldBlock || !first.KeyClaimed || first.Key != wantKey {
				t.Fatalf("first: %+v", first)
			}
			second := f.e.Decide(ctx, call("fs.keyed", args))
			reason := "duplicate call: an earlier call of fs.keyed with the same key still stands (run run-1, step 0)"
			if second.Reason != reason || second.KeyClaimed || second.Key != wantKey {
				t.Fatalf("second: %+v", second)
			}
			if (mode == Enforce) != (second.Action == Block) || (mode != Enforce) != second.WouldBlock {
				t.Fatalf("second in %s: %+v", mode, second)
			}
			other := call("fs.keyed", args)
			other.Run = "run-2"
			if d := f.e.Decide(ctx, other); !d.KeyClaimed || d.Action != Allow {
				t.Fatalf("another run (scope run): %+v", d)
			}
			if err := f.st.ReleaseKey(ctx, first.Key); err != nil {
				t.Fatal(err)
			}
			if third := f.e.Decide(ctx, call("fs.keyed", args)); !third.KeyClaimed || third.Action != Allow {
				t.Fatalf("after release: %+v", third)
			}
		})
	}
}

// TestBlockedCallClaimsNoKey: in enforce a call blocked by an earlier rule leaves the key free.
func TestBlockedCallClaimsNoKey(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	m := mf("fs.k", manifest.Idempotent, "fs:write", func(m *manifest.Manifest) {
		m.Idempotency = &manifest.Idempotency{Key: "{{args.id}}", Scope: "global"}
	})
	e, err := New(Config{Manifests: []*manifest.Manifest{m}, Deny: []string{"fs.k"}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	d := e.Decide(context.Background(), call("fs.k", map[string]any{"id": "x"}))
	if d.Action != Block || d.KeyClaimed {
		t.Fatalf("got %+v", d)
	}
	ok, _, err := st.ClaimKey(context.Background(), "fs.k\x00global\x00x", "other", 1)
	if err != nil || !ok {
		t.Fatalf("the key was taken: ok=%v err=%v", ok, err)
	}
}

type failingStore struct{ store.Store }

func (failingStore) ClaimKey(context.Context, string, string, int64) (bool, store.KeyHolder, error) {
	return false, store.KeyHolder{}, errors.New("disk on fire")
}

func (failingStore) ListApprovals(context.Context, store.ApprovalFilter) ([]store.Approval, error) {
	return nil, errors.New("disk on fire")
}

// TestStoreErrors: a store that fails makes the call a violation (blocked in enforce).
func TestStoreErrors(t *testing.T) {
	mem := store.NewMemory(nil)
	defer mem.Close()
	e, err := New(Config{Manifests: testManifests(), Store: failingStore{mem}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d := e.Decide(ctx, call("fs.keyed", map[string]any{"id": 1})); d.Action != Block ||
		d.Reason != "the duplicate-call key could not be checked: disk on fire" {
		t.Fatalf("got %+v", d)
	}
	if d := e.Decide(ctx, call("pay.charge", nil)); d.Action != Block ||
		d.Reason != "the approval queue could not be read: disk on fire" {
		t.Fatalf("got %+v", d)
	}
}

// TestApproval: in enforce a call needing approval queues a request with the manifest's
// rules; the same call waits while it is pending, passes once (consumed) when approved, and
// a later identical call needs a new approval. A denied request blocks.
func TestApproval(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	st := store.NewMemory(func() time.Time { return now })
	defer st.Close()
	e, err := New(Config{Manifests: testManifests(), Store: st, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	args := map[string]any{"amount": 25}
	d := e.Decide(ctx, call("pay.charge", args))
	if d.Action != NeedsApproval || d.ApprovalID == "" || !d.ApprovalRequired || d.Approval == nil ||
		d.Approval.Roles[0] != "finance" || d.JournalDecision() != "needs_approval" {
		t.Fatalf("first: %+v", d)
	}
	id := d.ApprovalID
	want := "pay.charge requires approval: request " + id + " is waiting for an approver; retry the same call once it is approved"
	if d.Reason != want || d.BlockedText() != "Blocked by Reversi: "+want {
		t.Fatalf("reason %q", d.Reason)
	}
	a, err := st.GetApproval(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if a.Run != "run-1" || a.Actor != "alice" || a.ArgsDigest != d.ArgsDigest || !reflect.DeepEqual(a.Roles, []string{"finance"}) ||
		a.OnTimeout != "deny" || !a.Expires.Equal(now.Add(time.Minute)) {
		t.Fatalf("request %+v", a)
	}
	if again := e.Decide(ctx, call("pay.charge", args)); again.Action != NeedsApproval || again.ApprovalID != id {
		t.Fatalf("pending: %+v", again)
	}
	if other := e.Decide(ctx, call("pay.charge", map[string]any{"amount": 26})); other.ApprovalID == id {
		t.Fatal("other arguments share the request")
	}
	if _, err := st.Decide(ctx, id, store.Decision{By: "bob", Roles: []string{"finance"}, Approve: true}); err != nil {
		t.Fatal(err)
	}
	ok := e.Decide(ctx, call("pay.charge", args))
	if ok.Action != Allow || ok.ApprovalID != id || ok.WouldBlock {
		t.Fatalf("approved: %+v", ok)
	}
	// The engine consumes nothing (issue 16): until the call's intent names the approval, a
	// decision still picks it; the intent consumes it, once.
	if again := e.Decide(ctx, call("pay.charge", args)); again.Action != Allow || again.ApprovalID != id {
		t.Fatalf("before the intent: %+v", again)
	}
	if _, err := st.CreateRun(ctx, store.Run{ID: "run-1", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	in := store.Intent{Run: "run-1", Tool: "pay.charge", ArgsDigest: ok.ArgsDigest, Approval: ok.ApprovalID}
	if _, err := st.RecordIntent(ctx, in); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecordIntent(ctx, in); !errors.Is(err, store.ErrConsumed) {
		t.Fatalf("a second intent with the approval: %v, want ErrConsumed", err)
	}
	next := e.Decide(ctx, call("pay.charge", args))
	if next.Action != NeedsApproval || next.ApprovalID == id {
		t.Fatalf("after use: %+v", next)
	}
	if _, err := st.Decide(ctx, next.ApprovalID, store.Decision{By: "bob", Roles: []string{"finance"}}); err != nil {
		t.Fatal(err)
	}
	denied := e.Decide(ctx, call("pay.charge", args))
	if denied.Action != Block || denied.Reason != "approval "+next.ApprovalID+" for this call was denied" {
		t.Fatalf("denied: %+v", denied)
	}
}

// TestApprovalCarriesActorIdentity: the request names the actor's uid and e-mail, so that the
// approver check compares identities (issue 16).
func TestApprovalCarriesActorIdentity(t *testing.T) {
	f := newFixture(t, Enforce, "")
	c := call("pay.charge", map[string]any{"amount": 1})
	c.ActorUID, c.ActorEmail = "uid-alice", "alice@corp.example"
	d := f.e.Decide(context.Background(), c)
	a, err := f.st.GetApproval(context.Background(), d.ApprovalID)
	if err != nil || a.ActorUID != "uid-alice" || a.ActorEmail != "alice@corp.example" {
		t.Fatalf("request %+v, %v", a, err)
	}
}

// TestApprovalAdviseObserve: approval is a rule like the others; nothing is queued.
func TestApprovalAdviseObserve(t *testing.T) {
	for _, mode := range []Mode{Advise, Observe} {
		f := newFixture(t, mode, "")
		d := f.e.Decide(context.Background(), call("pay.charge", nil))
		want := "approval required: pay.charge needs a person's approval"
		if d.Action != Allow || !d.WouldBlock || d.Reason != want || d.ApprovalID != "" {
			t.Fatalf("%s: %+v", mode, d)
		}
		if list, _ := f.st.ListApprovals(context.Background(), store.ApprovalFilter{}); len(list) != 0 {
			t.Fatalf("%s: queued %+v", mode, list)
		}
	}
}

// TestDefaultApprovalTimeout: `approval: always` (no rules) expires after a day.
func TestDefaultApprovalTimeout(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	st := store.NewMemory(func() time.Time { return now })
	defer st.Close()
	m := mf("x.send", manifest.Idempotent, "x:w", func(m *manifest.Manifest) { m.Approval.Required = true })
	e, _ := New(Config{Manifests: []*manifest.Manifest{m}, Store: st, Now: func() time.Time { return now }})
	d := e.Decide(context.Background(), call("x.send", nil))
	a, err := st.GetApproval(context.Background(), d.ApprovalID)
	if err != nil || !a.Expires.Equal(now.Add(24*time.Hour)) || a.Quorum != 1 {
		t.Fatalf("%+v %v", a, err)
	}
}

// TestFiveProblems: the violation lists the first five problems and counts the rest.
func TestFiveProblems(t *testing.T) {
	props := map[string]any{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		props[k] = map[string]any{"type": "integer"}
	}
	st := store.NewMemory(nil)
	defer st.Close()
	e, err := New(Config{Mode: Enforce, Store: st, Tools: []Tool{{Name: "t", InputSchema: map[string]any{"type": "object", "properties": props}}}})
	if err != nil {
		t.Fatal(err)
	}
	d := e.Decide(context.Background(), call("t", map[string]any{"a": "x", "b": "x", "c": "x", "d": "x", "e": "x", "f": "x", "g": 1.5}))
	want := []string{NoManifestText("t")}
	if !reflect.DeepEqual(d.Violations, want) {
		t.Fatalf("%q", d.Violations)
	}
	e, _ = New(Config{Mode: Observe, Store: st, Tools: []Tool{{Name: "t", InputSchema: map[string]any{"type": "object", "properties": props}}}})
	d = e.Decide(context.Background(), call("t", map[string]any{"a": "x", "b": "x", "c": "x", "d": "x", "e": "x", "f": "x", "g": 1.5}))
	if len(d.Violations) != 1 || !strings.HasPrefix(d.Reason, InputSchemaPrefix) {
		t.Fatalf("%q", d.Violations)
	}
	problems := strings.TrimPrefix(d.Reason, InputSchemaPrefix)
	if strings.Count(problems, "; ") != 4 || !strings.HasSuffix(problems, " (and 2 more)") {
		t.Fatalf("problems %q", problems)
	}
}

// TestSchemaHash: the hash is the first 12 hex digits of SHA-256 over the canonical JSON, so
// key order and whitespace do not change it.
func TestSchemaHash(t *testing.T) {
	a, err := SchemaHash(json.RawMessage(`{ "type": "object", "properties": {"a": {"type": "string"}} }`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := SchemaHash(map[string]any{"properties": map[string]any{"a": map[string]any{"type": "string"}}, "type": "object"})
	// sha256 of {"properties":{"a":{"type":"string"}},"type":"object"}
	if a != b || a != "08c8cc0e5745" {
		t.Fatalf("%s %s", a, b)
	}
	c, _ := SchemaHash(map[string]any{"type": "object"})
	if c == a || len(c) != SchemaHashLength {
		t.Fatal(c)
	}
}

// TestSchemaDriftMatches: a manifest with the current hash (12 or 64 digits) passes.
func TestSchemaDriftMatches(t *testing.T) {
	h, _ := SchemaHash(pathSchema)
	b, _ := CanonicalSchemaJSON(pathSchema)
	for _, hash := range []string{h, strings.ToUpper(h), fullHash(b)} {
		st := store.NewMemory(nil)
		m := mf("fs.s", manifest.ReadOnly, "fs:read", func(m *manifest.Manifest) { m.SchemaHash = hash })
		e, _ := New(Config{Manifests: []*manifest.Manifest{m}, Store: st, Tools: []Tool{{Name: "fs.s", InputSchema: pathSchema}}})
		if d := e.Decide(context.Background(), call("fs.s", map[string]any{"path": "x"})); d.Action != Allow {
			t.Fatalf("%s: %+v", hash, d)
		}
		_ = st.Close()
	}
}

// TestValidateSchemasOff: validate_schemas: false skips argument and result checks (drift
// is still checked).
func TestValidateSchemasOff(t *testing.T) {
	off := false
	st := store.NewMemory(nil)
	defer st.Close()
	e, _ := New(Config{Mode: Enforce, ValidateSchemas: &off, Store: st, Manifests: testManifests(), Tools: testTools()})
	if d := e.Decide(context.Background(), call("fs.schema", map[string]any{"path": 1})); d.Action != Allow {
		t.Fatalf("%+v", d)
	}
	if d := e.Decide(context.Background(), call("fs.drift", map[string]any{"path": 1})); d.Reason != SchemaDriftText {
		t.Fatalf("%+v", d)
	}
}

// TestBadSchema: a schema that does not compile is noted, not enforced.
func TestBadSchema(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	bad := map[string]any{"type": 12}
	e, err := New(Config{Mode: Observe, Store: st, Tools: []Tool{{Name: "t", InputSchema: bad, OutputSchema: bad}}})
	if err != nil {
		t.Fatal(err)
	}
	d := e.Decide(context.Background(), call("t", nil))
	if d.WouldBlock || len(d.Notes) != 2 || !strings.HasPrefix(d.Notes[1], "the tool's input schema could not be compiled, so the arguments were not checked: ") {
		t.Fatalf("%+v", d)
	}
	if note, ok := e.CheckResult("t", map[string]any{}); !ok || !strings.HasPrefix(note, "the tool's output schema could not be compiled") {
		t.Fatalf("%q %v", note, ok)
	}
}

// TestCheckResult: structuredContent against outputSchema (seed: Schema validation).
func TestCheckResult(t *testing.T) {
	out := map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}}, "required": []any{"id"}}
	st := store.NewMemory(nil)
	defer st.Close()
	off := false
	on, _ := New(Config{Store: st, Tools: []Tool{{Name: "t", OutputSchema: out}, {Name: "u"}}})
	noCheck, _ := New(Config{Store: st, ValidateSchemas: &off, Tools: []Tool{{Name: "t", OutputSchema: out}}})
	cases := []struct {
		name string
		e    *Engine
		tool string
		sc   any
		note string
		ok   bool
	}{
		{"matches", on, "t", map[string]any{"id": "x"}, "", true},
		{"wrong type", on, "t", map[string]any{"id": 1}, "result does not match the tool's output schema: /id: got number, want string", false},
		{"missing", on, "t", map[string]any{}, "result does not match the tool's output schema: /: missing property 'id'", false},
		{"no structured content", on, "t", nil, "", true},
		{"no output schema", on, "u", map[string]any{"id": 1}, "", true},
		{"unknown tool", on, "v", map[string]any{"id": 1}, "", true},
		{"validation off", noCheck, "t", map[string]any{"id": 1}, "", true},
	}
	for _, tc := range cases {
		note, ok := tc.e.CheckResult(tc.tool, tc.sc)
		if note != tc.note || ok != tc.ok {
			t.Errorf("%s: %q %v", tc.name, note, ok)
		}
	}
}

// TestNew: the automatic mode and the configuration errors.
func TestNew(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	auto, err := New(Config{Store: st})
	if err != nil || auto.Mode() != Observe || !auto.AutoObserve() {
		t.Fatalf("no manifests: %v %v", auto.Mode(), err)
	}
	named, _ := New(Config{Store: st, Mode: Enforce})
	if named.Mode() != Enforce || named.AutoObserve() {
		t.Fatal("an explicit mode must win")
	}
	withManifests, _ := New(Config{Store: st, Manifests: testManifests()})
	if withManifests.Mode() != Enforce || withManifests.AutoObserve() {
		t.Fatal("manifests: enforce")
	}
	bad := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "engine: a store is required"},
		{Config{Store: st, Mode: "strict"}, `engine: mode "strict" (enforce, advise or observe)`},
		{Config{Store: st, UnclassifiedReads: "allow"}, `engine: unclassified_reads "allow" (block or observe)`},
		{Config{Store: st, Deny: []string{"fs.["}}, `engine: bad tool-name glob "fs.[": syntax error in pattern`},
		{Config{Store: st, Manifests: []*manifest.Manifest{nil}}, "engine: manifest 0 is nil"},
		{Config{Store: st, Manifests: []*manifest.Manifest{mf("a", manifest.ReadOnly, "p"), mf("a", manifest.ReadOnly, "p")}}, "engine: two manifests for a"},
		{Config{Store: st, Tools: []Tool{{Name: "a"}, {Name: "a"}}}, "engine: two upstream tools named a"},
	}
	for _, b := range bad {
		if _, err := New(b.cfg); err == nil || err.Error() != b.want {
			t.Errorf("%+v: %v", b.cfg, err)
		}
	}
	if AutoObserveMessage != "reversi-gateway: no manifests yet, so starting in observe mode: everything runs and is journaled. Run `reversi suggest-manifest` to draft manifests for what the upstream offers." {
		t.Fatal("the seed's start message changed")
	}
}

// TestListed: allow and deny filter `tools/list`.
func TestListed(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	e, _ := New(Config{Store: st, Allow: []string{"fs.*", "github.get_*"}, Deny: []string{"fs.remove_dir"}})
	for tool, want := range map[string]bool{"fs.read": true, "fs.remove_dir": false, "github.get_issue": true, "github.create_issue": false} {
		if e.Listed(tool) != want {
			t.Errorf("%s: %v", tool, !want)
		}
	}
	d := e.Decide(context.Background(), call("github.create_issue", nil))
	if d.Action != Allow || d.Reason != "github.create_issue is not matched by the gateway's allow rules" || !d.WouldBlock {
		t.Fatalf("%+v", d)
	}
	// A tool name with a slash is denied when a part of it before the slash is (path.Match's *
	// stops at a slash; names are the upstream's to choose): issue 19 review.
	e, _ = New(Config{Store: st, Deny: []string{"fs.*"}})
	for tool, want := range map[string]bool{"fs.team/secret": false, "fs.a/b/c": false, "git.team/x": true} {
		if e.Listed(tool) != want {
			t.Errorf("deny fs.*: %s listed %v, want %v", tool, !want, want)
		}
	}
	if why, ok := e.AllowDeny("fs.team/secret"); ok || why != `fs.team/secret is within fs.team, and fs.team is denied by the gateway's deny rule "fs.*"` {
		t.Errorf("why %q", why)
	}
}

// TestHolder: Swap replaces the engine atomically and returns the old one.
func TestHolder(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	a, _ := New(Config{Store: st})
	b, _ := New(Config{Store: st, Mode: Enforce})
	h := NewHolder(a)
	if h.Load() != a {
		t.Fatal("load")
	}
	if old := h.Swap(b); old != a || h.Load() != b {
		t.Fatal("swap")
	}
}
