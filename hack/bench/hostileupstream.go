package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// hostile-upstream (issue 18): the idle and peak RSS of a `reversi gateway` process (HTTP mode, SQLite
// journal) in front of the hostile server (test/upstreams/hostile), one process per case. Idle
// is VmRSS once the gateway serves (after one call), peak is VmHWM at the end of the case (for
// a gateway that refuses to start: the exited process's maximum RSS, against the idle of a
// normal start). Each case also checks that the gateway keeps serving and that the journal
// passes integrity_check with one outcome per intent. Fails when a case breaks that or its
// peak passes idle + -bound.

type upstreamCase struct {
	name  string
	args  []string // the hostile server's flags
	http  string   // "", "json" or "sse": the upstream over Streamable HTTP
	start bool     // the gateway must refuse to start
	run   func(h *upstreamRun) (string, error)
}

type upstreamRun struct {
	url      string // the gateway's /mcp
	cancels  string // the hostile server's -cancel-log
	calls    string // the hostile server's -calls-log
	stderr   *syncbuf.Buffer
	sessions []*mcp.ClientSession
}

func hostileUpstreamMain(argv []string) error {
	fs := flag.NewFlagSet("hostile-upstream", flag.ContinueOnError)
	reversi := fs.String("reversi", "", "reversi binary (default: go build of this module)")
	bound := fs.Int("bound", 200, "allowed peak RSS growth over idle, MiB")
	kill := fs.Int("kill", 1024, "kill a gateway whose RSS passes this many MiB (a safety for measuring a gateway without the bounds)")
	keep := fs.Bool("keep", false, "keep the temporary folder")
	only := fs.String("run", "", "run only the cases whose name matches this regular expression (and the idle baseline)")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	match, err := regexp.Compile(*only)
	if err != nil {
		return fmt.Errorf("-run: %w", err)
	}
	dir, err := os.MkdirTemp("", "reversi-hostile-upstream-bench-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "bench: keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if *reversi == "" {
		*reversi = filepath.Join(dir, "reversi")
		fmt.Fprintln(os.Stderr, "bench: go build -o", *reversi, ".")
		build := exec.Command("go", "build", "-o", *reversi, ".")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("go build of the reversi binary (run the bench from the module root, or pass -reversi): %w", err)
		}
	}
	hostile, err := upstreams.BuildHostile()
	if err != nil {
		return err
	}
	big := map[string]any{"bytes": 20 << 20}
	cases := []upstreamCase{
		{name: "normal listing (the idle baseline)", run: func(h *upstreamRun) (string, error) { return "serves", nil }},
		{name: "start: cyclic cursor", args: []string{"-list", "cycle"}, start: true},
		{name: "start: endless cursors, 64 KiB per tool", args: []string{"-list", "endless", "-pad", "65536"}, start: true},
		{name: "start: 2,500 tools", args: []string{"-list", "many"}, start: true},
		{name: "refresh after list_changed: endless cursors, 64 KiB per tool", run: func(h *upstreamRun) (string, error) {
			if _, err := h.call(0, "h.relist", map[string]any{"list": "endless"}, false); err != nil {
				return "", err
			}
			return "said: " + h.waitStderr("the tool list was not refreshed", 30*time.Second), nil
		}, args: []string{"-pad", "65536"}},
		{name: "banner + a garbage line before every message, 200 calls of noise", args: []string{"-banner", "hostile v1", "-garbage"},
			run: func(h *upstreamRun) (string, error) {
				for range 200 {
					if _, err := h.call(0, "h.noise", map[string]any{}, false); err != nil {
						return "", err
					}
				}
				return "200 calls ok", nil
			}},
		{name: "stdio: 5 answers of 20 MiB, another session calling", run: func(h *upstreamRun) (string, error) {
			return h.bigAnswers(5, big)
		}},
		{name: "stdio: 5 messages of 20 MiB without an id (call_timeout 2s)", args: []string{"-calltimeout"}, run: func(h *upstreamRun) (string, error) {
			return h.bigAnswersTool(5, "h.big_noid", big, "call_timeout")
		}},
		{name: "HTTP upstream, JSON: 5 answers of 20 MiB", http: "json", run: func(h *upstreamRun) (string, error) { return h.bigAnswers(5, big) }},
		{name: "HTTP upstream, SSE: 5 answers of 20 MiB", http: "sse", run: func(h *upstreamRun) (string, error) { return h.bigAnswers(5, big) }},
		{name: "never-answering tool: 20 sessions leave (DELETE) mid-call", run: func(h *upstreamRun) (string, error) { return h.sessionsLeave(20) }},
		{name: "crash mid-call, restart", run: func(h *upstreamRun) (string, error) {
			if _, err := h.call(0, "h.crash", map[string]any{}, true); err != nil {
				return "", err
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				if _, err := h.call(0, "h.echo", map[string]any{"text": "x"}, false); err == nil {
					return "restarted; said: " + h.waitStderr("upstream h stopped", time.Second), nil
				}
				if time.Now().After(deadline) {
					return "", errors.New("not restarted within 30s")
				}
				time.Sleep(200 * time.Millisecond)
			}
		}},
	}
	type row struct {
		name, result string
		idle, peak   int64 // KiB
		err          error
	}
	var rows []row
	var idle int64
	for i, c := range cases {
		if i > 0 && !match.MatchString(c.name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: hostile-upstream %d/%d: %s\n", i+1, len(cases), c.name)
		r := row{name: c.name}
		r.result, r.idle, r.peak, r.err = runUpstreamCase(*reversi, hostile, filepath.Join(dir, strconv.Itoa(i)), c, int64(*kill)<<10)
		if i == 0 {
			idle = r.idle
		}
		if c.start {
			r.idle = idle
		}
		if r.err == nil && r.peak-r.idle > int64(*bound)<<10 {
			r.err = fmt.Errorf("peak RSS %d MiB is over idle %d MiB + %d MiB", r.peak>>10, r.idle>>10, *bound)
		}
		rows = append(rows, r)
	}
	fmt.Printf("Gateway process (`reversi gateway`, HTTP mode, SQLite) against test/upstreams/hostile; bound: peak ≤ idle + %d MiB\n\n", *bound)
	fmt.Println("| case | what the gateway did | idle RSS MiB | peak RSS MiB | peak − idle MiB | met |")
	fmt.Println("| - | - | -: | -: | -: | - |")
	var errs []error
	for _, r := range rows {
		met := "yes"
		if r.err != nil {
			met = "**no**"
			r.result, _, _ = strings.Cut(r.err.Error(), "\n") // the table keeps the first line
			errs = append(errs, fmt.Errorf("%s: %w", r.name, r.err))
		}
		fmt.Printf("| %s | %s | %.1f | %.1f | %+.1f | %s |\n", r.name, strings.ReplaceAll(r.result, "|", "/"),
			float64(r.idle)/1024, float64(r.peak)/1024, float64(r.peak-r.idle)/1024, met)
	}
	return errors.Join(errs...)
}

// runUpstreamCase runs one case in its own gateway process and returns what happened, the
// idle and peak RSS in KiB.
func runUpstreamCase(reversi, hostile, dir string, c upstreamCase, kill int64) (result string, idle, peak int64, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", 0, 0, err
	}
	cancels, calls := filepath.Join(dir, "cancelled"), filepath.Join(dir, "calls")
	args := append([]string{"-cancel-log", cancels, "-calls-log", calls}, c.args...)
	callTimeout := "60s"
	if i := indexOf(args, "-calltimeout"); i >= 0 { // the bench's own flag: a short call_timeout
		args = append(args[:i], args[i+1:]...)
		callTimeout = "2s"
	}
	up := map[string]any{"name": "h", "command": hostile, "args": args, "env": map[string]string{}}
	if c.http != "" {
		hargs := append([]string{"-http", "127.0.0.1:0"}, args...)
		if c.http == "sse" {
			hargs = append(hargs, "-sse")
		}
		srv := exec.Command(hostile, hargs...)
		serr := &syncbuf.Buffer{}
		srv.Stderr = serr
		if err := srv.Start(); err != nil {
			return "", 0, 0, err
		}
		defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
		url, err := waitFor(serr, "listening on ", 10*time.Second)
		if err != nil {
			return "", 0, 0, err
		}
		up = map[string]any{"name": "h", "url": url}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cfg, _ := json.Marshal(map[string]any{"mode": "observe", "upstreams": []any{up}, "call_timeout": callTimeout,
		"listen": map[string]any{"host": "127.0.0.1", "port": port}})
	cfgFile := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		return "", 0, 0, err
	}
	data := filepath.Join(dir, "data")
	cmd := exec.Command(reversi, "gateway", "--config", cfgFile, "--store", "sqlite", "--data", data)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	errw := &syncbuf.Buffer{}
	cmd.Stderr = errw
	if err := cmd.Start(); err != nil {
		return "", 0, 0, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var killed atomic.Int64 // the RSS (KiB) at which the watchdog killed the gateway
	go func() {
		for {
			select {
			case <-exited:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if rss, _, err := procRSS(cmd.Process.Pid); err == nil && rss > kill {
				killed.Store(rss)
				_ = cmd.Process.Kill()
				return
			}
		}
	}()
	defer func() {
		if k := killed.Load(); k > 0 {
			result, peak, err = "", k, fmt.Errorf("killed at %d MiB RSS (over -kill %d MiB)", k>>10, kill>>10)
		}
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	// The peak of a case that failed is measured too (for a gateway without the bounds).
	peakNow := func() int64 {
		_, hwm, _ := procRSS(cmd.Process.Pid)
		return hwm
	}
	if c.start {
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			peak = peakNow()
			stop()
			return "", 0, peak, errors.New("the gateway did not refuse to start within 60s")
		}
		ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		if cmd.ProcessState.ExitCode() == 0 || ru == nil {
			return "", 0, 0, fmt.Errorf("the gateway exited %s:\n%s", cmd.ProcessState, errw)
		}
		msg := lastLine(errw.String())
		return "refused: " + msg, 0, ru.Maxrss, nil
	}
	defer stop()
	if _, err := waitFor(errw, "reversi-gateway: listening on ", 60*time.Second); err != nil {
		return "", 0, 0, fmt.Errorf("%w\n%s", err, errw)
	}
	h := &upstreamRun{url: fmt.Sprintf("http://127.0.0.1:%d/mcp", port), cancels: cancels, calls: calls, stderr: errw}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.url, DisableStandaloneSSE: true}, nil)
		cancel()
		if err != nil {
			return "", 0, 0, err
		}
		defer cs.Close()
		h.sessions = append(h.sessions, cs)
	}
	if _, err := h.call(0, "h.echo", map[string]any{"text": "idle"}, false); err != nil {
		return "", 0, 0, err
	}
	time.Sleep(500 * time.Millisecond)
	if idle, _, err = procRSS(cmd.Process.Pid); err != nil {
		return "", 0, 0, err
	}
	if result, err = c.run(h); err != nil {
		return "", idle, peakNow(), fmt.Errorf("%w\ngateway stderr:\n%s", err, errw)
	}
	if _, err := h.call(1, "h.echo", map[string]any{"text": "still serving"}, false); err != nil {
		return "", idle, peakNow(), fmt.Errorf("after the case: %w", err)
	}
	if _, peak, err = procRSS(cmd.Process.Pid); err != nil {
		return "", 0, 0, err
	}
	for _, cs := range h.sessions {
		_ = cs.Close()
	}
	stop()
	return result, idle, peak, checkUpstreamJournal(data)
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// call calls tool on session i; wantError: the result must be an isError one.
func (h *upstreamRun) call(i int, tool string, args any, wantError bool) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := h.sessions[i].CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", tool, err)
	case res.IsError != wantError:
		text := ""
		if len(res.Content) > 0 {
			if tc, ok := res.Content[0].(*mcp.TextContent); ok {
				text = tc.Text
			}
		}
		if len(text) > 200 {
			text = text[:200] + "…"
		}
		return nil, fmt.Errorf("%s: isError %v, want %v: %q", tool, res.IsError, wantError, text)
	}
	return res, nil
}

func (h *upstreamRun) bigAnswers(n int, args any) (string, error) {
	return h.bigAnswersTool(n, "h.big", args, "limits.message_bytes")
}

// bigAnswersTool calls tool n times on session 0, each while session 1 calls slow: the first
// must fail naming want, the second succeed.
func (h *upstreamRun) bigAnswersTool(n int, tool string, args any, want string) (string, error) {
	for range n {
		var wg sync.WaitGroup
		var slowErr error
		wg.Go(func() { _, slowErr = h.call(1, "h.slow", map[string]any{"ms": 300}, false) })
		res, err := h.call(0, tool, args, true)
		wg.Wait()
		if err != nil {
			return "", err
		}
		if slowErr != nil {
			return "", fmt.Errorf("the other session: %w", slowErr)
		}
		if tc, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, want) {
			return "", fmt.Errorf("%s: %v, want %q", tool, res.Content, want)
		}
	}
	return fmt.Sprintf("%d calls failed (%s), the other session's %d calls ok", n, want, n), nil
}

// sessionsLeave opens n more sessions, has each call the never-answering tool, and ends each
// session with an HTTP DELETE while its call is in flight: the DELETEs must return, the
// upstream must receive n notifications/cancelled and the calls must end.
func (h *upstreamRun) sessionsLeave(n int) (string, error) {
	began := time.Now()
	var calls sync.WaitGroup
	var ids []string
	var version string
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "leaver", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.url, DisableStandaloneSSE: true}, nil)
		cancel()
		if err != nil {
			return "", err
		}
		ids, version = append(ids, cs.ID()), cs.InitializeResult().ProtocolVersion
		calls.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = cs.CallTool(ctx, &mcp.CallToolParams{Name: "h.hang", Arguments: map[string]any{}})
		})
	}
	if err := waitLines(h.calls, "hang", n, 15*time.Second); err != nil {
		return "", err
	}
	left := time.Now()
	for _, id := range ids {
		req, err := http.NewRequest(http.MethodDelete, h.url, nil)
		if err != nil {
			return "", err
		}
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("Mcp-Protocol-Version", version)
		c := &http.Client{Timeout: 10 * time.Second}
		res, err := c.Do(req)
		if err != nil {
			return "", fmt.Errorf("DELETE: %w", err)
		}
		_ = res.Body.Close()
	}
	deleted := time.Since(left)
	if err := waitLines(h.cancels, "", n, 15*time.Second); err != nil {
		return "", err
	}
	done := make(chan struct{})
	go func() { calls.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		return "", errors.New("the calls did not end within 15s of their sessions' DELETE")
	}
	return fmt.Sprintf("%d DELETEs returned in %s; %d cancellations upstream %s after the calls began", n,
		deleted.Round(time.Millisecond), n, time.Since(began).Round(100*time.Millisecond)), nil
}

// waitLines waits for n lines of file (equal to want, unless want is "").
func waitLines(file, want string, n int, within time.Duration) error {
	got := 0
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(file)
		got = 0
		for _, l := range strings.Fields(string(b)) {
			if want == "" || l == want {
				got++
			}
		}
		if got >= n {
			return nil
		}
	}
	return fmt.Errorf("%s: %d lines %q after %s, want %d", filepath.Base(file), got, want, within, n)
}

// waitStderr waits for a line of the gateway's stderr containing s and returns it.
func (h *upstreamRun) waitStderr(s string, within time.Duration) string {
	rest, err := waitFor(h.stderr, s, within)
	if err != nil {
		return "(the gateway did not say " + strconv.Quote(s) + ")"
	}
	if strings.HasPrefix(rest, "(") {
		return s + " " + rest
	}
	return s + rest
}

// waitFor waits for marker in b and returns the rest of its line.
func waitFor(b *syncbuf.Buffer, marker string, within time.Duration) (string, error) {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, rest, ok := strings.Cut(b.String(), marker); ok {
			line, _, _ := strings.Cut(rest, "\n")
			return strings.TrimSpace(line), nil
		}
	}
	return "", fmt.Errorf("no %q within %s", marker, within)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// procRSS reads VmRSS and VmHWM (KiB) of a process.
func procRSS(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmRSS or VmHWM", pid)
	}
	return rss, hwm, sc.Err()
}

// checkUpstreamJournal: integrity_check, one outcome per intent, nothing pending.
func checkUpstreamJournal(data string) error {
	if err := store.CheckSQLiteIntegrity(data); err != nil {
		return err
	}
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	ctx := context.Background()
	runs, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		return err
	}
	for _, r := range runs {
		recs, err := st.Records(ctx, r.ID, 0, 0)
		if err != nil {
			return err
		}
		outcomes := map[int64]int{}
		intents := 0
		for _, rec := range recs {
			switch rec.Kind {
			case store.KindIntent:
				intents++
			case store.KindOutcome:
				outcomes[rec.Step]++
			}
		}
		for _, n := range outcomes {
			if n != 1 {
				return fmt.Errorf("run %s: a step with %d outcomes", r.ID, n)
			}
		}
		if len(outcomes) != intents {
			return fmt.Errorf("run %s: %d intents, %d outcomes", r.ID, intents, len(outcomes))
		}
	}
	return nil
}
