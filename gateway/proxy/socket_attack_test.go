//go:build linux

package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// TestSocketRefusesSymlink: in a ReversiGateway pod each sidecar's socket folder is its own
// emptyDir, writable by the server it runs, and mounted in the gateway container at
// /run/reversi/<name>/. A hostile server can replace its socket by a symlink to
// /run/reversi/<other>/<other>.sock, a path that exists only in the gateway container: if the
// gateway followed it, the calls meant for (and manifests of) one upstream would go to
// another server, and that server's one shared connection would be taken. The gateway must
// connect only to a socket that is the path itself.
func TestSocketRefusesSymlink(t *testing.T) {
	dir := shortTemp(t)
	for _, d := range []string{"a", "b"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(dir, "b", "b.sock")
	l, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	accepted := make(chan struct{}, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			_ = c.Close()
		}
	}()
	transport := func(path string) *stdioTransport {
		return &stdioTransport{socket: path, name: "a", limit: 1 << 20, terminate: time.Second,
			warn: func(string, ...any) {}, hit: func(string) {}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	link := filepath.Join(dir, "a", "a.sock")
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}
	c, err := transport(link).Connect(ctx)
	if err == nil {
		_ = c.Close()
		t.Fatal("the gateway followed a symlink at the socket path to another upstream's socket")
	}
	if !strings.Contains(err.Error(), "symlink") {
		t.Errorf("error %q does not say the path is a symlink", err)
	}
	select {
	case <-accepted:
		t.Fatal("the other upstream's socket was connected to")
	default:
	}

	// A regular file, a folder: not a socket, refused at once (not waited for).
	file := filepath.Join(dir, "a", "file.sock")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if c, err := transport(file).Connect(ctx); err == nil {
		_ = c.Close()
		t.Error("connected to a regular file")
	} else if time.Since(start) > time.Second {
		t.Errorf("a regular file was retried until the deadline: %v", err)
	}

	// The socket itself still connects.
	c, err = transport(other).Connect(ctx)
	if err != nil {
		t.Fatalf("the genuine socket: %v", err)
	}
	_ = c.Close()
	select {
	case <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("the genuine socket was not connected to")
	}

	// A socket that is not there yet is waited for, as before.
	late := filepath.Join(dir, "a", "late.sock")
	go func() {
		time.Sleep(300 * time.Millisecond)
		if l2, err := net.Listen("unix", late); err == nil {
			t.Cleanup(func() { _ = l2.Close() })
			go func() {
				for {
					c, err := l2.Accept()
					if err != nil {
						return
					}
					_ = c.Close()
				}
			}()
		}
	}()
	c, err = transport(late).Connect(ctx)
	if err != nil {
		t.Fatalf("a socket that appears later: %v", err)
	}
	_ = c.Close()
}

// flappingServer listens on sock and serves each connection as a minimal MCP server: it
// answers initialize and tools/list (no tools), then closes the connection when closeAfter
// says so. It returns the count of connections accepted.
func flappingServer(t *testing.T, sock string, closeAfterList bool) *atomic.Int64 {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					var m struct {
						ID     json.RawMessage `json:"id"`
						Method string          `json:"method"`
					}
					if json.Unmarshal(sc.Bytes(), &m) != nil || m.ID == nil {
						continue
					}
					var result string
					switch m.Method {
					case "initialize":
						result = `{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"flap","version":"1"}}`
					case "tools/list":
						result = `{"tools":[]}`
					default:
						result = `{}`
					}
					fmt.Fprintf(c, `{"jsonrpc":"2.0","id":%s,"result":%s}`+"\n", m.ID, result)
					if m.Method == "tools/list" && closeAfterList {
						return
					}
				}
			}()
		}
	}()
	return &n
}

// TestSocketFlappingServerIsBackedOff: a hostile server (or any process that has the socket)
// that completes the handshake and closes the connection at once, again and again, must not
// have the gateway reconnect (and journal a note, and list again) as fast as it can: each
// reconnect is a note in the gateway journal, which a PVC holds. Reconnects after a session
// that lived only briefly keep backing off.
func TestSocketFlappingServerIsBackedOff(t *testing.T) {
	sock := filepath.Join(shortTemp(t), "flap.sock")
	n := flappingServer(t, sock, true)
	cfg := &config.Gateway{Mode: config.ModeObserve, UnclassifiedReads: config.UnclassifiedBlock,
		Actor: "dev", Upstreams: []config.Upstream{{Name: "flap", Socket: sock, Namespace: true}}}
	f := start(t, cfg, nil)
	time.Sleep(6 * time.Second)
	got := n.Load()
	notes := strings.Count(f.stderr.String(), "upstream flap stopped")
	// Backoff 0.5 s doubling: within 6 s some 4 to 5 reconnects; allow slack.
	if got > 8 {
		t.Errorf("%d connections in 6 s (%d notes of the upstream stopping): the gateway reconnects to a flapping upstream without backing off", got, notes)
	}
	if got < 2 {
		t.Errorf("%d connections: the gateway did not reconnect at all", got)
	}
}

// TestSocketLongPath: a container upstream's name may have 54 characters, and the gateway
// reaches its socket at /run/reversi/<name>/<name>.sock, 127 bytes then: more than the 107 a
// Unix socket address holds. The gateway connects to it anyway (through /proc/self/fd).
func TestSocketLongPath(t *testing.T) {
	name := strings.Repeat("n", 54)
	dir := filepath.Join(shortTemp(t), name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	l, err := net.Listen("unix", name+".sock") // relative: a bind by the long name cannot be made
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	long := filepath.Join(dir, name+".sock")
	if len(long) <= 107 {
		t.Fatalf("%s is only %d bytes", long, len(long))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := (&stdioTransport{socket: long, name: name, limit: 1 << 20, terminate: time.Second,
		warn: func(string, ...any) {}, hit: func(string) {}}).Connect(ctx)
	if err != nil {
		t.Fatalf("a socket path of %d bytes: %v", len(long), err)
	}
	_ = c.Close()
}
