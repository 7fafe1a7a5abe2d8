package controllers

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// maxDeadLetterNote bounds the last dead letter a condition message quotes (bytes).
const maxDeadLetterNote = 1024

// podNotes is one pod's report of its notification outbox (the Lease annotations
// reversi.dev/notifications-*).
type podNotes struct {
	pod            string
	dead, retrying int
	lastDead       string
}

// notesOf reads the notification report of a Lease's annotations; ok is false when the pod
// has not reported one (no annotation, or not a count).
func notesOf(pod string, a map[string]string) (podNotes, bool) {
	dead, err1 := strconv.Atoi(a[v1alpha1.AnnotationNotificationsDead])
	retrying, err2 := strconv.Atoi(a[v1alpha1.AnnotationNotificationsRetrying])
	if err1 != nil || err2 != nil || dead < 0 || retrying < 0 {
		return podNotes{}, false
	}
	return podNotes{pod: pod, dead: dead, retrying: retrying, lastDead: truncate(a[v1alpha1.AnnotationNotificationsLastDead], maxDeadLetterNote)}, true
}

// notifications sets the NotificationsDelivered condition (issue 24: dead letters "visible
// (`reversi notifications list`, a metric, a condition)") from the reports on the Leases of
// the pods that reportsTo gw (reports: pod name → its Lease's annotations, only Leases gw
// controls), in the order of pods (sorted by name):
//   - no spec.notifications: the condition is removed;
//   - a pod reports dead letters: False, reason NotificationDeadLettered, the first such pod
//     named with its count, its last dead letter quoted (receiver, error, idempotency key:
//     never a URL, which the pods leave out) and the kubectl exec command that lists them, then the
//     other pods with dead letters (at most 5 named); a Warning event of that reason when the
//     condition becomes False;
//   - else at least one pod reports: True, reason NoDeadLetters;
//   - else Unknown, reason NotificationsUnreported.
//
// False and True messages end with how many notifications retry (pending after a failed
// attempt), when any do.
// It never touches Ready, Reconciling or Stalled: a dead letter does not stop the gateway
// from serving. Source: issue 24.
func (r *ReversiGatewayReconciler) notifications(gw *v1alpha1.ReversiGateway, pods []corev1.Pod, reports map[string]map[string]string) {
	if len(gw.Spec.Notifications) == 0 {
		removeCondition(gw, v1alpha1.ConditionNotificationsDelivered)
		return
	}
	var reported, dead []podNotes
	retrying := 0
	for i := range pods {
		p := &pods[i]
		if !reportsTo(gw, p) {
			continue
		}
		n, ok := notesOf(p.Name, reports[p.Name])
		if !ok {
			continue
		}
		reported = append(reported, n)
		retrying += n.retrying
		if n.dead > 0 {
			dead = append(dead, n)
		}
	}
	before := apimeta.FindStatusCondition(gw.Status.Conditions, v1alpha1.ConditionNotificationsDelivered)
	wasFalse := before != nil && before.Status == metav1.ConditionFalse
	switch {
	case len(dead) > 0:
		msg := deadLetterMessage(gw, dead)
		if retrying > 0 {
			msg += fmt.Sprintf("; %s retrying after a failed attempt", plural(retrying, "notification is", "notifications are"))
		}
		setCondition(gw, v1alpha1.ConditionNotificationsDelivered, metav1.ConditionFalse, v1alpha1.ReasonNotificationDeadLettered, msg)
		if !wasFalse {
			r.event(gw, corev1.EventTypeWarning, v1alpha1.ReasonNotificationDeadLettered, msg)
		}
	case len(reported) > 0:
		msg := fmt.Sprintf("no notification is dead-lettered (reported by %s)", plural(len(reported), "pod"))
		if retrying > 0 {
			msg += fmt.Sprintf("; %s retrying after a failed attempt", plural(retrying, "notification is", "notifications are"))
		}
		setCondition(gw, v1alpha1.ConditionNotificationsDelivered, metav1.ConditionTrue, v1alpha1.ReasonNoDeadLetters, msg)
	default:
		setCondition(gw, v1alpha1.ConditionNotificationsDelivered, metav1.ConditionUnknown, v1alpha1.ReasonNotificationsUnreported,
			"no gateway pod has reported its notification outbox on its Lease yet")
	}
}

// deadLetterMessage is the False message: the first pod in full, then the others in short.
func deadLetterMessage(gw *v1alpha1.ReversiGateway, dead []podNotes) string {
	first := dead[0]
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s: %s dead-lettered", first.pod, plural(first.dead, "notification"))
	if first.lastDead != "" {
		// Quoted: the text is the receiver's answer and whatever the Lease's writer put there;
		// it must not read as this message's own words (another command to run).
		fmt.Fprintf(&b, " (last: %q)", first.lastDead)
	}
	store := "--data " + GatewayDataDir
	if storeType(gw) == v1alpha1.StorePostgres {
		store = "--store postgres"
	}
	fmt.Fprintf(&b, "; list them with kubectl exec -n %s %s -c %s -- /reversi notifications list --state dead %s", gw.Namespace, first.pod, GatewayContainer, store)
	if rest := dead[1:]; len(rest) > 0 {
		names := make([]string, 0, 5)
		for _, n := range rest[:min(len(rest), 5)] {
			names = append(names, fmt.Sprintf("%s: %d", n.pod, n.dead))
		}
		if len(rest) > 5 {
			names = append(names, fmt.Sprintf("%d more", len(rest)-5))
		}
		fmt.Fprintf(&b, "; other pods with dead letters: %s", strings.Join(names, ", "))
	}
	b.WriteString("; dead letters stay in the store until retried: fix the receiver (its URL and key Secrets, or what it answers), then retry them with the same command's `notifications retry --all` in place of `notifications list --state dead`")
	return b.String()
}

// plural is "1 <one>" or "<n> <many>" (many defaults to one+"s").
func plural(n int, one string, many ...string) string {
	if n == 1 {
		return "1 " + one
	}
	if len(many) > 0 {
		return strconv.Itoa(n) + " " + many[0]
	}
	return strconv.Itoa(n) + " " + one + "s"
}
