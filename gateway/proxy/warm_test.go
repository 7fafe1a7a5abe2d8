package proxy

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goroutineID is the number runtime.Stack prints in its first line ("goroutine 7 [running]:").
func goroutineID(t testing.TB) int {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := bytes.Fields(buf)
	id, err := strconv.Atoi(string(f[1]))
	if err != nil {
		t.Errorf("runtime.Stack header %q", buf)
	}
	return id
}

// TestWarmWorkersReuse: calls one after the other run on one goroutine (the stack the first
// grew serves the next), concurrent calls get goroutines of their own, at most maxWarmWorkers
// stay idle, and closing done ends them all.
func TestWarmWorkersReuse(t *testing.T) {
	done := make(chan struct{})
	w := &warmWorkers{done: done, work: make(chan func())}
	ids := make(chan int, 1)
	seen := map[int]bool{}
	for range 20 {
		w.run(func() { ids <- goroutineID(t) })
		seen[<-ids] = true
		waitIdle(t, w, 1)
	}
	if len(seen) != 1 {
		t.Fatalf("20 calls in a row ran on %d goroutines, want 1", len(seen))
	}

	const n = 3 * maxWarmWorkers
	release := make(chan struct{})
	var started, finished sync.WaitGroup
	started.Add(n)
	finished.Add(n)
	concurrent := make(chan int, n)
	for range n {
		w.run(func() {
			defer finished.Done()
			concurrent <- goroutineID(t)
			started.Done()
			<-release
		})
	}
	started.Wait() // every call is running at once: none waited for another
	close(concurrent)
	distinct := map[int]bool{}
	for id := range concurrent {
		distinct[id] = true
	}
	if len(distinct) != n {
		t.Fatalf("%d concurrent calls ran on %d goroutines", n, len(distinct))
	}
	close(release)
	finished.Wait()
	waitIdle(t, w, maxWarmWorkers)
	// The bound check caps idle by construction: what it must do is end the workers over it.
	for deadline := time.Now().Add(5 * time.Second); workersOf(w) != maxWarmWorkers; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers stay after %d concurrent calls, want the bound %d", workersOf(w), n, maxWarmWorkers)
		}
	}

	close(done)
	ended := make(chan struct{})
	go func() { w.wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("idle workers did not end when done closed")
	}
}

func idleWorkers(w *warmWorkers) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.idle
}

// waitIdle waits until n workers of w are idle and parked on work. A worker counts itself idle
// before it blocks in its select, so idle alone is not enough: a run between the two finds no
// receiver and starts a second worker (the reuse check then saw 2 goroutines, and the next
// waitIdle 2 idle workers, about 1 run in 400 on 2 CPUs).
func waitIdle(t *testing.T, w *warmWorkers, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); idleWorkers(w) != n || parkedWorkers(w) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("idle workers %d (%d parked), want %d", idleWorkers(w), parkedWorkers(w), n)
		}
	}
}

// workersOf counts the goroutines of w, parked or not.
func workersOf(w *warmWorkers) int { return countWorkers(w, false) }

// parkedWorkers counts the goroutines of w blocked in serve's select (runtime.Stack's state
// "select", serve's receiver w).
func parkedWorkers(w *warmWorkers) int { return countWorkers(w, true) }

func countWorkers(w *warmWorkers, parkedOnly bool) int {
	buf := allStacks()
	frame := []byte(fmt.Sprintf("(*warmWorkers).serve(%p", w))
	parked := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, _, _ := bytes.Cut(g, []byte("\n"))
		if (!parkedOnly || bytes.Contains(header, []byte("[select"))) && bytes.Contains(g, frame) {
			parked++
		}
	}
	return parked
}

// allStacks is runtime.Stack of every goroutine, whole.
func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// growStack uses about depth × 1 KB of stack, as a call through decide, the journal and the
// result check does.
//
//go:noinline
func growStack(depth int) byte {
	var pad [1024]byte
	pad[depth%len(pad)] = byte(depth)
	if depth == 0 {
		return pad[0]
	}
	return growStack(depth-1) + pad[depth%len(pad)]
}

// BenchmarkWarmWorkers: a call that grows its stack to about 64 KB, on a new goroutine
// (go, the fast path until 2026-12-04) and on a warm worker.
func BenchmarkWarmWorkers(b *testing.B) {
	fn := func(wg *sync.WaitGroup) func() {
		return func() { growStack(64); wg.Done() }
	}
	b.Run("go", func(b *testing.B) {
		var wg sync.WaitGroup
		for b.Loop() {
			wg.Add(1)
			go fn(&wg)()
			wg.Wait()
		}
	})
	b.Run("warm", func(b *testing.B) {
		done := make(chan struct{})
		w := &warmWorkers{done: done, work: make(chan func())}
		var wg sync.WaitGroup
		for b.Loop() {
			wg.Add(1)
			w.run(fn(&wg))
			wg.Wait()
		}
		close(done)
		w.wait()
	})
}
