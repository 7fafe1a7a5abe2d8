package kube

import (
	"context"
	"math"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// maxReportError bounds the refusal a report carries (bytes; a longer one ends in "...").
const maxReportError = 2048

// maxReportDeadLetter bounds the last dead letter a report carries (bytes; a longer one ends
// in "...").
const maxReportDeadLetter = 1024

// report is what a gateway pod says it serves: the digest (`sha256:<hex>`) and revision of
// the manifests it enforces, why it refused the last rendering it saw ("" after a
// successful load), and the summary of its notification outbox.
type report struct {
	digest, revision, loadErr string
	notes                     notesReport
}

// notesReport is the summary of a pod's notification outbox (issue 24: dead letters visible
// as a condition): the dead letters, the rows pending after a failed attempt, and the newest
// dead letter as "<receiver>: <error> (<idempotency key>)", at most maxReportDeadLetter bytes,
// never a receiver's URL or key. The zero value (reported false) is "no summary": a gateway
// without receivers, whose Lease then carries no notification annotations.
type notesReport struct {
	reported       bool
	dead, retrying int
	lastDead       string
}

// cut bounds s to n bytes (a longer one ends in "..."), keeping it valid UTF-8.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-3], "") + "..."
}

// newReport is the report of a load: loadErr nil when it succeeded, else its text cut to
// maxReportError bytes.
func newReport(digest, revision string, loadErr error) report {
	r := report{digest: digest, revision: revision}
	if loadErr != nil {
		r.loadErr = cut(loadErr.Error(), maxReportError)
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
	seq    uint64 // counts the changes; the report of seq is latest
	loaded bool   // set was called: nothing is written before the pod says what it serves
	wake   chan struct{}
}

func newReporter(what string, write func(context.Context, report) error, logf func(string, ...any)) *reporter {
	return &reporter{write: write, what: what, logf: logf, backoff: reportBackoff, wake: make(chan struct{}, 1)}
}

// set makes r's manifest part (digest, revision, load error) the report to write, keeping the
// notification summary set last, and wakes run. Every call is written, also when nothing
// changed (each reload reports). It never blocks.
func (p *reporter) set(r report) {
	p.mu.Lock()
	r.notes = p.latest.notes
	p.latest, p.seq, p.loaded = r, p.seq+1, true
	p.mu.Unlock()
	p.poke()
}

// setNotes makes n the report's notification summary, keeping its manifest part. A summary
// equal to the one set last changes nothing and is not written: the outbox is read every few
// seconds, the Lease written only when what it says changes. It never blocks.
func (p *reporter) setNotes(n notesReport) {
	p.mu.Lock()
	if p.latest.notes == n {
		p.mu.Unlock()
		return
	}
	p.latest.notes, p.seq = n, p.seq+1
	p.mu.Unlock()
	p.poke()
}

func (p *reporter) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// current is the report to write and its seq; ok is false until set was called.
func (p *reporter) current() (r report, seq uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latest, p.seq, p.loaded
}

// run writes each report set (and each changed summary, once the first report was set),
// retrying failed writes with backoff, until ctx ends.
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
			r, seq, ok := p.current()
			if !ok || seq == written { // a summary alone waits for the first set
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
