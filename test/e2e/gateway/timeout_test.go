package gateway

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestTimeout (seed "MCP gateway", Timeout and retry): timeout_ms on server-everything's slow
// tool makes the gateway stop waiting and journal the step uncertain with a "timed out" note.
func TestTimeout(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	node, args, env := upstreams.Everything(t)
	cfg := "mode: enforce\nupstreams:\n" + upstreamYAML("ev", node, args, env)
	manifests := `
- tool: ev.trigger-long-running-operation
  description: A slow operation.
  effect: read_only
  permission: ev:read
  timeout_ms: 300ms
`
	p := startStdio(t, bins.reversi, "gateway", "--config", writeFile(t, dir, "gateway.yaml", cfg),
		"--manifests", writeFile(t, dir, "m.yaml", manifests), "--store", "sqlite", "--data", data)
	start := time.Now()
	res := call(t, p.cs, "ev.trigger-long-running-operation", map[string]any{"duration": 20, "steps": 20})
	elapsed := time.Since(start)
	t.Logf("a 20 s operation with timeout_ms 300ms answered after %s", elapsed)
	if !res.IsError || !strings.Contains(text(res), "timed out after 300ms") || !strings.Contains(text(res), "uncertain") {
		t.Fatalf("result: %+v", res)
	}
	if elapsed < 300*time.Millisecond || elapsed > 10*time.Second {
		t.Errorf("answered after %s: want the 300ms timeout, well before the 20 s operation ends", elapsed)
	}
	o := outcomes(records(t, openLedger(t, data)), "ev.trigger-long-running-operation")
	if len(o) != 1 || o[0].Status != store.Uncertain || !strings.Contains(o[0].Note, "timed out after 300ms") {
		t.Fatalf("ledger outcome: %+v", o)
	}
}

// countLines counts the lines of file equal to tool (the upstream's tools/call requests,
// written by count-calls.mjs).
func countLines(t *testing.T, file, tool string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if l == tool {
			n++
		}
	}
	return n
}

// TestRetry (seed "MCP gateway", Timeout and retry): a read_only tool with retry is forwarded
// `attempts` times when the upstream answers isError, with exponential backoff between the
// attempts; a tool without retry once; a success is not repeated. The upstream
// (server-filesystem) counts the tools/call requests it receives (count-calls.mjs preload).
// A manifest that sets retry on a tool that is neither read_only nor idempotent is rejected
// and the gateway does not start.
func TestRetry(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	writeFile(t, root, "present.txt", "hello")
	count := filepath.Join(dir, "calls.txt")
	node, args, env := upstreams.Filesystem(t, root)
	env = append(env, upstreams.CountCallsEnv(t, count)...)
	cfg := "mode: enforce\nupstreams:\n" + upstreamYAML("fs", node, args, env)
	manifests := `
- tool: fs.read_text_file
  description: Read a file.
  effect: read_only
  permission: fs:read
  retry: { attempts: 3, base_ms: 150ms, max_ms: 1s }
- tool: fs.get_file_info
  description: Stat a file.
  effect: read_only
  permission: fs:read
`
	cfgPath := writeFile(t, dir, "gateway.yaml", cfg)
	p := startStdio(t, bins.reversi, "gateway", "--config", cfgPath,
		"--manifests", writeFile(t, dir, "m.yaml", manifests), "--store", "memory")
	missing := filepath.Join(root, "missing.txt")

	start := time.Now()
	res := call(t, p.cs, "fs.read_text_file", map[string]any{"path": missing})
	elapsed := time.Since(start)
	if !res.IsError || strings.Contains(text(res), "Blocked by Reversi") {
		t.Fatalf("read_text_file of a missing file: want the upstream's error, got %+v", res)
	}
	if n := countLines(t, count, "read_text_file"); n != 3 {
		t.Fatalf("the upstream saw read_text_file %d times, want 3 (retry.attempts)", n)
	}
	// Backoff 150ms then 300ms: at least 450ms in all.
	t.Logf("3 attempts of a failing read_text_file took %s (backoff 150ms + 300ms)", elapsed)
	if elapsed < 450*time.Millisecond {
		t.Errorf("3 attempts took %s, less than the 450ms of backoff", elapsed)
	}

	if res := call(t, p.cs, "fs.read_text_file", map[string]any{"path": filepath.Join(root, "present.txt")}); res.IsError || !strings.Contains(text(res), "hello") {
		t.Fatalf("read_text_file of a present file: %+v", res)
	}
	if n := countLines(t, count, "read_text_file"); n != 4 {
		t.Fatalf("a successful read_text_file was forwarded %d times, want once", n-3)
	}

	if res := call(t, p.cs, "fs.get_file_info", map[string]any{"path": missing}); !res.IsError {
		t.Fatalf("get_file_info of a missing file: %+v", res)
	}
	if n := countLines(t, count, "get_file_info"); n != 1 {
		t.Fatalf("get_file_info without retry was forwarded %d times, want 1", n)
	}

	// retry on a tool that changes things: the manifest is rejected, the gateway does not start.
	bad := `
- tool: fs.write_file
  description: Write a file.
  effect: irreversible
  permission: fs:write
  retry: { attempts: 3 }
`
	cmd, errw := command(t, bins.reversi, "gateway", "--config", cfgPath, "--manifests", writeFile(t, dir, "bad.yaml", bad), "--store", "memory")
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("gateway with retry on an irreversible tool: %v, want exit status 1\n%s", err, errw)
	}
	for _, want := range []string{"fs.write_file", "retry", "only read_only and idempotent tools may retry"} {
		if !strings.Contains(errw.String(), want) {
			t.Errorf("error lacks %q:\n%s", want, errw)
		}
	}
}
