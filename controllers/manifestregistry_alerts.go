package controllers

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/pkg/webhook"
)

// The controller's rendering alerts (issue 24: "rendering refused (signature, downgrade,
// drift)", configured "on the controller for rendering alerts"). When a ManifestRegistry
// reconcile refuses a revision for a security reason (alertReason) or restores a drifted
// ConfigMap, each receiver of `reversi controller --notifications-config` whose filters admit
// it gets one alert.rendering_refused per (registry, revision, reason). The ManifestRegistry's
// status is the outbox: the alert is recorded in status.notifications in the status write that
// records the refusal, then posted (pkg/webhook.Post), retried with backoff on later
// reconciles, and dead-lettered after MaxAttempts (condition NotificationsDelivered=False,
// reason NotificationDeadLettered, a Warning Event, and the metric).

// EventRenderingRefused is the event type of the controller's alerts (gateway/config's
// NotificationEvents, store.NoticeAlertRenderingRefused).
const EventRenderingRefused = "alert.rendering_refused"

// Defaults of AlertOptions: the gateway's outbox worker's (pkg/webhook DefaultTimeout and
// the Default* of its retry policy).
const (
	DefaultAlertTimeout = webhook.DefaultTimeout
	// maxReceiverName bounds a receiver's name (status.notifications[].receiver).
	maxReceiverName = 63
	// maxAlertText bounds status.notifications[].message and lastError (bytes).
	maxAlertText = 1024
)

// AlertOptions configure the rendering alerts of the ManifestRegistry reconciler (issue 24).
type AlertOptions struct {
	// Receivers are the receivers of the notifications file (LoadNotificationsConfig). Only
	// alert.rendering_refused is sent; a receiver's `events:` filter must admit it, its
	// `namespaces:` filter the registry's namespace, and a receiver with a `tools:` or
	// `risk:` filter gets no rendering alerts (an alert names no tool and no risk, and such a
	// filter admits only what it names, as the gateway's does). Empty: no alerts, and
	// status.notifications is left as it is.
	Receivers []config.Notification
	// Timeout bounds one POST (connect to the answer's end; DefaultAlertTimeout when 0).
	Timeout time.Duration
	// MaxAttempts is how many attempts a delivery gets before it is Dead
	// (webhook.DefaultMaxAttempts when 0).
	MaxAttempts int
	// Backoff is the wait after the first failed attempt, doubling after each next one up to
	// MaxBackoff, with up to 20 % jitter (webhook.DefaultBackoff, webhook.DefaultMaxBackoff when 0).
	Backoff, MaxBackoff time.Duration
	// HTTPClient posts the alerts (webhook.NewClient(Timeout, 2) when nil).
	HTTPClient *http.Client
}

func (o *AlertOptions) defaults() {
	o.Timeout = cmp.Or(o.Timeout, DefaultAlertTimeout)
	o.MaxAttempts = cmp.Or(o.MaxAttempts, webhook.DefaultMaxAttempts)
	o.Backoff = cmp.Or(o.Backoff, webhook.DefaultBackoff)
	o.MaxBackoff = max(cmp.Or(o.MaxBackoff, webhook.DefaultMaxBackoff), o.Backoff)
	if o.HTTPClient == nil {
		o.HTTPClient = webhook.NewClient(o.Timeout, 2)
	}
}

// NotificationsConfigError is a notifications file that cannot be used: each error names the
// file, the line and the field (gateway/config's errors), or the file cannot be read.
type NotificationsConfigError struct {
	File string
	Errs []error
}

func (e *NotificationsConfigError) Error() string {
	msgs := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		msgs[i] = err.Error()
	}
	return fmt.Sprintf("--notifications-config %s: %s", e.File, strings.Join(msgs, "; "))
}

func (e *NotificationsConfigError) Unwrap() []error { return e.Errs }

// LoadNotificationsConfig reads the controller's notifications file (`reversi controller
// --notifications-config`, issue 24): a YAML (or JSON) document whose only field is
// `notifications:`, a list of receivers in exactly gateway.yaml's format
// (gateway/config.ParseNotifications), ${NAME} in url and secret expanded with lookup
// (os.LookupEnv when nil: a Deployment feeds them from Secrets with env valueFrom). At most
// v1alpha1.MaxRegistryNotifications receivers. Errors: a *NotificationsConfigError naming the
// file, line and field, never an expanded value.
func LoadNotificationsConfig(file string, lookup config.LookupFunc) ([]config.Notification, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, &NotificationsConfigError{File: file, Errs: []error{err}}
	}
	docs, errs := manifest.ParseFile(file, data)
	if len(errs) > 0 {
		return nil, &NotificationsConfigError{File: file, Errs: errs}
	}
	if len(docs) != 1 {
		return nil, &NotificationsConfigError{File: file, Errs: []error{fmt.Errorf("%s: %d documents, want one mapping with notifications:", file, len(docs))}}
	}
	top, ok := docs[0].Value.(map[string]any)
	if !ok {
		return nil, &NotificationsConfigError{File: file, Errs: []error{fmt.Errorf("%s:%d: expected a mapping with notifications:, found %s", file, docs[0].Line(""), manifest.Describe(docs[0].Value))}}
	}
	for k := range top {
		if k != "notifications" {
			return nil, &NotificationsConfigError{File: file, Errs: []error{fmt.Errorf("%s:%d: %s: unknown field: the file holds only notifications:", file, docs[0].Line(k), k)}}
		}
	}
	rs, errs := config.ParseNotifications(file, data, lookup)
	if len(errs) > 0 {
		return nil, &NotificationsConfigError{File: file, Errs: errs}
	}
	for _, n := range rs {
		if len(n.Name) > maxReceiverName {
			errs = append(errs, fmt.Errorf("%s: %s.name: %q is longer than %d characters (status.notifications names receivers): give it a shorter name", n.Where, n.Field, n.Name, maxReceiverName))
		}
	}
	if len(errs) > 0 {
		return nil, &NotificationsConfigError{File: file, Errs: errs}
	}
	if len(rs) > v1alpha1.MaxRegistryNotifications {
		return nil, &NotificationsConfigError{File: file, Errs: []error{fmt.Errorf("%s: notifications: %d receivers, at most %d (status.notifications holds one entry per receiver)", file, len(rs), v1alpha1.MaxRegistryNotifications)}}
	}
	return rs, nil
}

// alertAdmits reports whether receiver n takes the rendering alert of a registry in namespace
// ns: its events filter (empty: all) names alert.rendering_refused, its namespaces filter
// (empty: all) names ns, and it has no tools or risk filter (see AlertOptions.Receivers).
func alertAdmits(n *config.Notification, ns string) bool {
	return (len(n.Events) == 0 || slices.Contains(n.Events, EventRenderingRefused)) &&
		(len(n.Namespaces) == 0 || slices.Contains(n.Namespaces, ns)) && len(n.Tools) == 0 && len(n.Risk) == 0
}

// alertReasons are the Ready reasons of a refusal that is alerted (issue 24: "rendering
// refused (signature, downgrade, drift)"): an unsigned or badly signed commit or tag, a
// manifest signature that does not verify, a downgrade or replay of the signed index, a
// revision that does not descend from the applied one, another registry's folder.
var alertReasons = []string{v1alpha1.ReasonCommitVerificationFailed, v1alpha1.ReasonSignatureVerificationFailed,
	v1alpha1.ReasonVersionDowngrade, v1alpha1.ReasonRevisionNotDescendant, v1alpha1.ReasonRegistryMismatch}

// alertReason reports whether a failed step is alerted: its reason is one of alertReasons, or
// the step set SourceVerified=False with its reason (unusable commit keys). Decided by the
// typed reason, never by the message.
func alertReason(reg *v1alpha1.ManifestRegistry, e *stepError) bool {
	if slices.Contains(alertReasons, e.reason) {
		return true
	}
	sv := apimeta.FindStatusCondition(reg.Status.Conditions, v1alpha1.ConditionSourceVerified)
	return sv != nil && sv.Status == metav1.ConditionFalse && sv.Reason == e.reason && sv.ObservedGeneration == reg.Generation
}

// AlertKey is the Idempotency-Key of the alert about registry ns/name refusing revision for
// reason: `alert.rendering_refused:<ns>/<name>:<revision>:<reason>`. The reason is part of it
// so that a revision refused for a second reason (its commit keys changed) is a new alert;
// the same refusal reconciled again is the same one.
func AlertKey(ns, name, revision, reason string) string {
	return EventRenderingRefused + ":" + ns + "/" + name + ":" + cmp.Or(revision, "unknown") + ":" + reason
}

// recordAlert writes the alert about reg refusing revision for reason into
// status.notifications, Pending and due now, for every admitting receiver whose entry holds
// another key (the same key: already recorded, whatever its state, so nothing is sent again).
// Entries of receivers no longer configured are removed. No receivers: nothing changes.
func (r *ManifestRegistryReconciler) recordAlert(reg *v1alpha1.ManifestRegistry, reason, revision, message string) {
	if r.Alerts == nil || len(r.Alerts.Receivers) == 0 {
		return
	}
	r.pruneAlerts(reg)
	key := AlertKey(reg.Namespace, reg.Name, revision, reason)
	now := metav1.Now()
	for i := range r.Alerts.Receivers {
		rc := &r.Alerts.Receivers[i]
		if !alertAdmits(rc, reg.Namespace) {
			continue
		}
		entry := v1alpha1.RegistryNotification{Receiver: rc.Name, Type: EventRenderingRefused, Key: key, Revision: revision, Reason: reason,
			Message: truncateText(message, maxAlertText), OccurredAt: now, State: v1alpha1.NotificationPending, NextAttemptTime: &now}
		entry.Seal = r.sealAlert(reg, &entry)
		j := slices.IndexFunc(reg.Status.Notifications, func(n v1alpha1.RegistryNotification) bool { return n.Receiver == rc.Name })
		switch {
		case j < 0:
			reg.Status.Notifications = append(reg.Status.Notifications, entry)
		case reg.Status.Notifications[j].Key == key:
			continue
		default:
			if old := reg.Status.Notifications[j]; old.State == v1alpha1.NotificationPending {
				r.deadLetter(reg, old, "superseded by a newer alert ("+key+") before it was delivered")
			}
			reg.Status.Notifications[j] = entry
		}
	}
	slices.SortFunc(reg.Status.Notifications, func(a, b v1alpha1.RegistryNotification) int { return strings.Compare(a.Receiver, b.Receiver) })
}

// pruneAlerts removes the entries the controller did not write (no valid seal: someone with
// manifestregistries/status wrote or edited them; a Warning Event StatusNotSealed says so, and
// they are never sent) and those of receivers no longer configured (a Pending one is
// dead-lettered first: an Event and the metric say so).
func (r *ManifestRegistryReconciler) pruneAlerts(reg *v1alpha1.ManifestRegistry) {
	reg.Status.Notifications = slices.DeleteFunc(reg.Status.Notifications, func(n v1alpha1.RegistryNotification) bool {
		if !r.alertSealed(reg, &n) {
			r.event(reg, corev1.EventTypeWarning, v1alpha1.ReasonStatusNotSealed, "",
				fmt.Sprintf("status.notifications entry for receiver %s (key %s) was not written by the controller (no valid seal): it is dropped and not sent; check who may patch manifestregistries/status",
					truncateText(n.Receiver, maxReceiverName), truncateText(n.Key, 300)))
			return true
		}
		known := slices.ContainsFunc(r.Alerts.Receivers, func(c config.Notification) bool { return c.Name == n.Receiver && alertAdmits(&c, reg.Namespace) })
		if !known && n.State == v1alpha1.NotificationPending {
			r.deadLetter(reg, n, "the receiver is no longer configured (--notifications-config)")
		}
		return !known
	})
}

// deadLetter counts n as dead and records a Warning Event naming the receiver and why.
func (r *ManifestRegistryReconciler) deadLetter(reg *v1alpha1.ManifestRegistry, n v1alpha1.RegistryNotification, why string) {
	alertDeliveries.WithLabelValues("dead").Inc()
	// An Event's note holds at most 1 KiB: the key and the error are cut to fit.
	r.event(reg, corev1.EventTypeWarning, v1alpha1.ReasonNotificationDeadLettered, "",
		fmt.Sprintf("alert %s to receiver %s was dead-lettered after %d attempts: %s; see status.notifications",
			truncateText(n.Key, 300), n.Receiver, n.Attempts, truncateText(why, 400)))
}

// syncAlerts prepares status.notifications for a status write: entries of receivers no
// longer configured go, and NotificationsDelivered says how delivery stands. No receivers:
// nothing changes.
func (r *ManifestRegistryReconciler) syncAlerts(reg *v1alpha1.ManifestRegistry) {
	if r.Alerts == nil || len(r.Alerts.Receivers) == 0 {
		return
	}
	r.pruneAlerts(reg)
	setAlertsCondition(reg)
}

// deliverAlerts posts every due Pending entry of reg's status.notifications, one at a time,
// records each result, sets NotificationsDelivered, and patches the status when anything
// changed. It returns how long until the next entry is due (0: none pending). A POST whose
// answer is lost (the controller stops) leaves the entry Pending: it is sent again, with the
// same key (at least once).
func (r *ManifestRegistryReconciler) deliverAlerts(ctx context.Context, reg *v1alpha1.ManifestRegistry) (time.Duration, error) {
	if r.Alerts == nil || len(r.Alerts.Receivers) == 0 {
		return 0, nil
	}
	base := reg.DeepCopy()
	r.pruneAlerts(reg)
	o := r.alertOptions()
	for i := range reg.Status.Notifications {
		n := &reg.Status.Notifications[i]
		if n.State != v1alpha1.NotificationPending || (n.NextAttemptTime != nil && time.Now().Before(n.NextAttemptTime.Time)) {
			continue
		}
		if st, done := r.finishedAlert(reg, n); done {
			// Delivered or dead-lettered by this controller already: someone reset it to
			// Pending (the seal covers the alert, not its delivery state). Not sent again.
			n.State, n.NextAttemptTime = st, nil
			continue
		}
		rc := r.receiver(n.Receiver)
		err := r.postAlert(ctx, o, rc, reg, n)
		if ctx.Err() != nil {
			return 0, ctx.Err() // stopping: the entry stays Pending for the next start
		}
		now := metav1.Now()
		n.Attempts++
		n.LastAttemptTime = &now
		switch {
		case err == nil:
			n.State, n.NextAttemptTime, n.LastError = v1alpha1.NotificationDelivered, nil, ""
			r.finishAlert(reg, n)
			alertDeliveries.WithLabelValues("delivered").Inc()
			log.FromContext(ctx).Info("alert delivered", "receiver", n.Receiver, "key", n.Key, "attempts", n.Attempts)
		case webhook.IsPermanent(err) || int(n.Attempts) >= o.MaxAttempts:
			n.State, n.NextAttemptTime, n.LastError = v1alpha1.NotificationDead, nil, truncateText(err.Error(), maxAlertText)
			r.finishAlert(reg, n)
			r.deadLetter(reg, *n, n.LastError)
		default:
			next := metav1.NewTime(now.Add(backoff(o, int(n.Attempts))))
			n.NextAttemptTime, n.LastError = &next, truncateText(err.Error(), maxAlertText)
			alertDeliveries.WithLabelValues("retried").Inc()
			log.FromContext(ctx).Info("alert delivery failed, retrying", "receiver", n.Receiver, "key", n.Key, "attempts", n.Attempts, "error", n.LastError)
		}
	}
	setAlertsCondition(reg)
	if !equality.Semantic.DeepEqual(base.Status, reg.Status) {
		if err := r.patchStatus(ctx, reg, base); err != nil {
			return 0, err
		}
	}
	var due time.Duration
	for _, n := range reg.Status.Notifications {
		if n.State == v1alpha1.NotificationPending && n.NextAttemptTime != nil {
			d := max(time.Until(n.NextAttemptTime.Time), time.Millisecond)
			if due == 0 || d < due {
				due = d
			}
		}
	}
	return due, nil
}

// alertSealDomain starts every sealed alert (its version is part of the message).
const alertSealDomain = "reversi-registry-alert-seal:v1"

// alertSealMessage is what an alert's seal covers: the domain, then as JSON the registry
// (namespace, name, uid) and the alert as recorded (receiver, type, key, revision, reason,
// message, occurredAt in RFC 3339 seconds, as the API server keeps it). Not its delivery
// state: that changes on every attempt (finishedAlert keeps a delivered one from going out
// again).
func alertSealMessage(reg *v1alpha1.ManifestRegistry, n *v1alpha1.RegistryNotification) []byte {
	b, _ := json.Marshal([]string{reg.Namespace, reg.Name, string(reg.UID), n.Receiver, n.Type, n.Key, n.Revision, n.Reason, n.Message,
		n.OccurredAt.UTC().Format(time.RFC3339)})
	return append([]byte(alertSealDomain+"\n"), b...)
}

// sealAlert is n's seal with the controller's rendering key ("" without a key).
func (r *ManifestRegistryReconciler) sealAlert(reg *v1alpha1.ManifestRegistry, n *v1alpha1.RegistryNotification) string {
	if r.Key == nil || r.Key.Signer == nil {
		return ""
	}
	sig, err := r.Key.Signer.Sign(alertSealMessage(reg, n))
	if err != nil {
		return ""
	}
	return r.Key.Signer.KeyID + ":" + base64.RawURLEncoding.EncodeToString(sig)
}

// alertSealed reports whether n carries a seal of one of the controller's keys (current or
// earlier, r.Key.Trust) over exactly what it says.
func (r *ManifestRegistryReconciler) alertSealed(reg *v1alpha1.ManifestRegistry, n *v1alpha1.RegistryNotification) bool {
	id, mac, ok := strings.Cut(n.Seal, ":")
	if !ok || r.Key == nil || r.Key.Trust == nil {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(mac)
	return err == nil && r.Key.Trust.Verify(id, sig, alertSealMessage(reg, n)) == nil
}

// maxFinishedAlerts bounds the alerts finishedAlert remembers (then it starts over).
const maxFinishedAlerts = 4096

func finishedKey(reg *v1alpha1.ManifestRegistry, n *v1alpha1.RegistryNotification) string {
	return string(reg.UID) + "\x00" + n.Receiver + "\x00" + n.Key
}

// finishAlert remembers that n was delivered or dead-lettered (its state), for finishedAlert.
func (r *ManifestRegistryReconciler) finishAlert(reg *v1alpha1.ManifestRegistry, n *v1alpha1.RegistryNotification) {
	r.alertsMu.Lock()
	defer r.alertsMu.Unlock()
	if r.finished == nil || len(r.finished) >= maxFinishedAlerts {
		r.finished = map[string]v1alpha1.NotificationState{}
	}
	r.finished[finishedKey(reg, n)] = n.State
}

// finishedAlert reports whether this controller delivered or dead-lettered n already, and its
// final state.
func (r *ManifestRegistryReconciler) finishedAlert(reg *v1alpha1.ManifestRegistry, n *v1alpha1.RegistryNotification) (v1alpha1.NotificationState, bool) {
	r.alertsMu.Lock()
	defer r.alertsMu.Unlock()
	st, ok := r.finished[finishedKey(reg, n)]
	return st, ok
}

// alertOptions are r.Alerts with the defaults filled in (SetupWithManager fills them once, so
// that every reconcile shares one HTTP client and its idle connections).
func (r *ManifestRegistryReconciler) alertOptions() AlertOptions {
	o := *r.Alerts
	o.defaults()
	return o
}

func (r *ManifestRegistryReconciler) receiver(name string) *config.Notification {
	for i := range r.Alerts.Receivers {
		if r.Alerts.Receivers[i].Name == name {
			return &r.Alerts.Receivers[i]
		}
	}
	return nil
}

// backoff is the wait after the attempt-th failed attempt (webhook.Retry.Delay).
func backoff(o AlertOptions, attempt int) time.Duration {
	return webhook.Retry{Backoff: o.Backoff, MaxBackoff: o.MaxBackoff}.Delay(attempt)
}

// postAlert makes one attempt at delivering n to rc (webhook.Post, bounded by o.Timeout).
func (r *ManifestRegistryReconciler) postAlert(ctx context.Context, o AlertOptions, rc *config.Notification, reg *v1alpha1.ManifestRegistry, n *v1alpha1.RegistryNotification) error {
	if rc == nil {
		return &webhook.PermanentError{Err: errors.New("the receiver is no longer configured")}
	}
	body, err := AlertBody(rc.Type, reg.Namespace, reg.Name, n)
	if err != nil {
		return &webhook.PermanentError{Err: err}
	}
	pctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	secret := rc.Secret
	if rc.Type == config.NotifySlack {
		secret = ""
	}
	return webhook.Post(pctx, o.HTTPClient, webhook.Delivery{URL: rc.URL, Event: n.Type, Key: n.Key, Secret: secret, Body: body, UserAgent: "reversi-controller"}, 0)
}

// setAlertsCondition sets NotificationsDelivered from status.notifications: False
// (NotificationDeadLettered) naming every receiver whose latest alert is Dead and its last
// error; True NotificationPending while one waits for an attempt; True Succeeded otherwise.
func setAlertsCondition(reg *v1alpha1.ManifestRegistry) {
	var dead, pending []string
	for _, n := range reg.Status.Notifications {
		switch n.State {
		case v1alpha1.NotificationDead:
			// The error quoted: it holds the receiver's answer, which must not read as this
			// message's own words.
			dead = append(dead, fmt.Sprintf("receiver %s: %s after %d attempts: %q", n.Receiver, n.Key, n.Attempts, truncateText(n.LastError, 300)))
		case v1alpha1.NotificationPending:
			pending = append(pending, n.Receiver)
		}
	}
	switch {
	case len(dead) > 0:
		setCondition(reg, v1alpha1.ConditionNotificationsDelivered, metav1.ConditionFalse, v1alpha1.ReasonNotificationDeadLettered,
			truncateText("alert dead-lettered, "+strings.Join(dead, "; ")+": fix the receiver (see the controller's --notifications-config); the next refused revision is sent again", 2*maxAlertText))
	case len(pending) > 0:
		setCondition(reg, v1alpha1.ConditionNotificationsDelivered, metav1.ConditionTrue, v1alpha1.ReasonNotificationPending,
			"alert pending for receiver "+strings.Join(pending, ", ")+" (see status.notifications)")
	default:
		setCondition(reg, v1alpha1.ConditionNotificationsDelivered, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "every alert was delivered")
	}
}

// AlertObject names the object an alert is about.
type AlertObject struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// AlertWebhookBody is the generic webhook's JSON body of a rendering alert (schema_version 1,
// as gateway/notify's approval bodies: fields may be added without a new version).
type AlertWebhookBody struct {
	SchemaVersion  int         `json:"schema_version"`
	Type           string      `json:"type"`
	IdempotencyKey string      `json:"idempotency_key"`
	OccurredAt     time.Time   `json:"occurred_at"`
	Object         AlertObject `json:"object"`
	Revision       string      `json:"revision"`
	Reason         string      `json:"reason"`
	Message        string      `json:"message"`
	// Severity is "warning".
	Severity string `json:"severity"`
	// Command is the exact command that shows the registry's conditions and Events.
	Command string `json:"command"`
}

// describeCommand is the command to look at the registry.
func describeCommand(ns, name string) string {
	return "kubectl describe manifestregistry -n " + ns + " " + name
}

// AlertBody renders the alert n about ManifestRegistry ns/name for a receiver of type typ:
// the webhook's JSON (AlertWebhookBody), or Slack's {"text": ...} in mrkdwn with every value
// escaped (&, <, >) and the message in a code block.
func AlertBody(typ, ns, name string, n *v1alpha1.RegistryNotification) ([]byte, error) {
	if typ != config.NotifySlack {
		return json.Marshal(AlertWebhookBody{SchemaVersion: 1, Type: n.Type, IdempotencyKey: n.Key, OccurredAt: n.OccurredAt.UTC(),
			Object: AlertObject{Kind: "ManifestRegistry", Namespace: ns, Name: name}, Revision: n.Revision, Reason: n.Reason,
			Message: n.Message, Severity: "warning", Command: describeCommand(ns, name)})
	}
	e := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace
	var b strings.Builder
	fmt.Fprintf(&b, "*Rendering refused*: ManifestRegistry `%s/%s` (%s)", e(ns), e(name), e(n.Reason))
	fmt.Fprintf(&b, "\n*Revision:* %s", e(cmp.Or(n.Revision, "unknown")))
	fmt.Fprintf(&b, "\n*Why:*\n```%s```", e(strings.ReplaceAll(n.Message, "```", "` ` `")))
	fmt.Fprintf(&b, "\nThe last good rendering stays in use.")
	fmt.Fprintf(&b, "\n*Look:* `%s`", e(describeCommand(ns, name)))
	return json.Marshal(map[string]string{"text": b.String()})
}

// truncateText cuts s to at most n bytes on a rune boundary, marking the cut.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-3]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// alertDeliveries is reversi_controller_notifications_total{state}: delivered, retried (a
// failed attempt that will be tried again), dead (dead-lettered), on controller-runtime's
// metrics registry (the controller's /metrics).
var alertDeliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "reversi_controller_notifications_total",
	Help: "Rendering alerts (alert.rendering_refused, issue 24) by outcome: delivered, retried (a failed attempt to be tried again) and dead (dead-lettered).",
}, []string{"state"})

func init() {
	for _, s := range []string{"delivered", "retried", "dead"} {
		alertDeliveries.WithLabelValues(s)
	}
	ctrlmetrics.Registry.MustRegister(alertDeliveries)
}
