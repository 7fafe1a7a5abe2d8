package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/reversi-gitops/reversi/pkg/webhook"
)

// hookKey is the demo's HMAC key of the approvers' webhook (in Secret approvers-hook).
const hookKey = "demo-approvers-hook-key"

// Delivery is one POST the approvers' webhook received.
type Delivery struct {
	// Event is X-Reversi-Event, Key the Idempotency-Key.
	Event, Key string
	// Verified: X-Reversi-Signature is the body's HMAC-SHA256 under the Secret's key.
	Verified bool
	// Body is the JSON body.
	Body string
}

// hookReceiver is the approvers' webhook: an HTTP server on 127.0.0.1 that keeps what it
// receives (at most 64 deliveries of 64 KiB) and answers 204.
type hookReceiver struct {
	srv *httptest.Server
	key string

	mu   sync.Mutex
	got  []Delivery
	wake chan struct{}
}

func newHookReceiver(key string) *hookReceiver {
	h := &hookReceiver{key: key, wake: make(chan struct{}, 1)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil || r.Method != http.MethodPost {
			http.Error(w, "a POST with a body, please", http.StatusBadRequest)
			return
		}
		d := Delivery{Event: r.Header.Get(webhook.HeaderEvent), Key: r.Header.Get(webhook.HeaderIdempotency),
			Verified: webhook.Verify(h.key, body, r.Header.Get(webhook.HeaderSignature)), Body: string(body)}
		h.mu.Lock()
		if len(h.got) < 64 {
			h.got = append(h.got, d)
		}
		h.mu.Unlock()
		select {
		case h.wake <- struct{}{}:
		default:
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	return h
}

// wait returns the first delivery of event, waiting at most d.
func (h *hookReceiver) wait(ctx context.Context, event string, d time.Duration) (Delivery, error) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		h.mu.Lock()
		for _, g := range h.got {
			if g.Event == event {
				h.mu.Unlock()
				return g, nil
			}
		}
		n := len(h.got)
		h.mu.Unlock()
		select {
		case <-h.wake:
		case <-deadline.C:
			return Delivery{}, fmt.Errorf("the approvers' webhook received no %s within %s (%d other deliveries): see the gateway's log", event, d, n)
		case <-ctx.Done():
			return Delivery{}, ctx.Err()
		}
	}
}
