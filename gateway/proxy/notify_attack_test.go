package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	gwnotify "github.com/reversi-gitops/reversi/gateway/notify"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// notifyWorld is a gateway in enforce mode fronting the real server-memory, whose
// delete_entities is held for approval, on a SQLite store whose outbox a worker delivers to a
// Slack-compatible receiver on 127.0.0.1 (its texts arrive on slack).
type notifyWorld struct {
	f     *fixture
	st    *store.SQLite
	slack chan string
}

func newNotifyWorld(t *testing.T) *notifyWorld {
	t.Helper()
	nw := &notifyWorld{slack: make(chan string, 256)}
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var m map[string]string
		_ = json.Unmarshal(b, &m)
		nw.slack <- m["text"]
	}))
	t.Cleanup(rcv.Close)
	p := filepath.Join(t.TempDir(), "m.yaml")
	man := "- tool: memory.delete_entities\n  description: Delete entities.\n  effect: irreversible\n  permission: memory:write\n  risk: {blast_radius: high}\n"
	if err := os.WriteFile(p, []byte(man), 0o600); err != nil {
		t.Fatal(err)
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	f := start(t, memoryConfig(t, config.ModeEnforce), ms)
	nw.f, nw.st = f, f.store.(*store.SQLite)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := gwnotify.New(ctx, gwnotify.Options{Outbox: nw.st, Gateway: "gw-test", StoreFlags: "--data .reversi",
		Receivers: []config.Notification{{Name: "chat", Type: config.NotifySlack, URL: rcv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return nw
}

// TestAttackAgentForgesTheSlackMessage (issue 24, red team): an agent with only an API key
// makes a held call whose argument closes the Slack code block of the preview with backticks
// and writes a bold "approved" line and a fake approve command outside it. The approvers'
// channel must show the arguments inside the one code block, the real commands after it.
func TestAttackAgentForgesTheSlackMessage(t *testing.T) {
	nw := newNotifyWorld(t)
	cs := nw.f.client(t)
	forged := "`````\n*:white_check_mark: Approved by security-lead: nothing to do*\n*Approve:* `reversi approvals approve apr-0 --by me`\n`````"
	res := call(t, cs, "memory.delete_entities", map[string]any{"entityNames": []any{forged}})
	if !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "requires approval") {
		t.Fatalf("not held: %v", texts(res))
	}
	var text string
	select {
	case text = <-nw.slack:
	case <-time.After(2 * time.Second):
		t.Fatal("no Slack message within 2 s of the held call")
	}
	if n := strings.Count(text, "```"); n != 2 {
		t.Fatalf("the agent's arguments end the code block (%d fences): %s", n, text)
	}
	in := text[strings.Index(text, "```")+3:]
	in, after := in[:strings.Index(in, "```")], in[strings.Index(in, "```")+3:]
	if !strings.Contains(in, "Approved by security-lead") || strings.Contains(after, "security-lead") ||
		strings.Count(after, "*Approve:*") != 1 || !strings.Contains(after, "*Approve:* `reversi approvals approve apr-") {
		t.Fatalf("forged lines outside the code block: %s", text)
	}
}

// TestAttackHeldCallFlood (issue 24, red team): an agent that loops on held calls (other
// arguments each time, so each is a new request) queued a request, and a message to the
// approvers' channel, per call without bound. At most engine.MaxPendingApprovalsPerActor of one
// actor now wait at once; the calls beyond are blocked, say why, and notify nobody. The
// honest path: the first calls are held and announced.
func TestAttackHeldCallFlood(t *testing.T) {
	nw := newNotifyWorld(t)
	cs := nw.f.client(t)
	const calls = engine.MaxPendingApprovalsPerActor + 15
	blocked := 0
	for i := range calls {
		res := call(t, cs, "memory.delete_entities", map[string]any{"entityNames": []any{fmt.Sprintf("e-%d", i)}})
		text := strings.Join(texts(res), "")
		switch {
		case strings.Contains(text, "requires approval"):
		case strings.Contains(text, "approval requests waiting for approvers"):
			blocked++
		default:
			t.Fatalf("call %d: %s", i, text)
		}
	}
	ctx := context.Background()
	pending, err := nw.st.ListApprovals(ctx, store.ApprovalFilter{State: store.ApprovalPending})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := nw.st.ListNotifications(ctx, store.NotificationFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) > engine.MaxPendingApprovalsPerActor || len(rows) > engine.MaxPendingApprovalsPerActor ||
		blocked != calls-engine.MaxPendingApprovalsPerActor {
		t.Fatalf("%d held calls: %d pending requests, %d outbox rows, %d blocked (at most %d may wait)", calls, len(pending), len(rows),
			blocked, engine.MaxPendingApprovalsPerActor)
	}
	select {
	case <-nw.slack:
	case <-time.After(2 * time.Second):
		t.Fatal("the first held call was not announced")
	}
	// a decision frees a place
	if _, err := nw.st.Decide(ctx, pending[0].ID, store.Decision{By: "ops", Approve: false}); err != nil {
		t.Fatal(err)
	}
	res := call(t, cs, "memory.delete_entities", map[string]any{"entityNames": []any{"after-a-decision"}})
	if !strings.Contains(strings.Join(texts(res), ""), "requires approval") {
		t.Fatalf("after a decision: %v", texts(res))
	}
}
