package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/pkg/webhook"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	gwnotify "github.com/reversi-gitops/reversi/gateway/notify"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestHeldCallNotifies: a call of server-memory's delete_entities (irreversible: held for
// approval) through the gateway produces exactly one approval.requested delivery within 1 s,
// signed, whose redacted preview hides the argument the manifest's audit.redaction names (its
// value is nowhere in the body); approving the request produces approval.approved; the
// worker's counter is served with the gateway's metrics. Source: issue 24 (Acceptance).
func TestHeldCallNotifies(t *testing.T) {
	type got struct {
		h    http.Header
		body []byte
	}
	ch := make(chan got, 16)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ch <- got{r.Header.Clone(), b}
	}))
	defer rcv.Close()
	p := filepath.Join(t.TempDir(), "m.yaml")
	man := "- tool: memory.delete_entities\n  description: Delete entities.\n  effect: irreversible\n  permission: memory:write\n" +
		"  risk: {blast_radius: high}\n  audit: {redaction: [$args.entityNames]}\n"
	if err := os.WriteFile(p, []byte(man), 0o600); err != nil {
		t.Fatal(err)
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.OpenSQLite(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w, err := gwnotify.New(ctx, gwnotify.Options{Outbox: st, Gateway: "gw-test",
		Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rcv.URL, Secret: "k"}}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	defer func() { wcancel(); <-done }()
	gw, err := New(ctx, Options{Config: memoryConfig(t, config.ModeEnforce), Manifests: ms, Store: st, Stderr: io.Discard,
		Collectors: []prometheus.Collector{w.Collector()}})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	cs := (&fixture{gw: gw, store: st}).client(t)

	const secret = "customer-4411-confidential"
	start := time.Now()
	res := call(t, cs, "memory.delete_entities", map[string]any{"entityNames": []any{secret}})
	if !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "requires approval") {
		t.Fatalf("not held: %v", texts(res))
	}
	pending, err := st.ListApprovals(ctx, store.ApprovalFilter{State: store.ApprovalPending})
	if err != nil || len(pending) != 1 {
		t.Fatalf("pending %+v %v", pending, err)
	}
	id := pending[0].ID
	var d got
	select {
	case d = <-ch:
	case <-time.After(time.Second):
		t.Fatal("no delivery within 1 s of the held call")
	}
	if took := time.Since(start); took > time.Second+500*time.Millisecond {
		t.Errorf("delivered %s after the call began", took)
	}
	if !webhook.Verify("k", d.body, d.h.Get(gwnotify.HeaderSignature)) || d.h.Get(gwnotify.HeaderIdempotency) != "approval.requested:"+id {
		t.Fatalf("headers %v", d.h)
	}
	if strings.Contains(string(d.body), secret) {
		t.Fatalf("the redacted argument is in the body: %s", d.body)
	}
	var b gwnotify.Body
	if err := json.Unmarshal(d.body, &b); err != nil {
		t.Fatal(err)
	}
	if b.Type != "approval.requested" || b.Tool != "memory.delete_entities" || b.Approval != id || b.Actor != "dev-laptop" ||
		b.ArgumentsPreview != `{"entityNames":"[redacted]"}` || b.Risk.BlastRadius != "high" || b.Quorum != 1 || b.ExpiresAt == nil ||
		b.Run == "" || !strings.HasPrefix(b.ApproveCommand, "reversi approvals approve "+id) {
		t.Fatalf("body %s", d.body)
	}
	select {
	case extra := <-ch:
		t.Fatalf("a second delivery: %s", extra.body)
	case <-time.After(300 * time.Millisecond):
	}

	if _, err := st.Decide(ctx, id, store.Decision{By: "ops", Approve: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case d = <-ch:
	case <-time.After(time.Second):
		t.Fatal("no approval.approved within 1 s")
	}
	if d.h.Get(gwnotify.HeaderEvent) != "approval.approved" || d.h.Get(gwnotify.HeaderIdempotency) != "approval.approved:"+id ||
		strings.Contains(string(d.body), secret) {
		t.Fatalf("approved delivery %v %s", d.h, d.body)
	}
	deadline := time.Now().Add(time.Second)
	for {
		fams, err := gw.metrics.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var delivered float64
		for _, f := range fams {
			if f.GetName() == MetricsPrefix+"notifications_total" {
				for _, m := range f.GetMetric() {
					if m.GetLabel()[0].GetValue() == gwnotify.MetricDelivered {
						delivered = m.GetCounter().GetValue()
					}
				}
			}
		}
		if delivered == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reversi_gateway_notifications_total{state=delivered} %v, want 2", delivered)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
