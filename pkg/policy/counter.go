package policy

import (
	"context"
	"sync"
	"time"

	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// CountKey names one limit counter: a rule ("<policy>/<rule>"), its scope and the subject
// counted in it (the run id for per run, the actor's principal for per actor, the gateway's
// name for per gateway).
type CountKey struct {
	Rule    string               `json:"rule"`
	Scope   apipolicy.LimitScope `json:"scope"`
	Subject string               `json:"subject"`
}

// Counter counts the calls of limit rules. The gateway's store implements it (so counts
// survive restarts and are shared by replicas); MemoryCounter serves tests and `reversi test`.
type Counter interface {
	// Count returns how many calls were added under key at or after since (the zero time:
	// ever).
	Count(ctx context.Context, key CountKey, since time.Time) (int, error)
	// Add records one call under key at time at.
	Add(ctx context.Context, key CountKey, at time.Time) error
}

// Record adds the call to every counter of res.Counts, at time at, unless res denies: the
// gateway calls it once the call is forwarded (a denied or still-held call counts nothing). Evaluate then Record is
// not atomic: two concurrent calls may both see the last free slot. A store that must be
// exact serialises the two per key.
func Record(ctx context.Context, c Counter, res Result, at time.Time) error {
	if c == nil || res.Decision == apipolicy.DecisionDeny {
		return nil
	}
	for _, k := range res.Counts {
		if err := c.Add(ctx, k, at); err != nil {
			return err
		}
	}
	return nil
}

// MemoryCounter is a Counter in memory, safe for concurrent use. It keeps every time added
// (a test's worth of calls).
type MemoryCounter struct {
	mu    sync.Mutex
	times map[CountKey][]time.Time
}

// NewMemoryCounter returns an empty MemoryCounter.
func NewMemoryCounter() *MemoryCounter {
	return &MemoryCounter{times: map[CountKey][]time.Time{}}
}

// Count implements Counter.
func (m *MemoryCounter) Count(_ context.Context, key CountKey, since time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, t := range m.times[key] {
		if !t.Before(since) {
			n++
		}
	}
	return n, nil
}

// Add implements Counter.
func (m *MemoryCounter) Add(_ context.Context, key CountKey, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.times[key] = append(m.times[key], at)
	return nil
}
