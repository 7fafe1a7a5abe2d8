package proxy

import "sync"

// maxWarmWorkers bounds the idle goroutines a session keeps for its next calls (a worker
// beyond it ends when its call does). Each holds the stack its calls grew: tens of KB, about
// 0.8 MB after arguments nested to the line filter's depth limit (the attack review,
// 2026-12-04); each collection halves an idle stack that uses little of it.
const maxWarmWorkers = 8

// warmWorkers runs a session's calls on goroutines that outlive them. A call on a fresh
// goroutine starts on the runtime's smallest stack and copies it two or three times as it
// grows through decide, the journal and the result check (about 30 µs of a stdio call, pprof,
// 2026-12-04); a worker that served the previous call starts on the stack that call grew. The
// value with done and work set is ready; done closing ends the idle workers, and wait waits
// for every worker to end.
type warmWorkers struct {
	done <-chan struct{}
	work chan func() // unbuffered: a send succeeds only when an idle worker takes it

	mu      sync.Mutex
	idle    int // workers waiting on work
	workers sync.WaitGroup
}

// run runs fn on an idle worker, or on a new one when none is idle. It never blocks on fn.
func (w *warmWorkers) run(fn func()) {
	select {
	case w.work <- fn:
		return
	default:
	}
	w.workers.Add(1)
	go w.serve(fn)
}

func (w *warmWorkers) serve(fn func()) {
	defer w.workers.Done()
	for {
		fn()
		w.mu.Lock()
		if w.idle >= maxWarmWorkers {
			w.mu.Unlock()
			return
		}
		w.idle++
		w.mu.Unlock()
		select {
		case fn = <-w.work:
		case <-w.done:
			return
		}
		w.mu.Lock()
		w.idle--
		w.mu.Unlock()
	}
}

// wait waits for every worker to end: call it after done is closed and the last call ran.
func (w *warmWorkers) wait() { w.workers.Wait() }
