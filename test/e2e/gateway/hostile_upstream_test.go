package gateway

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// rssBound is the peak RSS growth over idle the hostile-upstream tests allow (issue 18).
const rssBound = 200 << 10 // KiB

// vm reads a field of /proc/<pid>/status in KiB (VmRSS: resident now, VmHWM: the peak).
func vm(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// TestHostileUpstream (issue 18), the `reversi gateway` process in front of the hostile server:
// a listing over a limit refuses the start (exit 1, the message naming the field to raise)
// within a bounded RSS; over stdio, a banner and a garbage line before every message are
// skipped, 20 MiB answers fail only their calls, the gateway serves on, its peak RSS stays
// within rssBound of its idle RSS, and the journal holds one outcome per intent.
func TestHostileUpstream(t *testing.T) {
	hostile := upstreams.Hostile(t)
	for _, c := range []struct{ name, list, want string }{
		{"cyclic cursor", "cycle", "a cycle"},
		{"2,500 tools", "many", "raise limits.tools_per_upstream in gateway.yaml"},
	} {
		t.Run("start: "+c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := "upstreams:\n" + upstreamYAML("h", hostile, []string{"-list", c.list}, nil)
			cmd, errw := command(t, bins.reversi, "gateway", "--config", writeFile(t, dir, "gateway.yaml", cfg), "--store", "memory")
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("the gateway did not refuse to start within 30s\n%s", errw)
			}
			maxRSS := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
			t.Logf("exit %d, max RSS %d MiB: %s", cmd.ProcessState.ExitCode(), maxRSS>>10, strings.TrimSpace(errw.String()))
			if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(errw.String(), "upstream h") || !strings.Contains(errw.String(), c.want) {
				t.Errorf("exit %v, stderr lacks %q:\n%s", cmd.ProcessState, c.want, errw)
			}
			if maxRSS > 300<<10 {
				t.Errorf("max RSS %d MiB while refusing, want under 300 MiB", maxRSS>>10)
			}
		})
	}

	t.Run("stdio: banner, garbage, 20 MiB answers", func(t *testing.T) {
		dir := t.TempDir()
		data := filepath.Join(dir, "data")
		cfg := "call_timeout: 3s\nupstreams:\n" + upstreamYAML("h", hostile, []string{"-banner", "hostile v1", "-garbage"}, nil)
		p := startStdio(t, bins.reversi, "gateway", "--config", writeFile(t, dir, "gateway.yaml", cfg), "--store", "sqlite", "--data", data)
		if res := call(t, p.cs, "h.echo", map[string]any{"text": "idle"}); res.IsError {
			t.Fatalf("echo: %s", text(res))
		}
		idle := vm(t, p.cmd.Process.Pid, "VmRSS")
		for i := range 5 {
			tool, want := "h.big", "over limits.message_bytes"
			if i == 4 {
				tool, want = "h.big_noid", "timed out after 3s (call_timeout"
			}
			res := call(t, p.cs, tool, map[string]any{"bytes": 20 << 20, "id_last": i%2 == 1})
			if !res.IsError || !strings.Contains(text(res), want) {
				t.Errorf("%s: %.300s, want an error with %q", tool, text(res), want)
			}
			if res := call(t, p.cs, "h.noise", map[string]any{}); res.IsError || text(res) != "ok" {
				t.Errorf("noise after %s: %s", tool, text(res))
			}
		}
		peak := vm(t, p.cmd.Process.Pid, "VmHWM")
		t.Logf("idle RSS %d MiB, peak %d MiB (+%d MiB)", idle>>10, peak>>10, (peak-idle)>>10)
		if peak-idle > rssBound {
			t.Errorf("peak RSS %d MiB over idle %d MiB + %d MiB", peak>>10, idle>>10, rssBound>>10)
		}
		if !strings.Contains(p.stderr.String(), `skipped a line before initialize that is not a JSON-RPC message (a banner?)`) {
			t.Errorf("the banner was not logged:\n%s", p.stderr)
		}
		p.close() // waits for the gateway to exit
		recs := records(t, openLedger(t, data))
		intents, outs := 0, map[int64]int{}
		for _, r := range recs {
			switch r.Kind {
			case store.KindIntent:
				intents++
			case store.KindOutcome:
				outs[r.Step]++
			}
		}
		if intents != 11 || len(outs) != 11 {
			t.Errorf("%d intents and %d outcomes, want 11 of each", intents, len(outs))
		}
		for _, r := range outcomes(recs, "h.big") {
			if r.Status != store.Uncertain {
				t.Errorf("h.big outcome %s, want uncertain", r.Status)
			}
		}
	})
}
