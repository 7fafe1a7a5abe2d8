package proxy

import (
	"bytes"
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
	time.Sleep(20 * time.Millisecond) // a worker over the bound would be idle by now
	if got := idleWorkers(w); got != maxWarmWorkers {
		t.Fatalf("%d idle workers after %d concurrent calls, want the bound %d", got, n, maxWarmWorkers)
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

func waitIdle(t *testing.T, w *warmWorkers, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); idleWorkers(w) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("idle workers %d, want %d", idleWorkers(w), n)
		}
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
