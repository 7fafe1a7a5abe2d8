//go:build linux

package stdiobridge

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/test/syncbuf"
)

// pidEcho is a real process that says its pid on its first line, then echoes its stdin (cat,
// in the same process: exec keeps the pid).
var pidEcho = []string{"/bin/sh", "-c", `echo "pid $$"; exec cat`}

// quick is a backoff short enough for tests, and long enough to be seen.
var quick = Backoff{Initial: 200 * time.Millisecond, Max: 400 * time.Millisecond, Reset: time.Minute}

// running is one in-process bridge (Run), with its log and a way to stop it as a signal would.
type running struct {
	path string
	log  *syncbuf.Buffer
	sigs chan os.Signal
	code chan int
}

func runBridge(t *testing.T, o Options) *running {
	t.Helper()
	if o.Listen == "" {
		o.Listen = "unix://" + filepath.Join(shortDir(t), "b.sock")
	}
	r := &running{path: strings.TrimPrefix(o.Listen, "unix://"), log: &syncbuf.Buffer{}, sigs: make(chan os.Signal, 4), code: make(chan int, 1)}
	o.Log, o.Signals = r.log, r.sigs
	if o.Backoff == (Backoff{}) {
		o.Backoff = quick
	}
	errc := make(chan error, 1)
	go func() {
		code, err := Run(context.Background(), o)
		errc <- err
		r.code <- code
	}()
	waitFor(t, 10*time.Second, func() string {
		select {
		case err := <-errc:
			t.Fatalf("Run: %v", err)
		default:
		}
		if !strings.Contains(r.log.String(), "listening on unix://"+r.path) {
			return "no listening line: " + r.log.String()
		}
		return ""
	})
	t.Cleanup(func() {
		select {
		case r.sigs <- syscall.SIGTERM:
		default:
		}
		select {
		case <-r.code:
		case <-time.After(20 * time.Second):
			t.Errorf("the bridge did not stop; log:\n%s", r.log.String())
		}
	})
	return r
}

// stop sends sig as the CLI forwards one, and returns the exit status.
func (r *running) stop(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	r.sigs <- sig
	select {
	case code := <-r.code:
		r.code <- code // for Cleanup
		return code
	case <-time.After(20 * time.Second):
		t.Fatalf("the bridge did not stop after %v; log:\n%s", sig, r.log.String())
		return 0
	}
}

// shortDir is a temporary folder with a short path (a socket path holds at most 107 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func waitFor(t *testing.T, d time.Duration, cond func() string) {
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

// echoConn is a connection to a pidEcho child.
type echoConn struct {
	net.Conn
	r   *bufio.Reader
	pid int
}

func dialEcho(t *testing.T, path string) *echoConn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	e := &echoConn{Conn: c, r: bufio.NewReader(c)}
	line := e.line(t)
	pid, err := strconv.Atoi(strings.TrimPrefix(line, "pid "))
	if err != nil {
		t.Fatalf("first line %q, want the child's pid", line)
	}
	e.pid = pid
	return e
}

func (e *echoConn) line(t *testing.T) string {
	t.Helper()
	_ = e.SetReadDeadline(time.Now().Add(10 * time.Second))
	l, err := e.r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the bridge: %v (got %q)", err, l)
	}
	return strings.TrimSuffix(l, "\n")
}

// echo writes a line and checks that the child echoes it back.
func (e *echoConn) echo(t *testing.T, msg string) {
	t.Helper()
	if _, err := io.WriteString(e, msg+"\n"); err != nil {
		t.Fatal(err)
	}
	if got := e.line(t); got != msg {
		t.Fatalf("echo %q, want %q", got, msg)
	}
}

// closed checks that the bridge closes the connection (EOF) within 10 s, reading nothing.
func closed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil || len(b) > 0 {
		t.Fatalf("%s: read %q, %v; want the bridge to close it (EOF)", what, b, err)
	}
}

// alive reports whether process pid exists and has not exited (a zombie has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || (s[i+2] != 'Z' && s[i+2] != 'X')
}

func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	waitFor(t, 15*time.Second, func() string {
		if alive(pid) {
			return fmt.Sprintf("%s (pid %d) is still running", what, pid)
		}
		return ""
	})
}

// TestShared: the child runs before any connection; a connection is its stdin and stdout; a
// second connection while one is served is closed at once with a log line and the first goes
// on; when the client closes, the child is stopped and a new one started at once, which serves
// the next connection; the socket is 0660 and is removed when the bridge stops, which exits
// with the child's status (cat killed by SIGTERM: 143).
func TestShared(t *testing.T) {
	r := runBridge(t, Options{Command: pidEcho})
	fi, err := os.Lstat(r.path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket %v %v, want a socket with mode 0660", fi.Mode(), err)
	}
	waitFor(t, 10*time.Second, func() string {
		if !strings.Contains(r.log.String(), "started the server (pid ") {
			return "the child was not started before any connection: " + r.log.String()
		}
		return ""
	})
	a := dialEcho(t, r.path)
	if !strings.Contains(r.log.String(), fmt.Sprintf("started the server (pid %d)", a.pid)) {
		t.Fatalf("the connection's child %d is not the one started at once:\n%s", a.pid, r.log.String())
	}
	a.echo(t, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)

	second, err := net.Dial("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	closed(t, second, "a second connection")
	if !strings.Contains(r.log.String(), "refused a connection: a connection is being served and --session shared serves one at a time") {
		t.Errorf("no refusal line:\n%s", r.log.String())
	}
	a.echo(t, "still served")

	_ = a.Close()
	waitGone(t, a.pid, "the closed connection's child")
	b := dialEcho(t, r.path)
	if b.pid == a.pid {
		t.Fatalf("the next connection got the old child %d", a.pid)
	}
	b.echo(t, "next")
	if code := r.stop(t, syscall.SIGTERM); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit status %d, want %d (the child's: cat ended by SIGTERM)", code, 128+int(syscall.SIGTERM))
	}
	closed(t, b, "the connection when the bridge stopped")
	waitGone(t, b.pid, "the child when the bridge stopped")
	if _, err := os.Lstat(r.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is still there after the bridge stopped: %v", err)
	}
}

// TestSharedReconnectWhileStopping: a client that reconnects as soon as it hung up, while its
// child is still being stopped, is held for the next child rather than refused (a gateway
// reconnecting at once must not lose its upstream to the bridge's own shutdown of the last one).
func TestSharedReconnectWhileStopping(t *testing.T) {
	// The child takes a while to exit after its stdin closed.
	r := runBridge(t, Options{Command: []string{"/bin/sh", "-c", `echo "pid $$"; cat; sleep 2`}})
	a := dialEcho(t, r.path)
	a.echo(t, "first")
	_ = a.Close()
	waitFor(t, 10*time.Second, func() string {
		if !strings.Contains(r.log.String(), fmt.Sprintf("the connection closed: stopping its server (pid %d)", a.pid)) {
			return "the bridge did not see the client hang up: " + r.log.String()
		}
		return ""
	})
	if !alive(a.pid) {
		t.Fatalf("the old child %d is gone already: the test needs it still stopping", a.pid)
	}
	b := dialEcho(t, r.path)
	if b.pid == a.pid {
		t.Fatalf("the next connection got the old child %d", a.pid)
	}
	b.echo(t, "second")
	if strings.Contains(r.log.String(), "refused a connection") {
		t.Errorf("a connection was refused:\n%s", r.log.String())
	}
	waitGone(t, a.pid, "the closed connection's child")
}

// TestSharedChildExit: when the child exits, its last bytes are delivered and then the
// connection is closed (the gateway sees the end of the stream); the child is started again
// after the backoff, doubling after each quick exit; a connection that arrives while it is
// restarting is held and served by the new child.
func TestSharedChildExit(t *testing.T) {
	r := runBridge(t, Options{Command: []string{"/bin/sh", "-c", `echo "pid $$"; read line; echo "bye $line"; exit 3`},
		Backoff: Backoff{Initial: 300 * time.Millisecond, Max: 600 * time.Millisecond, Reset: time.Minute}})
	a := dialEcho(t, r.path)
	if _, err := io.WriteString(a, "now\n"); err != nil {
		t.Fatal(err)
	}
	if got := a.line(t); got != "bye now" {
		t.Fatalf("last line %q, want %q", got, "bye now")
	}
	closed(t, a, "the connection of an exited child")
	waitFor(t, 5*time.Second, func() string {
		if !strings.Contains(r.log.String(), fmt.Sprintf("the server (pid %d) exited (exit status 3) after", a.pid)) ||
			!strings.Contains(r.log.String(), "starting it again in 300ms") {
			return "no exit and backoff line: " + r.log.String()
		}
		return ""
	})
	// Held while restarting, then served by the new child.
	b := dialEcho(t, r.path)
	if b.pid == a.pid {
		t.Fatal("same child")
	}
	if _, err := io.WriteString(b, "again\n"); err != nil {
		t.Fatal(err)
	}
	if got := b.line(t); got != "bye again" {
		t.Fatalf("%q", got)
	}
	closed(t, b, "the second child's connection")
	waitFor(t, 5*time.Second, func() string {
		if !strings.Contains(r.log.String(), "starting it again in 600ms") {
			return "the backoff did not double: " + r.log.String()
		}
		return ""
	})
	if code := r.stop(t, syscall.SIGTERM); code != 128+int(syscall.SIGTERM) && code != 3 {
		t.Errorf("exit status %d", code)
	}
}

// TestPerClient: one child per connection, each its own process; past --max-connections a
// connection is refused with a log line; closing a connection stops its child only; after
// many connections come and go no goroutine is left; SIGTERM stops every child and the
// bridge exits 0.
func TestPerClient(t *testing.T) {
	r := runBridge(t, Options{Command: pidEcho, Session: SessionPerClient, MaxConnections: 2})
	if strings.Contains(r.log.String(), "started the server") {
		t.Fatalf("per_client started a child before any connection:\n%s", r.log.String())
	}
	a, b := dialEcho(t, r.path), dialEcho(t, r.path)
	if a.pid == b.pid || !alive(a.pid) || !alive(b.pid) {
		t.Fatalf("children %d and %d: want two running processes", a.pid, b.pid)
	}
	a.echo(t, "to a")
	b.echo(t, "to b")
	third, err := net.Dial("unix", r.path)
	if err != nil {
		t.Fatal(err)
	}
	closed(t, third, "a connection past --max-connections")
	if !strings.Contains(r.log.String(), "refused a connection: 2 connections are being served, the most --max-connections allows") {
		t.Errorf("no refusal line:\n%s", r.log.String())
	}
	_ = a.Close()
	waitGone(t, a.pid, "the closed connection's child")
	if !alive(b.pid) {
		t.Fatal("closing one connection stopped the other's child")
	}
	b.echo(t, "b goes on")

	// No goroutine per connection is left once connections end.
	waitFor(t, 5*time.Second, func() string {
		if n := strings.Count(r.log.String(), "a connection ended"); n != 1 {
			return fmt.Sprintf("%d connections ended", n)
		}
		return ""
	})
	base := runtime.NumGoroutine()
	for i := range 10 {
		c := dialEcho(t, r.path)
		c.echo(t, strconv.Itoa(i))
		_ = c.Close()
		waitGone(t, c.pid, "a child")
	}
	waitFor(t, 10*time.Second, func() string {
		if n := strings.Count(r.log.String(), "a connection ended"); n != 11 {
			return fmt.Sprintf("%d connections ended, want 11", n)
		}
		if n := runtime.NumGoroutine(); n > base {
			return fmt.Sprintf("%d goroutines after 10 connections came and went, %d before", n, base)
		}
		return ""
	})

	if code := r.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("per_client exit status %d, want 0", code)
	}
	closed(t, b, "b when the bridge stopped")
	waitGone(t, b.pid, "b's child")
}

// TestSocketFile: a missing directory is made; a stale socket is removed (and said); a live
// one, or a file that is not a socket, is an error naming --listen and the path.
func TestSocketFile(t *testing.T) {
	dir := shortDir(t)
	stale := filepath.Join(dir, "new", "stale.sock")
	if err := os.MkdirAll(filepath.Dir(stale), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	_ = ln.Close() // a socket file nobody listens on, as a killed bridge leaves
	r := runBridge(t, Options{Listen: "unix://" + stale, Command: pidEcho})
	if !strings.Contains(r.log.String(), "removed the stale socket "+stale) {
		t.Errorf("no stale-socket line:\n%s", r.log.String())
	}
	dialEcho(t, stale).echo(t, "after the stale one")

	// A live socket (this bridge's) is not taken over.
	_, err = Run(context.Background(), Options{Listen: "unix://" + stale, Command: pidEcho})
	if err == nil || !strings.Contains(err.Error(), "--listen: "+stale+": another process is listening on it") {
		t.Errorf("a second bridge on a live socket: %v", err)
	}
	// Neither is a plain file.
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Options{Listen: "unix://" + plain, Command: pidEcho})
	if err == nil || !strings.Contains(err.Error(), "--listen: "+plain+" exists and is not a socket") {
		t.Errorf("a plain file: %v", err)
	}
	if b, _ := os.ReadFile(plain); string(b) != "data" {
		t.Error("the plain file was touched")
	}
	// A missing directory is made, 0750.
	deep := filepath.Join(dir, "a", "b", "c.sock")
	r2 := runBridge(t, Options{Listen: "unix://" + deep, Command: pidEcho})
	if fi, err := os.Stat(filepath.Dir(deep)); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("made directory: %v %v, want 0750", fi, err)
	}
	dialEcho(t, r2.path).echo(t, "deep")
}

// TestOptionErrors: every bad option is refused before anything starts, naming its flag.
func TestOptionErrors(t *testing.T) {
	long := "unix:///" + strings.Repeat("x", 120) + ".sock"
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Command: pidEcho}, "--listen: required: use unix:// and an absolute path"},
		{Options{Listen: "/run/x.sock", Command: pidEcho}, `--listen: "/run/x.sock" is not a unix:// address`},
		{Options{Listen: "tcp://127.0.0.1:80", Command: pidEcho}, `is not a unix:// address`},
		{Options{Listen: "unix://run/x.sock", Command: pidEcho}, `--listen: "unix://run/x.sock" names a host ("run")`},
		{Options{Listen: "unix:///run/", Command: pidEcho}, "does not name an absolute socket path"},
		{Options{Listen: "unix:///run/x.sock?mode=1", Command: pidEcho}, "has a query"},
		{Options{Listen: long, Command: pidEcho}, "over the 107 a Unix socket address holds"},
		{Options{Listen: "unix:///run/x.sock", Session: "pooled", Command: pidEcho}, `--session: "pooled" is not a session mode: use shared or per_client`},
		{Options{Listen: "unix:///run/x.sock", MaxConnections: 4, Command: pidEcho}, "--max-connections: 4, but --session shared serves one connection at a time"},
		{Options{Listen: "unix:///run/x.sock", Session: SessionPerClient, MaxConnections: -1, Command: pidEcho}, "--max-connections: -1 is negative"},
		{Options{Listen: "unix:///run/x.sock", GracePeriod: -time.Second, Command: pidEcho}, "--grace-period: -1s is negative"},
		{Options{Listen: "unix:///run/x.sock"}, "no server command: give it after --"},
		{Options{Listen: "unix:///run/x.sock", Command: []string{"no-such-server-xyz"}}, `the server command (after --): exec: "no-such-server-xyz": executable file not found`},
	} {
		_, err := Run(context.Background(), c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.o, err, c.want)
		}
	}
	if _, err := os.Stat("/run/x.sock"); err == nil {
		t.Error("a refused run made its socket")
	}
}

// The built reversi binary, for what only a separate process shows: the CLI's flags, signals
// from outside, and a bridge that is SIGKILLed. Its folder, binDir, is removed by TestMain
// (each run left an 80 MB binary in the temporary folder).
var binOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "reversi-bridge-bin")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "reversi")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/reversi-gitops/reversi").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func reversiBin(t *testing.T) string {
	t.Helper()
	bin, err := binOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// bridgeProc is `reversi stdio-bridge` run as a process.
type bridgeProc struct {
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	done chan struct{}
	path string
}

func startProc(t *testing.T, args ...string) *bridgeProc {
	t.Helper()
	p := &bridgeProc{log: &syncbuf.Buffer{}, done: make(chan struct{})}
	for i, a := range args {
		if a == "--listen" {
			p.path = strings.TrimPrefix(args[i+1], "unix://")
		}
	}
	p.cmd = exec.Command(reversiBin(t), append([]string{"stdio-bridge"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.WaitDelay = 2 * time.Second // an orphan holding the log pipe must not hold the test
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	waitFor(t, 15*time.Second, func() string {
		select {
		case <-p.done:
			t.Fatalf("the bridge exited: %s", p.log.String())
		default:
		}
		if !strings.Contains(p.log.String(), "started the server (pid ") {
			return "not ready: " + p.log.String()
		}
		return ""
	})
	return p
}

var startedPID = regexp.MustCompile(`started the server \(pid (\d+)\)`)

// childPIDs are the pids of the children the bridge said it started, in order.
func (p *bridgeProc) childPIDs() []int {
	var out []int
	for _, m := range startedPID.FindAllStringSubmatch(p.log.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

func (p *bridgeProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(20 * time.Second):
		t.Fatalf("the bridge did not exit:\n%s", p.log.String())
		return 0
	}
}

// TestProcessSignals: as a process, SIGTERM to the bridge reaches its child, which exits 7, and
// the bridge exits 7 with the socket removed and no child left; a child that ignores SIGTERM
// gets SIGKILL after --grace-period (exit 137); and SIGINT in per_client stops every child.
func TestProcessSignals(t *testing.T) {
	dir := shortDir(t)
	trap := []string{"--", "/bin/sh", "-c", `trap 'exit 7' TERM; echo "pid $$"; while :; do sleep 0.05; done`}
	p := startProc(t, append([]string{"--listen", "unix://" + filepath.Join(dir, "a.sock")}, trap...)...)
	child := p.childPIDs()[0]
	c := dialEcho(t, p.path)
	if c.pid != child {
		t.Fatalf("connection's child %d, started %d", c.pid, child)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 7 {
		t.Errorf("exit status %d, want the child's 7:\n%s", code, p.log.String())
	}
	closed(t, c, "the connection")
	waitGone(t, child, "the child after SIGTERM")
	if _, err := os.Lstat(p.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left: %v", err)
	}
	if !strings.Contains(p.log.String(), "got terminated: forwarding it to 1 server process(es)") {
		t.Errorf("log:\n%s", p.log.String())
	}

	stubborn := startProc(t, "--listen", "unix://"+filepath.Join(dir, "b.sock"), "--grace-period", "300ms",
		"--", "/bin/sh", "-c", `trap '' TERM; echo "pid $$"; while :; do sleep 0.05; done`)
	child = stubborn.childPIDs()[0]
	dialEcho(t, stubborn.path) // its first line comes after the trap is set
	t0 := time.Now()
	_ = stubborn.cmd.Process.Signal(syscall.SIGTERM)
	if code := stubborn.wait(t); code != 128+int(syscall.SIGKILL) {
		t.Errorf("exit status %d, want 137 (SIGKILL after the grace period):\n%s", code, stubborn.log.String())
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Errorf("SIGKILL after %s, before the grace period", d)
	}
	if !strings.Contains(stubborn.log.String(), "did not exit within --grace-period 300ms: sending SIGKILL") {
		t.Errorf("log:\n%s", stubborn.log.String())
	}
	waitGone(t, child, "the stubborn child")

	pc := startProcNoChild(t, "--listen", "unix://"+filepath.Join(dir, "c.sock"), "--session", "per_client", "--", pidEcho[0], pidEcho[1], pidEcho[2])
	x, y := dialEcho(t, pc.path), dialEcho(t, pc.path)
	_ = pc.cmd.Process.Signal(syscall.SIGINT)
	if code := pc.wait(t); code != 0 {
		t.Errorf("per_client exit status %d, want 0:\n%s", code, pc.log.String())
	}
	waitGone(t, x.pid, "per_client child x")
	waitGone(t, y.pid, "per_client child y")
}

// startProcNoChild is startProc for per_client, which starts no child until a connection.
func startProcNoChild(t *testing.T, args ...string) *bridgeProc {
	t.Helper()
	p := &bridgeProc{log: &syncbuf.Buffer{}, done: make(chan struct{})}
	for i, a := range args {
		if a == "--listen" {
			p.path = strings.TrimPrefix(args[i+1], "unix://")
		}
	}
	p.cmd = exec.Command(reversiBin(t), append([]string{"stdio-bridge"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.WaitDelay = 2 * time.Second // an orphan holding the log pipe must not hold the test
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	waitFor(t, 15*time.Second, func() string {
		if !strings.Contains(p.log.String(), "listening on unix://"+p.path) {
			return "not listening: " + p.log.String()
		}
		return ""
	})
	return p
}

// TestProcessKilled: a SIGKILLed bridge cannot forward anything, yet its child (one that
// neither reads stdin nor writes, so the end of its pipes would not stop it) does not outlive
// it: the parent-death signal; and the next bridge on the same path removes the stale socket.
func TestProcessKilled(t *testing.T) {
	sock := filepath.Join(shortDir(t), "k.sock")
	deaf := []string{"--", "/bin/sh", "-c", `echo "pid $$"; exec sleep 600`}
	p := startProc(t, append([]string{"--listen", "unix://" + sock}, deaf...)...)
	c := dialEcho(t, sock)
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	waitGone(t, c.pid, "the child of a SIGKILLed bridge")
	closed(t, c, "the connection of a SIGKILLed bridge")
	q := startProc(t, "--listen", "unix://"+sock, "--", pidEcho[0], pidEcho[1], pidEcho[2])
	if !strings.Contains(q.log.String(), "removed the stale socket "+sock) {
		t.Errorf("log:\n%s", q.log.String())
	}
	dialEcho(t, sock).echo(t, "after")
}

// TestCLIErrors: the command's own errors (the command after --) and Run's, as a user sees
// them: exit status 1 and one line naming the flag.
func TestCLIErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "unix:///tmp/x.sock"}, "error: give the server's command after --: reversi stdio-bridge --listen unix:///run/reversi/NAME.sock [--session shared|per_client] -- COMMAND [ARGS...]"},
		{[]string{"--listen", "unix:///tmp/x.sock", "cat"}, "error: give the server's command after --"},
		{[]string{"--listen", "unix:///tmp/x.sock", "extra", "--", "cat"}, `error: arguments before --: ["extra"]`},
		{[]string{"--", "cat"}, "error: --listen: required"},
		{[]string{"--listen", "unix:///tmp/x.sock", "--session", "per-agent", "--", "cat"}, `error: --session: "per-agent" is not a session mode`},
		{[]string{"--listen", "unix:///tmp/x.sock", "--max-connections", "many", "--", "cat"}, `invalid argument "many" for "--max-connections"`},
		{[]string{"--listen", "unix:///tmp/x.sock", "--", "no-such-server-xyz"}, `error: the server command (after --): exec: "no-such-server-xyz"`},
	} {
		out, err := exec.Command(reversiBin(t), append([]string{"stdio-bridge"}, c.args...)...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), c.want) {
			t.Errorf("%q: %v %q, want exit status 1 and %q", c.args, err, out, c.want)
		}
	}
	help, err := exec.Command(reversiBin(t), "stdio-bridge", "--help").CombinedOutput()
	for _, flag := range []string{"--listen", "--session", "--max-connections", "--grace-period", "0660"} {
		if err != nil || !strings.Contains(string(help), flag) {
			t.Errorf("--help lacks %s: %v\n%s", flag, err, help)
		}
	}
}

// TestProcessReapsOrphans: a process the server started and left (its parent exited) comes to
// the bridge, a child subreaper as PID 1 of a container would be, and is reaped when it exits:
// no zombie stays; the server itself is still waited for by the bridge (its exit is logged
// with its status).
func TestProcessReapsOrphans(t *testing.T) {
	sock := filepath.Join(shortDir(t), "r.sock")
	p := startProc(t, "--listen", "unix://"+sock, "--", "/bin/sh", "-c", `(sleep 0.3 &); echo "pid $$"; read x; exit 5`)
	c := dialEcho(t, sock)
	zombies := func() []string {
		var out []string
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			i := strings.LastIndexByte(string(stat), ')')
			if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(p.cmd.Process.Pid) && f[0] == "Z" {
				out = append(out, e.Name())
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, func() string {
		if !strings.Contains(p.log.String(), "reaped process ") {
			return fmt.Sprintf("the orphaned sleep was not reaped (zombies %v):\n%s", zombies(), p.log.String())
		}
		return ""
	})
	if z := zombies(); len(z) > 0 {
		t.Errorf("zombies of the bridge: %v", z)
	}
	if _, err := io.WriteString(c, "go\n"); err != nil {
		t.Fatal(err)
	}
	closed(t, c, "the server's connection")
	waitFor(t, 10*time.Second, func() string {
		if !strings.Contains(p.log.String(), fmt.Sprintf("the server (pid %d) exited (exit status 5)", c.pid)) {
			return "the server's own exit was not seen:\n" + p.log.String()
		}
		return ""
	})
}

// TestSocketSymlinkRefused: a symlink planted at the socket path (to a stale socket elsewhere,
// or to another bridge's live one) is not followed: the bridge neither removes its target nor
// listens through it.
func TestSocketSymlinkRefused(t *testing.T) {
	dir := shortDir(t)
	target := filepath.Join(dir, "target.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: target, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	_ = ln.Close() // stale: a bridge that followed the link would remove it
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Options{Listen: "unix://" + link, Command: pidEcho})
	if err == nil || !strings.Contains(err.Error(), "--listen: "+link+" exists and is not a socket") {
		t.Errorf("a symlink at the socket path: %v", err)
	}
	if fi, err := os.Lstat(target); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the symlink's target was removed or changed: %v %v", fi, err)
	}
}
