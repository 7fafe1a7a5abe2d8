package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// The notification outbox (issue 24, "Delivery never loses an event"). A held call and every
// decision of its request are announced to the configured receivers (gateway/notify): the
// store writes one outbox row per receiver that wants the event, in the SAME transaction as
// the event itself (the approval row created by CreateApproval; the phase change written by
// Decide or SettleApprovals), so an event is never committed without its notifications, nor a
// notification without its event. gateway/notify claims due rows (a lease, so that of several
// replicas on Postgres one delivers each row at a time), delivers them, and marks them
// delivered, retried later, or dead.
//
// Which receivers want an event is decided by the receivers' filters the gateway stores with
// SetNotificationReceivers (a table, so that every process writing an event routes it the same
// way: the gateway, its replicas, and `reversi approvals approve` deciding from the CLI). With
// no receiver stored, or none whose filters admit the event, nothing is written: an event a
// filter excludes leaves no row (nothing to deliver, nothing to list).

// NotificationState is the state of an outbox row.
type NotificationState string

const (
	// NotificationPending: not delivered yet; due at NextAttempt.
	NotificationPending NotificationState = "pending"
	// NotificationDelivered: the receiver answered 2xx.
	NotificationDelivered NotificationState = "delivered"
	// NotificationDead: every attempt failed (or the failure cannot be retried): a dead
	// letter, listed by `reversi notifications list --state dead`, delivered again only when
	// retried (RetryNotifications: `reversi notifications retry`).
	NotificationDead NotificationState = "dead"
)

// NotificationStates lists every NotificationState.
var NotificationStates = []NotificationState{NotificationPending, NotificationDelivered, NotificationDead}

// The notice types: the approval events a notification announces.
const (
	NoticeApprovalRequested = "approval.requested"
	NoticeApprovalApproved  = "approval.approved"
	NoticeApprovalDenied    = "approval.denied"
	NoticeApprovalExpired   = "approval.expired"
	NoticeApprovalEscalated = "approval.escalated"
)

// The alerts (issue 24): a reload the gateway refused, a rendering the controller refused
// (signature, downgrade, drift), a rollback step that ended verification_failed or
// unrecoverable, the kill switch turned on (halted) and off (resumed), an upstream down.
const (
	NoticeAlertReloadRefused    = "alert.reload_refused"
	NoticeAlertRenderingRefused = "alert.rendering_refused"
	NoticeAlertRollbackFailed   = "alert.rollback_failed"
	NoticeAlertHalted           = "alert.halted"
	NoticeAlertResumed          = "alert.resumed"
	NoticeAlertUpstreamDown     = "alert.upstream_down"
)

// NoticeTypes lists every notice type (gateway/config.NotificationEvents).
var NoticeTypes = []string{NoticeApprovalRequested, NoticeApprovalApproved, NoticeApprovalDenied, NoticeApprovalExpired, NoticeApprovalEscalated,
	NoticeAlertReloadRefused, NoticeAlertRenderingRefused, NoticeAlertRollbackFailed, NoticeAlertHalted, NoticeAlertResumed, NoticeAlertUpstreamDown}

// noticeOfEvent maps the phase events of a request's decision records to notice types.
var noticeOfEvent = map[ApprovalEvent]string{EventApproved: NoticeApprovalApproved, EventDenied: NoticeApprovalDenied,
	EventExpired: NoticeApprovalExpired, EventEscalated: NoticeApprovalEscalated}

// Risk is a tool's risk as its manifest records it (manifest.Risk), for approvers and for the
// receivers' risk filters.
type Risk struct {
	DataClass   string `json:"data_class,omitempty"`
	BlastRadius string `json:"blast_radius,omitempty"`
	Environment string `json:"environment,omitempty"`
}

// Notice is what one notification announces: the event and the request as they were when the
// event was committed, or an alert (IsAlert(Type)) and what it is about. It is stored as JSON in the outbox row (its field names are the JSON's).
type Notice struct {
	// Type is one of NoticeTypes; Key the idempotency key "<type>:<approval id>" (an alert's:
	// "<type>:<object>:<seq>", see alertTx), the same for every receiver and every attempt
	// (receivers deduplicate by it).
	Type string `json:"type"`
	Key  string `json:"idempotency_key"`
	// At is when the event was committed.
	At       time.Time `json:"at"`
	Approval string    `json:"approval"`
	// Namespace is the Kubernetes namespace of the object the notice is about ("" for a
	// standalone gateway), for the receivers' namespace filters.
	Namespace string `json:"namespace,omitempty"`
	Tool      string `json:"tool"`
	Run       string `json:"run"`
	Actor     string `json:"actor"`
	Reason    string `json:"reason,omitempty"`
	// ArgumentsPreview is the redacted preview of the call's arguments (JSON text,
	// engine.ArgumentsPreview): never the arguments themselves.
	ArgumentsPreview string    `json:"arguments_preview,omitempty"`
	Risk             Risk      `json:"risk,omitzero"`
	Roles            []string  `json:"roles,omitempty"`
	Quorum           int       `json:"quorum"`
	Expires          time.Time `json:"expires_at,omitzero"`
	// Kept: the request is an ApprovalRequest in Kubernetes (decided with an Approval object).
	Kept bool `json:"kept,omitempty"`
	// DecidedBy are the principals whose decisions counted (approved, denied).
	DecidedBy []string `json:"decided_by,omitempty"`
	// Note says what happened (e.g. "quorum 2 reached").
	Note string `json:"note,omitempty"`

	// The fields of an alert (the alert.* types; Source: issue 24). Their JSON names are the
	// controller's alert body's (object, revision, reason, message, severity). Of the fields
	// above an alert uses Run (a rollback's run), Actor (who turned the kill switch),
	// Tool and Risk (a rollback step's tool and its manifest's risk: what the tools and risk
	// filters see), Reason (a CamelCase reason, e.g. ReloadRefused) and Namespace.
	//
	// Object is what the alert is about: the gateway (kind ReversiGateway in Kubernetes,
	// Gateway standalone) or the run (ReversiRun).
	Object *ObjectRef `json:"object,omitempty"`
	// Severity is SeverityWarning or SeverityCritical.
	Severity string `json:"severity,omitempty"`
	// Message says what happened and what to do, in a sentence or two.
	Message string `json:"message,omitempty"`
	// Revision is the manifest set's checksum ("sha256:<hex>") served when the event happened.
	Revision string `json:"revision,omitempty"`
	// Upstream is the upstream's name (alert.upstream_down).
	Upstream string `json:"upstream,omitempty"`
	// Step is the rollback's step (the intent's Seq in Run), Status its rollback status
	// (verification_failed, unrecoverable).
	Step   int64  `json:"step,omitempty"`
	Status string `json:"status,omitempty"`
	// Seq is the Seq of the journal record the alert announces (in Run's journal; the
	// gateway-level journal when Run is ""): the store sets it, with Key and At.
	Seq int64 `json:"seq,omitempty"`
	// Since is when the state the alert reports began (halted since; the upstream's session
	// began, for alert.upstream_down), the zero time when it does not apply.
	Since time.Time `json:"since,omitzero"`
}

// ObjectRef names the object an alert is about, as the controller's alerts do.
type ObjectRef struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// The severities of an alert (Notice.Severity).
const (
	// SeverityWarning: the gateway keeps serving as before (a refused reload keeps the
	// previous manifests), or an operator's action to note (resumed).
	SeverityWarning = "warning"
	// SeverityCritical: something is not working or not undone (a rollback step, an
	// upstream, every call blocked by the kill switch).
	SeverityCritical = "critical"
)

// IsAlert reports whether typ is an alert type (alert.*) rather than an approval event.
func IsAlert(typ string) bool { return strings.HasPrefix(typ, "alert.") }

// Notification is one outbox row: a notice for one receiver (Sink, the receiver's name).
type Notification struct {
	ID          string
	Sink        string
	Notice      Notice
	State       NotificationState
	Attempts    int
	Created     time.Time
	NextAttempt time.Time // when a pending row is due
	Delivered   time.Time // zero unless delivered
	LastError   string    // the last failed attempt's error
}

// NotificationFilter selects rows for ListNotifications: empty fields match everything;
// Limit <= 0 means no limit.
type NotificationFilter struct {
	State NotificationState
	Sink  string
	Limit int
}

// Receiver is a receiver's name and filters, as the store keeps them (SetNotificationReceivers).
// An empty filter admits everything.
type Receiver struct {
	Name string
	// Events are notice types; Tools tool-name globs (api/policy.GlobMatch: the gateway's
	// allow/deny semantics); Risk blast radii (the manifest's risk.blast_radius); Namespaces
	// Kubernetes namespaces (Notice.Namespace).
	Events, Tools, Risk, Namespaces []string
}

// Matches reports whether r's filters admit n. A tools filter admits only a notice that names
// a tool matching one of its globs, so an alert that names no tool (reload refused, halted,
// resumed, upstream down) is not admitted by it; an alert about a rollback step names the
// step's tool (the call being undone). A risk filter admits only a notice whose risk (the
// tool's manifest's blast radius) it lists: an alert without a tool carries no risk. Source:
// issue 24.
func (r *Receiver) Matches(n Notice) bool {
	if len(r.Events) > 0 && !slices.Contains(r.Events, n.Type) {
		return false
	}
	if len(r.Tools) > 0 && (n.Tool == "" || !slices.ContainsFunc(r.Tools, func(g string) bool { return apipolicy.GlobMatch(g, n.Tool) })) {
		return false
	}
	if len(r.Risk) > 0 && !slices.Contains(r.Risk, n.Risk.BlastRadius) {
		return false
	}
	if len(r.Namespaces) > 0 && !slices.Contains(r.Namespaces, n.Namespace) {
		return false
	}
	return true
}

// ErrLeaseLost: the row is no longer leased to this owner (its lease expired and another
// worker took it, or it was finished): the delivery's result is not recorded.
var ErrLeaseLost = errors.New("store: the notification's lease was lost")

// Outbox is the notification outbox of the SQL stores (SQLite, Postgres, Memory all have it;
// a wrapping store such as gateway/kube's is not one: use the store it wraps).
type Outbox interface {
	// SetNotificationReceivers replaces the stored receivers with rs (names unique): from its
	// commit on, every event is written for the receivers whose filters admit it, by any
	// process on the store. Pending rows of receivers no longer in rs are dead-lettered.
	SetNotificationReceivers(ctx context.Context, rs []Receiver) error
	// NotificationWake receives (without blocking the sender) after a write of this store
	// instance committed new rows: the worker's cue to look now rather than at its next poll.
	NotificationWake() <-chan struct{}
	// ClaimNotifications leases up to limit due pending rows (NextAttempt <= now, not leased or
	// lease expired) to owner until now + lease and returns them, oldest due first. Of
	// concurrent claimers (replicas on Postgres) each row goes to one.
	// Only rows of the receivers named in sinks are claimed (the ones this worker knows).
	ClaimNotifications(ctx context.Context, owner string, sinks []string, lease time.Duration, limit int) ([]Notification, error)
	// FinishNotification records an attempt on a row leased to owner: state delivered, dead,
	// or pending again at next (with lastErr). Attempts grows by one. ErrLeaseLost when the
	// row is not leased to owner any more.
	FinishNotification(ctx context.Context, id, owner string, state NotificationState, next time.Time, lastErr string) error
	// ListNotifications returns rows, oldest first.
	ListNotifications(ctx context.Context, f NotificationFilter) ([]Notification, error)
	// RetryNotifications makes dead letters pending again, due now, with their attempts
	// counted from zero (the operator fixed the receiver): the rows named in ids, or with ids
	// empty every dead row (of receiver sink, when not ""). Only rows of receivers configured
	// now are taken (another receiver's row would never be claimed). It returns how many.
	RetryNotifications(ctx context.Context, ids []string, sink string) (int, error)
	// SettleApprovals writes the expiry (or escalation) of pending requests decided by the
	// store whose Expires has passed, with their decision records and notifications, at most
	// limit of them; it returns how many it changed. (Without it, expiry is only applied when
	// the request is read or decided, and nothing announces it.)
	SettleApprovals(ctx context.Context, limit int) (int, error)
	// SetNoticeNamespace sets the namespace of the notices this store instance writes (see
	// sqlStore.SetNoticeNamespace).
	SetNoticeNamespace(ns string)
}

// The kinds of an alert's Object as the proxy names them (ObjectGateway, ObjectRun); a store
// with a namespace (a gateway in Kubernetes) writes the kinds of the objects there
// (ReversiGateway, ReversiRun).
const (
	ObjectGateway = "Gateway"
	ObjectRun     = "Run"
)

var kubeKinds = map[string]string{ObjectGateway: "ReversiGateway", ObjectRun: "ReversiRun"}

var _ Outbox = (*sqlStore)(nil)

// outbox is a sqlStore's wake channel, and the namespace its notices carry.
type outbox struct {
	once sync.Once
	wake chan struct{}
	ns   atomic.Pointer[string]
}

// SetNoticeNamespace sets the Kubernetes namespace every notice written by this store
// instance from now on carries (Notice.Namespace, and an alert's Object.Namespace), for the
// receivers' namespaces filters: a gateway in Kubernetes mode sets its own namespace before
// it serves (internal/cli). "" (the default) is a standalone gateway's. Source: issue 24.
func (s *sqlStore) SetNoticeNamespace(ns string) { s.ob.ns.Store(&ns) }

// namespace is the namespace set by SetNoticeNamespace.
func (o *outbox) namespace() string {
	if p := o.ns.Load(); p != nil {
		return *p
	}
	return ""
}

func (o *outbox) channel() chan struct{} {
	o.once.Do(func() { o.wake = make(chan struct{}, 1) })
	return o.wake
}

func (o *outbox) signal() {
	select {
	case o.channel() <- struct{}{}:
	default:
	}
}

// SetNotificationReceivers implements Outbox.
func (s *sqlStore) SetNotificationReceivers(ctx context.Context, rs []Receiver) error {
	names := map[string]bool{}
	for _, r := range rs {
		if r.Name == "" || names[r.Name] {
			return fmt.Errorf("%w: receiver names must be unique and not empty (%q)", ErrInvalid, r.Name)
		}
		names[r.Name] = true
	}
	return s.write(ctx, durable, func(ctx context.Context, tx querier) error {
		if _, err := tx.exec(ctx, `DELETE FROM notification_receivers`); err != nil {
			return fmt.Errorf("store: notification receivers: %w", err)
		}
		now := tn(s.stamp())
		for _, r := range rs {
			if _, err := tx.exec(ctx, `INSERT INTO notification_receivers (name, events, tools, risk, namespaces, updated) VALUES ($1, $2, $3, $4, $5, $6)`,
				r.Name, encodeGroups(r.Events), encodeGroups(r.Tools), encodeGroups(r.Risk), encodeGroups(r.Namespaces), now); err != nil {
				return fmt.Errorf("store: notification receivers: %w", err)
			}
		}
		q := &query{}
		q.add(`UPDATE notifications SET state = 'dead', last_error = 'the receiver is no longer configured', lease_owner = '',
			lease_until = 0 WHERE state = 'pending'`)
		if len(rs) > 0 {
			list := make([]string, 0, len(rs))
			for _, r := range rs {
				list = append(list, r.Name)
			}
			q.add(` AND sink NOT IN (`, q.placeholders(list), `)`)
		}
		if _, err := tx.exec(ctx, q.sql.String(), q.args...); err != nil {
			return fmt.Errorf("store: notification receivers: %w", err)
		}
		return nil
	})
}

// receiversTx reads the stored receivers in tx.
func receiversTx(ctx context.Context, tx querier) ([]Receiver, error) {
	return collect(ctx, tx, "notification receivers", `SELECT name, events, tools, risk, namespaces FROM notification_receivers ORDER BY name`, nil,
		func(r rows) (Receiver, error) {
			var rc Receiver
			var ev, tools, risk, ns string
			if err := r.Scan(&rc.Name, &ev, &tools, &risk, &ns); err != nil {
				return Receiver{}, err
			}
			var err error
			for _, f := range []struct {
				to  *[]string
				raw string
			}{{&rc.Events, ev}, {&rc.Tools, tools}, {&rc.Risk, risk}, {&rc.Namespaces, ns}} {
				if *f.to, err = decodeGroups(f.raw); err != nil {
					break
				}
			}
			return rc, err
		})
}

// NotificationWake implements Outbox.
func (s *sqlStore) NotificationWake() <-chan struct{} { return s.ob.channel() }

// noticeOf is the notice of type typ about a as of at.
func noticeOf(a *Approval, typ, note string, at time.Time) Notice {
	n := Notice{Type: typ, Key: typ + ":" + a.ID, At: at.UTC(), Approval: a.ID, Tool: a.Tool, Run: a.Run, Actor: a.Actor,
		Reason: a.Reason, ArgumentsPreview: a.ArgsPreview, Risk: a.Risk, Roles: slices.Clone(a.Roles), Quorum: a.Quorum,
		Expires: a.Expires, Kept: a.Kept(), Note: note}
	if typ == NoticeApprovalApproved || typ == NoticeApprovalDenied {
		for _, d := range a.Decisions {
			if d.Approve == (typ == NoticeApprovalApproved) {
				n.DecidedBy = append(n.DecidedBy, d.By)
			}
		}
	}
	return n
}

const notificationCols = `id, sink, payload, state, attempts, created, next_attempt, delivered, last_error`

func scanNotification(sc interface{ Scan(...any) error }) (Notification, error) {
	var n Notification
	var payload, state string
	var created, next, delivered int64
	if err := sc.Scan(&n.ID, &n.Sink, &payload, &state, &n.Attempts, &created, &next, &delivered, &n.LastError); err != nil {
		return Notification{}, err
	}
	n.State, n.Created, n.NextAttempt, n.Delivered = NotificationState(state), nt(created), nt(next), nt(delivered)
	if err := json.Unmarshal([]byte(payload), &n.Notice); err != nil {
		return Notification{}, fmt.Errorf("notification %s: the stored notice is not JSON: %w", n.ID, err)
	}
	return n, nil
}

// noticeTx writes the rows of n for the stored receivers whose filters admit it, in tx (a
// row already there for a receiver and key is kept: a notice is written once). It reports
// whether it wrote any. A notice without a namespace gets the store's (SetNoticeNamespace).
func (s *sqlStore) noticeTx(ctx context.Context, tx querier, n Notice) (bool, error) {
	if n.Namespace == "" {
		n.Namespace = s.ob.namespace()
	}
	rs, err := receiversTx(ctx, tx)
	if err != nil {
		return false, err
	}
	var sinks []string
	for i := range rs {
		if rs[i].Matches(n) {
			sinks = append(sinks, rs[i].Name)
		}
	}
	if len(sinks) == 0 {
		return false, nil
	}
	payload, err := json.Marshal(n)
	if err != nil {
		return false, fmt.Errorf("store: notification %s: %w", n.Key, err)
	}
	now := tn(s.stamp())
	wrote := false
	for _, sink := range sinks {
		c, err := tx.exec(ctx, `INSERT INTO notifications (id, sink, idempotency_key, event, approval, payload, state, attempts,
			created, next_attempt, delivered, last_error, lease_owner, lease_until)
			VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, $7, $7, 0, '', '', 0) ON CONFLICT (sink, idempotency_key) DO NOTHING`,
			newID("ntf-"), sink, n.Key, n.Type, n.Approval, string(payload), now)
		if err != nil {
			return false, fmt.Errorf("store: notification %s: %w", n.Key, err)
		}
		wrote = wrote || c > 0
	}
	return wrote, nil
}

// alertTx writes the notices of alert n, the announcement of the journal record rec that
// was just appended in tx: At and Seq are rec's, the namespace the store's, and Key the
// idempotency key "<type>:<object>:<seq>" ("<type>:<object>:<step>:<seq>" for a rollback
// step), where object is the alert's Object as "<namespace>/<name>" (or "<name>"): one key
// per journal record, the same on every attempt, for every receiver and after a restart.
func (s *sqlStore) alertTx(ctx context.Context, tx querier, n Notice, rec *Record) (bool, error) {
	if !IsAlert(n.Type) || !slices.Contains(NoticeTypes, n.Type) {
		return false, fmt.Errorf("%w: alert type %q", ErrInvalid, n.Type)
	}
	n.At, n.Seq = rec.Time, rec.Seq
	if n.Namespace == "" {
		n.Namespace = s.ob.namespace()
	}
	if n.Object != nil {
		o := *n.Object
		if o.Namespace == "" {
			o.Namespace = n.Namespace
		}
		if k, ok := kubeKinds[o.Kind]; ok && o.Namespace != "" {
			o.Kind = k
		}
		n.Object = &o
	}
	n.Key = n.Type + ":" + alertScope(n)
	if n.Step > 0 {
		n.Key += ":" + strconv.FormatInt(n.Step, 10)
	}
	n.Key += ":" + strconv.FormatInt(rec.Seq, 10)
	return s.noticeTx(ctx, tx, n)
}

// alertScope is the object part of an alert's key.
func alertScope(n Notice) string {
	switch {
	case n.Object == nil:
		return n.Run
	case n.Object.Namespace != "":
		return n.Object.Namespace + "/" + n.Object.Name
	}
	return n.Object.Name
}

// phaseNoticesTx writes the notices of the phase records in recs (approved, denied, expired,
// escalated) about a.
func (s *sqlStore) phaseNoticesTx(ctx context.Context, tx querier, a *Approval, recs []ApprovalRecord, at time.Time) (bool, error) {
	wrote := false
	for _, r := range recs {
		typ, ok := noticeOfEvent[r.Event]
		if !ok || r.Once == "" {
			continue
		}
		w, err := s.noticeTx(ctx, tx, noticeOf(a, typ, r.Note, at))
		if err != nil {
			return false, err
		}
		wrote = wrote || w
	}
	return wrote, nil
}

// ClaimNotifications implements Outbox: a read finds whether anything is due (so that an idle
// poll writes nothing), then one UPDATE ... RETURNING leases the due rows: on Postgres the
// rows are chosen FOR UPDATE SKIP LOCKED and the UPDATE re-checks the lease, so concurrent
// claimers never share a row; SQLite has one writer at a time.
func (s *sqlStore) ClaimNotifications(ctx context.Context, owner string, sinks []string, lease time.Duration, limit int) ([]Notification, error) {
	if owner == "" || lease <= 0 || limit <= 0 {
		return nil, fmt.Errorf("%w: a claim needs an owner, a lease and a limit", ErrInvalid)
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	if len(sinks) == 0 {
		return nil, nil
	}
	now := tn(s.stamp())
	q := &query{}
	at := q.arg(now)
	due := ` FROM notifications WHERE state = 'pending' AND next_attempt <= ` + at + ` AND lease_until <= ` + at +
		` AND sink IN (` + q.placeholders(sinks) + `)`
	var n int
	if err := queryRow(ctx, s.r, `SELECT count(*) FROM (SELECT 1`+due+` LIMIT 1) d`, q.args...).Scan(&n); err != nil {
		return nil, fmt.Errorf("store: claim notifications: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	owned, until, lim := q.arg(owner), q.arg(now+lease.Nanoseconds()), q.arg(int64(limit))
	claim := `UPDATE notifications SET lease_owner = ` + owned + `, lease_until = ` + until + ` WHERE id IN (SELECT id` + due +
		` ORDER BY next_attempt, id LIMIT ` + lim + s.d.skipLocked + `) AND state = 'pending' AND lease_until <= ` + at +
		` RETURNING ` + notificationCols
	var out []Notification
	err := s.write(ctx, lazy, func(ctx context.Context, tx querier) error {
		var err error
		out, err = collect(ctx, tx, "claim notifications", claim, q.args, func(r rows) (Notification, error) { return scanNotification(r) })
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].NextAttempt.Equal(out[j].NextAttempt) {
			return out[i].NextAttempt.Before(out[j].NextAttempt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// FinishNotification implements Outbox.
func (s *sqlStore) FinishNotification(ctx context.Context, id, owner string, state NotificationState, next time.Time, lastErr string) error {
	if !slices.Contains(NotificationStates, state) {
		return fmt.Errorf("%w: notification state %q", ErrInvalid, state)
	}
	now := s.stamp()
	var delivered int64
	if state == NotificationDelivered {
		delivered, lastErr = tn(now), ""
	}
	if state != NotificationPending {
		next = time.Time{}
	}
	return s.write(ctx, lazy|single, func(ctx context.Context, tx querier) error {
		n, err := tx.exec(ctx, `UPDATE notifications SET state = $1, attempts = attempts + 1, next_attempt = $2, last_error = $3,
			delivered = $4, lease_owner = '', lease_until = 0 WHERE id = $5 AND lease_owner = $6 AND state = 'pending'`,
			string(state), tn(next), lastErr, delivered, id, owner)
		if err != nil {
			return fmt.Errorf("store: finish notification %s: %w", id, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: %s", ErrLeaseLost, id)
		}
		return nil
	})
}

// RetryNotifications implements Outbox.
func (s *sqlStore) RetryNotifications(ctx context.Context, ids []string, sink string) (int, error) {
	var n int64
	err := s.write(ctx, durable|single, func(ctx context.Context, tx querier) error {
		q := &query{}
		q.add(`UPDATE notifications SET state = 'pending', attempts = 0, next_attempt = `, q.arg(tn(s.stamp())),
			`, lease_owner = '', lease_until = 0 WHERE state = 'dead' AND sink IN (SELECT name FROM notification_receivers)`)
		if len(ids) > 0 {
			q.add(` AND id IN (`, q.placeholders(ids), `)`)
		}
		if sink != "" {
			q.add(` AND sink = `, q.arg(sink))
		}
		var err error
		if n, err = tx.exec(ctx, q.sql.String(), q.args...); err != nil {
			return fmt.Errorf("store: retry notifications: %w", err)
		}
		return nil
	})
	if err == nil && n > 0 {
		s.ob.signal()
	}
	return int(n), err
}

// ListNotifications implements Outbox.
func (s *sqlStore) ListNotifications(ctx context.Context, f NotificationFilter) ([]Notification, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if f.State != "" && !slices.Contains(NotificationStates, f.State) {
		return nil, fmt.Errorf("%w: notification state %q", ErrInvalid, f.State)
	}
	q := &query{}
	state, sink := q.arg(string(f.State)), q.arg(f.Sink)
	q.add(`SELECT `+notificationCols+` FROM notifications WHERE (`, state, ` = '' OR state = `, state, `) AND (`,
		sink, ` = '' OR sink = `, sink, `) ORDER BY created, id`)
	q.limit(f.Limit)
	return collect(ctx, s.r, "list notifications", q.sql.String(), q.args, func(r rows) (Notification, error) { return scanNotification(r) })
}

// SettleApprovals implements Outbox: each expired request is settled in a transaction of its
// own that reads it (held, see consumeTx), applies expiry (Approval.settle), writes it back
// only if it is still pending, and appends its phase records and notices; a decision that
// came first wins.
func (s *sqlStore) SettleApprovals(ctx context.Context, limit int) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	if limit <= 0 {
		limit = 100
	}
	ids, err := collect(ctx, s.r, "settle approvals", `SELECT id FROM approvals WHERE state = 'pending' AND uid = ''
		AND expires > 0 AND expires <= $1 ORDER BY expires, id LIMIT $2`, []any{tn(s.stamp()), int64(limit)},
		func(r rows) (id string, err error) { err = r.Scan(&id); return id, err })
	if err != nil {
		return 0, err
	}
	changed := 0
	for _, id := range ids {
		var did, wrote bool
		err := s.write(ctx, durable, func(ctx context.Context, tx querier) error {
			did, wrote = false, false
			a, err := s.readApprovalTx(ctx, tx, id)
			if err != nil {
				return err
			}
			before, escalated := a.State, a.Escalated
			now := s.stamp()
			if !a.settle(now) {
				return nil
			}
			args := approvalArgs(&a)
			n, err := tx.exec(ctx, `UPDATE approvals SET roles = $1, expires = $2, state = $3, escalated = $4, decided = $5
				WHERE id = $6 AND state = 'pending'`, args[5], args[8], args[12], args[14], args[15], id)
			if err != nil {
				return fmt.Errorf("store: settle approval %s: %w", id, err)
			}
			if n == 0 {
				return nil
			}
			recs := a.phaseRecords(before, escalated)
			for _, r := range recs {
				rec, _, err := approvalRecord(r)
				if err != nil {
					return err
				}
				if err := s.appendApprovalTx(ctx, tx, &rec); err != nil && !errors.Is(err, ErrExists) && !errors.Is(err, ErrNotFound) {
					return err
				}
			}
			did = true
			wrote, err = s.phaseNoticesTx(ctx, tx, &a, recs, now)
			return err
		})
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return changed, err
		}
		if did {
			changed++
		}
		if wrote {
			s.ob.signal()
		}
	}
	return changed, nil
}
