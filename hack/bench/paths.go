package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// A path is one way for the bench's clients to reach server-memory's read_graph: directly or
// through a proxy. start brings its processes up for n sessions and connects them; data is the
// repetition's own place for a journal (a folder, or a file for the floor).
type path struct {
	key, name string
	tool      string
	// base is the key of the direct path with the same upstreams ("direct1" means "direct"
	// at one session); "" for a direct path.
	base string
	// multi: measured only at more than one session (at one it is the same as "direct").
	multi    bool
	topology func(n int) string
	start    func(ctx context.Context, e *env, n int, data string) (*fleet, error)
}

// allPaths are the paths in the order every round measures them; pg adds PostgreSQL.
func allPaths(pg func(context.Context) (string, error)) []*path {
	ps := []*path{
		{key: "direct", name: "direct stdio", tool: directTool,
			topology: func(n int) string { return fmt.Sprintf("%d server-memory process(es), one session each", n) },
			start: func(ctx context.Context, e *env, n int, _ string) (*fleet, error) {
				return connectCommands(ctx, n, func() *exec.Cmd { return upstreams.Command(e.memCmd, e.memArgs, e.memEnv) })
			}},
		{key: "direct1", name: "direct stdio, 1 upstream", tool: directTool, multi: true,
			topology: func(n int) string { return fmt.Sprintf("1 server-memory process, %d callers on its one session", n) },
			start: func(ctx context.Context, e *env, n int, _ string) (*fleet, error) {
				f, err := connectCommands(ctx, 1, func() *exec.Cmd { return upstreams.Command(e.memCmd, e.memArgs, e.memEnv) })
				if err != nil {
					return nil, err
				}
				for len(f.sessions) < n { // the same session n times (close closes it once)
					f.sessions = append(f.sessions, f.sessions[0])
				}
				return f, nil
			}},
		{key: "floor", name: "floor: byte relay, no journal", tool: directTool, base: "direct",
			topology: func(n int) string {
				return fmt.Sprintf("%d relay process(es) (`bench floor`, GOMAXPROCS=1), each with its own server-memory", n)
			},
			start: func(ctx context.Context, e *env, n int, _ string) (*fleet, error) { return e.floor(ctx, n, "") }},
		{key: "floor-journal", name: "floor: byte relay + fdatasync'd append", tool: directTool, base: "direct",
			topology: func(n int) string {
				return fmt.Sprintf("%d relay process(es) (`bench floor -journal`, GOMAXPROCS=1), each with its own server-memory, all appending to one journal file (O_APPEND, fdatasync per line)", n)
			},
			start: func(ctx context.Context, e *env, n int, data string) (*fleet, error) {
				return e.floor(ctx, n, data+".jsonl")
			}},
		{key: "naive", name: "naive go-sdk proxy", tool: directTool, base: "direct",
			topology: func(n int) string {
				return fmt.Sprintf("%d proxy process(es) (`bench naive-proxy`: go-sdk server → go-sdk client), each with its own server-memory", n)
			},
			start: func(ctx context.Context, e *env, n int, _ string) (*fleet, error) {
				args := append([]string{"naive-proxy", "--", e.memCmd}, e.memArgs...)
				f, err := connectCommands(ctx, n, func() *exec.Cmd { c := exec.Command(e.self, args...); c.Env = e.memEnv; return c })
				if err != nil {
					return nil, err
				}
				f.proxies = f.pids
				return f, nil
			}},
		{key: "mcp-proxy", name: "mcp-proxy (npm), HTTP", tool: directTool, base: "direct1",
			topology: func(n int) string {
				return fmt.Sprintf("1 mcp-proxy process, 1 server-memory (it forwards every session over one stdio session), %d HTTP session(s)", n)
			},
			start: func(ctx context.Context, e *env, n int, _ string) (*fleet, error) {
				return e.npmProxy(ctx, n, upstreams.StartMCPProxy)
			}},
		{key: "supergateway", name: "supergateway (npm), HTTP", tool: directTool, base: "direct",
			topology: func(n int) string {
				return fmt.Sprintf("1 supergateway process, %d HTTP session(s), each with its own server-memory (spawned through sh -c as the session opens)", n)
			},
			start: func(ctx context.Context, e *env, n int, _ string) (*fleet, error) {
				return e.npmProxy(ctx, n, upstreams.StartSupergateway)
			}},
		{key: "gw-stdio", name: "reversi gateway stdio (SQLite)", tool: gatewayTool, base: "direct",
			topology: func(n int) string {
				return fmt.Sprintf("%d reversi gateway process(es), each with its own server-memory; one SQLite data folder", n)
			},
			start: func(ctx context.Context, e *env, n int, data string) (*fleet, error) {
				return e.gatewayStdio(ctx, n, "sqlite", data)
			}},
		{key: "gw-stdio-memory", name: "reversi gateway stdio (memory store)", tool: gatewayTool, base: "direct",
			topology: func(n int) string {
				return fmt.Sprintf("%d reversi gateway process(es) with --store memory, each with its own server-memory", n)
			},
			start: func(ctx context.Context, e *env, n int, data string) (*fleet, error) {
				return e.gatewayStdio(ctx, n, "memory", data)
			}},
		{key: "gw-http", name: "reversi gateway HTTP (SQLite)", tool: gatewayTool, base: "direct1",
			topology: func(n int) string {
				return fmt.Sprintf("1 reversi gateway process (listen: 127.0.0.1), 1 server-memory, %d HTTP session(s); SQLite", n)
			},
			start: func(ctx context.Context, e *env, n int, data string) (*fleet, error) {
				return e.gatewayHTTP(ctx, n, data, "")
			}},
	}
	if pg != nil {
		ps = append(ps, &path{key: "gw-http-pg", name: "reversi gateway HTTP (PostgreSQL)", tool: gatewayTool, base: "direct1",
			topology: func(n int) string {
				return fmt.Sprintf("as gateway HTTP (SQLite), journaling to PostgreSQL (test/pgtest on 127.0.0.1), %d HTTP session(s)", n)
			},
			start: func(ctx context.Context, e *env, n int, _ string) (*fleet, error) {
				url, err := pg(ctx)
				if err != nil {
					return nil, err
				}
				return e.gatewayHTTP(ctx, n, "", url)
			}})
	}
	return ps
}

// pathKeys lists every path's key (PostgreSQL's included), for -paths.
func pathKeys() []string {
	var keys []string
	for _, p := range allPaths(func(context.Context) (string, error) { return "", nil }) {
		keys = append(keys, p.key)
	}
	return keys
}

// selectPaths returns the paths f asks for, in the order of allPaths, with the direct paths
// their rows are compared with.
func selectPaths(f gatewayFlags) ([]*path, error) {
	all := allPaths(f.postgres)
	if len(f.paths) == 0 {
		return all, nil
	}
	want := map[string]bool{}
	for _, k := range f.paths {
		k = strings.TrimSpace(k)
		found := false
		for _, p := range all {
			if p.key == k {
				found = true
				want[k] = true
				if p.base != "" {
					want["direct"] = true
					want[p.base] = true
				}
			}
		}
		if !found {
			if k == "gw-http-pg" {
				return nil, errors.New("-paths gw-http-pg needs -postgres")
			}
			return nil, fmt.Errorf("-paths: unknown path %q; use %s", k, strings.Join(pathKeys(), ", "))
		}
	}
	var out []*path
	for _, p := range all {
		if want[p.key] {
			out = append(out, p)
		}
	}
	return out, nil
}

// floor starts n floor relays (this binary's `floor`, with GOMAXPROCS=1), each in front of its
// own server-memory; with journal they all append to that file, which is read back after the
// row.
func (e *env) floor(ctx context.Context, n int, journal string) (*fleet, error) {
	args := []string{"floor"}
	if journal != "" {
		args = append(args, "-journal", journal)
	}
	args = append(append(args, "--", e.memCmd), e.memArgs...)
	// GOMAXPROCS=1: one P, so a wake-up never spins a second thread looking for work (less CPU
	// per call than the default on two cores); the floor is the least a relay can spend. The
	// server inherits the variable and ignores it.
	env := append(append([]string{}, e.memEnv...), "GOMAXPROCS=1")
	f, err := connectCommands(ctx, n, func() *exec.Cmd {
		c := exec.Command(e.self, args...)
		c.Env = env
		return c
	})
	if err != nil {
		return nil, err
	}
	f.proxies = f.pids
	if journal != "" {
		f.verify = func(_ context.Context, want int) error { return checkFloorJournal(journal, want) }
	}
	return f, nil
}

// npmProxy starts one npm proxy (upstreams.StartMCPProxy or StartSupergateway) in front of
// server-memory and connects n Streamable HTTP sessions to it.
func (e *env) npmProxy(ctx context.Context, n int, start func(string, []string, []string) (*upstreams.NPMProxy, error)) (*fleet, error) {
	p, err := start(e.memCmd, e.memArgs, e.memEnv)
	if err != nil {
		return nil, err
	}
	f := &fleet{proxies: []int{p.Pid}, cleanup: []func(){p.Stop}, stderr: p.Stderr}
	if f.sessions, err = connectHTTP(ctx, n, p.URL); err != nil {
		f.close()
		return nil, fmt.Errorf("%w\nproxy stderr:\n%s", err, tail(p.Stderr(), 4000))
	}
	return f, nil
}

// connectHTTP connects n Streamable HTTP sessions to url, all at once. Each session is its own
// client with its own connections, as separate agents are (http.DefaultTransport would keep
// only 2 idle connections for 16 sessions).
func connectHTTP(ctx context.Context, n int, url string) ([]*mcp.ClientSession, error) {
	sessions := make([]*mcp.ClientSession, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			sessions[i], errs[i] = newClient().Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, s := range sessions {
			if s != nil {
				_ = s.Close()
			}
		}
		return nil, fmt.Errorf("connect %s: %w", url, err)
	}
	return sessions, nil
}

// gatewayStdio starts n `reversi gateway` processes over stdio (what n agents each spawning
// the gateway get), each with its own server-memory, journaling to data (one SQLite folder for
// all) or to their own memory store.
func (e *env) gatewayStdio(ctx context.Context, n int, storeKind, data string) (*fleet, error) {
	if storeKind == "sqlite" {
		// Create the SQLite file once, so that n processes do not race to create the schema.
		st, err := store.OpenSQLite(data, nil)
		if err != nil {
			return nil, err
		}
		if err := st.Close(); err != nil {
			return nil, err
		}
	}
	f, err := connectCommands(ctx, n, func() *exec.Cmd {
		cmd := exec.Command(e.reversi, "gateway", "--config", e.cfgFile, "--manifests", e.manifests,
			"--store", storeKind, "--data", data)
		cmd.Dir = e.dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
		if p := os.Getenv("REVERSI_CPUPROFILE"); p != "" && n == 1 {
			if storeKind != "sqlite" {
				p += "." + storeKind
			}
			cmd.Env = append(cmd.Env, "REVERSI_CPUPROFILE="+p) // the one stdio gateway's profile (<file>.memory with --store memory)
		}
		return cmd
	})
	if err != nil {
		return nil, err
	}
	f.proxies = f.pids
	if storeKind == "sqlite" {
		f.verify = func(ctx context.Context, want int) error { return checkJournal(ctx, data, want) }
	} else {
		f.verifyLive = func(ctx context.Context, want int) error { return checkRunsLive(ctx, f.sessions, want) }
	}
	return f, nil
}

// gatewayHTTP starts one `reversi gateway` process serving Streamable HTTP on 127.0.0.1
// (listen: in its config), journaling to SQLite in data or, with pgURL, to that PostgreSQL
// database, and connects n sessions to it.
func (e *env) gatewayHTTP(ctx context.Context, n int, data, pgURL string) (*fleet, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close() // the gateway takes a port number (1 to 65535), not 0
	cfg := map[string]any{"listen": map[string]any{"host": "127.0.0.1", "port": port}}
	for k, v := range e.cfg {
		cfg[k] = v
	}
	cfgFile := filepath.Join(e.dir, fmt.Sprintf("gateway-http-%d.yaml", port))
	if err := writeJSON(cfgFile, cfg); err != nil {
		return nil, err
	}
	args := []string{"gateway", "--config", cfgFile, "--manifests", e.manifests}
	if pgURL != "" {
		args = append(args, "--store", "postgres", "--database-url", pgURL)
	} else {
		args = append(args, "--store", "sqlite", "--data", data)
	}
	stderr := &syncbuf.Buffer{}
	cmd := exec.Command(e.reversi, args...)
	cmd.Dir = e.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if p := os.Getenv("REVERSI_HTTP_CPUPROFILE"); p != "" {
		if pgURL != "" {
			p += ".pg"
		}
		cmd.Env = append(cmd.Env, fmt.Sprintf("REVERSI_CPUPROFILE=%s.%d", p, n)) // the HTTP gateway's profile at n sessions (.pg: PostgreSQL)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	f := &fleet{proxies: []int{cmd.Process.Pid}, stderr: stderr.String}
	f.cleanup = append(f.cleanup, func() { stopProcess(cmd.Process.Pid, done) })
	const marker = "reversi-gateway: listening on "
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), marker); time.Sleep(20 * time.Millisecond) {
		select {
		case <-done:
			f.close()
			return nil, fmt.Errorf("the HTTP gateway exited: %s", stderr)
		default:
		}
		if time.Now().After(deadline) {
			f.close()
			return nil, fmt.Errorf("the HTTP gateway did not listen within 30 s: %s", stderr)
		}
	}
	if f.sessions, err = connectHTTP(ctx, n, fmt.Sprintf("http://127.0.0.1:%d/mcp", port)); err != nil {
		f.close()
		return nil, fmt.Errorf("%w\ngateway stderr:\n%s", err, tail(stderr.String(), 4000))
	}
	if pgURL != "" {
		f.verify = func(ctx context.Context, want int) error { return checkJournalPostgres(ctx, pgURL, want) }
	} else {
		f.verify = func(ctx context.Context, want int) error { return checkJournal(ctx, data, want) }
	}
	return f, nil
}

// stopProcess sends SIGTERM to pid, waits up to 10 s for it to exit (done), then kills its
// process group (pid is its leader: nothing it spawned is left).
func stopProcess(pid int, done <-chan struct{}) {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-done
}
