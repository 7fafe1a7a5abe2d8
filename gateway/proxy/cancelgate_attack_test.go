package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRelayAttackForeignCancel (issue 19): the cancel gate drops the response of a call only for
// a cancel from the call's own session with the call's own credential. Another principal
// cancelling the same request id, in its own session or naming the victim's, leaves the call
// alone: its result still reaches its agent. The victim's own cancel (the honest path) is in
// test/e2e/gateway TestRelayTSClient.
func TestRelayAttackForeignCancel(t *testing.T) {
	h := startHostile(t, true, nil)
	victim, attacker := h.key("ci-bot"), h.key("other-bot")
	sidA := h.initSession(t, victim, "2025-06-18")
	sidB := h.initSession(t, attacker, "2025-06-18")
	c := h.rawConn(t)
	body := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"everything.trigger-long-running-operation","arguments":{"duration":2,"steps":1}}}`
	if _, err := io.WriteString(c, h.postHead("Authorization: Bearer "+victim, "Mcp-Session-Id: "+sidA, "Mcp-Protocol-Version: 2025-06-18",
		"Content-Length: "+strconv.Itoa(len(body)))+body); err != nil {
		t.Fatal(err)
	}
	waitInflight(t, h.gw, "ci-bot", 1)
	cancel := `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"not yours"}}`
	for _, sid := range []string{sidB, sidA} {
		res := post(t, h.base+PathAgent, cancel, "Authorization", "Bearer "+attacker, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18")
		_ = readBody(t, res)
	}
	// The victim's call completes and its result arrives on its stream.
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	br := bufio.NewReader(c)
	var got strings.Builder
	for !strings.Contains(got.String(), `"id":5`) {
		line, err := br.ReadString('\n')
		got.WriteString(line)
		if err != nil {
			t.Fatalf("the victim's call got no response after another principal's cancels (%v):\n%s", err, got.String())
		}
	}
	_ = c.Close()
	if !strings.Contains(got.String(), "Long running operation completed") {
		t.Errorf("the victim's call was cancelled by another principal's notifications/cancelled:\n%s", got.String())
	}
	// server-everything asked the victim (which declared no capability) for its roots during the
	// call: refused at once and journaled, instead of held until call_timeout, which kept the
	// session from closing (the DELETEs below would time out).
	if !strings.Contains(gatewayOrRunNotes(t, h.store), "the agent did not declare the roots capability, so it is not asked roots/list") {
		t.Errorf("the roots/list to an agent without roots is not journaled as refused: %q", gatewayOrRunNotes(t, h.store))
	}
	for sid, key := range map[string]string{sidA: victim, sidB: attacker} {
		h.deleteSession(t, sid, key)
	}
}

// hookedWriter runs onHeader as the status is written and logs what reaches the client.
type hookedWriter struct {
	http.ResponseWriter
	onHeader func()
	log      func(string)
}

func (w *hookedWriter) WriteHeader(code int) {
	w.onHeader()
	w.ResponseWriter.WriteHeader(code)
}

func (w *hookedWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.log("body")
	return n, err
}

// TestCancelRacingAWholeReply: the fast path's JSON reply announces its Content-Length, so a
// cancel (the agent's notifications/cancelled on another POST) landing between the header and
// the body must not drop the body, which would leave a 200 promising bytes that never come; the
// cancel waits for the reply instead. A cancel before the reply still means no reply.
func TestCancelRacingAWholeReply(t *testing.T) {
	body := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[]}}` + "\n")
	var mu sync.Mutex
	var events []string
	logEvent := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var gate *cancelGate
		hw := &hookedWriter{ResponseWriter: w, log: logEvent, onHeader: func() {
			done := make(chan struct{})
			go func() { gate.drop(); logEvent("dropped"); close(done) }()
			select { // a drop that did not wait for the body returns at once
			case <-done:
			case <-time.After(100 * time.Millisecond):
			}
		}}
		gate = &cancelGate{deadlineWriter: &deadlineWriter{ResponseWriter: hw, rc: http.NewResponseController(w), timeout: 5 * time.Second}}
		if !gate.writeWhole(body) {
			t.Error("the reply was refused before any cancel")
		}
	}))
	defer srv.Close()
	res, err := http.Post(srv.URL, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil || !bytes.Equal(got, body) || res.ContentLength != int64(len(body)) {
		t.Fatalf("the reply: %q, Content-Length %d, %v", got, res.ContentLength, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(events)
		mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(events, ",") != "body,dropped" {
		t.Errorf("events %v: the cancel must wait for the body its header announced", events)
	}

	// Dropped first: nothing is written, and the caller answers with an empty stream.
	rec := httptest.NewRecorder()
	gate := &cancelGate{deadlineWriter: &deadlineWriter{ResponseWriter: rec, rc: http.NewResponseController(rec), timeout: 5 * time.Second}}
	gate.drop()
	if gate.writeWhole(body) || rec.Body.Len() > 0 || rec.Header().Get("Content-Length") != "" {
		t.Errorf("a dropped gate wrote %q (Content-Length %q)", rec.Body.String(), rec.Header().Get("Content-Length"))
	}
}
