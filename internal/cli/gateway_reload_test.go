package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// gatewayCmd runs `reversi gateway args...` in-process with its stdio connected to a go-sdk
// client, and stops it at the end of the test.
func gatewayCmd(t *testing.T, args ...string) (*mcp.ClientSession, *syncbuf.Buffer) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	stderr := &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() {
		root := NewRoot()
		root.SetArgs(append([]string{"gateway"}, args...))
		root.SetIn(inR)
		root.SetOut(outW)
		root.SetErr(stderr)
		err := root.Execute()
		_ = outW.Close()
		done <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "cli-test", Version: "1"}, nil).Connect(ctx,
		&mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		_ = cs.Close()
		_ = inW.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("gateway: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("the gateway did not stop")
		}
	})
	return cs, stderr
}

// reloadFixture writes a gateway.yaml fronting server-memory (upstream "mem"), a manifest
// folder with mem.read_graph, and a project config with the given reload block.
func reloadFixture(t *testing.T, reload string) (dir, manifests string) {
	t.Helper()
	dir = t.TempDir()
	node, args, _ := upstreams.Memory(t)
	cfg := "mode: enforce\nupstreams:\n  - name: mem\n    command: " + node +
		"\n    args: [" + args[0] + "]\n    env: { MEMORY_FILE_PATH: " + filepath.Join(dir, "graph.jsonl") + " }\n"
	manifests = filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"gateway.yaml":             cfg,
		"reversi.config.yaml":      reload,
		"manifests/read.yaml":      "- tool: mem.read_graph\n  description: Read the graph.\n  effect: read_only\n  permission: mem:read\n",
		"manifests/.gitkeep-notes": "hidden entries are not manifests",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("REVERSI_CONFIG", filepath.Join(dir, "reversi.config.yaml"))
	return dir, manifests
}

const searchYAML = "- tool: mem.search_nodes\n  description: Search.\n  effect: read_only\n  permission: mem:read\n"

// waitPasses calls tool until it is not blocked, and returns how long that took.
func waitPasses(t *testing.T, cs *mcp.ClientSession, tool string, within time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	for {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"query": "x"}})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if !res.IsError {
			return time.Since(began)
		}
		if time.Since(began) > within {
			t.Fatalf("%s still blocked after %v: %+v", tool, within, res.Content)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// TestGatewayHotReloadDefaultWatch: with no reload settings the gateway polls its manifests
// every 2 s, so a manifest added to the folder is enforced within about that, in the same session.
func TestGatewayHotReloadDefaultWatch(t *testing.T) {
	dir, manifests := reloadFixture(t, "{}\n")
	cs, stderr := gatewayCmd(t, "--config", filepath.Join(dir, "gateway.yaml"), "--manifests", manifests,
		"--store", "sqlite", "--data", filepath.Join(dir, "data"))
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mem.search_nodes", Arguments: map[string]any{"query": "x"}})
	if err != nil || !res.IsError {
		t.Fatalf("search_nodes without a manifest: %v %+v", err, res)
	}
	if err := os.WriteFile(filepath.Join(manifests, "search.yaml"), []byte(searchYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	took := waitPasses(t, cs, "mem.search_nodes", 15*time.Second)
	t.Logf("manifest written -> enforced in %v with the default 2 s watch", took.Round(time.Millisecond))
	if !strings.Contains(stderr.String(), "reversi-gateway: reloaded 2 manifests") {
		t.Errorf("stderr does not report the reload:\n%s", stderr.String())
	}
}

// TestGatewayReloadOnSIGHUP: with the file watch off (reload.watch: false), SIGHUP reloads.
func TestGatewayReloadOnSIGHUP(t *testing.T) {
	dir, manifests := reloadFixture(t, "reload: { watch: false }\n")
	cs, stderr := gatewayCmd(t, "--config", filepath.Join(dir, "gateway.yaml"), "--manifests", manifests,
		"--store", "memory")
	if err := os.WriteFile(filepath.Join(manifests, "search.yaml"), []byte(searchYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	// No watch: more than a default interval later the change is still not loaded.
	time.Sleep(2500 * time.Millisecond)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mem.search_nodes", Arguments: map[string]any{"query": "x"}})
	if err != nil || !res.IsError {
		t.Fatalf("with reload.watch false the change was loaded without a signal: %v %+v", err, res)
	}
	// The gateway catches SIGHUP (it is running: the call above went through it).
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitPasses(t, cs, "mem.search_nodes", 15*time.Second)
	if !strings.Contains(stderr.String(), "reversi-gateway: reloaded 2 manifests") {
		t.Errorf("stderr does not report the reload:\n%s", stderr.String())
	}
}

// TestGatewayReloadRereadsTheTrustedKey: the manifest public key is re-read on reload; when it
// is rotated to a key that did not sign the registry, the reload is refused and the verified
// manifests keep serving (fail closed, nothing lost).
func TestGatewayReloadRereadsTheTrustedKey(t *testing.T) {
	dir, manifests := reloadFixture(t, "manifest_public_key: keys/a.pub\nreload: { interval: 100ms }\n")
	t.Chdir(dir)
	if err := os.WriteFile(filepath.Join(manifests, "search.yaml"), []byte(searchYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"keygen", "keys/a"}, {"keygen", "keys/b"},
		{"manifests", "publish", "manifests", "--registry", "reg", "--by", "alice", "--key", "keys/a.key", "--status", "approved"},
	} {
		if code, out, errs := runCLI(args...); code != 0 {
			t.Fatalf("%v: %d %s %s", args, code, out, errs)
		}
	}
	cs, stderr := gatewayCmd(t, "--config", "gateway.yaml", "--manifests", "reg", "--store", "memory")
	waitPasses(t, cs, "mem.search_nodes", 5*time.Second)

	// Rotate the trust to key b, which signed nothing in the registry.
	b, err := os.ReadFile("keys/b.pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("keys/a.pub", b, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(stderr.String(), "reload refused, the previous manifests keep serving") {
		if time.Now().After(deadline) {
			t.Fatalf("the key rotation was not picked up:\n%s", stderr.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
	if s := stderr.String(); !strings.Contains(s, "which is not trusted") || strings.Contains(s, "edited after it was signed") {
		t.Errorf("the refusal does not say the key is not trusted (and only that):\n%s", s)
	}
	waitPasses(t, cs, "mem.search_nodes", time.Second)
}

// TestGatewayRefusesAnOlderRegistry: a standalone gateway keeps the signed index's sequence as a
// high-water mark in its store: a registry folder put back to an older signed state is refused
// by the running gateway (the newer rules keep serving) and by a gateway started on it with the
// same data folder.
func TestGatewayRefusesAnOlderRegistry(t *testing.T) {
	dir, _ := reloadFixture(t, "manifest_public_key: keys/a.pub\nreload: { interval: 100ms }\n")
	t.Chdir(dir)
	for _, args := range [][]string{
		{"keygen", "keys/a"},
		{"manifests", "publish", "manifests", "--registry", "reg", "--by", "alice", "--key", "keys/a.key", "--status", "approved"},
	} {
		if code, out, errs := runCLI(args...); code != 0 {
			t.Fatalf("%v: %d %s %s", args, code, out, errs)
		}
	}
	if err := os.CopyFS("reg-v1", os.DirFS("reg")); err != nil { // sequence 1: no search_nodes
		t.Fatal(err)
	}
	if err := os.WriteFile("search.yaml", []byte(searchYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCLI("manifests", "publish", "search.yaml", "--registry", "reg", "--by", "alice", "--key", "keys/a.key", "--status", "approved"); code != 0 {
		t.Fatalf("publish: %d %s %s", code, out, errs)
	}
	cs, stderr := gatewayCmd(t, "--config", "gateway.yaml", "--manifests", "reg", "--store", "sqlite", "--data", "data")
	waitPasses(t, cs, "mem.search_nodes", 5*time.Second)

	if err := os.Rename("reg", "reg-v2"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename("reg-v1", "reg"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(stderr.String(), "has sequence 1") {
		if time.Now().After(deadline) {
			t.Fatalf("the older registry was not refused:\n%s", stderr.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
	if !strings.Contains(stderr.String(), "older than 2") {
		t.Fatalf("the refusal does not name the sequences:\n%s", stderr.String())
	}
	waitPasses(t, cs, "mem.search_nodes", time.Second)

	code, _, errs := runCLI("gateway", "--config", "gateway.yaml", "--manifests", "reg", "--store", "sqlite", "--data", "data")
	if code == 0 || !strings.Contains(errs, "older than 2") {
		t.Fatalf("a gateway started on the older registry: exit %d\n%s", code, errs)
	}
}

// TestGatewayRefusesAnotherRegistryAtItsPath: the registry a folder held is pinned by its signed
// id: another registry copied over the folder (same trusted key, a higher sequence) is refused.
func TestGatewayRefusesAnotherRegistryAtItsPath(t *testing.T) {
	dir, _ := reloadFixture(t, "manifest_public_key: keys/a.pub\nreload: { interval: 100ms }\n")
	t.Chdir(dir)
	for _, args := range [][]string{
		{"keygen", "keys/a"},
		{"manifests", "publish", "manifests", "--registry", "reg", "--by", "alice", "--key", "keys/a.key", "--status", "approved"},
		{"manifests", "publish", "manifests", "--registry", "other", "--by", "alice", "--key", "keys/a.key", "--status", "approved"},
		{"manifests", "sign", "--registry", "other", "--key", "keys/a.key"},
	} {
		if code, out, errs := runCLI(args...); code != 0 {
			t.Fatalf("%v: %d %s %s", args, code, out, errs)
		}
	}
	cs, stderr := gatewayCmd(t, "--config", "gateway.yaml", "--manifests", "reg", "--store", "sqlite", "--data", "data")
	waitPasses(t, cs, "mem.read_graph", 5*time.Second)
	if err := os.Rename("reg", "reg-first"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename("other", "reg"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(stderr.String(), "(its id) has sequence 1 with digest") {
		if time.Now().After(deadline) {
			t.Fatalf("another registry at the folder was not refused:\n%s", stderr.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
	if code, _, errs := runCLI("gateway", "--config", "gateway.yaml", "--manifests", "reg", "--store", "sqlite", "--data", "data"); code == 0 || !strings.Contains(errs, "another source took its place") {
		t.Fatalf("a gateway started on another registry at the folder: exit %d\n%s", code, errs)
	}
}
