//go:build linux

package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/internal/stdiobridge"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// lint --gateway-config reaches a socket: upstream (issue 23) as the gateway does: through a
// stdio-bridge in front of server-memory, tools named <upstream>.<tool>.
func TestLintGatewayConfigSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "cli-sock") // short: a socket path holds 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "memory.sock")
	cmd, args, env := upstreams.Memory(t)
	k, v, _ := strings.Cut(env[0], "=")
	t.Setenv(k, v) // the bridge's environment is its server's
	log := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, err := stdiobridge.Run(ctx, stdiobridge.Options{Listen: "unix://" + sock, Command: append([]string{cmd}, args...), Log: log})
		if err != nil {
			t.Errorf("bridge: %v", err)
		}
		done <- code
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("the bridge did not stop:\n%s", log.String())
		}
	})
	gw := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(gw, []byte(fmt.Sprintf("upstreams:\n  - name: memory\n    socket: %s\n", sock)), 0o644); err != nil {
		t.Fatal(err)
	}
	m := writeFile(t, "m.yaml", "- {tool: memory.read_graph, effect: read_only, permission: memory:read}\n")
	code, out, errs := runCLI("lint", m, "--gateway-config", gw)
	if code != 0 || !strings.Contains(out, "info L027 memory.read_graph: no schema_hash") || !strings.Contains(out, "warning L035 memory.open_nodes:") ||
		strings.Contains(out, "L034") {
		t.Errorf("exit %d\n%s\n%s\nbridge:\n%s", code, out, errs, log.String())
	}
	if !strings.Contains(log.String(), "serving a connection with the server") {
		t.Errorf("lint did not go through the bridge:\n%s", log.String())
	}
	// A relative socket path is refused with the field's path.
	if err := os.WriteFile(gw, []byte("upstreams:\n  - name: memory\n    socket: memory.sock\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI("lint", m, "--gateway-config", gw)
	if code != 1 || !strings.Contains(errs, `upstreams[0].socket: "memory.sock" is not an absolute path`) {
		t.Errorf("relative socket: %d %q", code, errs)
	}
}
