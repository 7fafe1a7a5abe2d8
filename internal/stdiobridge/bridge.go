//go:build unix

// Package stdiobridge is `reversi stdio-bridge` (issue 23): it runs a stdio MCP server as its
// child and serves it on a Unix socket, so that a gateway in another container of the pod
// reaches it as a `socket:` upstream, with no network port and no API rights (DESIGN.md, "stdio
// servers in pods"). It is the entrypoint of a ReversiGateway's server sidecar:
//
//	reversi stdio-bridge --listen unix:///run/reversi/<name>.sock [--session shared|per_client] -- <command> <args>
//
// What it guarantees:
//
//   - One connection is one child's stdin and stdout, byte for byte (MCP's stdio framing is
//     newline-delimited JSON-RPC; the bridge does not parse it). It never holds a line: bytes are
//     copied through a 32 KiB buffer in each direction, so a long line costs it nothing and the
//     gateway's limits.message_bytes is the only limit on a message (the gateway discards an
//     oversized answer itself and fails only the call it answers). The child's stderr is the
//     bridge's stderr (the container's log).
//   - A connection never outlives its child: when the child exits, what it wrote is delivered,
//     then the connection is closed, so the gateway sees the end of the stream (and journals
//     a call in flight `uncertain`). A child never outlives its connection either: when the
//     client closes the connection, the child's stdin is closed, then after StopWait it gets
//     SIGTERM, then after the grace period SIGKILL. So each connection is a fresh MCP session of
//     a fresh process, as a gateway's command upstream is.
//   - shared (the default): one child at a time, started at once (a server slow to start is
//     ready when the gateway connects) and again as soon as the previous one stopped. One
//     connection is served at a time: a second connection while one is served is closed at once
//     with a log line ("refused a connection: ... --session shared serves one at a time"); the
//     gateway's shared upstream uses one connection, so a second is a misconfiguration (a gateway
//     with session: per_client against a shared bridge) or someone else. A child that exits on
//     its own is started again after a backoff (Backoff: doubling from Initial to Max, back to
//     Initial once a child ran Reset); one connection that arrives meanwhile is held and served
//     by the next child, others are refused. So is one that arrives after the served client
//     hung up while its child is being stopped (a client reconnecting at once is not refused).
//   - per_client: one child per connection, started when it is accepted, at most
//     --max-connections at once (the others refused with a log line); it is not restarted: its
//     connection ends with it.
//   - SIGTERM and SIGINT are forwarded to every child (to its process group). The bridge stops
//     accepting, waits for the children to exit (SIGKILL after the grace period), closes the
//     connections, removes the socket, and exits: with the status of the shared child (128+n
//     when a signal n ended it), 0 for per_client.
//   - No child is left behind: each child is the leader of its own process group, which gets
//     SIGKILL once the child has exited (so what the server started stops with it), and on
//     Linux each child has SIGKILL as its parent-death signal, so a SIGKILLed bridge takes its
//     children with it. (Processes those children started survive a SIGKILLed bridge; in a pod
//     the container's end stops them.)
//   - With Options.Reap (the CLI) the bridge is a child subreaper and reaps the processes its
//     servers leave behind (as PID 1 of its container it gets them anyway).
//   - The socket is created with mode 0660 (in a directory created 0750 if missing): owner and
//     group may connect, others not. In a pod the gateway and the server sidecar may run as
//     different users; they share the pod's fsGroup, which owns the emptyDir the socket is in
//     (and, by its setgid bit, the socket), so 0600 would lock the gateway out. A stale socket
//     (nobody listening) is removed; a live one, or a file that is not a socket, is an error.
//   - Readiness: one line "listening on unix://<path>" on stderr once the socket accepts.
package stdiobridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"
)

// The values of --session.
const (
	SessionShared    = "shared"
	SessionPerClient = "per_client"
)

// Defaults of the flags.
const (
	// DefaultMaxConnections is --max-connections for per_client: children at once.
	DefaultMaxConnections = 32
	// DefaultGracePeriod is --grace-period: how long a child has to exit after SIGTERM (or a
	// forwarded signal) before it gets SIGKILL. Below Kubernetes' default
	// terminationGracePeriodSeconds (30 s), so the bridge kills its child before the kubelet
	// kills the bridge.
	DefaultGracePeriod = 10 * time.Second
	// StopWait is how long a child whose connection closed has to exit on the end of its stdin
	// before it gets SIGTERM (servers exit on EOF; some ignore it).
	StopWait = time.Second
	// maxSocketPath is the longest socket path a Unix socket address holds (sun_path, less its
	// terminating NUL).
	maxSocketPath = 107
)

// Backoff is the restart backoff of a shared child that exited on its own.
type Backoff struct {
	// Initial is the first wait, doubled after each quick exit up to Max; a child that ran at
	// least Reset before it exited resets it.
	Initial, Max, Reset time.Duration
}

// DefaultBackoff is 250 ms doubling to 30 s, reset after a child ran a minute.
var DefaultBackoff = Backoff{Initial: 250 * time.Millisecond, Max: 30 * time.Second, Reset: time.Minute}

// Options are the flags of `reversi stdio-bridge` and what the command wires in.
type Options struct {
	// Listen is --listen: unix:// and the socket's absolute path.
	Listen string
	// Session is --session: SessionShared ("" too) or SessionPerClient.
	Session string
	// MaxConnections is --max-connections: per_client children at once (0:
	// DefaultMaxConnections); shared serves one, so only 0 or 1 is accepted there.
	MaxConnections int
	// GracePeriod is --grace-period (0: DefaultGracePeriod).
	GracePeriod time.Duration
	// Command is the server's command line (after --). Children inherit the bridge's
	// environment: in a sidecar it is the server's.
	Command []string
	// Log receives the bridge's log lines and the children's stderr.
	Log io.Writer
	// Signals are forwarded to the children; the first one also stops the bridge.
	Signals <-chan os.Signal
	// Backoff is the shared child's restart backoff (zero: DefaultBackoff).
	Backoff Backoff
	// Reap makes the bridge reap the orphans its servers leave (Linux: it becomes a child
	// subreaper; see startReaper). Only for a process that is the bridge and nothing else (the
	// CLI): it waits for any exited child that is not a server.
	Reap bool
}

// Check validates the options; each error names its flag.
func (o *Options) Check() (socketPath string, err error) {
	var errs []error
	socketPath, perr := SocketPath(o.Listen)
	if perr != nil {
		errs = append(errs, perr)
	}
	switch o.Session {
	case "", SessionShared:
		if o.MaxConnections > 1 {
			errs = append(errs, fmt.Errorf("--max-connections: %d, but --session shared serves one connection at a time: use --session per_client for more", o.MaxConnections))
		}
	case SessionPerClient:
	default:
		errs = append(errs, fmt.Errorf("--session: %q is not a session mode: use shared or per_client", o.Session))
	}
	if o.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("--max-connections: %d is negative: give at least 1 (0 means %d for per_client)", o.MaxConnections, DefaultMaxConnections))
	}
	if o.GracePeriod < 0 {
		errs = append(errs, fmt.Errorf("--grace-period: %s is negative", o.GracePeriod))
	}
	if len(o.Command) == 0 || o.Command[0] == "" {
		errs = append(errs, errors.New("no server command: give it after --, e.g. reversi stdio-bridge --listen unix:///run/reversi/memory.sock -- node server.js"))
	}
	return socketPath, errors.Join(errs...)
}

// SocketPath is the socket path of a --listen value: unix:// followed by an absolute path
// (unix:///run/reversi/x.sock).
func SocketPath(listen string) (string, error) {
	const want = "use unix:// and an absolute path, e.g. --listen unix:///run/reversi/memory.sock"
	if listen == "" {
		return "", errors.New("--listen: required: " + want)
	}
	u, err := url.Parse(listen)
	switch {
	case err != nil:
		return "", fmt.Errorf("--listen: %q: %v: %s", listen, err, want)
	case u.Scheme != "unix":
		return "", fmt.Errorf("--listen: %q is not a unix:// address: %s", listen, want)
	case u.Host != "" || u.Opaque != "":
		return "", fmt.Errorf("--listen: %q names a host (%q): %s (three slashes)", listen, u.Host+u.Opaque, want)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return "", fmt.Errorf("--listen: %q has a query, fragment or user: %s", listen, want)
	case !filepath.IsAbs(u.Path) || strings.HasSuffix(u.Path, "/"):
		return "", fmt.Errorf("--listen: %q does not name an absolute socket path: %s", listen, want)
	}
	p := filepath.Clean(u.Path)
	if len(p) > maxSocketPath {
		return "", fmt.Errorf("--listen: the socket path %s is %d bytes, over the %d a Unix socket address holds: use a shorter one", p, len(p), maxSocketPath)
	}
	return p, nil
}

// Run runs the bridge until a signal (Options.Signals) or ctx's end (taken as SIGTERM) stops
// it, and returns its exit status (see the package comment). An error means it could not
// start: bad options (naming the flag), a command that cannot be found, a socket that cannot
// be made.
func Run(ctx context.Context, o Options) (int, error) {
	path, err := o.Check()
	if err != nil {
		return 0, err
	}
	if _, err := exec.LookPath(o.Command[0]); err != nil {
		return 0, fmt.Errorf("the server command (after --): %w", err)
	}
	if o.Session == "" {
		o.Session = SessionShared
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = DefaultMaxConnections
		if o.Session == SessionShared {
			o.MaxConnections = 1
		}
	}
	if o.GracePeriod == 0 {
		o.GracePeriod = DefaultGracePeriod
	}
	if o.Backoff == (Backoff{}) {
		o.Backoff = DefaultBackoff
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	b := &bridge{o: o, path: path, log: &lockedWriter{w: o.Log}, children: map[*child]struct{}{},
		stop: make(chan struct{}), conns: make(chan net.Conn), refusals: rate.Sometimes{First: 10, Interval: 10 * time.Second}}
	ln, err := b.listen()
	if err != nil {
		return 0, err
	}
	b.spawn = newSpawner()
	defer b.spawn.close()
	if o.Reap {
		defer b.startReaper()()
	}
	acceptDone := make(chan struct{})
	go b.accept(ln, acceptDone)
	finished := make(chan struct{})
	defer close(finished)
	go b.watch(ctx, finished)
	b.logf("listening on unix://%s (session %s, at most %d connection(s); server: %s)", path, o.Session, o.MaxConnections, strings.Join(o.Command, " "))

	var code int
	if o.Session == SessionShared {
		code = b.runShared(ln)
	} else {
		code = b.runPerClient(ln)
	}
	_ = ln.Close() // removes the socket file
	<-acceptDone
	b.logf("stopped; exit status %d", code)
	return code, nil
}

// bridge is one run of the bridge.
type bridge struct {
	o     Options
	path  string
	log   *lockedWriter
	spawn *spawner

	conns    chan net.Conn  // accepted connections, for the run loop
	stop     chan struct{}  // closed by the first signal
	refusals rate.Sometimes // bounds the log lines of refused connections

	spawnMu  sync.Mutex // held from a child's start to its registration (the reaper must not take it)
	mu       sync.Mutex
	children map[*child]struct{} // running children, for signal forwarding
	stopping bool
	stopSig  syscall.Signal
}

func (b *bridge) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "reversi stdio-bridge: "+format+"\n", args...)
}

// listen makes the socket: the directory if missing, a stale socket removed, mode 0660.
func (b *bridge) listen() (*net.UnixListener, error) {
	dir := filepath.Dir(b.path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("--listen: making the socket's directory: %w", err)
	}
	if fi, err := os.Lstat(b.path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--listen: %s exists and is not a socket (%s): remove it or listen elsewhere", b.path, fi.Mode().Type())
		}
		c, derr := net.DialTimeout("unix", b.path, time.Second)
		if derr == nil {
			_ = c.Close()
			return nil, fmt.Errorf("--listen: %s: another process is listening on it (a second bridge?)", b.path)
		}
		if err := os.Remove(b.path); err != nil {
			return nil, fmt.Errorf("--listen: removing the stale socket %s: %w", b.path, err)
		}
		b.logf("removed the stale socket %s (%v)", b.path, derr)
	}
	old := syscall.Umask(0o117) // the socket is born 0660: no moment with wider rights
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: b.path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	if err := os.Chmod(b.path, 0o660); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("--listen: %w", err)
	}
	return ln, nil
}

// accept hands accepted connections to the run loop until the listener closes.
func (b *bridge) accept(ln *net.UnixListener, done chan<- struct{}) {
	defer close(done)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			b.logf("accept: %v", err) // e.g. EMFILE: wait a little rather than spin
			select {
			case <-b.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case b.conns <- c:
		case <-b.stop:
			_ = c.Close()
			return
		}
	}
}

// watch forwards signals to the children; the first one (or ctx's end, as SIGTERM) stops the
// bridge.
func (b *bridge) watch(ctx context.Context, finished <-chan struct{}) {
	done := ctx.Done()
	for {
		var sig syscall.Signal
		select {
		case <-finished:
			return
		case <-done:
			done = nil
			sig = syscall.SIGTERM
		case s, ok := <-b.o.Signals:
			if !ok {
				b.o.Signals = nil
				continue
			}
			ss, isSys := s.(syscall.Signal)
			if !isSys {
				continue
			}
			sig = ss
		}
		b.mu.Lock()
		b.logf("got %v: forwarding it to %d server process(es)", sig, len(b.children))
		for c := range b.children {
			c.signal(sig)
		}
		if !b.stopping {
			b.stopping, b.stopSig = true, sig
			close(b.stop)
		}
		b.mu.Unlock()
	}
}

// refuse closes a connection the bridge will not serve, saying why (rate-limited).
func (b *bridge) refuse(c net.Conn, why string) {
	b.refusals.Do(func() { b.logf("refused a connection: %s", why) })
	_ = c.Close()
}

// runShared is the shared mode's loop (see the package comment).
func (b *bridge) runShared(ln *net.UnixListener) int {
	delay := b.o.Backoff.Initial
	var held net.Conn // a connection that came while the server was restarting
	code := 0         // the status of the last child
	for {
		c, err := b.startChild()
		if err != nil {
			b.logf("could not start the server: %v", err)
		} else {
			p, stopped := b.serveShared(c, &held)
			code = c.status()
			if stopped {
				_ = ln.Close()
				if held != nil {
					_ = held.Close()
				}
				return code
			}
			if p != nil && p.hungUp {
				// The client closed its connection and the child was stopped for it: the next
				// one starts at once.
				delay = b.o.Backoff.Initial
				continue
			}
			ran := time.Since(c.started)
			if ran >= b.o.Backoff.Reset {
				delay = b.o.Backoff.Initial
			}
			b.logf("the server (pid %d) exited (%s) after %s; starting it again in %s", c.pid, c.state(), ran.Round(time.Millisecond), delay)
		}
		// Back off; hold one connection for the next child.
		timer := time.NewTimer(delay)
	wait:
		for {
			select {
			case conn := <-b.conns:
				if held == nil {
					held = conn
				} else {
					b.refuse(conn, "the server is restarting and a connection is already waiting for it (--session shared serves one at a time)")
				}
			case <-timer.C:
				break wait
			case <-b.stop:
				timer.Stop()
				_ = ln.Close()
				if held != nil {
					_ = held.Close()
				}
				return code
			}
		}
		delay = min(2*delay, b.o.Backoff.Max)
	}
}

// serveShared serves connections with child c until it has exited: it returns the pair that
// served the last connection (nil: none) and whether the bridge is stopping.
func (b *bridge) serveShared(c *child, held *net.Conn) (*pair, bool) {
	var p *pair
	if *held != nil {
		p, *held = b.bridgePair(*held, c), nil
	}
	exited := c.done
	for {
		var pdone <-chan struct{}
		if p != nil {
			pdone = p.done
		}
		select {
		case conn := <-b.conns:
			switch {
			case p == nil:
				p = b.bridgePair(conn, c)
			case p.clientClosed.Load() && *held == nil:
				// The served client hung up and its child is being stopped: the next child
				// serves this one (a client that reconnects at once is not refused).
				*held = conn
			default:
				b.refuse(conn, "a connection is being served and --session shared serves one at a time")
			}
		case <-pdone:
			return p, false
		case <-exited:
			if p == nil {
				return nil, false
			}
			exited = nil // the pair delivers the child's last bytes, then ends
		case <-b.stop:
			b.awaitChild(c)
			if p != nil {
				<-p.done
			}
			return p, true
		}
	}
}

// runPerClient is the per_client mode's loop.
func (b *bridge) runPerClient(ln *net.UnixListener) int {
	active := map[*pair]struct{}{}
	ended := make(chan *pair)
	for {
		select {
		case conn := <-b.conns:
			if len(active) >= b.o.MaxConnections {
				b.refuse(conn, fmt.Sprintf("%d connections are being served, the most --max-connections allows", b.o.MaxConnections))
				continue
			}
			c, err := b.startChild()
			if err != nil {
				b.logf("could not start a server for a connection: %v; closing it", err)
				_ = conn.Close()
				continue
			}
			p := b.bridgePair(conn, c)
			active[p] = struct{}{}
			go func() { <-p.done; ended <- p }()
		case p := <-ended:
			delete(active, p)
			b.logf("a connection ended; its server (pid %d) exited (%s)", p.c.pid, p.c.state())
		case <-b.stop:
			_ = ln.Close()
			for p := range active {
				go b.awaitChild(p.c)
			}
			for len(active) > 0 {
				delete(active, <-ended)
			}
			return 0
		}
	}
}

// awaitChild waits for c to exit after a signal was forwarded to it, sending SIGKILL when the
// grace period passes first.
func (b *bridge) awaitChild(c *child) {
	select {
	case <-c.done:
		return
	case <-time.After(b.o.GracePeriod):
	}
	b.logf("the server (pid %d) did not exit within --grace-period %s: sending SIGKILL", c.pid, b.o.GracePeriod)
	c.signal(syscall.SIGKILL)
	<-c.done
}

// stopChild stops a child whose connection closed: its stdin is closed, then after StopWait it
// gets SIGTERM, then after the grace period SIGKILL.
func (b *bridge) stopChild(c *child) {
	_ = c.stdin.Close()
	select {
	case <-c.done:
		return
	case <-time.After(StopWait):
	}
	c.signal(syscall.SIGTERM)
	b.awaitChild(c)
}

// pair is one connection bridged to one child.
type pair struct {
	conn   net.Conn
	c      *child
	done   chan struct{} // closed when both copies ended, the child exited and conn is closed
	hungUp bool          // the client closed the connection first (set before done closes)
	// clientClosed is set as soon as the client closed the connection, before its child is stopped.
	clientClosed atomic.Bool
}

// bridgePair copies conn to the child's stdin and the child's stdout to conn until either
// ends, then ends the other (see the package comment). Its goroutines end with it.
func (b *bridge) bridgePair(conn net.Conn, c *child) *pair {
	p := &pair{conn: conn, c: c, done: make(chan struct{})}
	b.logf("serving a connection with the server (pid %d)", c.pid)
	in := make(chan error, 1)  // conn → stdin ended: nil when the client closed, else the failed side
	out := make(chan struct{}) // stdout → conn ended
	go func() { in <- copyIn(c.stdin, conn) }()
	go func() { _, _ = io.Copy(conn, c.stdout); close(out) }()
	go func() {
		defer close(p.done)
		inDone := false
		select {
		case err := <-in:
			inDone = true
			if err == nil || errors.Is(err, errClientRead) {
				p.hungUp = true
				p.clientClosed.Store(true)
				b.logf("the connection closed: stopping its server (pid %d)", c.pid)
				b.stopChild(c)
			} // else the child's stdin broke: it is exiting
		case <-out: // the child closed its stdout: it is exiting
		case <-c.done:
		}
		if !p.hungUp {
			select {
			case <-c.done:
			case <-time.After(b.o.GracePeriod):
				b.logf("the server (pid %d) closed its stdout or stdin but did not exit within --grace-period %s: sending SIGTERM", c.pid, b.o.GracePeriod)
				c.signal(syscall.SIGTERM)
				b.awaitChild(c)
			}
		}
		if !p.hungUp {
			b.logf("the server (pid %d) exited (%s): closing its connection", c.pid, c.state())
		}
		// The child has exited: deliver what it wrote (a process it left holding stdout
		// open gets StopWait), then close the connection.
		select {
		case <-out:
		case <-time.After(StopWait):
		}
		_ = conn.Close()
		_ = c.stdout.Close()
		<-out
		if !inDone {
			<-in
		}
		_ = c.stdin.Close()
	}()
	return p
}

// errClientRead marks copyIn's error when reading the client failed (a reset connection).
var errClientRead = errors.New("reading the connection")

// copyIn copies the client's bytes to the child's stdin: nil when the client closed the
// connection, errClientRead (wrapped) when reading it failed, or the write's error.
func copyIn(stdin io.Writer, conn net.Conn) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if _, werr := stdin.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %w", errClientRead, err)
		}
	}
}

// lockedWriter serialises the bridge's log lines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
