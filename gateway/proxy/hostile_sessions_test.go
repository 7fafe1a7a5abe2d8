package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
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

// TestHostileHeaderFlood: headers are read before authentication. 100 unauthenticated
// connections that send a megabyte of headers each and never end them made net/http hold
// about 2.7 MiB apiece (its default MaxHeaderBytes is 1 MiB; 1,024 connections, the default
// limits.connections, about 2.7 GiB); within limits.header_bytes (32 KiB) they are answered
// 431 and closed, and a request with 16 KiB of headers (a large token) is still served.
func TestHostileHeaderFlood(t *testing.T) {
	h := startHostile(t, true, nil)
	const conns = 100
	w := watchHeap(nil)
	var wg sync.WaitGroup
	refused := make(chan bool, conns)
	var line strings.Builder
	for j := 0; line.Len() < 1<<20; j++ {
		fmt.Fprintf(&line, "X-Flood-%d: %s\r\n", j, strings.Repeat("v", 100))
	}
	flood := []byte(line.String())
	for range conns {
		wg.Go(func() {
			c := h.rawConn(t)
			fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\n", h.host)
			_, _ = c.Write(flood) // the gateway may close before the end: that is the point
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			status, _ := bufio.NewReader(c).ReadString('\n')
			refused <- strings.HasPrefix(status, "HTTP/1.1 431")
		})
	}
	wg.Wait()
	close(refused)
	growth := w.Stop()
	n := 0
	for r := range refused {
		if r {
			n++
		}
	}
	t.Logf("%d connections with 1 MiB of headers: heap peak +%s, %d answered 431", conns, mibs(growth), n)
	if growth > 64<<20 {
		t.Errorf("the heap grew by %s for %d unauthenticated header floods, over 64 MiB", mibs(growth), conns)
	}
	if n != conns {
		t.Errorf("%d of %d header floods were answered 431", n, conns)
	}
	if got := limitHits(h.gw, "header_bytes"); got < conns {
		t.Errorf("limit_hits{header_bytes} = %v, want %d", got, conns)
	}
	res := post(t, h.base+PathAgent, initBody, "Authorization", "Bearer "+h.key("ci-bot"), "X-Large", strings.Repeat("t", 16<<10))
	if body := readBody(t, res); res.StatusCode != http.StatusOK {
		t.Errorf("initialize with 16 KiB of headers: %d %s", res.StatusCode, body)
	}
	h.stillServes(t)
}

// TestHostileAnnouncedBodies: a body is held as it arrives, not as announced. 100 requests
// that announce 4 MiB (request_body_bytes) and send nothing made the gateway allocate 4 MiB
// each at once (400 MiB for 100 connections; 4 GiB for the default 1,024), held for the read
// timeout, at the cost of a request head each.
func TestHostileAnnouncedBodies(t *testing.T) {
	h := startHostile(t, true, nil)
	const conns = 100
	w := watchHeap(nil)
	for range conns {
		c := h.rawConn(t) // closed when the test ends
		head := h.postHead("Authorization: Bearer "+h.key("ci-bot"), fmt.Sprintf("Content-Length: %d", 4<<20))
		if _, err := io.WriteString(c, head+"{"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	growth := w.Stop()
	t.Logf("%d requests announcing 4 MiB and sending 1 byte: heap peak +%s", conns, mibs(growth))
	if growth > 64<<20 {
		t.Errorf("the heap grew by %s for %d announced bodies, over 64 MiB", mibs(growth), conns)
	}
	h.stillServes(t)
}
