package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
	"github.com/reversi-gitops/reversi/pkg/webhook"
)

// ownManager starts a manager of the test's own, limited to namespace ns, running only the
// ManifestRegistry reconciler with alerts; the returned stop cancels it and waits until it
// has stopped (also at cleanup). Its registries carry ownManagerLabel, so the suite's manager
// leaves them alone.
func ownManager(t *testing.T, ns string, alerts *AlertOptions) (stop func()) {
	t.Helper()
	return ownManagerWith(t, ns, func(r *ManifestRegistryReconciler) { r.Alerts = alerts })
}

// ownManagerWith is ownManager with the reconciler's options changed by opts (nil: none).
func ownManagerWith(t *testing.T, ns string, opts func(*ManifestRegistryReconciler)) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{Scheme: testEnv.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Controller: crconfig.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	r := &ManifestRegistryReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("reversi-controller"), Key: ctlKey,
		APIReader: mgr.GetAPIReader(), AllowFileURLs: true, TempDir: t.TempDir()}
	if opts != nil {
		opts(r)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// delivery is one request a test receiver got.
type delivery struct {
	header http.Header
	body   []byte
}

// testReceiver is a real HTTP receiver on 127.0.0.1: answer(n) is the status of the n-th
// request (1-based).
type testReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []delivery
	answer func(n int, r *http.Request) int
}

func newReceiver(t *testing.T, answer func(n int, r *http.Request) int) *testReceiver {
	rc := &testReceiver{answer: answer}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, delivery{header: r.Header.Clone(), body: body})
		n := len(rc.got)
		rc.mu.Unlock()
		code := http.StatusOK
		if rc.answer != nil {
			code = rc.answer(n, r)
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "answer %d", code)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *testReceiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.got...)
}

func (rc *testReceiver) waitFor(t *testing.T, n int) []delivery {
	t.Helper()
	eventually(t, 15*time.Second, func() string {
		if got := len(rc.deliveries()); got < n {
			return fmt.Sprintf("%d deliveries, want %d", got, n)
		}
		return ""
	})
	return rc.deliveries()
}

// unsignedRegistry makes a repository of signed manifests whose HEAD commit is not signed, and
// a registry in ns (reconciled by the test's own manager) that verifies HEAD commits: it is
// refused with CommitVerificationFailed. It returns the repository and the refused revision.
func unsignedRegistry(t *testing.T, ns string) (*sourcetest.Repo, *sourcetest.SSHKey, string) {
	t.Helper()
	k := newKey(t)
	sshKey := sourcetest.NewSSHKey(t)
	repo := signedRegistryRepo(t, k) // an unsigned commit
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	createSecret(t, ns, "commit-keys", map[string][]byte{"ci.sshpub": sshKey.AuthorizedKey})
	create(t, newRegistry(ns, ownManagerRegistry, repo.FileURL(), func(r *v1alpha1.ManifestRegistry) {
		r.Labels = map[string]string{ownManagerLabel: "true"}
		withKeys("manifest-keys")(r)
		r.Spec.Verify.Commit = &v1alpha1.CommitVerification{Mode: v1alpha1.CommitVerifyHEAD, SecretRef: v1alpha1.LocalObjectReference{Name: "commit-keys"}}
	}))
	return repo, sshKey, "main@sha1:" + repo.Rev("HEAD")
}

// waitAlert waits until the registry's entry for receiver is in state and returns the registry.
func waitAlert(t *testing.T, ns, receiver string, state v1alpha1.NotificationState, key string) *v1alpha1.ManifestRegistry {
	t.Helper()
	var reg *v1alpha1.ManifestRegistry
	eventually(t, 15*time.Second, func() string {
		reg = getRegistry(t, ns, ownManagerRegistry)
		for _, n := range reg.Status.Notifications {
			if n.Receiver == receiver {
				if n.State != state || n.Key != key {
					return fmt.Sprintf("receiver %s: %s %s (attempts %d, %s), want %s %s", receiver, n.State, n.Key, n.Attempts, n.LastError, state, key)
				}
				return ""
			}
		}
		return fmt.Sprintf("no notification for %s in %+v", receiver, reg.Status.Notifications)
	})
	return reg
}

// metricValue reads reversi_controller_notifications_total{state} from the registry the
// controller serves on /metrics.
func metricValue(t *testing.T, state string) float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "reversi_controller_notifications_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" && l.GetValue() == state {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("reversi_controller_notifications_total{state=%q} is not registered", state)
	return 0
}

// noURL fails when the receiver's URL (host and port) appears in the registry's status or in
// an Event of the namespace: a Slack URL is a secret (issue 24).
func noURL(t *testing.T, ns string, rc *testReceiver) {
	t.Helper()
	host := strings.TrimPrefix(rc.URL, "http://")
	status, _ := json.Marshal(getRegistry(t, ns, ownManagerRegistry).Status)
	if bytes.Contains(status, []byte(host)) {
		t.Errorf("the receiver's URL is in the status: %s", status)
	}
	var evs eventsv1.EventList
	if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if strings.Contains(e.Note, host) {
			t.Errorf("the receiver's URL is in Event %s: %s", e.Reason, e.Note)
		}
	}
}

// Issue 24, acceptance: "A rendering refused by the controller (e.g. an unsigned commit) sends
// the alert once per revision." One signed delivery with the idempotency key; reconciling the
// same refused revision again sends nothing; a second unsigned revision sends one more; a
// revision that then succeeds sends nothing.
func TestRenderingAlertOncePerRevision(t *testing.T) {
	ns := namespace(t)
	rc := newReceiver(t, nil)
	ownManager(t, ns, &AlertOptions{Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rc.URL, Secret: "s3cret"}}})
	repo, sshKey, rev := unsignedRegistry(t, ns)

	got := rc.waitFor(t, 1)
	key := AlertKey(ns, ownManagerRegistry, rev, v1alpha1.ReasonCommitVerificationFailed)
	d := got[0]
	if !webhook.Verify("s3cret", d.body, d.header.Get(webhook.HeaderSignature)) {
		t.Errorf("X-Reversi-Signature %q does not verify the body", d.header.Get(webhook.HeaderSignature))
	}
	if d.header.Get(webhook.HeaderIdempotency) != key || d.header.Get(webhook.HeaderEvent) != EventRenderingRefused {
		t.Errorf("headers %v, want the key %s", d.header, key)
	}
	var body map[string]any
	if err := json.Unmarshal(d.body, &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"schema_version": 1.0, "type": EventRenderingRefused, "idempotency_key": key, "revision": rev,
		"reason": v1alpha1.ReasonCommitVerificationFailed, "severity": "warning", "command": "kubectl describe manifestregistry -n " + ns + " " + ownManagerRegistry,
		"object": map[string]any{"kind": "ManifestRegistry", "namespace": ns, "name": ownManagerRegistry}}
	for k, v := range want {
		if fmt.Sprint(body[k]) != fmt.Sprint(v) {
			t.Errorf("body %s = %v, want %v", k, body[k], v)
		}
	}
	if msg, _ := body["message"].(string); !strings.Contains(msg, "not signed") {
		t.Errorf("body message %q does not say why", msg)
	}
	if _, err := time.Parse(time.RFC3339, fmt.Sprint(body["occurred_at"])); err != nil {
		t.Errorf("occurred_at: %v", err)
	}
	reg := waitAlert(t, ns, "hook", v1alpha1.NotificationDelivered, key)
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionNotificationsDelivered); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("NotificationsDelivered %+v, want True", c)
	}
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != v1alpha1.ReasonCommitVerificationFailed {
		t.Errorf("Ready %+v, want False CommitVerificationFailed", c)
	}

	// The same refused revision, reconciled again: nothing new.
	at := requestReconcile(t, ns, ownManagerRegistry)
	eventually(t, 10*time.Second, func() string {
		if r := getRegistry(t, ns, ownManagerRegistry); r.Status.LastHandledReconcileAt != at {
			return "the forced reconcile was not handled yet"
		}
		return ""
	})
	time.Sleep(300 * time.Millisecond)
	if n := len(rc.deliveries()); n != 1 {
		t.Fatalf("%d deliveries after reconciling the same revision again, want 1", n)
	}

	// A second unsigned revision: one more alert, with its own key.
	repo.WriteFile("README", "another unsigned change\n")
	repo.Commit("unsigned again")
	rev2 := "main@sha1:" + repo.Rev("HEAD")
	requestReconcile(t, ns, ownManagerRegistry)
	got = rc.waitFor(t, 2)
	key2 := AlertKey(ns, ownManagerRegistry, rev2, v1alpha1.ReasonCommitVerificationFailed)
	if k := got[1].header.Get(webhook.HeaderIdempotency); k != key2 {
		t.Errorf("second alert's key %s, want %s", k, key2)
	}
	waitAlert(t, ns, "hook", v1alpha1.NotificationDelivered, key2)

	// A signed revision is rendered: no alert.
	repo.WriteFile("README", "signed\n")
	repo.CommitSigned("signed", sshKey)
	requestReconcile(t, ns, ownManagerRegistry)
	waitReady(t, ns, ownManagerRegistry, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "main@sha1:"+repo.Rev("HEAD"))
	time.Sleep(300 * time.Millisecond)
	if n := len(rc.deliveries()); n != 2 {
		t.Errorf("%d deliveries after a good revision, want 2", n)
	}
	noURL(t, ns, rc)
}

// A receiver that answers 500 three times and then 200 gets the same idempotency key on all
// four attempts, and the status says Delivered after 4 attempts (issue 24: "retried with
// backoff").
func TestRenderingAlertRetriedThenDelivered(t *testing.T) {
	ns := namespace(t)
	rc := newReceiver(t, func(n int, _ *http.Request) int {
		if n <= 3 {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	retried, delivered := metricValue(t, "retried"), metricValue(t, "delivered")
	ownManager(t, ns, &AlertOptions{Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rc.URL}},
		Backoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	_, _, rev := unsignedRegistry(t, ns)
	key := AlertKey(ns, ownManagerRegistry, rev, v1alpha1.ReasonCommitVerificationFailed)
	reg := waitAlert(t, ns, "hook", v1alpha1.NotificationDelivered, key)
	got := rc.deliveries()
	if len(got) != 4 {
		t.Fatalf("%d attempts, want 4", len(got))
	}
	for i, d := range got {
		if k := d.header.Get(webhook.HeaderIdempotency); k != key {
			t.Errorf("attempt %d: key %s, want %s", i+1, k, key)
		}
		if !bytes.Equal(d.body, got[0].body) {
			t.Errorf("attempt %d: another body", i+1)
		}
	}
	if n := reg.Status.Notifications[0]; n.Attempts != 4 || n.LastError != "" {
		t.Errorf("status %+v, want 4 attempts and no error", n)
	}
	if d := metricValue(t, "retried") - retried; d != 3 {
		t.Errorf("retried grew by %v, want 3", d)
	}
	if d := metricValue(t, "delivered") - delivered; d != 1 {
		t.Errorf("delivered grew by %v, want 1", d)
	}
}

// A receiver that always fails ends Dead after MaxAttempts: NotificationsDelivered=False
// NotificationDeadLettered naming the receiver and the last error, a Warning Event, the metric,
// and Ready unchanged (issue 24: "dead-lettered and visible (a metric, a condition)").
func TestRenderingAlertDeadLettered(t *testing.T) {
	ns := namespace(t)
	rc := newReceiver(t, func(int, *http.Request) int { return http.StatusBadGateway })
	dead := metricValue(t, "dead")
	ownManager(t, ns, &AlertOptions{Receivers: []config.Notification{{Name: "hook", Type: config.NotifySlack, URL: rc.URL}},
		MaxAttempts: 3, Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	_, _, rev := unsignedRegistry(t, ns)
	reg := waitAlert(t, ns, "hook", v1alpha1.NotificationDead, AlertKey(ns, ownManagerRegistry, rev, v1alpha1.ReasonCommitVerificationFailed))
	if n := len(rc.deliveries()); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}
	c := condition(reg.Status.Conditions, v1alpha1.ConditionNotificationsDelivered)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonNotificationDeadLettered ||
		!strings.Contains(c.Message, "receiver hook") || !strings.Contains(c.Message, "HTTP 502") {
		t.Errorf("NotificationsDelivered %+v, want False NotificationDeadLettered naming hook and HTTP 502", c)
	}
	if r := condition(reg.Status.Conditions, v1alpha1.ConditionReady); r == nil || r.Reason != v1alpha1.ReasonCommitVerificationFailed {
		t.Errorf("Ready %+v: the dead letter must not change it", r)
	}
	if d := metricValue(t, "dead") - dead; d != 1 {
		t.Errorf("dead grew by %v, want 1", d)
	}
	eventually(t, 10*time.Second, func() string {
		var evs eventsv1.EventList
		if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == v1alpha1.ReasonNotificationDeadLettered && strings.Contains(e.Note, "receiver hook") {
				return ""
			}
		}
		return "no NotificationDeadLettered Event"
	})
	noURL(t, ns, rc)
}

// A controller stopped after the refusal and its alert were recorded, before the delivery
// was answered, delivers the alert when it starts again (issue 24: "a restart resumes
// delivery"; the outbox is the object's status).
func TestRenderingAlertSurvivesRestart(t *testing.T) {
	ns := namespace(t)
	arrived := make(chan struct{}, 8)
	var mu sync.Mutex
	answering := false
	rc := newReceiver(t, func(_ int, r *http.Request) int {
		mu.Lock()
		ok := answering
		mu.Unlock()
		if !ok {
			arrived <- struct{}{}
			<-r.Context().Done() // never answers: the controller stops meanwhile
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	alerts := func() *AlertOptions {
		return &AlertOptions{Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rc.URL}}, Timeout: 20 * time.Second}
	}
	stop := ownManager(t, ns, alerts())
	_, _, rev := unsignedRegistry(t, ns)
	key := AlertKey(ns, ownManagerRegistry, rev, v1alpha1.ReasonCommitVerificationFailed)
	select {
	case <-arrived:
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery attempt")
	}
	stop()
	reg := waitAlert(t, ns, "hook", v1alpha1.NotificationPending, key)
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != v1alpha1.ReasonCommitVerificationFailed {
		t.Fatalf("Ready %+v: the refusal was not recorded with the alert", c)
	}
	mu.Lock()
	answering = true
	mu.Unlock()
	ownManager(t, ns, alerts())
	waitAlert(t, ns, "hook", v1alpha1.NotificationDelivered, key)
	got := rc.deliveries()
	if len(got) != 2 || got[1].header.Get(webhook.HeaderIdempotency) != key {
		t.Errorf("%d requests, the last with key %q; want 2, the second with %s", len(got), got[len(got)-1].header.Get(webhook.HeaderIdempotency), key)
	}
}

// Receivers whose filters exclude the alert get nothing: a namespaces filter without the
// registry's namespace, an events filter without alert.rendering_refused, a tools filter (an
// alert names no tool); a receiver without filters gets it (so the reconcile did alert).
func TestRenderingAlertFilters(t *testing.T) {
	ns := namespace(t)
	all, otherNS, otherEvents, tools := newReceiver(t, nil), newReceiver(t, nil), newReceiver(t, nil), newReceiver(t, nil)
	ownManager(t, ns, &AlertOptions{Receivers: []config.Notification{
		{Name: "all", Type: config.NotifyWebhook, URL: all.URL},
		{Name: "other-ns", Type: config.NotifyWebhook, URL: otherNS.URL, Namespaces: []string{"payments"}},
		{Name: "approvals", Type: config.NotifyWebhook, URL: otherEvents.URL, Events: []string{"approval.requested"}},
		{Name: "tools", Type: config.NotifyWebhook, URL: tools.URL, Tools: []string{"*"}},
		{Name: "this-ns", Type: config.NotifySlack, URL: newReceiver(t, nil).URL, Namespaces: []string{ns}, Events: []string{EventRenderingRefused}},
	}})
	_, _, rev := unsignedRegistry(t, ns)
	key := AlertKey(ns, ownManagerRegistry, rev, v1alpha1.ReasonCommitVerificationFailed)
	waitAlert(t, ns, "all", v1alpha1.NotificationDelivered, key)
	reg := waitAlert(t, ns, "this-ns", v1alpha1.NotificationDelivered, key)
	time.Sleep(200 * time.Millisecond)
	for name, rc := range map[string]*testReceiver{"other-ns": otherNS, "approvals": otherEvents, "tools": tools} {
		if n := len(rc.deliveries()); n != 0 {
			t.Errorf("receiver %s: %d deliveries, want none", name, n)
		}
	}
	if len(reg.Status.Notifications) != 2 {
		t.Errorf("status.notifications %+v, want entries for all and this-ns only", reg.Status.Notifications)
	}
}

// A rendered ConfigMap that someone edited is restored and alerted once, with reason
// RenderingDrift and the rendered revision (issue 24: "rendering refused (signature,
// downgrade, drift)"); Ready stays True.
func TestRenderingAlertDrift(t *testing.T) {
	ns := namespace(t)
	rc := newReceiver(t, nil)
	ownManager(t, ns, &AlertOptions{Receivers: []config.Notification{{Name: "hook", Type: config.NotifyWebhook, URL: rc.URL}}})
	k := newKey(t)
	repo := signedRegistryRepo(t, k)
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	create(t, newRegistry(ns, ownManagerRegistry, repo.FileURL(), func(r *v1alpha1.ManifestRegistry) {
		r.Labels = map[string]string{ownManagerLabel: "true"}
		withKeys("manifest-keys")(r)
	}))
	rev := "main@sha1:" + repo.Rev("HEAD")
	waitReady(t, ns, ownManagerRegistry, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, rev)
	if n := len(rc.deliveries()); n != 0 {
		t.Fatalf("%d deliveries for a good rendering", n)
	}
	cm := configMap(t, ns, ownManagerRegistry+"-manifests")
	cm.Data["revision"] = "main@sha1:ffffffffffffffffffffffffffffffffffffffff"
	if err := k8s.Update(t.Context(), cm, client.FieldOwner("mallory-edit")); err != nil {
		t.Fatal(err)
	}
	got := rc.waitFor(t, 1)
	key := AlertKey(ns, ownManagerRegistry, rev, v1alpha1.EventRenderingDrift)
	if k := got[0].header.Get(webhook.HeaderIdempotency); k != key {
		t.Errorf("key %s, want %s", k, key)
	}
	if !strings.Contains(string(got[0].body), "mallory-edit") {
		t.Errorf("body %s does not name who edited the ConfigMap", got[0].body)
	}
	reg := waitAlert(t, ns, "hook", v1alpha1.NotificationDelivered, key)
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Ready %+v, want True (the drift was restored)", c)
	}
}

// The Slack message of a rendering alert (golden: testdata/alert-slack.json): the registry,
// the reason, the revision, the message in a code block, the command; &, < and > escaped.
func TestAlertSlackBody(t *testing.T) {
	n := &v1alpha1.RegistryNotification{Type: EventRenderingRefused, Key: AlertKey("payments", "reg", "main@sha1:0123456789abcdef0123456789abcdef01234567", "CommitVerificationFailed"),
		Revision: "main@sha1:0123456789abcdef0123456789abcdef01234567", Reason: "CommitVerificationFailed",
		Message:    "commit 0123456789ab \"<script>&\": signature verification failed: not signed ```",
		OccurredAt: metav1.NewTime(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
	got, err := AlertBody(config.NotifySlack, "payments", "reg", n)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "alert-slack.json")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(golden, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(got)+"\n" != string(want) {
		t.Errorf("Slack body\n%s\nwant (%s)\n%s", got, golden, want)
	}
}

// The notifications file (issue 24): gateway.yaml's receiver format, ${NAME} from the
// environment, errors with file:line and field that never repeat an expanded value, and only
// notifications: in it.
func TestLoadNotificationsConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := map[string]string{"HOOK_URL": "https://hooks.example/x", "HOOK_KEY": "k3y", "BAD_URL": "ftp://sekrit"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	rs, err := LoadNotificationsConfig(write("ok.yaml", "notifications:\n  - type: webhook\n    url: ${HOOK_URL}\n    secret: ${HOOK_KEY}\n    namespaces: [payments]\n  - type: slack\n    name: chat\n    url: https://chat.example/T\n"), lookup)
	if err != nil || len(rs) != 2 || rs[0].URL != "https://hooks.example/x" || rs[0].Secret != "k3y" || rs[0].Namespaces[0] != "payments" || rs[1].Name != "chat" {
		t.Fatalf("%+v %v", rs, err)
	}
	for file, want := range map[string]string{
		"unset.yaml":   "unset.yaml:3: notifications[0].url: environment variable NOPE is not set",
		"bad.yaml":     "bad.yaml:3: notifications[0].url: the value of ${BAD_URL} is not an http or https URL",
		"extra.yaml":   "extra.yaml:1: upstreams: unknown field",
		"event.yaml":   `notifications[0].events[0]: "alert.nope" is not one of`,
		"unknown.yaml": `notifications[0]`,
		"long.yaml":    "long.yaml:2: notifications[0].name: \"" + strings.Repeat("x", 64) + "\" is longer than 63 characters",
	} {
		content := map[string]string{
			"unset.yaml":   "notifications:\n  - type: webhook\n    url: ${NOPE}\n",
			"bad.yaml":     "notifications:\n  - type: webhook\n    url: ${BAD_URL}\n",
			"extra.yaml":   "upstreams: {}\nnotifications: []\n",
			"event.yaml":   "notifications:\n  - type: webhook\n    url: https://h.example\n    events: [alert.nope]\n",
			"unknown.yaml": "notifications:\n  - type: webhook\n    url: https://h.example\n    retries: 3\n",
			"long.yaml":    "notifications:\n  - name: " + strings.Repeat("x", 64) + "\n    type: webhook\n    url: https://h.example\n",
		}[file]
		_, err := LoadNotificationsConfig(write(file, content), lookup)
		var ce *NotificationsConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "sekrit") {
			t.Errorf("%s: %v, want a NotificationsConfigError with %q", file, err, want)
		}
	}
}

// The outbox stays bounded (issue 24): one entry per admitting receiver; the same key is not
// recorded again; a newer alert replaces the older one, a superseded Pending one counting as
// dead; a receiver no longer configured loses its entry (dead when Pending). The backoff
// doubles from Backoff up to MaxBackoff with at most 20 % jitter.
func TestRecordAlertBounds(t *testing.T) {
	r := &ManifestRegistryReconciler{Key: ctlKey, Alerts: &AlertOptions{Receivers: []config.Notification{
		{Name: "a", Type: config.NotifyWebhook, URL: "https://a.example"},
		{Name: "b", Type: config.NotifySlack, URL: "https://b.example"},
		{Name: "elsewhere", Type: config.NotifyWebhook, URL: "https://c.example", Namespaces: []string{"other"}},
	}}}
	reg := &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: "payments", Name: "reg"}}
	r.recordAlert(reg, v1alpha1.ReasonVersionDowngrade, "main@sha1:1", "older index")
	if len(reg.Status.Notifications) != 2 || reg.Status.Notifications[0].Receiver != "a" || reg.Status.Notifications[1].State != v1alpha1.NotificationPending {
		t.Fatalf("%+v", reg.Status.Notifications)
	}
	first := reg.Status.Notifications[0].OccurredAt
	reg.Status.Notifications[0].State = v1alpha1.NotificationDelivered
	r.recordAlert(reg, v1alpha1.ReasonVersionDowngrade, "main@sha1:1", "older index")
	if n := reg.Status.Notifications[0]; n.State != v1alpha1.NotificationDelivered || !n.OccurredAt.Equal(&first) {
		t.Errorf("the same refusal was recorded again: %+v", n)
	}
	dead := metricValue(t, "dead")
	r.recordAlert(reg, v1alpha1.ReasonVersionDowngrade, "main@sha1:2", "older index again")
	for _, n := range reg.Status.Notifications {
		if n.Key != AlertKey("payments", "reg", "main@sha1:2", v1alpha1.ReasonVersionDowngrade) || n.State != v1alpha1.NotificationPending {
			t.Errorf("a newer alert did not replace the older: %+v", n)
		}
	}
	if d := metricValue(t, "dead") - dead; d != 1 {
		t.Errorf("dead grew by %v, want 1 (b's superseded Pending alert)", d)
	}
	r.Alerts.Receivers = r.Alerts.Receivers[:1]
	r.syncAlerts(reg)
	if len(reg.Status.Notifications) != 1 || reg.Status.Notifications[0].Receiver != "a" {
		t.Errorf("after b was removed: %+v", reg.Status.Notifications)
	}
	if d := metricValue(t, "dead") - dead; d != 2 {
		t.Errorf("dead grew by %v, want 2", d)
	}
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionNotificationsDelivered); c == nil || c.Reason != v1alpha1.ReasonNotificationPending {
		t.Errorf("NotificationsDelivered %+v, want True NotificationPending", c)
	}
	o := AlertOptions{}
	o.defaults()
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 9: 256 * time.Second, 10: 5 * time.Minute, 30: 5 * time.Minute} {
		if got := backoff(o, attempt); got < want || got > want+want/5 {
			t.Errorf("backoff after attempt %d: %s, want %s to %s", attempt, got, want, want+want/5)
		}
	}
}
