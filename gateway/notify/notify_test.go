package notify

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/pkg/webhook"

	dto "github.com/prometheus/client_model/go"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/egress"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/pgtest"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// pg is a PostgreSQL server for the test that needs one (started on first use).
var pg pgtest.Lazy

// childEnv, when set to a data folder, makes the test binary the gateway process of
// TestDeliveredAfterRestart: it queues a request (whose notification the store writes in the
// same transaction) and dies before any worker ran.
const childEnv = "REVERSI_NOTIFY_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		child(dir, os.Getenv("REVERSI_NOTIFY_CHILD_URL"))
	}
	code := m.Run()
	pg.Stop()
	os.Exit(code)
}

func child(dir, url string) {
	ctx := context.Background()
	st, err := store.OpenSQLite(dir, nil)
	if err == nil {
		_, err = New(ctx, Options{Outbox: st, Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: url, Secret: "s3"}}})
	}
	if err == nil {
		err = queue(ctx, st, "run-child", "mem.delete_entities", `{"entityNames":["alice"]}`)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(0) // killed: no worker ran, the store was not closed
}

// delivery is one request a receiver got.
type delivery struct {
	at      time.Time
	headers http.Header
	body    []byte
}

// receiver is an HTTP receiver on 127.0.0.1 that answers the statuses of codes in turn (then
// 200) and records every request.
type receiver struct {
	*httptest.Server
	mu    sync.Mutex
	codes []int
	got   []delivery
	ch    chan delivery
}

func newReceiver(t *testing.T, codes ...int) *receiver {
	t.Helper()
	r := &receiver{codes: codes, ch: make(chan delivery, 100)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		d := delivery{at: time.Now(), headers: req.Header.Clone(), body: body}
		r.mu.Lock()
		code := http.StatusOK
		if len(r.got) < len(r.codes) {
			code = r.codes[len(r.got)]
		}
		r.got = append(r.got, d)
		r.mu.Unlock()
		w.WriteHeader(code)
		fmt.Fprintf(w, "answer %d", code)
		r.ch <- d
	}))
	t.Cleanup(r.Close)
	return r
}

// next waits (at most within) for the next request.
func (r *receiver) next(t *testing.T, within time.Duration) delivery {
	t.Helper()
	select {
	case d := <-r.ch:
		return d
	case <-time.After(within):
		t.Fatalf("no request at %s within %s", r.URL, within)
		return delivery{}
	}
}

// quiet checks that no request comes within d (after those already received).
func (r *receiver) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	before := r.count()
	time.Sleep(d)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) != before {
		last := r.got[len(r.got)-1]
		t.Fatalf("unexpected request at %s: %s %s", r.URL, last.headers.Get(HeaderEvent), last.body)
	}
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// counter is the value of reversi_gateway_notifications_total{state}, waited for (bounded)
// until it is want: the worker counts an attempt right after recording it.
func counter(t *testing.T, w *Worker, state string, want float64) float64 {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		var m dto.Metric
		if err := w.metric.WithLabelValues(state).Write(&m); err != nil {
			t.Fatal(err)
		}
		if v := m.GetCounter().GetValue(); v == want || time.Now().After(deadline) {
			return v
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func openSQLite(t *testing.T, dir string) *store.SQLite {
	t.Helper()
	st, err := store.OpenSQLite(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// run starts w until the test ends.
func run(t *testing.T, w *Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
}

func newWorker(t *testing.T, o Options) *Worker {
	t.Helper()
	w, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// queue opens a run and queues the request a held call of tool makes (as gateway/engine
// does), with preview as its redacted arguments preview.
func queue(ctx context.Context, st store.Store, run, tool, preview string) error {
	if _, err := st.CreateRun(ctx, store.Run{ID: run, Actor: "agent-alice"}); err != nil && !errors.Is(err, store.ErrExists) {
		return err
	}
	_, err := st.CreateApproval(ctx, store.ApprovalRequest{Tool: tool, ArgsDigest: "sha256:1", Run: run, Actor: "agent-alice",
		Roles: []string{"finance"}, Quorum: 1, Expires: time.Now().Add(time.Hour), Reason: tool + " is irreversible",
		ArgsPreview: preview, Risk: store.Risk{BlastRadius: "high"}})
	return err
}

func mustQueue(t *testing.T, st store.Store, run, tool, preview string) store.Approval {
	t.Helper()
	ctx := context.Background()
	if err := queue(ctx, st, run, tool, preview); err != nil {
		t.Fatal(err)
	}
	l, err := st.ListApprovals(ctx, store.ApprovalFilter{Run: run})
	if err != nil || len(l) == 0 {
		t.Fatalf("queued %v %v", l, err)
	}
	return l[len(l)-1]
}

func list(t *testing.T, o store.Outbox, state store.NotificationState) []store.Notification {
	t.Helper()
	l, err := o.ListNotifications(context.Background(), store.NotificationFilter{State: state})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitState waits (bounded) until the outbox has n rows in state.
func waitState(t *testing.T, o store.Outbox, state store.NotificationState, n int, within time.Duration) []store.Notification {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		l := list(t, o, state)
		if len(l) == n {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows %s after %s, want %d: %+v", len(l), state, within, n, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWebhookDeliversSignedWithinASecond: a queued request reaches the webhook once, within
// 1 s, signed with the shared secret, with the headers and the body's fields; approving it
// sends approval.approved, naming the approver.
func TestWebhookDeliversSignedWithinASecond(t *testing.T) {
	rcv := newReceiver(t)
	st := openSQLite(t, t.TempDir())
	w := newWorker(t, Options{Outbox: st, Gateway: "gw-a", StoreFlags: "--data .reversi",
		Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rcv.URL, Secret: "s3cret"}}})
	run(t, w)
	start := time.Now()
	a := mustQueue(t, st, "run-1", "mem.delete_entities", `{"entityNames":["alice"],"token":"[redacted]"}`)
	d := rcv.next(t, time.Second)
	if took := d.at.Sub(start); took > time.Second {
		t.Fatalf("delivered after %s", took)
	}
	if !webhook.Verify("s3cret", d.body, d.headers.Get(HeaderSignature)) || !strings.HasPrefix(d.headers.Get(HeaderSignature), "sha256=") {
		t.Fatalf("signature %q does not verify", d.headers.Get(HeaderSignature))
	}
	if webhook.Verify("other", d.body, d.headers.Get(HeaderSignature)) {
		t.Fatal("the signature verifies with another secret")
	}
	key := "approval.requested:" + a.ID
	if d.headers.Get(HeaderEvent) != "approval.requested" || d.headers.Get(HeaderIdempotency) != key ||
		d.headers.Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", d.headers)
	}
	var b map[string]any
	if err := json.Unmarshal(d.body, &b); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"schema_version": 1.0, "type": "approval.requested", "idempotency_key": key, "gateway": "gw-a",
		"approval_id": a.ID, "tool": "mem.delete_entities", "run": "run-1", "actor": "agent-alice",
		"reason":            "mem.delete_entities is irreversible",
		"arguments_preview": `{"entityNames":["alice"],"token":"[redacted]"}`, "quorum": 1.0,
		"approve_command": "reversi approvals approve " + a.ID + " --data .reversi --by <your name>",
		"deny_command":    "reversi approvals deny " + a.ID + " --data .reversi --by <your name>"}
	for k, v := range want {
		if fmt.Sprint(b[k]) != fmt.Sprint(v) {
			t.Errorf("body %s = %v, want %v", k, b[k], v)
		}
	}
	if r, _ := b["risk"].(map[string]any); r["blast_radius"] != "high" {
		t.Errorf("risk %v", b["risk"])
	}
	if roles, _ := b["roles"].([]any); len(roles) != 1 || roles[0] != "finance" {
		t.Errorf("roles %v", b["roles"])
	}
	if e, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(b["expires_at"])); !e.Equal(a.Expires) {
		t.Errorf("expires_at %v, want %v", b["expires_at"], a.Expires)
	}
	rcv.quiet(t, 300*time.Millisecond) // exactly one delivery
	if l := waitState(t, st, store.NotificationDelivered, 1, time.Second); l[0].Attempts != 1 {
		t.Fatalf("delivered row %+v", l[0])
	}

	if _, err := st.Decide(context.Background(), a.ID, store.Decision{By: "bob", Roles: []string{"finance"}, Approve: true}); err != nil {
		t.Fatal(err)
	}
	d = rcv.next(t, time.Second)
	if d.headers.Get(HeaderEvent) != "approval.approved" || d.headers.Get(HeaderIdempotency) != "approval.approved:"+a.ID ||
		!webhook.Verify("s3cret", d.body, d.headers.Get(HeaderSignature)) || !strings.Contains(string(d.body), `"decided_by":["bob"]`) ||
		strings.Contains(string(d.body), "approve_command") {
		t.Fatalf("approved delivery %v %s", d.headers, d.body)
	}
	waitState(t, st, store.NotificationDelivered, 2, time.Second)
	if got := counter(t, w, MetricDelivered, 2); got != 2 {
		t.Fatalf("delivered counter %v, want 2", got)
	}
}

// TestRetriesWithTheSameKey: the receiver answers 500 three times, then 200: the worker
// retries with backoff and delivers once more, every attempt with the same idempotency key
// and body; the row is delivered after 4 attempts.
func TestRetriesWithTheSameKey(t *testing.T) {
	rcv := newReceiver(t, 500, 500, 500)
	st := openSQLite(t, t.TempDir())
	w := newWorker(t, Options{Outbox: st, Poll: 20 * time.Millisecond, Backoff: 30 * time.Millisecond, MaxAttempts: 5,
		Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rcv.URL, Secret: "k"}}})
	run(t, w)
	a := mustQueue(t, st, "run-1", "mem.delete_entities", `{}`)
	var got []delivery
	for range 4 {
		got = append(got, rcv.next(t, 2*time.Second))
	}
	for i, d := range got {
		if d.headers.Get(HeaderIdempotency) != "approval.requested:"+a.ID || string(d.body) != string(got[0].body) {
			t.Fatalf("attempt %d: key %q body %s", i+1, d.headers.Get(HeaderIdempotency), d.body)
		}
		if i > 0 && d.at.Sub(got[i-1].at) < 30*time.Millisecond {
			t.Errorf("attempt %d came %s after the previous one: no backoff", i+1, d.at.Sub(got[i-1].at))
		}
	}
	rcv.quiet(t, 300*time.Millisecond)
	l := waitState(t, st, store.NotificationDelivered, 1, time.Second)
	if l[0].Attempts != 4 || rcv.count() != 4 {
		t.Fatalf("row %+v after %d requests, want 4 attempts", l[0], rcv.count())
	}
	if r, d := counter(t, w, MetricRetried, 3), counter(t, w, MetricDelivered, 1); r != 3 || d != 1 {
		t.Fatalf("metrics retried %v delivered %v", r, d)
	}
}

// TestDeadLetterAfterTheLimit: a receiver that always fails gets MaxAttempts attempts; the
// row is then dead with the last error, and not tried again. A 4xx (here 404) is dead at
// once.
func TestDeadLetterAfterTheLimit(t *testing.T) {
	failing := newReceiver(t, 503, 503, 503, 503, 503)
	gone := newReceiver(t, 404)
	st := openSQLite(t, t.TempDir())
	w := newWorker(t, Options{Outbox: st, Poll: 20 * time.Millisecond, Backoff: 10 * time.Millisecond, MaxAttempts: 3,
		Receivers: []config.Notification{{Name: "failing", Type: config.NotifyWebhook, URL: failing.URL},
			{Name: "gone", Type: config.NotifySlack, URL: gone.URL}}})
	run(t, w)
	mustQueue(t, st, "run-1", "mem.delete_entities", `{}`)
	dead := waitState(t, st, store.NotificationDead, 2, 3*time.Second)
	failing.quiet(t, 200*time.Millisecond)
	byName := map[string]store.Notification{dead[0].Sink: dead[0], dead[1].Sink: dead[1]}
	if f := byName["failing"]; f.Attempts != 3 || failing.count() != 3 || !strings.Contains(f.LastError, "HTTP 503: answer 503") {
		t.Fatalf("failing: %+v after %d requests", f, failing.count())
	}
	if g := byName["gone"]; g.Attempts != 1 || gone.count() != 1 || !strings.Contains(g.LastError, "HTTP 404") {
		t.Fatalf("gone: %+v after %d requests", g, gone.count())
	}
	if d := counter(t, w, MetricDead, 2); d != 2 {
		t.Fatalf("dead counter %v", d)
	}
}

// TestDeliveredAfterRestart: the gateway process queues a request and is killed before its
// worker delivers anything (the child process exits without closing the store); a new
// process on the same data folder delivers it, once. A row leased by a worker that died is
// delivered by another once the lease expires.
func TestDeliveredAfterRestart(t *testing.T) {
	rcv := newReceiver(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir, "REVERSI_NOTIFY_CHILD_URL="+rcv.URL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	rcv.quiet(t, 100*time.Millisecond)
	st := openSQLite(t, dir)
	if l := list(t, st, store.NotificationPending); len(l) != 1 || l[0].Notice.Run != "run-child" {
		t.Fatalf("pending after the kill: %+v", l)
	}
	// A worker that claims the row and dies (never finishes it) holds it for its lease only.
	if l, err := st.ClaimNotifications(context.Background(), "dead-worker", []string{"hook"}, 300*time.Millisecond, 10); err != nil || len(l) != 1 {
		t.Fatalf("claim %v %v", l, err)
	}
	start := time.Now()
	w := newWorker(t, Options{Outbox: st, Poll: 50 * time.Millisecond,
		Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rcv.URL, Secret: "s3"}}})
	run(t, w)
	d := rcv.next(t, 2*time.Second)
	if time.Since(start) < 250*time.Millisecond {
		t.Fatalf("delivered after %s, inside the dead worker's lease", time.Since(start))
	}
	if !webhook.Verify("s3", d.body, d.headers.Get(HeaderSignature)) || !strings.Contains(string(d.body), `"run":"run-child"`) {
		t.Fatalf("delivery %v %s", d.headers, d.body)
	}
	rcv.quiet(t, 200*time.Millisecond)
	waitState(t, st, store.NotificationDelivered, 1, time.Second)
}

// TestFilterExcludingTheToolSendsNothing: of two receivers, the one whose tools filter
// excludes the tool gets nothing (no request within a bounded wait) and has no outbox row
// (filters run when the event is written: an excluded event leaves no row); the other gets
// it. Events and risk filters likewise.
func TestFilterExcludingTheToolSendsNothing(t *testing.T) {
	all := newReceiver(t)
	payments := newReceiver(t)
	approvedOnly := newReceiver(t)
	critical := newReceiver(t)
	st := openSQLite(t, t.TempDir())
	w := newWorker(t, Options{Outbox: st, Receivers: []config.Notification{
		{Name: "all", Type: config.NotifyWebhook, URL: all.URL},
		{Name: "payments", Type: config.NotifyWebhook, URL: payments.URL, Tools: []string{"payments.*"}},
		{Name: "approved", Type: config.NotifyWebhook, URL: approvedOnly.URL, Events: []string{"approval.approved"}},
		{Name: "critical", Type: config.NotifyWebhook, URL: critical.URL, Risk: []string{"critical"}}}})
	run(t, w)
	mustQueue(t, st, "run-1", "mem.delete_entities", `{}`)
	if d := all.next(t, time.Second); d.headers.Get(HeaderEvent) != "approval.requested" {
		t.Fatalf("all got %v", d.headers)
	}
	for _, r := range []*receiver{payments, approvedOnly, critical} {
		r.quiet(t, 300*time.Millisecond)
	}
	l := list(t, st, "")
	if len(l) != 1 || l[0].Sink != "all" {
		t.Fatalf("outbox rows %+v, want only all's", l)
	}
	mustQueue(t, st, "run-1", "payments.refund", `{}`)
	if d := payments.next(t, time.Second); !strings.Contains(string(d.body), `"tool":"payments.refund"`) {
		t.Fatalf("payments got %s", d.body)
	}
	all.next(t, time.Second)
	approvedOnly.quiet(t, 200*time.Millisecond)
	critical.quiet(t, 0)
}

// TestMatches: the filters one by one (tool globs have allow/deny's slash rule).
func TestMatches(t *testing.T) {
	n := store.Notice{Type: "approval.requested", Tool: "fs.team/secret", Risk: store.Risk{BlastRadius: "high"}}
	for _, c := range []struct {
		r    config.Notification
		want bool
	}{
		{config.Notification{}, true},
		{config.Notification{Tools: []string{"fs.*"}}, true},
		{config.Notification{Tools: []string{"mem.*"}}, false},
		{config.Notification{Events: []string{"approval.denied"}}, false},
		{config.Notification{Events: []string{"approval.denied", "approval.requested"}}, true},
		{config.Notification{Risk: []string{"high", "critical"}}, true},
		{config.Notification{Risk: []string{"critical"}}, false},
	} {
		if got := Matches(&c.r, n); got != c.want {
			t.Errorf("%+v: %v, want %v", c.r, got, c.want)
		}
	}
}

// goldenNotice is the notice of the golden files.
var goldenNotice = store.Notice{Type: store.NoticeApprovalRequested, Key: "approval.requested:apr-7f3a", At: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
	Approval: "apr-7f3a", Tool: "payments.refund", Run: "run-42", Actor: "agent-alice", Reason: "payments.refund is irreversible <b>",
	ArgumentsPreview: `{"amount":120,"card_token":"[redacted]","note":"a & b"}`, Risk: store.Risk{BlastRadius: "high", DataClass: "pii"},
	Roles: []string{"finance", "ops"}, Quorum: 2, Expires: time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)}

// TestSlackGolden: the Slack payload of a request, against testdata/slack-requested.json
// (go test -update rewrites it): the tool, run, actor, redacted preview, risk, roles and
// quorum, expiry and the exact commands, with &, < and > escaped.
func TestSlackGolden(t *testing.T) {
	golden(t, "slack-requested.json", func() ([]byte, error) { return SlackBody(goldenNotice, "gw-a", "--data .reversi") })
	kept := goldenNotice
	kept.Kept, kept.Type, kept.Key, kept.DecidedBy = true, store.NoticeApprovalDenied, "approval.denied:apr-7f3a", []string{"carol"}
	kept.Note = "denied"
	golden(t, "slack-denied.json", func() ([]byte, error) { return SlackBody(kept, "gw-a", "") })
	golden(t, "webhook-requested.json", func() ([]byte, error) { return WebhookBody(goldenNotice, "gw-a", "--data .reversi") })
}

func golden(t *testing.T, name string, render func() ([]byte, error)) {
	t.Helper()
	b, err := render()
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	pretty, _ := json.MarshalIndent(v, "", "  ")
	pretty = append(pretty, '\n')
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, pretty, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(pretty) != string(want) {
		t.Fatalf("%s differs:\n%s\nwant:\n%s", name, pretty, want)
	}
}

// TestEgressRefusesReceivers: a receiver URL the egress rules refuse is an error of New that
// names the receiver's file:line and field, and stores no receiver.
func TestEgressRefusesReceivers(t *testing.T) {
	st := openSQLite(t, t.TempDir())
	for _, c := range []struct {
		rules egress.Rules
		url   string
		want  string
	}{
		{egress.Rules{BlockPrivate: true}, "http://127.0.0.1:9/hook", "gateway.yaml:7: notifications[1].url: refused by the egress rules: 127.0.0.1 is a private address"},
		{egress.Rules{AllowedHosts: []string{"hooks.example.com"}}, "http://127.0.0.1:9/hook", "host 127.0.0.1 is not in egress.allowed_hosts"},
		{egress.Rules{}, "http://169.254.169.254/latest", "cloud metadata address"},
	} {
		_, err := New(context.Background(), Options{Outbox: st, Egress: c.rules, Receivers: []config.Notification{
			{Name: "hook", Type: config.NotifyWebhook, URL: c.url, Where: "gateway.yaml:7", Field: "notifications[1]"}}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s with %+v: %v, want %q", c.url, c.rules, err, c.want)
		}
	}
	mustQueue(t, st, "run-1", "mem.delete_entities", `{}`)
	if l := list(t, st, ""); len(l) != 0 {
		t.Fatalf("rows after refused configs: %+v", l)
	}
}

// TestPostgresReplicasDeliverOnce: two gateways (two stores, two workers) on one Postgres
// schema: every request queued on either is delivered exactly once.
func TestPostgresReplicasDeliverOnce(t *testing.T) {
	srv := pg.Get(t)
	url := srv.URL("postgres", "search_path", srv.Unique("notify_"))
	ctx := context.Background()
	rcv := newReceiver(t)
	var stores []*store.Postgres
	for range 2 {
		st, err := store.OpenPostgres(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		stores = append(stores, st)
		run(t, newWorker(t, Options{Outbox: st, Poll: 20 * time.Millisecond, Batch: 2, Concurrency: 2,
			Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rcv.URL}}}))
	}
	const n = 20
	for i := range n {
		mustQueue(t, stores[i%2], fmt.Sprintf("run-%d", i), "mem.delete_entities", `{}`)
	}
	keys := map[string]int{}
	for range n {
		keys[rcv.next(t, 3*time.Second).headers.Get(HeaderIdempotency)]++
	}
	rcv.quiet(t, 300*time.Millisecond)
	if len(keys) != n {
		t.Fatalf("%d distinct keys of %d: %v", len(keys), n, keys)
	}
	waitState(t, stores[0], store.NotificationDelivered, n, 2*time.Second)
}
