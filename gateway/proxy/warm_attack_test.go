package proxy

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Attacks on the warm workers of the stdio fast path (warm.go).

// warmServing counts the goroutines running warmWorkers.serve now.
func warmServing() int {
	return strings.Count(string(allStacks()), "(*warmWorkers).serve(")
}

// waitServing polls until warmServing reports want (or the deadline passes) and returns the last count.
func waitServing(want int, d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		got := warmServing()
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A burst of concurrent calls leaves at most maxWarmWorkers goroutines behind: a worker over the
// bound ends when its call does. TestWarmWorkersReuse checks only the idle count, which the bound
// check caps by construction, so a worker over the bound that stayed (blocked on done, say) would
// pass it.
func TestAttackWarmWorkersOverBoundEnd(t *testing.T) {
	before := warmServing()
	done := make(chan struct{})
	w := &warmWorkers{done: done, work: make(chan func())}
	const n = 10 * maxWarmWorkers
	release := make(chan struct{})
	var started, finished sync.WaitGroup
	started.Add(n)
	finished.Add(n)
	for range n {
		w.run(func() { defer finished.Done(); started.Done(); <-release })
	}
	started.Wait()
	if got := warmServing() - before; got != n {
		t.Fatalf("%d workers for %d concurrent calls", got, n)
	}
	close(release)
	finished.Wait()
	if got := waitServing(before+maxWarmWorkers, 5*time.Second) - before; got != maxWarmWorkers {
		t.Fatalf("%d worker goroutines stay after %d concurrent calls, want the bound %d", got, n, maxWarmWorkers)
	}
	close(done)
	w.wait()
	if got := warmServing() - before; got != 0 {
		t.Fatalf("%d workers after done and wait", got)
	}
}

// Calls handed to run while done closes all run, exactly once, and wait then returns: a send an
// idle worker took is never dropped for done, and no worker outlives wait.
func TestAttackWarmWorkersDoneRace(t *testing.T) {
	for round := range 200 {
		done := make(chan struct{})
		w := &warmWorkers{done: done, work: make(chan func())}
		const n = 64
		var ran atomic.Int64
		var calls sync.WaitGroup
		calls.Add(n)
		var senders sync.WaitGroup
		for i := range 4 {
			senders.Add(1)
			go func() {
				defer senders.Done()
				for j := range n / 4 {
					if i == 0 && j == n/8 {
						close(done)
					}
					w.run(func() { ran.Add(1); calls.Done() })
				}
			}()
		}
		senders.Wait()
		ok := make(chan struct{})
		go func() { calls.Wait(); w.wait(); close(ok) }()
		select {
		case <-ok:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: %d of %d calls ran; wait did not return", round, ran.Load(), n)
		}
		if ran.Load() != n {
			t.Fatalf("round %d: %d calls ran, want %d", round, ran.Load(), n)
		}
	}
}

// Over a real stdio session: the fast path runs its calls on warm workers, a burst of concurrent
// calls leaves at most maxWarmWorkers of them once the agent goes idle, and the session's end ends
// them all (serveStdio returns with no worker left). Cancellation through notifications/cancelled
// still reaches a call on a warm worker.
func TestAttackWarmWorkersStdioSession(t *testing.T) {
	before := warmServing()
	h := startHostileStdio(t, "-cancel-log", filepath.Join(t.TempDir(), "cancels"))
	l, cancel, served := h.lines, h.cancel, h.served

	if r := l.call(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"h.echo","arguments":{"text":"one"}}}`); r["result"] == nil {
		t.Fatalf("call 1: %v", r)
	}
	if got := waitServing(before+1, 5*time.Second) - before; got != 1 {
		t.Errorf("%d warm workers after one fast-path call, want 1 (does take run its calls on warm workers?)", got)
	}

	const n = 3 * maxWarmWorkers
	for i := range n {
		l.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"h.slow","arguments":{"ms":400}}}`, 100+i))
	}
	results := 0
	deadline := time.After(15 * time.Second)
collect:
	for results < n {
		select {
		case m, ok := <-l.got:
			if !ok {
				break collect
			}
			if m["result"] != nil {
				results++
			}
		case <-deadline:
			break collect
		}
	}
	if results != n {
		t.Fatalf("%d results of %d concurrent calls", results, n)
	}
	if got := waitServing(before+maxWarmWorkers, 5*time.Second) - before; got > maxWarmWorkers {
		t.Errorf("%d warm workers stay after %d concurrent calls, want at most %d", got, n, maxWarmWorkers)
	}

	// A cancel still reaches a call on a warm worker: no response.
	l.send(`{"jsonrpc":"2.0","id":500,"method":"tools/call","params":{"name":"h.slow","arguments":{"ms":1500}}}`)
	time.Sleep(300 * time.Millisecond)
	l.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":500,"reason":"stop"}}`)
	if got := l.responses(2500 * time.Millisecond); len(got) != 0 {
		t.Errorf("the cancelled call was answered: %v", got)
	}

	// The session's end ends a call in flight and every worker.
	l.send(`{"jsonrpc":"2.0","id":600,"method":"tools/call","params":{"name":"h.slow","arguments":{"ms":5000}}}`)
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	cancel()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("serveStdio did not return")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("serveStdio took %v to end: the call in flight was not cancelled", d)
	}
	if got := warmServing() - before; got != 0 {
		t.Errorf("%d warm workers after serveStdio returned", got)
	}
}
