package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/reversi-gitops/reversi/test/syncbuf"
)

// hostile-client (issue 18): the resident memory a hostile client on 127.0.0.1 can make a
// gateway process spend. Each case runs against a fresh `reversi gateway` process in HTTP mode
// in front of server-memory (so one case's garbage does not raise the next one's idle), and
// the table gives the process's RSS when idle, its peak during the case (VmHWM, reset before
// the case, and 5 ms samples of VmRSS), and what the requests were answered. -reversi runs a
// binary of another commit, for a before/after comparison.

const mib = 1 << 20

type hostileCase struct {
	name string
	run  func(h *hostileGW) (answers string, err error)
}

func hostileMain(argv []string) error {
	fs := flag.NewFlagSet("hostile-client", flag.ContinueOnError)
	reversi := fs.String("reversi", "", "the reversi binary to run (default: build this module's)")
	n := fs.Int("n", 4, "requests sent at once in each case")
	only := fs.String("case", "", "run only the case of this name")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	if *n < 1 || *n > 64 {
		return errors.New("-n must be 1 to 64")
	}
	dir, err := os.MkdirTemp("", "reversi-hostile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := setup(dir, *reversi) // "": setup builds this module's binary
	if err != nil {
		return err
	}
	cases := []hostileCase{
		{"idle", func(*hostileGW) (string, error) { time.Sleep(time.Second); return "-", nil }},
		{fmt.Sprintf("%d batches of 4 MiB of pings at once (protocol 2025-03-26)", *n), func(h *hostileGW) (string, error) {
			sid, err := h.session("2025-03-26")
			if err != nil {
				return "", err
			}
			return h.concurrent(*n, func(i int) (*http.Request, error) {
				return h.post(sid, bytes.NewReader(pingBatch(4*mib-1024, i*1_000_000)), -2)
			})
		}},
		{fmt.Sprintf("%d chunked bodies of 5 MiB at once", *n), func(h *hostileGW) (string, error) {
			sid, err := h.session("2025-06-18")
			if err != nil {
				return "", err
			}
			return h.concurrent(*n, func(int) (*http.Request, error) {
				return h.post(sid, io.MultiReader(strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"ping","params":{"_meta":{"pad":"`),
					io.LimitReader(repeatX{}, 5*mib)), -1)
			})
		}},
		{fmt.Sprintf("%d bodies of 4 MiB within the limit at once (tools/call, padded _meta)", *n), func(h *hostileGW) (string, error) {
			sid, err := h.session("2025-06-18")
			if err != nil {
				return "", err
			}
			pad := strings.Repeat("x", 4*mib-200)
			return h.concurrent(*n, func(i int) (*http.Request, error) {
				msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"memory.read_graph","arguments":{},"_meta":{"pad":"%s"}}}`, 100+i, pad)
				return h.post(sid, strings.NewReader(msg), len(msg))
			})
		}},
		{"200 slow bodies held until the read timeout (5 s)", func(h *hostileGW) (string, error) { return h.slowBodies(200) }},
	}
	fmt.Printf("gateway: %s; upstream @modelcontextprotocol/server-memory (stdio), SQLite journal; limits at their defaults but read_timeout 5s\n\n", e.reversi)
	fmt.Println("| case | answers | RSS idle MiB | RSS peak MiB | peak − idle MiB | took |")
	fmt.Println("| - | - | -: | -: | -: | -: |")
	for _, c := range cases {
		if *only != "" && !strings.Contains(c.name, *only) {
			continue
		}
		h, err := startHostileGW(e, filepath.Join(dir, fmt.Sprintf("case-%d", time.Now().UnixNano())))
		if err != nil {
			return err
		}
		time.Sleep(2 * time.Second) // settle after the start
		idle, err := h.resetPeak()
		if err != nil {
			h.stop()
			return err
		}
		stop := h.sample()
		start := time.Now()
		answers, cerr := c.run(h)
		took := time.Since(start)
		peak := stop()
		h.stop()
		if cerr != nil {
			return fmt.Errorf("%s: %w\ngateway stderr:\n%s", c.name, cerr, h.stderr)
		}
		fmt.Printf("| %s | %s | %.0f | %.0f | %+.0f | %s |\n", c.name, answers, float64(idle)/mib, float64(peak)/mib, float64(peak-idle)/mib, took.Round(10*time.Millisecond))
	}
	return nil
}

// hostileGW is one gateway process under test.
type hostileGW struct {
	cmd    *exec.Cmd
	base   string
	stderr *syncbuf.Buffer
	done   chan struct{}
}

func startHostileGW(e *env, data string) (*hostileGW, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	upEnv := map[string]string{}
	for _, kv := range e.memEnv {
		k, v, _ := strings.Cut(kv, "=")
		upEnv[k] = v
	}
	cfg := map[string]any{
		"mode": "observe", "actor": actor, "listen": map[string]any{"host": "127.0.0.1", "port": port},
		"upstreams": []map[string]any{{"name": "memory", "command": e.memCmd, "args": e.memArgs, "env": upEnv}},
	}
	// Parsed (and then ignored) by a gateway from before issue 18 too.
	cfg["limits"] = map[string]any{"read_timeout": "5s"}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	file := data + ".yaml"
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return nil, err
	}
	h := &hostileGW{stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	h.cmd = exec.Command(e.reversi, "gateway", "--config", file, "--data", data, "--store", "sqlite")
	h.cmd.Dir = filepath.Dir(data)
	h.cmd.Stderr = h.stderr
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = h.cmd.Wait(); close(h.done) }()
	const marker = "reversi-gateway: listening on "
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if s := h.stderr.String(); strings.Contains(s, marker) {
			h.base = fmt.Sprintf("http://127.0.0.1:%d", port)
			return h, nil
		}
		select {
		case <-h.done:
			return nil, fmt.Errorf("the gateway exited: %s", h.stderr)
		default:
		}
	}
	h.stop()
	return nil, fmt.Errorf("the gateway did not listen within 30 s: %s", h.stderr)
}

func (h *hostileGW) stop() {
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.done
	}
}

// status reads a field of /proc/<pid>/status in bytes.
func (h *hostileGW) status(field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, h.cmd.Process.Pid)
}

// resetPeak resets the process's VmHWM to its VmRSS (clear_refs 5) and returns that.
func (h *hostileGW) resetPeak() (int64, error) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", h.cmd.Process.Pid), []byte("5"), 0)
	return h.status("VmRSS")
}

// sample samples VmRSS every 5 ms until stop, which returns the peak (VmHWM included).
func (h *hostileGW) sample() (stop func() int64) {
	done, out := make(chan struct{}), make(chan int64)
	go func() {
		var peak int64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, err := h.status("VmRSS"); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-done:
				if v, err := h.status("VmHWM"); err == nil {
					peak = max(peak, v)
				}
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return func() int64 { close(done); return <-out }
}

// session opens an MCP session with raw requests at protocol.
func (h *hostileGW) session(protocol string) (string, error) {
	init := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"hostile","version":"1"}}}`, protocol)
	req, err := h.post("", strings.NewReader(init), len(init))
	if err != nil {
		return "", err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	sid := res.Header.Get("Mcp-Session-Id")
	if res.StatusCode != 200 || sid == "" {
		return "", fmt.Errorf("initialize: %s", res.Status)
	}
	note := `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	req, err = h.post(sid, strings.NewReader(note), len(note))
	if err != nil {
		return "", err
	}
	if protocol >= "2025-06-18" {
		req.Header.Set("Mcp-Protocol-Version", protocol)
	}
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	_ = res.Body.Close()
	return sid, nil
}

// post builds a POST to /mcp in session sid; length -1 sends it chunked, -2 lets net/http
// measure a bytes.Reader.
func (h *hostileGW) post(sid string, body io.Reader, length int) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, h.base+"/mcp", body)
	if err != nil {
		return nil, err
	}
	switch {
	case length >= 0:
		req.ContentLength = int64(length)
	case length == -1:
		req.ContentLength = -1
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	return req, nil
}

// concurrent sends n requests at once and tells their answers, e.g. "4× 400".
func (h *hostileGW) concurrent(n int, mk func(i int) (*http.Request, error)) (string, error) {
	codes := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		req, err := mk(i)
		if err != nil {
			return "", err
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			res, err := http.DefaultClient.Do(req.WithContext(ctx))
			if err != nil {
				codes[i] = "error"
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			codes[i] = strconv.Itoa(res.StatusCode)
		})
	}
	wg.Wait()
	return summarize(codes), nil
}

// slowBodies opens n connections that send a request head announcing 1,000 bytes and 20 of
// them, and waits until the gateway has answered or closed every one (the client gives up
// after 30 s: "closed").
func (h *hostileGW) slowBodies(n int) (string, error) {
	host := strings.TrimPrefix(h.base, "http://")
	head := "POST /mcp HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n" + `{"jsonrpc":"2.0","id":`
	codes := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", host, 5*time.Second)
			if err != nil {
				codes[i] = "dial error"
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.WriteString(c, head); err != nil {
				codes[i] = "write error"
				return
			}
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				codes[i] = "closed"
				return
			}
			_ = res.Body.Close()
			codes[i] = strconv.Itoa(res.StatusCode)
		})
	}
	wg.Wait()
	return summarize(codes), nil
}

func summarize(codes []string) string {
	count := map[string]int{}
	var order []string
	for _, c := range codes {
		if count[c] == 0 {
			order = append(order, c)
		}
		count[c]++
	}
	var parts []string
	for _, c := range order {
		parts = append(parts, fmt.Sprintf("%d× %s", count[c], c))
	}
	return strings.Join(parts, ", ")
}

// pingBatch is a JSON-RPC batch of pings of about size bytes, ids from first.
func pingBatch(size, first int) []byte {
	var b bytes.Buffer
	b.WriteByte('[')
	for i := 0; b.Len() < size-64; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"ping"}`, first+i)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// repeatX reads as an endless run of 'x'.
type repeatX struct{}

func (repeatX) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}
