package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/pkg/webhook"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/notify"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// hookReceiver is an HTTP receiver on 127.0.0.1 answering code (0: 200) to every request.
type hookReceiver struct {
	*httptest.Server
	mu   sync.Mutex
	got  []http.Header
	body [][]byte
	ch   chan int
	code atomic.Int32 // the answer's status (0: 200)
}

func newHookReceiver(t *testing.T, code int) *hookReceiver {
	t.Helper()
	h := &hookReceiver{ch: make(chan int, 64)}
	h.code.Store(int32(code))
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.got, h.body = append(h.got, r.Header.Clone()), append(h.body, b)
		n := len(h.got)
		h.mu.Unlock()
		if c := h.code.Load(); c != 0 {
			w.WriteHeader(int(c))
		}
		h.ch <- n
	}))
	t.Cleanup(h.Close)
	return h
}

// wait waits (bounded) for request n (1-based) and returns its headers and body.
func (h *hookReceiver) wait(t *testing.T, n int, within time.Duration) (http.Header, []byte) {
	t.Helper()
	deadline := time.After(within)
	for {
		h.mu.Lock()
		if len(h.got) >= n {
			defer h.mu.Unlock()
			return h.got[n-1], h.body[n-1]
		}
		h.mu.Unlock()
		select {
		case <-h.ch:
		case <-deadline:
			t.Fatalf("request %d never came to %s within %s", n, h.URL, within)
		}
	}
}

// TestGatewayCommandNotifies runs `reversi gateway` with a receiver from each source
// (notifications: in gateway.yaml, in reversi.config.yaml, and $REVERSI_APPROVAL_WEBHOOK): a
// held call reaches all three within a second, signed where a secret is set, with the
// redacted preview (the redacted argument's value is in no body); `reversi approvals approve`
// in another store instance is announced as approval.approved; `reversi notifications list`
// shows what was delivered.
func TestGatewayCommandNotifies(t *testing.T) {
	dir := t.TempDir()
	hook, env, slack := newHookReceiver(t, 0), newHookReceiver(t, 0), newHookReceiver(t, 0)
	t.Setenv("HOOK_URL", hook.URL)
	t.Setenv("HOOK_SECRET", "gw-secret")
	t.Setenv(config.ApprovalWebhookEnv, env.URL)
	t.Setenv(config.ApprovalWebhookSecretEnv, "env-secret")
	t.Setenv("REVERSI_CONFIG", filepath.Join(dir, "reversi.config.yaml"))
	node, args, _ := upstreams.Memory(t)
	cfg := "mode: enforce\nactor: ci-bot\nupstreams:\n  - name: mem\n    command: " + node +
		"\n    args: [" + args[0] + "]\n    env: { MEMORY_FILE_PATH: " + filepath.Join(dir, "graph.jsonl") + " }\n" +
		"notifications:\n  - type: webhook\n    url: ${HOOK_URL}\n    secret: ${HOOK_SECRET}\n"
	man := "- tool: mem.delete_entities\n  description: Delete.\n  effect: irreversible\n  permission: mem:write\n" +
		"  risk: {blast_radius: high}\n  audit: {redaction: [$args.entityNames]}\n"
	for name, body := range map[string]string{"gateway.yaml": cfg, "m.yaml": man,
		"reversi.config.yaml": "notifications:\n  - {type: slack, url: '" + slack.URL + "', risk: [high]}\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		root := NewRoot()
		root.SetArgs([]string{"gateway", "--config", filepath.Join(dir, "gateway.yaml"), "--manifests", filepath.Join(dir, "m.yaml"),
			"--store", "sqlite", "--data", data, "--run-id", "run-cli"})
		root.SetIn(inR)
		root.SetOut(outW)
		root.SetErr(&stderr)
		err := root.Execute()
		_ = outW.Close()
		done <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "cli-test", Version: "1"}, nil).Connect(ctx,
		&mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	const secretName = "patient-7731-hiv-clinic"
	start := time.Now()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "mem.delete_entities", Arguments: map[string]any{"entityNames": []any{secretName}}})
	if err != nil || !res.IsError {
		t.Fatalf("delete_entities (held): %v %+v", err, res)
	}
	id := regexp.MustCompile(`apr-[0-9a-f]+`).FindString(res.Content[0].(*mcp.TextContent).Text)
	for _, c := range []struct {
		r      *hookReceiver
		secret string
	}{{hook, "gw-secret"}, {env, "env-secret"}, {slack, ""}} {
		h, body := c.r.wait(t, 1, time.Second)
		if time.Since(start) > 1500*time.Millisecond { // the call's own answer included
			t.Errorf("%s: delivered %s after the call", c.r.URL, time.Since(start))
		}
		if strings.Contains(string(body), secretName) || !strings.Contains(string(body), "[redacted]") || !strings.Contains(string(body), id) {
			t.Errorf("%s: body %s", c.r.URL, body)
		}
		if c.secret != "" && !webhook.Verify(c.secret, body, h.Get(notify.HeaderSignature)) {
			t.Errorf("%s: signature %q", c.r.URL, h.Get(notify.HeaderSignature))
		}
	}
	if _, body := slack.wait(t, 1, 0); !strings.Contains(string(body), "reversi approvals approve "+id+" --data "+data+" --by") {
		t.Errorf("slack text lacks the approve command: %s", body)
	}

	// Decided from the CLI (another store instance): the gateway's poll finds the row.
	if out, errOut, code := reversiInProcess("approvals", "approve", id, "--data", data, "--by", "bob"); code != 0 {
		t.Fatalf("approve: %d %s %s", code, out, errOut)
	}
	if h, body := hook.wait(t, 2, 2*time.Second); h.Get(notify.HeaderEvent) != "approval.approved" || !webhook.Verify("gw-secret", body, h.Get(notify.HeaderSignature)) {
		t.Fatalf("second delivery %v %s", h, body)
	}
	env.wait(t, 2, 2*time.Second)
	slack.wait(t, 2, 2*time.Second) // the slack receiver's risk filter admits high

	_ = cs.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gateway: %v\n%s", err, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("the gateway did not stop when its stdin closed")
	}
	out, errOut, code := reversiInProcess("notifications", "list", "--data", data, "--json")
	if code != 0 {
		t.Fatalf("list: %d %s", code, errOut)
	}
	var l []struct {
		State, Receiver string
		Notice          store.Notice
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(l) != 6 {
		t.Fatalf("%d notifications, want 2 events x 3 receivers: %s", len(l), out)
	}
	for _, n := range l {
		if n.State != "delivered" || n.Notice.Approval != id {
			t.Errorf("notification %+v", n)
		}
	}
}

// TestNotificationsListDead: a receiver that always fails dead-letters the notification after
// the last attempt; `reversi notifications list --state dead` lists it with its error, and
// --state pending no longer does. Once the receiver is fixed, `reversi notifications retry
// --all` makes it pending again and the running gateway delivers it, with the same key.
func TestNotificationsListDead(t *testing.T) {
	data := t.TempDir()
	rcv := newHookReceiver(t, http.StatusBadGateway)
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := notify.New(context.Background(), notify.Options{Outbox: st, MaxAttempts: 2, Backoff: 10 * time.Millisecond, Poll: 20 * time.Millisecond,
		Receivers: []config.Notification{{Name: "ops-hook", Type: config.NotifyWebhook, URL: rcv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = w.Run(ctx) }()
	if _, err := st.CreateRun(ctx, store.Run{ID: "run-1", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	a, err := st.CreateApproval(ctx, store.ApprovalRequest{Tool: "mem.delete_entities", Run: "run-1", Actor: "alice", Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	rcv.wait(t, 2, 2*time.Second)
	deadline := time.Now().Add(2 * time.Second)
	for {
		l, err := st.ListNotifications(ctx, store.NotificationFilter{State: store.NotificationDead})
		if err != nil {
			t.Fatal(err)
		}
		if len(l) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not dead after 2 s: %+v", l)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-stopped
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := reversiInProcess("notifications", "list", "--state", "dead", "--data", data)
	if code != 0 {
		t.Fatalf("list: %d %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID ") {
		t.Fatalf("output:\n%s", out)
	}
	for _, want := range []string{" dead ", "approval.requested", a.ID, "mem.delete_entities", "ops-hook", " 2 ", "HTTP 502"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("dead row lacks %q:\n%s", want, out)
		}
	}
	if out, errOut, code := reversiInProcess("notifications", "list", "--state", "pending", "--data", data); code != 0 || out != "" ||
		!strings.Contains(errOut, "No pending notifications in ") {
		t.Fatalf("pending: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := reversiInProcess("notifications", "list", "--state", "lost", "--data", data); code == 0 || !strings.Contains(errOut, `--state "lost"`) {
		t.Fatalf("bad state: %d %s", code, errOut)
	}

	// The receiver is fixed; a gateway runs on the store again; the dead letter is retried.
	for _, bad := range [][]string{{}, {"--all", "ntf-x"}, {"ntf-x", "--receiver", "ops-hook"}} {
		if _, errOut, code := reversiInProcess(append([]string{"notifications", "retry", "--data", data}, bad...)...); code == 0 {
			t.Errorf("retry %v: accepted (%s)", bad, errOut)
		}
	}
	rcv.code.Store(http.StatusNoContent)
	st, err = store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w, err = notify.New(context.Background(), notify.Options{Outbox: st, Poll: 20 * time.Millisecond,
		Receivers: []config.Notification{{Name: "ops-hook", Type: config.NotifyWebhook, URL: rcv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	stopped = make(chan struct{})
	go func() { defer close(stopped); _ = w.Run(ctx) }()
	defer func() { cancel(); <-stopped }()
	if out, errOut, code := reversiInProcess("notifications", "retry", "--all", "--receiver", "ops-hook", "--data", data); code != 0 ||
		!strings.Contains(out, "1 dead letter(s) pending again") {
		t.Fatalf("retry --all: %d %q %q", code, out, errOut)
	}
	first, _ := rcv.wait(t, 1, time.Second)
	if h, _ := rcv.wait(t, 3, 2*time.Second); h.Get(notify.HeaderIdempotency) != first.Get(notify.HeaderIdempotency) {
		t.Fatalf("the retried delivery's key %q, want %q", h.Get(notify.HeaderIdempotency), first.Get(notify.HeaderIdempotency))
	}
	deadline = time.Now().Add(2 * time.Second)
	for {
		l, err := st.ListNotifications(ctx, store.NotificationFilter{State: store.NotificationDelivered})
		if err != nil {
			t.Fatal(err)
		}
		if len(l) == 1 && l[0].Notice.Approval == a.ID && l[0].Attempts == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered after the retry: %+v", l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
