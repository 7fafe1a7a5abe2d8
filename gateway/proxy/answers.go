package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Answers to an upstream's own requests (ping, sampling/createMessage, elicitation/create,
// roots/list). go-sdk's client answers each request an upstream sends on a goroutine of its
// own, and writes the answer with no deadline: a stdio upstream that sends requests and stops
// reading its stdin, or an HTTP upstream that sends them on a stream and never takes the POST
// that carries an answer, held one goroutine (and, over HTTP, one connection) per request for
// good: 20,000 pings made 18,600 goroutines that never ended, 3,000 over HTTP 9,000 goroutines
// and 3,000 sockets, and the gateway's Close then hung on them. The answers are bounded here:
//
//   - at most maxPendingAnswers answers of one connection wait to be written (or, over HTTP,
//     to be taken); the answer to a request beyond them is dropped and logged (the upstream
//     gets none, as from a peer that went away);
//   - each waits at most answerTimeout, then is dropped the same way.
//
// Dropping an answer never fails the connection or another call: nothing of it was written.

const (
	// maxPendingAnswers is how many answers to an upstream's requests may wait at once, per
	// connection.
	maxPendingAnswers = 64
	// answerTimeout is how long one answer may wait to be written or taken.
	answerTimeout = 10 * time.Second
)

// answerGate bounds one connection's answers (see above).
type answerGate struct {
	name    string // the upstream's name
	warn    func(format string, args ...any)
	pending atomic.Int64
	dropped atomic.Int64
	logs    rate.Sometimes // at most 10 drop logs, then one per 10 s
}

func newAnswerGate(name string, warn func(format string, args ...any)) *answerGate {
	return &answerGate{name: name, warn: warn, logs: rate.Sometimes{First: 10, Interval: 10 * time.Second}}
}

// enter admits one answer, or reports that maxPendingAnswers already wait (then it has logged
// the drop); leave must follow an admission.
func (g *answerGate) enter() bool {
	if g.pending.Add(1) > maxPendingAnswers {
		g.pending.Add(-1)
		g.drop(fmt.Sprintf("%d answers to its requests already wait for it to take them", maxPendingAnswers))
		return false
	}
	return true
}

func (g *answerGate) leave() { g.pending.Add(-1) }

// drop logs an answer that was dropped, and why (rate-limited).
func (g *answerGate) drop(why string) {
	n := g.dropped.Add(1)
	g.logs.Do(func() {
		if g.warn != nil {
			g.warn("upstream %s: dropped the answer to a request it sent (%d dropped so far): %s", g.name, n, why)
		}
	})
}

// errAnswerDropped is what an HTTP upstream's answer POST returns when its answer was dropped:
// the SDK takes a failed POST as a message that did not reach the upstream, and goes on.
var errAnswerDropped = errors.New("the answer was dropped: the upstream does not take its answers")

// isAnswer reports whether r is a POST carrying a JSON-RPC response (the gateway's answer to
// a request of the upstream): it has an id and no method.
func isAnswer(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	s, ok := scanPost(r)
	if !ok {
		return false
	}
	_, hasID := s.ID()
	return hasID && !s.hasMethod
}

// answerRoundTrip sends an answer POST within the gate: at most answerTimeout until the
// upstream has answered it.
func (g *answerGate) answerRoundTrip(base http.RoundTripper, r *http.Request) (*http.Response, error) {
	if !g.enter() {
		return nil, errAnswerDropped
	}
	ctx, cancel := context.WithTimeout(r.Context(), answerTimeout)
	resp, err := base.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel()
		g.leave()
		if ctx.Err() != nil && r.Context().Err() == nil {
			g.drop(fmt.Sprintf("it did not take the answer within %s", answerTimeout))
			return nil, errAnswerDropped
		}
		return nil, err
	}
	resp.Body = &answerBody{ReadCloser: resp.Body, done: func() { cancel(); g.leave() }}
	return resp, nil
}

// answerBody ends an answer POST's admission when the SDK closes its (empty) body.
type answerBody struct {
	io.ReadCloser
	done func()
	once atomic.Bool
}

func (b *answerBody) Close() error {
	err := b.ReadCloser.Close()
	if b.once.CompareAndSwap(false, true) {
		b.done()
	}
	return err
}
