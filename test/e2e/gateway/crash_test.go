package gateway

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// children returns the pids of pid's child processes (Linux /proc), so a test can stop the
// upstreams of a gateway it killed.
func children(pid int) []int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// TestCrashBetweenIntentAndOutcome (issue 5, crash safety): the gateway is killed with SIGKILL
// while a slow call is at the upstream, after its intent is on disk and before its outcome.
// Restarted on the same data folder, it reports the recovered call and the step is uncertain
// with store.RecoveryNote: never lost.
func TestCrashBetweenIntentAndOutcome(t *testing.T) {
	data := t.TempDir()
	node, args, _ := upstreams.Everything(t)
	gwArgs := []string{"gateway", "--store", "sqlite", "--data", data,
		"--upstream-cmd", node, "--upstream-arg", args[0], "--upstream-arg", args[1]}
	p := startStdio(t, bins.reversi, gwArgs...)

	callErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := p.cs.CallTool(ctx, &mcp.CallToolParams{Name: "trigger-long-running-operation",
			Arguments: map[string]any{"duration": 30, "steps": 30}})
		callErr <- err
	}()

	// Wait for the intent in the SQLite file, read by a second store on the same folder.
	st := openLedger(t, data)
	ctx := context.Background()
	var pending store.Record
	deadline := time.Now().Add(30 * time.Second)
	for pending.Seq == 0 {
		runs, err := st.ListRuns(ctx, store.RunFilter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			ps, err := st.PendingSteps(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if len(ps) > 0 {
				pending = ps[0]
			}
		}
		if pending.Seq != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no intent journaled within 30s\nstderr:\n%s", p.stderr)
		}
		select {
		case err := <-callErr:
			t.Fatalf("the slow call ended before the crash: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if pending.Tool != "trigger-long-running-operation" || pending.Kind != store.KindIntent {
		t.Fatalf("pending step: %+v", pending)
	}

	upstreamPids := children(p.cmd.Process.Pid)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Stop the orphaned upstream (it would otherwise finish its 30 s operation).
	for _, pid := range upstreamPids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	select {
	case err := <-callErr:
		if err == nil {
			t.Fatal("the slow call returned a result although the gateway was killed")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the client did not notice the killed gateway")
	}
	if ps, _ := st.PendingSteps(ctx, pending.Run); len(ps) != 1 {
		t.Fatalf("after the kill the step should still be pending: %+v", ps)
	}

	// Restart on the same data folder.
	p2 := startStdio(t, bins.reversi, gwArgs...)
	const msg = "reversi-gateway: 1 call(s) had no outcome journaled before the last stop; marked uncertain"
	if !strings.Contains(p2.stderr.String(), msg) {
		t.Errorf("restart printed no recovery message %q:\n%s", msg, p2.stderr)
	}
	recs, err := st.Records(ctx, pending.Run, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Seq != pending.Seq || recs[1].Kind != store.KindOutcome || recs[1].Step != pending.Seq ||
		recs[1].Status != store.Uncertain || recs[1].Note != store.RecoveryNote || recs[1].Tool != pending.Tool {
		t.Fatalf("records of run %s after restart: %+v", pending.Run, recs)
	}
	// The restarted gateway serves calls.
	if res := call(t, p2.cs, "echo", map[string]any{"message": "after restart"}); res.IsError {
		t.Fatalf("echo after restart: %+v", res)
	}
}
