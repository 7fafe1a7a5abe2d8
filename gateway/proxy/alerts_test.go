package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	gwnotify "github.com/reversi-gitops/reversi/gateway/notify"
	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
	"github.com/reversi-gitops/reversi/pkg/webhook"
)

// delivery is one POST a test receiver got.
type delivery struct {
	h    http.Header
	body []byte
}

// hooks are the receivers of an alert test: "hook" (every event, signed with "k") and
// "approvals" (events: approval.requested only), each an httptest server on 127.0.0.1 whose
// deliveries arrive on a channel; the notify worker runs on the gateway's SQLite store.
type hooks struct {
	all, approvals chan delivery
}

// alertGateway starts a gateway like startWith, with the notify worker of hooks on its store.
func alertGateway(t *testing.T, cfg *config.Gateway, o Options) (*fixture, *hooks) {
	t.Helper()
	h := &hooks{all: make(chan delivery, 32), approvals: make(chan delivery, 32)}
	rcv := func(ch chan delivery) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			ch <- delivery{r.Header.Clone(), b}
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	st, err := store.OpenSQLite(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	w, err := gwnotify.New(ctx, gwnotify.Options{Outbox: st, Gateway: "gw-test", Receivers: []config.Notification{
		{Name: "hook", Type: config.NotifyWebhook, URL: rcv(h.all), Secret: "k"},
		{Name: "approvals", Type: config.NotifyWebhook, URL: rcv(h.approvals), Events: []string{store.NoticeApprovalRequested}}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	errw := &syncBuffer{}
	o.Config, o.Store, o.Stderr, o.Name = cfg, st, errw, "gw-test"
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	gw, err := New(sctx, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return &fixture{gw: gw, store: st, stderr: errw}, h
}

// next returns the next delivery on ch within d, checks its signature (secret "k") and
// event header, and decodes its alert body.
func next(t *testing.T, ch chan delivery, d time.Duration, typ string) gwnotify.AlertBody {
	t.Helper()
	var got delivery
	select {
	case got = <-ch:
	case <-time.After(d):
		t.Fatalf("no %s delivery within %s", typ, d)
	}
	var b gwnotify.AlertBody
	if err := json.Unmarshal(got.body, &b); err != nil {
		t.Fatal(err)
	}
	if got.h.Get(gwnotify.HeaderEvent) != typ || b.Type != typ || got.h.Get(gwnotify.HeaderIdempotency) != b.IdempotencyKey ||
		!webhook.Verify("k", got.body, got.h.Get(gwnotify.HeaderSignature)) {
		t.Fatalf("delivery %v %s, want a signed %s", got.h, got.body, typ)
	}
	return b
}

// none checks that nothing arrives on ch for d.
func none(t *testing.T, ch chan delivery, d time.Duration, what string) {
	t.Helper()
	select {
	case got := <-ch:
		t.Fatalf("%s: got %v %s", what, got.h.Get(gwnotify.HeaderEvent), got.body)
	case <-time.After(d):
	}
}

// TestRefusedReloadAlerts: the gateway serves a signed registry; a tampered version file
// swapped in while it runs is refused by the file watch, and that reload_failed record comes
// with exactly one alert.reload_refused delivery, signed, naming the gateway and the
// manifests that keep serving, keyed by the record's seq; the receiver whose events filter
// lists only approval.requested gets nothing. Source: issue 24.
func TestRefusedReloadAlerts(t *testing.T) {
	k := signingtest.NewKey(t)
	dir := filepath.Join(t.TempDir(), "reg")
	reg := registry.New(dir)
	docs, errs := manifest.ReadPaths(writeFile(t, "memory.yaml", memoryManifests))
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	if _, err := reg.Publish(ms, manifest.Approved, registry.WriteOptions{By: "test", Signer: k.Signer}); err != nil {
		t.Fatal(err)
	}
	load := func(context.Context) (Loaded, error) {
		snap, errs := reg.Load(k.Trust)
		if len(errs) > 0 {
			return Loaded{}, errors.Join(errs...)
		}
		return Loaded{Manifests: snap.Manifests}, nil
	}
	first, err := load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f, h := alertGateway(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: first.Manifests, Load: load})
	served := f.gw.Digest()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.gw.Watch(ctx, 50*time.Millisecond, dir)
	// The watch is running once it has seen a change that reloads nothing (a probe file
	// rewritten until then: the watch's first look may come after a write).
	for i, deadline := 0, time.Now().Add(5*time.Second); !strings.Contains(f.stderr.String(), "reload: no change"); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("the watch did not run:\n%s", f.stderr.String())
		}
		write(t, filepath.Join(dir, "probe"), strings.Repeat("x", i))
		time.Sleep(60 * time.Millisecond)
	}

	// Tamper with one signed version: the same file, another description.
	versions, _ := filepath.Glob(filepath.Join(dir, "tools", "*", "v*.json"))
	if len(versions) == 0 {
		t.Fatalf("no version files in %s", dir)
	}
	raw, err := os.ReadFile(versions[0])
	if err != nil {
		t.Fatal(err)
	}
	tampered := strings.Replace(string(raw), `"description": "`, `"description": "tampered: `, 1)
	if tampered == string(raw) {
		t.Fatalf("nothing to tamper with in %s", raw)
	}
	tmp := versions[0] + ".new"
	write(t, tmp, tampered)
	if err := os.Rename(tmp, versions[0]); err != nil {
		t.Fatal(err)
	}
	b := next(t, h.all, 5*time.Second, store.NoticeAlertReloadRefused)
	failed := gatewayRecords(t, f.store, store.KindReloadFailed)
	if len(failed) != 1 {
		t.Fatalf("reload_failed records %+v", failed)
	}
	if b.IdempotencyKey != "alert.reload_refused:gw-test:"+itoa(failed[0].Seq) || b.JournalSeq != failed[0].Seq ||
		b.Severity != store.SeverityWarning || b.Reason != "ReloadRefused" || b.Gateway != "gw-test" || b.Revision != served ||
		b.Object != (store.ObjectRef{Kind: store.ObjectGateway, Name: "gw-test"}) || !strings.Contains(b.Message, failed[0].Note) ||
		!strings.Contains(b.Action, "previous manifests keep serving") {
		t.Fatalf("alert %+v (record %+v)", b, failed[0])
	}
	if f.gw.Digest() != served {
		t.Fatal("the tampered manifests are served")
	}
	none(t, h.all, 300*time.Millisecond, "a second delivery")
	none(t, h.approvals, 0, "the approvals-only receiver")
}

// TestKillSwitchAlerts: reversi.halt then reversi.resume are journaled each with its alert:
// alert.halted (who, why, since) then alert.resumed, each delivered once and signed; halting
// again with the same reason announces nothing; the approvals-only receiver gets neither.
func TestKillSwitchAlerts(t *testing.T) {
	f, h := alertGateway(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: loadManifests(t)})
	ctx := context.Background()
	if _, out, err := f.gw.haltTool(ctx, nil, HaltIn{Reason: "incident 42"}); err != nil || !out.Halted {
		t.Fatalf("halt: %+v %v", out, err)
	}
	b := next(t, h.all, 2*time.Second, store.NoticeAlertHalted)
	if b.Actor != "dev-laptop" || b.Severity != store.SeverityCritical || !strings.Contains(b.Message, "incident 42") || b.Since == nil ||
		!strings.Contains(b.Action, "reversi.resume") {
		t.Fatalf("halted alert %+v", b)
	}
	if _, _, err := f.gw.haltTool(ctx, nil, HaltIn{Reason: "incident 42"}); err != nil {
		t.Fatal(err)
	}
	none(t, h.all, 200*time.Millisecond, "halting again")
	if _, out, err := f.gw.resumeTool(ctx, nil, Empty{}); err != nil || out.Halted {
		t.Fatalf("resume: %+v %v", out, err)
	}
	r := next(t, h.all, 2*time.Second, store.NoticeAlertResumed)
	if r.Actor != "dev-laptop" || r.Severity != store.SeverityWarning || r.IdempotencyKey == b.IdempotencyKey || !strings.Contains(r.Message, "incident 42") {
		t.Fatalf("resumed alert %+v", r)
	}
	var notes []string
	for _, n := range gatewayRecords(t, f.store, store.KindNote) {
		notes = append(notes, n.Note)
	}
	if len(notes) != 2 || notes[0] != "halted by dev-laptop: incident 42" || notes[1] != "resumed by dev-laptop" {
		t.Fatalf("journal notes %q", notes)
	}
	if b.JournalSeq == 0 || r.JournalSeq <= b.JournalSeq {
		t.Fatalf("journal seqs %d %d", b.JournalSeq, r.JournalSeq)
	}
	none(t, h.approvals, 200*time.Millisecond, "the approvals-only receiver")
}

// failingReadBack: create_entities' compensation works, but its read-back expects an empty
// graph while another entity stays: verification_failed.
const failingReadBack = `
- tool: memory.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: memory:read
- tool: memory.create_entities
  description: Create entities.
  effect: reversible
  permission: memory:write
  risk: {blast_radius: high}
  compensation:
    tool: memory.delete_entities
    kind: inverse
    argument_map:
      entityNames: $result.entities.*.name
    verification:
      tool: memory.read_graph
      expect: { entities: [] }
      retries: 1
      backoff_ms: 10ms
- tool: memory.delete_entities
  description: Delete entities.
  effect: idempotent
  permission: memory:admin
`

// TestRollbackFailedAlerts: a rollback whose read-back never matches (it expects an empty
// graph while an entity stays) ends the step verification_failed, and that record comes with one alert.rollback_failed naming the run,
// the step, its tool and its risk. Source: issue 24.
func TestRollbackFailedAlerts(t *testing.T) {
	docs, errs := manifest.ReadPaths(writeFile(t, "memory.yaml", failingReadBack))
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	f, h := alertGateway(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: ms})
	cs := f.client(t)
	for _, name := range []string{"stays", "goes"} {
		if res := call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
			map[string]any{"name": name, "entityType": "t", "observations": []any{}}}}); res.IsError {
			t.Fatalf("create_entities: %v", texts(res))
		}
	}
	run, recs := onlyRun(t, f.store)
	steps := stepsOf(recs, "memory.create_entities")
	// Undone last first: deleting "goes" leaves "stays", so that read-back never matches.
	res, err := f.gw.ExecuteRollback(context.Background(), run.ID, rollback.Options{Confirm: true, Backoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var failedSteps []int64
	for _, s := range res.Steps {
		if s.Status == store.RollbackVerificationFailed {
			failedSteps = append(failedSteps, s.Step)
		}
	}
	if len(failedSteps) == 0 {
		t.Fatalf("no step ended verification_failed: %+v", res.Steps)
	}
	got := map[int64]gwnotify.AlertBody{}
	for range failedSteps {
		b := next(t, h.all, 3*time.Second, store.NoticeAlertRollbackFailed)
		got[b.Step] = b
	}
	for _, st := range failedSteps {
		b, ok := got[st]
		if !ok || b.Run != run.ID || b.Tool != "memory.create_entities" || b.Status != string(store.RollbackVerificationFailed) ||
			b.Risk == nil || b.Risk.BlastRadius != "high" || b.Actor != "dev-laptop" || b.Severity != store.SeverityCritical ||
			b.Object != (store.ObjectRef{Kind: store.ObjectRun, Name: run.ID}) || !strings.HasPrefix(b.IdempotencyKey, "alert.rollback_failed:"+run.ID+":"+itoa(st)+":") {
			t.Fatalf("step %d: alert %+v (steps %v)", st, b, steps)
		}
	}
	none(t, h.all, 300*time.Millisecond, "more rollback alerts")
	none(t, h.approvals, 0, "the approvals-only receiver")
}

// TestUpstreamDownAlertsOnce: server-memory killed, and held down while the gateway tries to
// restart it a few times, is one alert.upstream_down (with the error), not one per failed
// reconnect; killed again soon after it came back (a flap) it is journaled, not announced
// again. Source: issue 24.
func TestUpstreamDownAlertsOnce(t *testing.T) {
	mem := killableMemory(t)
	cfg := memoryConfig(t, config.ModeEnforce)
	cfg.Upstreams = []config.Upstream{mem.u}
	f, h := alertGateway(t, cfg, Options{Manifests: loadManifests(t)})
	cs := f.client(t)
	mem.hold(t, true)
	mem.kill(t, syscall.SIGKILL)
	b := next(t, h.all, 5*time.Second, store.NoticeAlertUpstreamDown)
	if b.Upstream != "memory" || b.Severity != store.SeverityCritical || !strings.Contains(b.Message, "killed") || b.Since == nil ||
		!strings.Contains(b.Action, "reconnects by itself") {
		t.Fatalf("alert %+v", b)
	}
	time.Sleep(1600 * time.Millisecond) // restarts at 0.5 s and 1.5 s fail while held
	mem.hold(t, false)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res := call(t, cs, "memory.read_graph", map[string]any{}); !res.IsError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the upstream was not reconnected")
		}
	}
	mem.kill(t, syscall.SIGKILL) // a flap: it lived less than stableSession
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		stops := 0
		for _, n := range gatewayRecords(t, f.store, store.KindNote) {
			if strings.HasPrefix(n.Note, "upstream memory stopped (") {
				stops++
			}
		}
		if stops == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d stops journaled, want 2", stops)
		}
	}
	none(t, h.all, 300*time.Millisecond, "a second upstream_down")
	none(t, h.approvals, 0, "the approvals-only receiver")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
