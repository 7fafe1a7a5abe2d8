// Package notify delivers the gateway's notifications: the approval events (a call held for
// approval, and its request approved, denied, expired or escalated) and the alerts (a reload
// refused, a rollback step not undone, the kill switch on and off, an upstream down) that the
// store wrote into its outbox in the same transaction as the event (store.Outbox), to the
// receivers of `notifications:` (gateway.yaml, reversi.config.yaml) and
// $REVERSI_APPROVAL_WEBHOOK (approval events only).
//
// Delivery is at least once: a Worker claims due rows with a lease (one replica at a time
// delivers a row, also with several gateways on one Postgres store), posts them, and marks
// them delivered, due again after an exponential backoff, or dead after MaxAttempts (or at
// once when the receiver's answer says a retry cannot help: a 4xx other than 408 and 429, a
// redirect). A gateway that stops between the event and the delivery delivers it when it
// starts again (the row is pending in the store; a lease held by a process that died
// expires). Every attempt of one row carries the same Idempotency-Key, so that receivers
// deduplicate.
//
// Providers:
//   - webhook: POST of Body (an alert: AlertBody) as JSON, with X-Reversi-Event (the type), Idempotency-Key and,
//     when the receiver has a secret, X-Reversi-Signature: sha256=<hex HMAC-SHA256 of the
//     body with the secret>.
//   - slack: POST of {"text": ...} (SlackBody) to a Slack-compatible incoming webhook.
//
// Filters (per receiver): events (notice types), tools (globs, api/policy.GlobMatch: the
// allow/deny semantics) and risk (the manifest's blast_radius). They are stored with the
// outbox and run when the event is written: an event a receiver's filters exclude leaves no
// row for it (nothing is sent, nothing is listed).
//
// Source: issue 24; seed "MCP gateway" (Storage and notifications).
package notify

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/egress"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/webhook"
)

// The headers of a delivery (pkg/webhook's).
const (
	HeaderSignature   = webhook.HeaderSignature
	HeaderEvent       = webhook.HeaderEvent
	HeaderIdempotency = webhook.HeaderIdempotency
)

// Defaults of Options.
const (
	DefaultPoll         = 500 * time.Millisecond
	DefaultTimeout      = webhook.DefaultTimeout
	DefaultMaxAttempts  = webhook.DefaultMaxAttempts
	DefaultBackoff      = webhook.DefaultBackoff
	DefaultMaxBackoff   = webhook.DefaultMaxBackoff
	DefaultBatch        = 16
	DefaultConcurrency  = 4
	DefaultMaxBodyBytes = 64 << 10
	DefaultReadLimit    = 4 << 10
)

// Metric label values of reversi_gateway_notifications_total{state}.
const (
	MetricDelivered = "delivered" // a receiver answered 2xx
	MetricRetried   = "retried"   // an attempt failed and the row is due again later
	MetricDead      = "dead"      // a row was dead-lettered
)

// Options configure a Worker. Zero values are the defaults.
type Options struct {
	// Outbox is the store's outbox (required): the SQL store itself, not a wrapper.
	Outbox store.Outbox
	// Receivers are the configured receivers (config.Notification).
	Receivers []config.Notification
	// Egress are reversi.config.yaml's egress rules: a receiver URL they refuse is an error
	// of New, and each delivery is checked again (names may resolve elsewhere later).
	Egress   egress.Rules
	Resolver egress.Resolver // nil: net.DefaultResolver
	// Gateway is the gateway's name (in the bodies); StoreFlags locate its store in the
	// approve command ("--data .reversi").
	Gateway, StoreFlags string
	// Owner names this worker in leases (default: random).
	Owner string
	// Poll is how often the outbox is looked at without a wake-up (another process's event,
	// a retry coming due) and expired requests settled.
	Poll time.Duration
	// Timeout bounds one delivery (connect, send, answer); Lease is how long a claimed row is
	// this worker's (default: (Batch/Concurrency + 2) * Timeout + 10s, the time a claimed
	// batch may take and some: a worker that dies leaves it to another then).
	Timeout, Lease time.Duration
	// MaxAttempts is how many attempts a row gets before it is dead.
	MaxAttempts int
	// Backoff is the first retry's delay, doubled each attempt up to MaxBackoff (with 20 %
	// jitter, k8s.io/apimachinery wait.Backoff).
	Backoff, MaxBackoff time.Duration
	// Batch is the most rows claimed at once, Concurrency the most deliveries in flight.
	Batch, Concurrency int
	// MaxBodyBytes bounds a rendered body (a larger one is dead-lettered), ReadLimit how much
	// of an answer is read (for the error message).
	MaxBodyBytes int
	ReadLimit    int64
	// Client posts the deliveries (default: a client with Timeout, no proxy from the
	// environment, no redirects followed).
	Client *http.Client
	// Logf receives one line per failed attempt (nil: none).
	Logf func(format string, args ...any)
}

// Worker delivers the outbox's rows. Build it with New (which installs the receivers'
// filters as the store's router), run it with Run.
type Worker struct {
	o         Options
	receivers map[string]*config.Notification
	sinks     []string // the receivers' names
	metric    *prometheus.CounterVec
}

// New checks the receivers (every URL against the egress rules, names unique) and stores
// their filters in the outbox (store.Outbox.SetNotificationReceivers), so that from now on
// every writer of an event on the store (this gateway, its replicas, the approvals CLI)
// writes a row for each receiver the event concerns. Errors name the receiver's field and
// file:line.
func New(ctx context.Context, o Options) (*Worker, error) {
	if o.Outbox == nil {
		return nil, errors.New("notify: no outbox")
	}
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.Backoff)
	}
	if o.Batch <= 0 {
		o.Batch = DefaultBatch
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Lease <= 0 {
		// A claim holds Batch rows while Concurrency are in flight: its last rows begin after
		// (Batch/Concurrency - 1) timeouts. The lease covers the whole batch, with 2 timeouts
		// and 10 s to spare, or another replica would claim (and post) rows still waiting here.
		waves := (o.Batch + o.Concurrency - 1) / o.Concurrency
		o.Lease = time.Duration(waves+2)*o.Timeout + 10*time.Second
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = DefaultReadLimit
	}
	if o.Owner == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.Owner = "notify-" + hex.EncodeToString(b[:])
	}
	if o.Client == nil {
		// The egress check of each delivery (post) resolves the name itself; the connection
		// resolves it again. The address actually dialled is checked too (metadata addresses
		// always, private ones under block_private), so that a name answering a public
		// address to the check and a private or metadata one to the dial is refused.
		o.Client = webhook.NewGuardedClient(o.Timeout, o.Concurrency, o.Egress.Dialed)
	}
	w := &Worker{o: o, receivers: map[string]*config.Notification{},
		metric: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reversi_gateway_notifications_total",
			Help: "Notification delivery results by state: delivered (a receiver answered 2xx), retried (an attempt failed; due again later), dead (dead-lettered: see reversi notifications list --state dead).",
		}, []string{"state"})}
	for _, s := range []string{MetricDelivered, MetricRetried, MetricDead} {
		w.metric.WithLabelValues(s)
	}
	var errs []error
	for i := range o.Receivers {
		r := &o.Receivers[i]
		where := r.Field
		if r.Where != "" {
			where = r.Where + ": " + r.Field
		}
		if _, dup := w.receivers[r.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: a receiver named %s is configured twice (gateway.yaml and reversi.config.yaml?): give one another name:", where, r.Name))
			continue
		}
		if r.Type != config.NotifyWebhook && r.Type != config.NotifySlack {
			errs = append(errs, fmt.Errorf("%s.type: %q is not webhook or slack", where, r.Type))
			continue
		}
		if err := egress.Check(ctx, r.URL, o.Egress, o.Resolver); err != nil {
			errs = append(errs, fmt.Errorf("%s.url: refused by the egress rules: %v", where, err))
			continue
		}
		w.receivers[r.Name] = r
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	rs := make([]store.Receiver, 0, len(w.receivers))
	for _, r := range o.Receivers {
		rs = append(rs, receiverOf(&r))
		w.sinks = append(w.sinks, r.Name)
	}
	if err := o.Outbox.SetNotificationReceivers(ctx, rs); err != nil {
		return nil, fmt.Errorf("notifications: %w", err)
	}
	return w, nil
}

func receiverOf(r *config.Notification) store.Receiver {
	return store.Receiver{Name: r.Name, Events: r.Events, Tools: r.Tools, Risk: r.Risk, Namespaces: r.Namespaces}
}

// Collector is the worker's metric, for the gateway's registry.
func (w *Worker) Collector() prometheus.Collector { return w.metric }

// Matches reports whether receiver r's filters admit n (store.Receiver.Matches: its type
// among Events, its tool matched by one of Tools with api/policy.GlobMatch, its blast radius
// among Risk; an empty filter admits everything).
func Matches(r *config.Notification, n store.Notice) bool {
	rc := receiverOf(r)
	return rc.Matches(n)
}

// Run delivers until ctx ends: at once after a wake-up (an event of this process), else every
// Poll, when it also settles expired requests (their approval.expired notices). A round takes
// up to Batch rows and delivers them, Concurrency at a time; a full batch is followed by
// another at once.
//
// Each receiver is delivered by a loop of its own (its rows claimed apart, Concurrency of
// them in flight): a receiver that hangs or is down, with many rows waiting (an agent making
// many held calls), makes only its own rows wait for their timeouts, never another
// receiver's.
func (w *Worker) Run(ctx context.Context) error {
	tick := time.NewTicker(w.o.Poll)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	cues := make([]chan struct{}, len(w.sinks))
	for i, sink := range w.sinks {
		cues[i] = make(chan struct{}, 1)
		wg.Add(1)
		go func() { defer wg.Done(); w.deliverLoop(ctx, sink, cues[i]) }()
	}
	for {
		if _, err := w.o.Outbox.SettleApprovals(ctx, w.o.Batch); err != nil && ctx.Err() == nil {
			w.logf("notifications: settling expired approval requests: %v", err)
		}
		for _, c := range cues {
			select {
			case c <- struct{}{}:
			default: // that receiver's loop is busy: it looks again when done
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.o.Outbox.NotificationWake():
		case <-tick.C:
		}
	}
}

// deliverLoop delivers sink's rows at each cue, a full batch followed by another at once.
func (w *Worker) deliverLoop(ctx context.Context, sink string, cue <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-cue:
		}
		for {
			n, err := w.round(ctx, []string{sink})
			if err != nil && ctx.Err() == nil {
				w.logf("notifications: %v", err)
			}
			if err != nil || n < w.o.Batch || ctx.Err() != nil {
				break
			}
		}
	}
}

// Round claims the due rows of every receiver (at most Batch) and delivers them; it returns
// how many it claimed. (Run delivers each receiver apart.)
func (w *Worker) Round(ctx context.Context) (int, error) { return w.round(ctx, w.sinks) }

func (w *Worker) round(ctx context.Context, sinks []string) (int, error) {
	rows, err := w.o.Outbox.ClaimNotifications(ctx, w.o.Owner, sinks, w.o.Lease, w.o.Batch)
	if err != nil {
		return 0, err
	}
	sem := make(chan struct{}, w.o.Concurrency)
	var wg sync.WaitGroup
	for _, n := range rows {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			w.deliver(ctx, n)
		}()
	}
	wg.Wait()
	return len(rows), nil
}

// deliver makes one attempt at n and records its result.
func (w *Worker) deliver(ctx context.Context, n store.Notification) {
	err := w.post(ctx, n)
	state, next, msg := store.NotificationDelivered, time.Time{}, ""
	switch {
	case err == nil:
	case webhook.IsPermanent(err) || n.Attempts+1 >= w.o.MaxAttempts:
		state, msg = store.NotificationDead, err.Error()
	default:
		state, msg = store.NotificationPending, err.Error()
		next = time.Now().Add(w.delay(n.Attempts + 1))
	}
	if err != nil {
		w.logf("notifications: %s to %s (attempt %d): %v", n.Notice.Key, n.Sink, n.Attempts+1, err)
	}
	// The result is recorded even when ctx ended meanwhile (the post happened).
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if ferr := w.o.Outbox.FinishNotification(fctx, n.ID, w.o.Owner, state, next, msg); ferr != nil {
		w.logf("notifications: recording the attempt on %s: %v", n.ID, ferr)
		return
	}
	w.metric.WithLabelValues(map[store.NotificationState]string{store.NotificationDelivered: MetricDelivered,
		store.NotificationPending: MetricRetried, store.NotificationDead: MetricDead}[state]).Inc()
}

// delay is the wait before attempt+1 (attempt >= 1 failed): Backoff doubled per attempt, at
// most MaxBackoff, plus up to 20 % jitter.
func (w *Worker) delay(attempt int) time.Duration {
	return webhook.Retry{Backoff: w.o.Backoff, MaxBackoff: w.o.MaxBackoff}.Delay(attempt)
}

// post renders n for its receiver and posts it once.
func (w *Worker) post(ctx context.Context, n store.Notification) error {
	r := w.receivers[n.Sink]
	if r == nil {
		return &webhook.PermanentError{Err: fmt.Errorf("the receiver %s is not configured any more", n.Sink)}
	}
	var body []byte
	var err error
	if r.Type == config.NotifySlack {
		body, err = SlackBody(n.Notice, w.o.Gateway, w.o.StoreFlags)
	} else {
		body, err = WebhookBody(n.Notice, w.o.Gateway, w.o.StoreFlags)
	}
	if err != nil {
		return &webhook.PermanentError{Err: fmt.Errorf("rendering: %w", err)}
	}
	if len(body) > w.o.MaxBodyBytes {
		return &webhook.PermanentError{Err: fmt.Errorf("the body is %d bytes, above the limit of %d", len(body), w.o.MaxBodyBytes)}
	}
	if err := egress.Check(ctx, r.URL, w.o.Egress, w.o.Resolver); err != nil {
		return fmt.Errorf("refused by the egress rules: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, w.o.Timeout)
	defer cancel()
	d := webhook.Delivery{URL: r.URL, Event: n.Notice.Type, Key: n.Notice.Key, Body: body, UserAgent: "reversi-gateway"}
	if r.Type == config.NotifyWebhook {
		d.Secret = r.Secret
	}
	return webhook.Post(ctx, w.o.Client, d, w.o.ReadLimit)
}

func (w *Worker) logf(format string, args ...any) {
	if w.o.Logf != nil {
		w.o.Logf(format, args...)
	}
}
