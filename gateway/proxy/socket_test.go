//go:build linux

package proxy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Socket upstreams (issue 23) against the real thing: `reversi stdio-bridge`, the built binary
// run as a process exactly as a ReversiGateway's sidecar runs it, in front of the real
// server-memory, and the gateway connected over the socket.

var reversiBinOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "reversi-socket-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "reversi")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/reversi-gitops/reversi").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// bridge is a `reversi stdio-bridge` process.
type bridge struct {
	sock string
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	done chan struct{}
}

// startBridge runs `reversi stdio-bridge --listen unix://<sock> [--session s] -- <server-memory>`
// with the server's environment as the sidecar's.
func startBridge(t *testing.T, sock, session string) *bridge {
	t.Helper()
	bin, err := reversiBinOnce()
	if err != nil {
		t.Fatal(err)
	}
	cmd, args, env := upstreams.Memory(t)
	argv := []string{"stdio-bridge", "--listen", "unix://" + sock}
	if session != "" {
		argv = append(argv, "--session", session)
	}
	argv = append(append(argv, "--", cmd), args...)
	b := &bridge{sock: sock, log: &syncbuf.Buffer{}, done: make(chan struct{})}
	b.cmd = exec.Command(bin, argv...)
	b.cmd.Env = append(env, "MEMORY_FILE_PATH="+filepath.Join(t.TempDir(), "graph.jsonl"))
	b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
	b.cmd.WaitDelay = 2 * time.Second
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
		<-b.done
		// The parent-death signal reaches the children as the bridge dies; they take a moment
		// to go on a loaded machine, at most 5 s.
		for _, pid := range b.children() {
			for deadline := time.Now().Add(5 * time.Second); procAlive(pid) && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			if procAlive(pid) {
				t.Errorf("server-memory (pid %d) outlived the test's bridge by 5 s", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return b
}

var bridgeStarted = regexp.MustCompile(`started the server \(pid (\d+)\)`)
var bridgeServing = regexp.MustCompile(`serving a connection with the server \(pid (\d+)\)`)

func pidsIn(re *regexp.Regexp, log string) []int {
	var out []int
	for _, m := range re.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

// children are the pids of the servers the bridge started, in order.
func (b *bridge) children() []int { return pidsIn(bridgeStarted, b.log.String()) }

// procAlive reports whether pid runs (a zombie has exited).
func procAlive(pid int) bool {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(s), ')')
	return i < 0 || len(s) < i+3 || (s[i+2] != 'Z' && s[i+2] != 'X')
}

func until(t *testing.T, d time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitStdinBytes waits until pid's stdin pipe holds bytes it has not read.
func waitStdinBytes(t *testing.T, pid int) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd/0", pid))
	if err != nil {
		t.Fatalf("the server's stdin: %v", err)
	}
	defer f.Close()
	until(t, 10*time.Second, func() string {
		n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ)
		if err != nil {
			t.Fatalf("FIONREAD: %v", err)
		}
		if n == 0 {
			return "the bridge wrote nothing to the stopped server"
		}
		return ""
	})
}

func shortTemp(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "gs") // a socket path holds at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// TestSocketUpstreamThroughStdioBridge: the gateway starts before the bridge listens and waits
// for the socket; over it, calls are enforced (an unmanifested tool and a denied one blocked,
// an allowed one reaches server-memory) and journaled. server-memory killed with a call in
// flight: the bridge closes the connection, the call is journaled uncertain, the bridge starts
// the server again and the gateway reconnects, and the next call succeeds on the new process.
// SIGTERM to the bridge ends it and its server: no process left, the socket removed.
func TestSocketUpstreamThroughStdioBridge(t *testing.T) {
	sock := filepath.Join(shortTemp(t), "run", "reversi", "memory.sock")
	cfg := &config.Gateway{Mode: config.ModeAuto, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Deny: []string{"memory.open_nodes"},
		Upstreams: []config.Upstream{{Name: "memory", Socket: sock, Namespace: true}}}
	ready := make(chan *fixture, 1)
	go func() { // New dials before anyone listens: the gateway container may start first
		ready <- start(t, cfg, loadManifests(t))
	}()
	time.Sleep(300 * time.Millisecond)
	b := startBridge(t, sock, "")
	var f *fixture
	select {
	case f = <-ready:
	case <-time.After(40 * time.Second):
		t.Fatalf("the gateway did not connect to the bridge; bridge log:\n%s", b.log.String())
	}
	first := b.children()
	if len(first) != 1 || !slices.Equal(pidsIn(bridgeServing, b.log.String()), first) {
		t.Fatalf("bridge log: want one server serving the gateway:\n%s", b.log.String())
	}
	if !strings.Contains(f.stderr.String(), "OK memory.create_entities") {
		t.Errorf("banner:\n%s", f.stderr.String())
	}
	cs := f.client(t)

	res := call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "alice", "entityType": "person", "observations": []any{"likes tea"}}}})
	if res.IsError {
		t.Fatalf("create_entities: %v", texts(res))
	}
	if res := call(t, cs, "memory.read_graph", map[string]any{}); !strings.Contains(strings.Join(texts(res), ""), "alice") {
		t.Fatalf("read_graph: %v", texts(res))
	}
	res = call(t, cs, "memory.search_nodes", map[string]any{"query": "alice"})
	if want := "Blocked by Reversi: " + engine.NoManifestText("memory.search_nodes"); !res.IsError || !slices.Equal(texts(res), []string{want}) {
		t.Errorf("search_nodes (no manifest): %v %q, want %q", res.IsError, texts(res), want)
	}
	res = call(t, cs, "memory.open_nodes", map[string]any{"names": []any{"alice"}})
	if !res.IsError || !strings.HasPrefix(strings.Join(texts(res), ""), engine.BlockedPrefix) {
		t.Errorf("open_nodes (denied): %v", texts(res))
	}
	_, recs := onlyRun(t, f.store)
	if s := stepsOf(recs, "memory.create_entities"); len(s) != 1 || s[0][0].Decision != "allow" || s[0][1].Status != store.Succeeded ||
		s[0][1].CompensationTool != "memory.delete_entities" {
		t.Fatalf("create_entities steps %+v, want one allowed, succeeded, with its compensation", s)
	}
	for _, tool := range []string{"memory.search_nodes", "memory.open_nodes"} {
		if s := stepsOf(recs, tool); len(s) != 1 || s[0][0].Decision != "block" {
			t.Errorf("%s steps %+v, want one blocked", tool, s)
		}
	}

	// Kill the server with a call in flight: frozen first, so the call is surely in its stdin.
	server := first[0]
	if err := syscall.Kill(server, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		done <- call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
			map[string]any{"name": "bob", "entityType": "person", "observations": []any{}}}})
	}()
	waitStdinBytes(t, server)
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if res := <-done; !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "outcome is uncertain") {
		t.Errorf("create_entities in flight when the server died: %v", texts(res))
	}
	_, recs = onlyRun(t, f.store)
	s := stepsOf(recs, "memory.create_entities")
	if len(s) != 2 || s[1][0].Decision != "allow" || s[1][1].Status != store.Uncertain || !strings.Contains(s[1][1].Note, "the upstream did not answer") {
		t.Fatalf("create_entities steps %+v, want the second allowed with an uncertain outcome", s)
	}
	// The bridge logs before it closes the connection, but its stderr reaches b.log through a
	// pipe and a copying goroutine: the line may come a little after the call's end.
	until(t, 5*time.Second, func() string {
		if !strings.Contains(b.log.String(), fmt.Sprintf("the server (pid %d) exited (signal: killed): closing its connection", server)) {
			return "bridge log:\n" + b.log.String()
		}
		return ""
	})

	// The bridge starts a new server, the gateway reconnects to it, and calls pass again.
	until(t, 30*time.Second, func() string {
		if _, err := f.gw.upstreams[0].session(); err != nil || len(pidsIn(bridgeServing, b.log.String())) < 2 {
			return fmt.Sprintf("not reconnected (%v); bridge log:\n%s", err, b.log.String())
		}
		return ""
	})
	res = call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "carol", "entityType": "person", "observations": []any{}}}})
	if res.IsError {
		t.Fatalf("create_entities after the restart: %v", texts(res))
	}
	if res := call(t, cs, "memory.read_graph", map[string]any{}); !strings.Contains(strings.Join(texts(res), ""), "carol") {
		t.Fatalf("read_graph after the restart: %v", texts(res))
	}
	now := b.children()
	if len(now) != 2 || now[1] == server || !procAlive(now[1]) || procAlive(server) {
		t.Fatalf("servers %v (killed %d): want one new one running", now, server)
	}
	if !strings.Contains(f.stderr.String(), "upstream memory reconnected") {
		t.Errorf("gateway stderr lacks the reconnect:\n%s", f.stderr.String())
	}

	// SIGTERM to the bridge: its server stops with it, the socket goes.
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the bridge did not exit on SIGTERM:\n%s", b.log.String())
	}
	if ws := b.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() {
		t.Errorf("the bridge died of %v instead of exiting", ws.Signal())
	}
	for _, pid := range b.children() {
		if procAlive(pid) {
			t.Errorf("server-memory (pid %d) outlived the bridge", pid)
		}
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is left: %v", err)
	}
}

// TestSocketUpstreamPerClient: with session: per_client on both sides each agent session is
// its own connection, hence its own server-memory process (one more serves the gateway's
// listings), and an agent's process stops when its session ends while the others go on.
func TestSocketUpstreamPerClient(t *testing.T) {
	sock := filepath.Join(shortTemp(t), "memory.sock")
	b := startBridge(t, sock, "per_client")
	until(t, 15*time.Second, func() string {
		if !strings.Contains(b.log.String(), "listening on unix://"+sock) {
			return "the bridge is not listening:\n" + b.log.String()
		}
		return ""
	})
	cfg := &config.Gateway{Mode: config.ModeObserve, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{{Name: "memory", Socket: sock, Namespace: true, Session: config.SessionPerClient}}}
	f := start(t, cfg, nil)
	a, c := f.client(t), f.client(t)
	res := call(t, a, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "only-a", "entityType": "person", "observations": []any{}}}})
	if res.IsError {
		t.Fatalf("a: %v", texts(res))
	}
	if got := strings.Join(texts(call(t, a, "memory.read_graph", map[string]any{})), ""); !strings.Contains(got, "only-a") {
		t.Fatalf("a reads %s", got)
	}
	if res := call(t, c, "memory.read_graph", map[string]any{}); res.IsError {
		t.Fatalf("c: %v", texts(res))
	}
	var serving []int
	until(t, 10*time.Second, func() string {
		serving = pidsIn(bridgeServing, b.log.String())
		if len(serving) != 3 {
			return fmt.Sprintf("%d connections, want 3 (the gateway's and one per agent):\n%s", len(serving), b.log.String())
		}
		return ""
	})
	slices.Sort(serving)
	if len(slices.Compact(slices.Clone(serving))) != 3 {
		t.Fatalf("servers %v: want three processes", serving)
	}
	for _, pid := range serving {
		if !procAlive(pid) {
			t.Fatalf("server %d is not running", pid)
		}
	}
	_ = c.Close()
	until(t, 15*time.Second, func() string {
		n := 0
		for _, pid := range serving {
			if procAlive(pid) {
				n++
			}
		}
		if n != 2 {
			return fmt.Sprintf("%d of %v running after an agent session closed, want 2:\n%s", n, serving, b.log.String())
		}
		return ""
	})
	if res := call(t, a, "memory.read_graph", map[string]any{}); res.IsError {
		t.Fatalf("a after c left: %v", texts(res))
	}
}
