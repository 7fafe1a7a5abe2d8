package controllers

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// notesIs checks the NotificationsDelivered condition: its status and reason, observedGeneration
// the gateway's, and every part in its message.
func notesIs(status metav1.ConditionStatus, reason string, parts ...string) func(*v1alpha1.ReversiGateway) string {
	return func(gw *v1alpha1.ReversiGateway) string {
		c := condition(gw.Status.Conditions, v1alpha1.ConditionNotificationsDelivered)
		if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != gw.Generation {
			return fmt.Sprintf("NotificationsDelivered %+v, want %s %s", c, status, reason)
		}
		for _, p := range parts {
			if !strings.Contains(c.Message, p) {
				return fmt.Sprintf("NotificationsDelivered message %q, want %q in it", c.Message, p)
			}
		}
		return ""
	}
}

// Issue 24, dead letters "visible as a condition": a gateway with spec.notifications has
// NotificationsDelivered Unknown until a pod reports its outbox on its Lease, True while the
// reports hold no dead letter (saying how many retry), False with reason
// NotificationDeadLettered when one does: the pod, the count, the last dead letter and the
// command that lists them, with a Warning event. Ready is not changed by it. Without
// spec.notifications the condition is gone.
func TestGatewayNotificationsDeliveredCondition(t *testing.T) {
	ns := namespace(t)
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	createSecret(t, ns, "hooks", map[string][]byte{"url": []byte("https://hooks.example.com/reversi"), "slack": []byte("https://chat.example.com/s3cr3t")})
	createSecret(t, ns, "hook-hmac", map[string][]byte{"key": []byte("hmac-s3cr3t")})
	create(t, notifyGateway(ns))
	waitGateway(t, ns, "ntf", notesIs(metav1.ConditionUnknown, v1alpha1.ReasonNotificationsUnreported))

	var dep appsv1.Deployment
	get(t, ns, "ntf-gateway", &dep)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ntf-gateway-abc", Labels: dep.Spec.Template.Labels},
		Spec: corev1.PodSpec{ServiceAccountName: "ntf-gateway", Containers: []corev1.Container{{Name: "gateway", Image: "reversi:latest"}}}}
	create(t, p)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := k8s.Status().Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	lease := waitLease(t, ns, "ntf-gateway-abc")
	patchLease(t, lease, map[string]any{v1alpha1.AnnotationNotificationsDead: "0", v1alpha1.AnnotationNotificationsRetrying: "1"})
	waitGateway(t, ns, "ntf", notesIs(metav1.ConditionTrue, v1alpha1.ReasonNoDeadLetters, "reported by 1 pod", "1 notification is retrying"))
	before := condition(getGateway(t, ns, "ntf").Status.Conditions, v1alpha1.ConditionReady)

	last := "approvers-hook: HTTP 400: bad request (approval.requested:apr-1)"
	patchLease(t, lease, map[string]any{v1alpha1.AnnotationNotificationsDead: "2", v1alpha1.AnnotationNotificationsRetrying: "3",
		v1alpha1.AnnotationNotificationsLastDead: last})
	gw := waitGateway(t, ns, "ntf", notesIs(metav1.ConditionFalse, v1alpha1.ReasonNotificationDeadLettered,
		"pod ntf-gateway-abc: 2 notifications dead-lettered (last: "+strconv.Quote(last)+")",
		"kubectl exec -n "+ns+" ntf-gateway-abc -c gateway -- /reversi notifications list --state dead --data /var/lib/reversi",
		"3 notifications are retrying after a failed attempt"))
	t.Logf("NotificationsDelivered: %s", condition(gw.Status.Conditions, v1alpha1.ConditionNotificationsDelivered).Message)
	if c := condition(gw.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != before.Status || c.Reason != before.Reason {
		t.Errorf("Ready changed with the dead letters: %+v, before %+v", c, before)
	}
	for _, v := range []string{"hooks.example.com", "s3cr3t"} {
		if strings.Contains(condition(gw.Status.Conditions, v1alpha1.ConditionNotificationsDelivered).Message, v) {
			t.Errorf("the condition holds %q", v)
		}
	}
	eventually(t, 10*time.Second, func() string {
		var evs eventsv1.EventList
		if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == v1alpha1.ReasonNotificationDeadLettered && e.Type == corev1.EventTypeWarning && e.Regarding.Name == "ntf" && strings.Contains(e.Note, "2 notifications dead-lettered") {
				return ""
			}
		}
		return "no NotificationDeadLettered event"
	})

	// A report that is not a count does not count as one.
	patchLease(t, lease, map[string]any{v1alpha1.AnnotationNotificationsDead: "many"})
	waitGateway(t, ns, "ntf", notesIs(metav1.ConditionUnknown, v1alpha1.ReasonNotificationsUnreported))

	gw = getGateway(t, ns, "ntf")
	gw.Spec.Notifications = nil
	if err := k8s.Update(t.Context(), gw); err != nil {
		t.Fatal(err)
	}
	waitGateway(t, ns, "ntf", func(gw *v1alpha1.ReversiGateway) string {
		if c := condition(gw.Status.Conditions, v1alpha1.ConditionNotificationsDelivered); c != nil {
			return fmt.Sprintf("NotificationsDelivered %+v without spec.notifications", c)
		}
		return ""
	})
}
