// Package gateway holds the end-to-end acceptance tests of the MCP gateway (issue 5) that run
// processes: the real `reversi` binary (and `reversi-gateway`, built once per package in
// TestMain) in front of the real MCP servers from npm (test/upstreams), driven by the go-sdk
// client and by the TypeScript SDK's client (ts-client.mjs), with the ledger read from the real
// SQLite file.
package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/syncbuf"
)

// bins are the binaries TestMain builds: reversi (the main binary), gateway
// (./cmd/reversi-gateway) and link (a symlink named reversi-gateway to reversi).
var bins struct{ reversi, gateway, link string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "reversi-e2e-gateway-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		bins.reversi = filepath.Join(dir, "reversi")
		bins.gateway = filepath.Join(dir, "cmd", "reversi-gateway")
		bins.link = filepath.Join(dir, "link", "reversi-gateway")
		for out, pkg := range map[string]string{bins.reversi: "github.com/reversi-gitops/reversi",
			bins.gateway: "github.com/reversi-gitops/reversi/cmd/reversi-gateway"} {
			if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, b)
				return 1
			}
		}
		if err := os.MkdirAll(filepath.Dir(bins.link), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := os.Symlink(bins.reversi, bins.link); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// syncBuffer is a syncbuf.Buffer (kept as a name for the tests here).
type syncBuffer = syncbuf.Buffer

// env is the gateway processes' environment: this process's, without the variables that would
// make the gateway pick up manifests or a project config from elsewhere.
func env() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "REVERSI_MANIFESTS=") || strings.HasPrefix(kv, "REVERSI_CONFIG=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// command builds a gateway process (bin with args) running in a fresh folder, so no
// reversi.config.yaml or ./manifests is found, with stderr collected.
func command(t *testing.T, bin string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = env()
	errw := &syncBuffer{}
	cmd.Stderr = errw
	return cmd, errw
}

// proc is a gateway process with a go-sdk client on its stdio.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	cs     *mcp.ClientSession
}

// startStdio starts bin with args and connects a go-sdk client to it over stdio.
func startStdio(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	cmd, errw := command(t, bin, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to %s %s: %v\nstderr:\n%s", bin, strings.Join(args, " "), err, errw)
	}
	p := &proc{cmd: cmd, stderr: errw, cs: cs}
	t.Cleanup(func() { p.close() })
	return p
}

// close ends the session, which closes the gateway's stdin; the gateway then exits.
func (p *proc) close() { _ = p.cs.Close() }

// startHTTP starts a gateway in HTTP mode (its config has listen) and returns its /mcp URL.
func startHTTP(t *testing.T, bin string, args ...string) (string, *syncBuffer) {
	t.Helper()
	cmd, errw := command(t, bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	const marker = "reversi-gateway: listening on "
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s := errw.String()
		if i := strings.Index(s, marker); i >= 0 {
			line, _, _ := strings.Cut(s[i+len(marker):], "\n")
			return strings.TrimSpace(line), errw
		}
		select {
		case <-done:
			t.Fatalf("gateway exited before listening: %v\nstderr:\n%s", cmd.ProcessState, errw)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("gateway did not listen within 30s\nstderr:\n%s", errw)
	return "", nil
}

// connectHTTP opens a go-sdk client session on a gateway's /mcp.
func connectHTTP(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// upstreamYAML is one entry of gateway.yaml's upstreams (JSON is YAML, so paths need no care).
func upstreamYAML(name, cmd string, args, env []string) string {
	a, _ := json.Marshal(args)
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	e, _ := json.Marshal(m)
	c, _ := json.Marshal(cmd)
	return fmt.Sprintf("  - name: %s\n    command: %s\n    args: %s\n    env: %s\n", name, c, a, e)
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		names = append(names, tool.Name)
	}
	return names
}

// openLedger opens the gateway's SQLite store in data (the same file a running gateway
// writes; WAL lets both read and write).
func openLedger(t *testing.T, data string) *store.SQLite {
	t.Helper()
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatalf("open the ledger in %s: %v", data, err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// records returns every ledger record of every run (not the gateway journal), oldest run first.
// A running gateway commits a call's outcome with its next write or within 5 ms
// (store.QueueOutcome), so while a step is open records reads again, for up to 2 s.
func records(t *testing.T, st store.Store) []store.Record {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Second)
	for {
		runs, err := st.ListRuns(ctx, store.RunFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var out []store.Record
		open := 0
		for i := len(runs) - 1; i >= 0; i-- {
			recs, err := st.Records(ctx, runs[i].ID, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				switch r.Kind {
				case store.KindIntent:
					open++
				case store.KindOutcome:
					open--
				}
			}
			out = append(out, recs...)
		}
		if open <= 0 || time.Now().After(deadline) {
			return out
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// outcomes returns the outcome records of tool.
func outcomes(recs []store.Record, tool string) []store.Record {
	var out []store.Record
	for _, r := range recs {
		if r.Kind == store.KindOutcome && r.Tool == tool {
			out = append(out, r)
		}
	}
	return out
}
