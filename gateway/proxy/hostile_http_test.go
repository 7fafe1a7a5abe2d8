package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// HTTP limits of the hostile client suite (hostile_client_test.go).

// rss is this process's resident set size in bytes (VmRSS).
func rss(t testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// peakRSS samples rss every 5 ms until stop, which returns the highest sample.
func peakRSS(t testing.TB) (stop func() int64) {
	done, out := make(chan struct{}), make(chan int64)
	go func() {
		peak := rss(t)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				out <- max(peak, rss(t))
				return
			case <-tick.C:
				peak = max(peak, rss(t))
			}
		}
	}()
	return func() int64 { close(done); return <-out }
}

// idleRSS is rss after a collection that returns freed memory to the system.
func idleRSS(t testing.TB) int64 {
	runtime.GC()
	debug.FreeOSMemory()
	return rss(t)
}

const mib = 1 << 20

// TestHostileSlowBodies: eight connections that send a request head and then trickle their
// body are answered 408 and closed within limits.read_timeout (1 s here), all at once.
func TestHostileSlowBodies(t *testing.T) {
	h := startHostile(t, false, func(c *config.Gateway) { c.Limits.ReadTimeout = time.Second })
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for range n {
		wg.Go(func() {
			c := h.rawConn(t)
			start := time.Now()
			if _, err := io.WriteString(c, h.postHead("Content-Length: 1000")+`{"jsonrpc":"2.0",`); err != nil {
				errs <- err.Error()
				return
			}
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				errs <- "no answer: " + err.Error()
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_, err = c.Read(make([]byte, 1)) // the gateway closes the connection
			if took := time.Since(start); res.StatusCode != http.StatusRequestTimeout || err != io.EOF || took > 3*time.Second {
				errs <- fmt.Sprintf("%s, then %v, after %s; want 408 and the connection closed within about 1 s", res.Status, err, took)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if got := limitHits(h.gw, "read_timeout"); got != n {
		t.Errorf("limit_hits{read_timeout} = %v, want %d", got, n)
	}
	h.stillServes(t)
}

// TestHostileUnauthenticatedSlowBody: on an authenticating gateway, a request without a
// credential that announces 100,000 bytes and sends 20 gets its 401 at once (within 3 s, for a
// loaded machine) and its connection closed; the gateway does not wait for the body
// (limits.read_timeout is 30 s here).
func TestHostileUnauthenticatedSlowBody(t *testing.T) {
	h := startHostile(t, true, nil)
	c := h.rawConn(t)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := io.WriteString(c, h.postHead("Content-Length: 100000")+`{"jsonrpc":"2.0","id":`); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within 5 s: %v", err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	took := time.Since(start)
	if res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" || took > 3*time.Second {
		t.Fatalf("%s %q after %s; want 401 with WWW-Authenticate at once", res.Status, res.Header.Get("WWW-Authenticate"), took)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the connection stays open after the 401: %v", err)
	}
	h.stillServes(t)
}

// TestHostileOversizedBody: a body beyond limits.request_body_bytes (64 KiB here) is a 413 with
// a JSON-RPC error, whether it announces its length or is chunked, and is not read to its end;
// a body within the limit is served.
func TestHostileOversizedBody(t *testing.T) {
	const limit = 64 << 10
	h := startHostile(t, false, func(c *config.Gateway) { c.Limits.RequestBodyBytes = limit })
	sid := h.initSession(t, "", "2025-06-18")
	msg := func(pad int) string {
		return `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"memory.read_graph","arguments":{},"_meta":{"pad":"` + strings.Repeat("x", pad) + `"}}}`
	}
	big := msg(mib)
	for _, chunked := range []bool{false, true} {
		c := h.rawConn(t)
		head := h.postHead("Mcp-Session-Id: "+sid, "Mcp-Protocol-Version: 2025-06-18", "Content-Length: "+strconv.Itoa(len(big)))
		if chunked {
			head = h.postHead("Mcp-Session-Id: "+sid, "Mcp-Protocol-Version: 2025-06-18", "Transfer-Encoding: chunked")
		}
		go func() { // the gateway answers before the body is sent; the write may then fail
			if _, err := io.WriteString(c, head); err != nil {
				return
			}
			for i := 0; i < len(big); i += 32 << 10 {
				part := big[i:min(i+32<<10, len(big))]
				if chunked {
					part = fmt.Sprintf("%x\r\n%s\r\n", len(part), part)
				}
				if _, err := io.WriteString(c, part); err != nil {
					return
				}
			}
			if chunked {
				_, _ = io.WriteString(c, "0\r\n\r\n")
			}
		}()
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("chunked %v: %v", chunked, err)
		}
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusRequestEntityTooLarge || res.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("chunked %v: %s %q", chunked, res.Status, body)
		}
		if id, code, m := rpcError(t, body); id != nil || code != -32600 || !strings.Contains(m, "limits.request_body_bytes (65536 bytes)") {
			t.Errorf("chunked %v: id %v code %d %q", chunked, id, code, m)
		}
	}
	if got := limitHits(h.gw, "request_body_bytes"); got != 2 {
		t.Errorf("limit_hits{request_body_bytes} = %v, want 2", got)
	}
	res := post(t, h.base+PathAgent, msg(limit/2), "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18")
	if body := readBody(t, res); res.StatusCode != 200 || !strings.Contains(body, `"result"`) {
		t.Errorf("a body within the limit: %d %s", res.StatusCode, body)
	}
	h.stillServes(t)
}

// pingBatch is a JSON-RPC batch of ping requests of about size bytes.
func pingBatch(size int) []byte {
	var b bytes.Buffer
	b.WriteByte('[')
	for i := 0; b.Len() < size-64; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"ping"}`, i+10)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// BatchRSSBound is what four 4 MiB batches at once may add to the gateway's resident memory
// (the test process's: gateway and clients). Before issue 18 the SDK decoded each batch
// whole: one cost about 410 MB, four 2.0 GB.
const BatchRSSBound = 200 * mib

// TestHostileBatches: in a session of protocol 2025-03-26 (which still has batches, so the SDK
// would take them), four batches of 4 MiB of pings at once are refused before they are decoded
// (limits.batch_size 0, the default) and the process's RSS stays within BatchRSSBound of
// idle; with batch_size 2 a batch of 2 is served and one of 3 refused.
func TestHostileBatches(t *testing.T) {
	h := startHostile(t, false, nil)
	sid := h.initSession(t, "", "2025-03-26")
	batch := pingBatch(4*mib - 1024)
	send := func(body []byte) (int, []byte) {
		req, err := http.NewRequest("POST", h.base+PathAgent, bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0, nil
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, nil
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	idle := idleRSS(t)
	stop := peakRSS(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			code, body := send(batch)
			if code != http.StatusBadRequest {
				t.Errorf("a 4 MiB batch: %d %.200s", code, body)
				return
			}
			if _, c, m := rpcError(t, body); c != -32600 || !strings.Contains(m, "limits.batch_size is 0") {
				t.Errorf("a 4 MiB batch: %d %q", c, m)
			}
		})
	}
	wg.Wait()
	peak := stop()
	t.Logf("RSS idle %d MiB, peak %d MiB with four 4 MiB batches at once (bound: +%d MiB)", idle/mib, peak/mib, BatchRSSBound/mib)
	if peak-idle > BatchRSSBound {
		t.Errorf("RSS grew by %d MiB, more than %d MiB", (peak-idle)/mib, BatchRSSBound/mib)
	}
	if got := limitHits(h.gw, "batch_size"); got != 4 {
		t.Errorf("limit_hits{batch_size} = %v, want 4", got)
	}
	h.stillServes(t)

	t.Run("batch_size 2", func(t *testing.T) {
		h := startHostile(t, false, func(c *config.Gateway) { c.Limits.BatchSize = 2 })
		sid = h.initSession(t, "", "2025-03-26")
		two := `[{"jsonrpc":"2.0","id":21,"method":"ping"},{"jsonrpc":"2.0","id":22,"method":"ping"}]`
		res := post(t, h.base+PathAgent, two, "Mcp-Session-Id", sid)
		if body := readBody(t, res); res.StatusCode != 200 || !strings.Contains(body, `"id":21`) || !strings.Contains(body, `"id":22`) {
			t.Errorf("a batch of 2: %d %s", res.StatusCode, body)
		}
		three := strings.TrimSuffix(two, "]") + `,{"jsonrpc":"2.0","id":23,"method":"ping"}]`
		res = post(t, h.base+PathAgent, three, "Mcp-Session-Id", sid)
		body := readBody(t, res)
		if _, c, m := rpcError(t, []byte(body)); res.StatusCode != 400 || c != -32600 || !strings.Contains(m, "more than 2 messages (limits.batch_size)") {
			t.Errorf("a batch of 3: %d %s", res.StatusCode, body)
		}
		h.stillServes(t)
	})
}

// TestHostileHosts: behind a reverse proxy (a loopback listener, allowed_hosts naming the
// public name) a request for that Host with a valid key is served and a loopback name is not;
// on a plain loopback gateway LOCALHOST and localhost. are localhost.
func TestHostileHosts(t *testing.T) {
	t.Run("reverse proxy", func(t *testing.T) {
		h := startHostile(t, true, func(c *config.Gateway) { c.AllowedHosts = []string{"gateway.example.com"} })
		for host, want := range map[string]int{"gateway.example.com": 200, "GATEWAY.example.com.": 200, "localhost": 403, h.host: 403} {
			res := post(t, h.base+PathAgent, initBody, "Authorization", "Bearer "+h.key("ci-bot"), "Host", host)
			if body := readBody(t, res); res.StatusCode != want {
				t.Errorf("Host %s: %d, want %d: %s", host, res.StatusCode, want, body)
			}
		}
		// A whole session through the proxy's Host.
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "behind-proxy", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: h.base + PathAgent, DisableStandaloneSSE: true,
				HTTPClient: &http.Client{Transport: hostRT{host: "gateway.example.com", key: h.key("ci-bot")}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if r := call(t, cs, "memory.read_graph", map[string]any{}); r.IsError {
			t.Errorf("a call behind the proxy: %v", texts(r))
		}
		integrityOK(t, h.data)
	})
	t.Run("loopback names", func(t *testing.T) {
		h := startHostile(t, false, nil)
		port := h.host[strings.LastIndex(h.host, ":")+1:]
		for host, want := range map[string]int{"LOCALHOST:" + port: 200, "localhost.:" + port: 200, "LocalHost.": 200,
			"evil.example:" + port: 403, "localhost.evil.example": 403} {
			res := post(t, h.base+PathAgent, initBody, "Host", host)
			if body := readBody(t, res); res.StatusCode != want {
				t.Errorf("Host %s: %d, want %d: %s", host, res.StatusCode, want, body)
			}
		}
		h.stillServes(t)
	})
}

// hostRT sends every request with Host host and the bearer key.
type hostRT struct{ host, key string }

func (h hostRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	r.Header.Set("Authorization", "Bearer "+h.key)
	return http.DefaultTransport.RoundTrip(r)
}

// TestHostileConnections: with limits.connections 3, three connections busy in a handler (a
// POST whose body is still coming: the handler is reading it) take every slot: a fourth client
// is not served until one of them ends, then it is; reaching the bound is counted.
func TestHostileConnections(t *testing.T) {
	h := startHostile(t, false, func(c *config.Gateway) { c.Limits.Connections = 3 })
	http.DefaultClient.CloseIdleConnections()
	var held []net.Conn
	for range 3 {
		c := h.rawConn(t)
		if _, err := io.WriteString(c, h.postHead("Content-Length: 1000")+`{"jsonrpc":"2.0",`); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	get := func(timeout time.Duration) error {
		c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
		res, err := c.Get(h.base + "/healthz")
		if err == nil {
			_ = res.Body.Close()
		}
		return err
	}
	if err := get(2 * time.Second); err == nil {
		t.Fatal("a fourth connection was served while three held every slot")
	}
	_ = held[0].Close()
	if err := get(5 * time.Second); err != nil {
		t.Fatalf("not served once a slot was free: %v", err)
	}
	if got := limitHits(h.gw, "connections"); got < 1 {
		t.Errorf("limit_hits{connections} = %v, want at least 1", got)
	}
	for _, c := range held[1:] {
		_ = c.Close()
	}
	h.stillServes(t)
}

// TestHostileConnectionHogs: the connection bound is no lockout. Without a credential, eight
// connections (limits.connections) that each made a GET /healthz and then stayed idle, or that
// send their headers a byte every 200 ms, held every slot for idle_timeout (120 s) or as long
// as they trickled, and no one else was served. A connection that does nothing for anyone now
// gives its slot up to a new one when all are taken: the newcomers are served at once.
func TestHostileConnectionHogs(t *testing.T) {
	const slots = 8
	h := startHostile(t, true, func(c *config.Gateway) { c.Limits.Connections = slots })
	http.DefaultClient.CloseIdleConnections()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for i := range slots {
		c := h.rawConn(t)
		if i%2 == 0 { // one request, then idle
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", h.host)
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = res.Body.Close()
			continue
		}
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\nX-Slow: ", h.host)
		wg.Go(func() { // a header a byte every 200 ms, for at most 15 s
			for range 75 {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := c.Write([]byte("x")); err != nil {
					return // closed: its slot was taken back
				}
			}
		})
	}
	time.Sleep(stalledAfter + 200*time.Millisecond) // the tricklers are past stalledAfter
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range slots + 2 {
		start := time.Now()
		res, err := client.Get(h.base + "/healthz")
		if err != nil {
			t.Fatalf("newcomer %d not served while %d hogs held the slots: %v", i, slots, err)
		}
		_ = res.Body.Close()
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("newcomer %d served after %s", i, took)
		}
	}
	if got := limitHits(h.gw, "connections"); got < 1 {
		t.Errorf("limit_hits{connections} = %v, want at least 1", got)
	}
	h.stillServes(t)
}

// TestHostileLongCallOutlivesTimeouts: read_timeout and write_timeout bound reading a request
// and each write, not a stream: with both at 1 s, a 3 s call answers on its SSE stream, with the
// client's standalone GET stream open throughout.
func TestHostileLongCallOutlivesTimeouts(t *testing.T) {
	h := startHostile(t, false, func(c *config.Gateway) { c.Limits.ReadTimeout, c.Limits.WriteTimeout = time.Second, time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "long", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.base + PathAgent}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	start := time.Now()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "everything.trigger-long-running-operation", Arguments: map[string]any{"duration": 3, "steps": 3}})
	if err != nil || res.IsError || !strings.Contains(texts(res)[0], "completed") {
		t.Fatalf("a 3 s call with 1 s timeouts: %v %v", err, res)
	}
	t.Logf("answered after %s", time.Since(start).Round(time.Millisecond))
	if r := call(t, cs, "memory.read_graph", map[string]any{}); r.IsError {
		t.Fatalf("the session after the long call: %v", texts(r))
	}
	h.stillServes(t)
}
