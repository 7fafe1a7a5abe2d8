package kube

import (
	"context"
	"math"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// maxReportError bounds the refusal a report carries (bytes; a longer one ends in "...").
const maxReportError = 2048

// report is what a gateway pod says it serves: the digest (`sha256:<hex>`) and revision of
// the manifests it enforces, and why it refused the last rendering it saw ("" after a
// successful load).
type report struct {
	digest, revision, loadErr string
}

// newReport is the report of a load: loadErr nil when it succeeded, else its text cut to
// maxReportError bytes.
func newReport(digest, revision string, loadErr error) report {
	r := report{digest: digest, revision: revision}
	if loadErr != nil {
		r.loadErr = loadErr.Error()
		if len(r.loadErr) > maxReportError {
			r.loadErr = r.loadErr[:maxReportError-3] + "..."
		}
	}
	return r
}

// reportBackoff is how a failed report is retried: 500 ms, doubling, at most 30 s between
// attempts (plus up to 10% jitter), for as long as the context lasts.
var reportBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}

// reporter writes the latest report until one write succeeds, retrying with backoff: the
// object it writes may not exist yet, or the gateway may not be allowed to write it yet (the
// controller creates a pod's report object, and the Role rule naming it, only after it sees
// the pod). A report set while an older one is being retried replaces it; only the latest is
// ever written. A failure is logged once per distinct error, and once more when a write
// succeeds after failures.
type reporter struct {
	// write writes one report; it is called from run's goroutine only.
	write func(ctx context.Context, r report) error
	// what names the report's target in the log ("Lease ns/name").
	what    string
	logf    func(format string, args ...any)
	backoff wait.Backoff

	mu     sync.Mutex
	latest report
	seq    uint64 // counts set calls; the report of seq is latest
	wake   chan struct{}
}

func newReporter(what string, write func(context.Context, report) error, logf func(string, ...any)) *reporter {
	return &reporter{write: write, what: what, logf: logf, backoff: reportBackoff, wake: make(chan struct{}, 1)}
}

// set makes r the report to write, and wakes run. It never blocks.
func (p *reporter) set(r report) {
	p.mu.Lock()
	p.latest, p.seq = r, p.seq+1
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *reporter) current() (report, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latest, p.seq
}

// run writes each report set, retrying failed writes with backoff, until ctx ends.
func (p *reporter) run(ctx context.Context) {
	var written uint64 // the seq written last (0: none)
	failing := ""      // the error logged last, "" after a success
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		// Each wake starts a new backoff at its first, shortest step.
		_ = p.backoff.DelayFunc().Until(ctx, true, true, func(ctx context.Context) (bool, error) {
			r, seq := p.current()
			if seq == written {
				return true, nil
			}
			if err := p.write(ctx, r); err != nil {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				if msg := err.Error(); msg != failing {
					p.logf("reversi-gateway: reporting the manifest digest on %s (retrying with backoff up to %s): %v", p.what, p.backoff.Cap, err)
					failing = msg
				}
				return false, nil
			}
			if failing != "" {
				p.logf("reversi-gateway: reported the manifest digest %s on %s", r.digest, p.what)
				failing = ""
			}
			written = seq
			return true, nil
		})
	}
}
