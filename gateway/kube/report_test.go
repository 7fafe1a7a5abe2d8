package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// fakeTarget is a report target that refuses every write with err while err is set; it
// records every attempt, what was written, and the log.
type fakeTarget struct {
	mu       sync.Mutex
	err      error
	attempts []report
	written  []report
	logs     []string
}

func (f *fakeTarget) write(_ context.Context, r report) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts = append(f.attempts, r)
	if f.err != nil {
		return f.err
	}
	f.written = append(f.written, r)
	return nil
}

func (f *fakeTarget) refuse(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeTarget) logf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}

func (f *fakeTarget) snapshot() (attempts, written []report, logs []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]report(nil), f.attempts...), append([]report(nil), f.written...), append([]string(nil), f.logs...)
}

// attemptsAfter waits until there were n more attempts than before.
func (f *fakeTarget) attemptsAfter(t *testing.T, before, n int) int {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d more attempts", n), func() bool { a, _, _ := f.snapshot(); return len(a) >= before+n })
	a, _, _ := f.snapshot()
	return len(a)
}

func fastReporter(f *fakeTarget) *reporter {
	p := newReporter("Lease agents/pay-gateway-0", f.write, f.logf)
	p.backoff = wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 100, Cap: 4 * time.Millisecond}
	return p
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A report whose target refuses it (the controller has not created the Lease, or the Role
// rule naming it, yet) is written again until it succeeds; a report set meanwhile replaces
// it, so what is finally written is the latest; each distinct error is logged once, and the
// recovery once.
func TestReporterRetriesTheLatestReportUntilWritten(t *testing.T) {
	forbidden := errors.New(`leases.coordination.k8s.io "pay-gateway-0" is forbidden`)
	notFound := errors.New(`leases.coordination.k8s.io "pay-gateway-0" not found`)
	f := &fakeTarget{err: forbidden}
	p := fastReporter(f)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()

	p.set(newReport("sha256:one", "rev 1", nil))
	n := f.attemptsAfter(t, 0, 3)
	f.refuse(notFound)
	n = f.attemptsAfter(t, n, 3)
	p.set(newReport("sha256:two", "rev 2", errors.New("ConfigMap agents/pay-manifests was refused")))
	n = f.attemptsAfter(t, n, 3)
	f.refuse(nil)
	waitFor(t, "a write", func() bool { _, w, _ := f.snapshot(); return len(w) == 1 })
	_, written, logs := f.snapshot()
	if want := (report{digest: "sha256:two", revision: "rev 2", loadErr: "ConfigMap agents/pay-manifests was refused"}); written[0] != want {
		t.Fatalf("written %+v, want the latest report %+v", written[0], want)
	}
	// Two errors, each logged once however often it came back, then the recovery.
	if len(logs) != 3 || !strings.Contains(logs[0], "Lease agents/pay-gateway-0") || !strings.Contains(logs[0], "forbidden") ||
		!strings.Contains(logs[1], "not found") || !strings.Contains(logs[2], "reported the manifest digest sha256:two on Lease agents/pay-gateway-0") {
		t.Errorf("%d attempts; logs (want each error once, then the recovery):\n%s", n, strings.Join(logs, "\n"))
	}

	// Later reports are written once each, and nothing is written again without a new one.
	p.set(newReport("sha256:three", "rev 3", nil))
	waitFor(t, "the third report", func() bool { _, w, _ := f.snapshot(); return len(w) == 2 })
	a, _, _ := f.snapshot()
	time.Sleep(20 * time.Millisecond)
	if attempts, written, _ := f.snapshot(); len(written) != 2 || len(attempts) != len(a) || written[1] != (report{digest: "sha256:three", revision: "rev 3"}) {
		t.Errorf("after the third report: %d attempts (%d before), written %+v", len(attempts), len(a), written)
	}
	cancel()
	<-done
}

// The reporter stops with its context, also while a write keeps failing.
func TestReporterStopsWithItsContext(t *testing.T) {
	f := &fakeTarget{err: errors.New("connection refused")}
	p := fastReporter(f)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	p.set(newReport("sha256:one", "rev 1", nil))
	f.attemptsAfter(t, 0, 5)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the reporter did not stop with its context")
	}
	n, _, logs := f.snapshot()
	time.Sleep(20 * time.Millisecond)
	if again, _, _ := f.snapshot(); len(again) != len(n) {
		t.Errorf("%d attempts after the context ended", len(again)-len(n))
	}
	if len(logs) != 1 {
		t.Errorf("one error, %d log lines: %q", len(logs), logs)
	}
}

// The retries start at 500 ms, double, and wait at most 30 s (plus 10% jitter) between
// attempts, however long they last.
func TestReportBackoffIsBounded(t *testing.T) {
	next := reportBackoff.DelayFunc()
	first := next()
	if first < 500*time.Millisecond || first > 550*time.Millisecond {
		t.Errorf("first delay %s, want 500 ms (+10%%)", first)
	}
	var last time.Duration
	for range 1000 {
		last = next()
		if last > 33*time.Second {
			t.Fatalf("a delay of %s, more than 30 s + 10%%", last)
		}
	}
	if last < 30*time.Second {
		t.Errorf("after 1000 failures the delay is %s, want 30 s (+10%%)", last)
	}
}

// A refusal is cut to maxReportError bytes.
func TestNewReportBoundsTheError(t *testing.T) {
	r := newReport("sha256:x", "rev", errors.New(strings.Repeat("e", 5000)))
	if len(r.loadErr) != maxReportError || !strings.HasSuffix(r.loadErr, "...") {
		t.Errorf("error of %d bytes", len(r.loadErr))
	}
	if r := newReport("sha256:x", "rev", nil); r.loadErr != "" {
		t.Errorf("a successful load reports %q", r.loadErr)
	}
}

// writeLease writes the report on the pod's Lease, in one merge patch: the three annotations
// (a refusal's removed after a successful load), holderIdentity and renewTime; the Pod of the
// same name is not touched. Without the Lease the write fails (and the reporter retries).
func TestWriteLeaseReportsOnThePodsLease(t *testing.T) {
	const ns, pod = "agents", "pay-gateway-0"
	cs := fake.NewClientset(
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, Labels: map[string]string{v1alpha1.LabelGateway: "pay"},
			Annotations: map[string]string{v1alpha1.AnnotationManifestError: "an older refusal"}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, Annotations: map[string]string{"team": "payments"}}},
	)
	m := &Manifests{o: ManifestOptions{Namespace: ns, PodName: pod}, cs: cs}
	before := time.Now().Add(-time.Second)
	if err := m.writeLease(t.Context(), newReport("sha256:abc", "ManifestRegistry agents/memory main@sha1:0123", nil)); err != nil {
		t.Fatal(err)
	}
	l, err := cs.CoordinationV1().Leases(ns).Get(t.Context(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := l.Annotations; a[v1alpha1.AnnotationManifestDigest] != "sha256:abc" || a[v1alpha1.AnnotationManifestRevision] != "ManifestRegistry agents/memory main@sha1:0123" {
		t.Errorf("annotations %v", a)
	}
	if _, ok := l.Annotations[v1alpha1.AnnotationManifestError]; ok {
		t.Errorf("the older refusal stays after a successful load: %v", l.Annotations)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != pod || l.Spec.RenewTime == nil || l.Spec.RenewTime.Before(&metav1.MicroTime{Time: before}) {
		t.Errorf("spec %+v", l.Spec)
	}
	if l.Labels[v1alpha1.LabelGateway] != "pay" {
		t.Errorf("the controller's labels were dropped: %v", l.Labels)
	}
	if err := m.writeLease(t.Context(), newReport("sha256:abc", "rev", errors.New("ConfigMap agents/pay-manifests was refused: not signed"))); err != nil {
		t.Fatal(err)
	}
	l, _ = cs.CoordinationV1().Leases(ns).Get(t.Context(), pod, metav1.GetOptions{})
	if l.Annotations[v1alpha1.AnnotationManifestError] != "ConfigMap agents/pay-manifests was refused: not signed" || l.Annotations[v1alpha1.AnnotationManifestDigest] != "sha256:abc" {
		t.Errorf("a refusal: %v", l.Annotations)
	}
	p, _ := cs.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{})
	if len(p.Annotations) != 1 {
		t.Errorf("the pod was written: %v", p.Annotations)
	}
	for _, a := range cs.Actions() {
		if a.GetVerb() != "get" && a.GetResource().Resource != "leases" {
			t.Errorf("the report wrote %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}

	other := &Manifests{o: ManifestOptions{Namespace: ns, PodName: "pay-gateway-1"}, cs: cs}
	if err := other.writeLease(t.Context(), newReport("sha256:abc", "rev", nil)); !apierrors.IsNotFound(err) {
		t.Errorf("a report without its Lease: %v, want NotFound", err)
	}
}
