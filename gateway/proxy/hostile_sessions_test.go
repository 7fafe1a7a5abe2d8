package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// openSession POSTs an initialize without a session and returns the status, the session id
// and the body.
func (h *hostile) openSession(t *testing.T, key string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest("POST", h.base+PathAgent, strings.NewReader(initBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get("Mcp-Session-Id"), string(b)
}

func (h *hostile) openSessions() int {
	n := 0
	for range h.gw.Server().Sessions() {
		n++
	}
	return n
}

// TestHostileManySessions: a client that opens sessions and never closes them (each one an
// initialize POST, 3,400 a second on this machine) is held to limits.sessions_per_principal
// (429) and the gateway to limits.sessions (503); a closed session frees its place. With the
// defaults, one principal stops at 128.
func TestHostileManySessions(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		h := startHostile(t, false, nil)
		want := config.DefaultLimits().SessionsPerPrincipal
		start := time.Now()
		opened := 0
		for i := 0; i < 4*want && time.Since(start) < 30*time.Second; i++ {
			code, _, body := h.openSession(t, "")
			if code != http.StatusOK {
				if code != http.StatusTooManyRequests || !strings.Contains(body, "limits.sessions_per_principal is 128") {
					t.Fatalf("refusal: %d %s", code, body)
				}
				break
			}
			opened++
		}
		if opened != want || h.openSessions() != want {
			t.Fatalf("one principal opened %d sessions (%d open), want %d", opened, h.openSessions(), want)
		}
		if got := limitHits(h.gw, "sessions_per_principal"); got != 1 {
			t.Errorf("limit_hits{sessions_per_principal} = %v, want 1", got)
		}
	})
	t.Run("bounds", func(t *testing.T) {
		h := startHostile(t, true, func(c *config.Gateway) { c.Limits.SessionsPerPrincipal, c.Limits.Sessions = 4, 6 })
		var ci []string
		for range 4 {
			code, sid, body := h.openSession(t, h.key("ci-bot"))
			if code != http.StatusOK || sid == "" {
				t.Fatalf("ci-bot's session: %d %s", code, body)
			}
			ci = append(ci, sid)
		}
		code, _, body := h.openSession(t, h.key("ci-bot"))
		if code != http.StatusTooManyRequests {
			t.Fatalf("ci-bot's fifth session: %d %s", code, body)
		}
		if _, _, msg := rpcError(t, []byte(body)); !strings.Contains(msg, "ci-bot already has 4 MCP sessions open (limits.sessions_per_principal is 4)") {
			t.Errorf("refusal: %q", msg)
		}
		for range 2 {
			if code, _, body := h.openSession(t, h.key("other-bot")); code != http.StatusOK {
				t.Fatalf("other-bot's session: %d %s", code, body)
			}
		}
		code, _, body = h.openSession(t, h.key("other-bot"))
		if _, _, msg := rpcError(t, []byte(body)); code != http.StatusServiceUnavailable || !strings.Contains(msg, "limits.sessions is 6") {
			t.Fatalf("the seventh session: %d %q", code, msg)
		}
		if n := h.openSessions(); n != 6 {
			t.Errorf("%d sessions open, want 6", n)
		}
		if code := h.deleteSession(t, ci[0], h.key("ci-bot")); code != http.StatusNoContent {
			t.Fatalf("DELETE: %d", code)
		}
		if code, _, body := h.openSession(t, h.key("ci-bot")); code != http.StatusOK {
			t.Fatalf("a session after one closed: %d %s", code, body)
		}
		// An initialize that fails leaves no session behind, nor a place taken.
		for range 3 {
			res := post(t, h.base+PathAgent, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "Authorization", "Bearer "+h.key("ci-bot"))
			_ = readBody(t, res)
		}
		if code := h.deleteSession(t, ci[1], h.key("ci-bot")); code != http.StatusNoContent {
			t.Fatalf("DELETE: %d", code)
		}
		if code, _, body := h.openSession(t, h.key("ci-bot")); code != http.StatusOK {
			t.Fatalf("a session after failed initializes: %d %s", code, body)
		}
		for _, sid := range ci[2:] {
			_ = h.deleteSession(t, sid, h.key("ci-bot"))
		}
		h.stillServes(t)
	})
}
