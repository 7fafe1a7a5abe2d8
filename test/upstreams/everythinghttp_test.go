package upstreams_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestEverythingHTTP: server-everything over Streamable HTTP on 127.0.0.1 only, answering a
// real client, recording what it receives, and gone (no process left) when its test ends.
func TestEverythingHTTP(t *testing.T) {
	t.Parallel()
	var pid int
	var addr string
	t.Run("serve", func(t *testing.T) {
		ev := upstreams.StartEverythingHTTP(t)
		pid = ev.Pid
		if !strings.HasPrefix(ev.URL, "http://127.0.0.1:") || !strings.HasSuffix(ev.URL, "/mcp") {
			t.Fatalf("URL %s", ev.URL)
		}
		addr = strings.TrimSuffix(strings.TrimPrefix(ev.URL, "http://"), "/mcp")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "upstreams-test", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: ev.URL, DisableStandaloneSSE: true}, nil)
		if err != nil {
			t.Fatalf("connect %s: %v\n%s", ev.URL, err, ev.Stderr())
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "over http"}})
		if err != nil || res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "over http") {
			t.Fatalf("echo: %v %+v", err, res)
		}
		_ = cs.Close()
		// go-sdk v1.8.0 asks server/discover (no session) before initialize.
		var methods []string
		sessions := map[string]bool{} // of the messages after initialize
		for _, m := range ev.Received(t) {
			if slices.Contains(methods, "initialize") {
				sessions[m.Session] = true
			}
			methods = append(methods, m.Method)
		}
		i := slices.Index(methods, "initialize")
		if i < 0 || len(methods) < i+3 || methods[i+1] != "notifications/initialized" || methods[len(methods)-1] != "tools/call" {
			t.Errorf("received %v, want initialize, notifications/initialized, ..., tools/call", methods)
		}
		if len(sessions) != 1 || sessions[""] {
			t.Errorf("sessions of the messages after initialize: %v, want one, named", sessions)
		}
	})
	if pid == 0 {
		t.Fatal("the server did not start")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("server-everything (pid %d) still exists after its test ended: %v", pid, err)
	}
	if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process group %d still has processes after the test ended: %v", pid, err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after the test ended", addr)
	}
}

// TestLoopbackPreload: loopback.mjs binds a listen on any host to 127.0.0.1 and refuses a Unix
// socket path.
func TestLoopbackPreload(t *testing.T) {
	t.Parallel()
	node := upstreams.Node(t)
	_, file, _, _ := runtime.Caller(0)
	preload := "--import=" + filepath.Join(filepath.Dir(file), "loopback.mjs")
	run := func(js string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, preload, "-e", js)
		cmd.Env = []string{}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(`const s = require("node:net").createServer(); s.listen(0, "0.0.0.0", () => { console.log("bound " + s.address().address); s.close(); });`)
	if err != nil || !strings.Contains(out, "bound 127.0.0.1") || !strings.Contains(out, "reversi-loopback: listening on 127.0.0.1:") {
		t.Errorf("listen(0, 0.0.0.0) under loopback.mjs: %v\n%s", err, out)
	}
	sock := filepath.Join(t.TempDir(), "s.sock")
	out, err = run(fmt.Sprintf(`require("node:net").createServer().listen(%q);`, sock))
	if err == nil || !strings.Contains(out, "refusing to listen on") {
		t.Errorf("listen(path) under loopback.mjs: %v\n%s", err, out)
	}
	if _, serr := os.Stat(sock); serr == nil {
		t.Errorf("the Unix socket %s was created", sock)
	}
}
