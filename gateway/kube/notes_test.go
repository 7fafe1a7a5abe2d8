package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// A summary is written with the manifest report and only when it changes; a summary set
// before the first manifest report waits for it (a pod never writes an empty digest); a
// manifest report keeps the summary. Source: issue 24 (dead letters visible as a condition,
// with bounded writes).
func TestReporterWritesASummaryOnlyWhenItChanges(t *testing.T) {
	f := &fakeTarget{}
	p := fastReporter(f)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()

	two := notesReport{reported: true, dead: 2, lastDead: "hook: HTTP 400: no (approval.requested:apr-1)"}
	p.setNotes(two)
	time.Sleep(20 * time.Millisecond)
	if a, _, _ := f.snapshot(); len(a) != 0 {
		t.Fatalf("a summary was written before the manifest report: %+v", a)
	}
	p.set(newReport("sha256:one", "rev 1", nil))
	waitFor(t, "the first report", func() bool { _, w, _ := f.snapshot(); return len(w) == 1 })
	for range 5 { // the same summary read again and again
		p.setNotes(two)
	}
	time.Sleep(20 * time.Millisecond)
	if a, w, _ := f.snapshot(); len(a) != 1 || w[0] != (report{digest: "sha256:one", revision: "rev 1", notes: two}) {
		t.Fatalf("attempts %+v, want one write of the manifests with the summary", a)
	}
	three := two
	three.dead = 3
	p.setNotes(three)
	waitFor(t, "the changed summary", func() bool { _, w, _ := f.snapshot(); return len(w) == 2 })
	p.set(newReport("sha256:two", "rev 2", nil))
	waitFor(t, "the next manifest report", func() bool { _, w, _ := f.snapshot(); return len(w) == 3 })
	if _, w, _ := f.snapshot(); w[1].notes != three || w[1].digest != "sha256:one" || w[2].notes != three || w[2].digest != "sha256:two" {
		t.Fatalf("written %+v", w)
	}
	cancel()
	<-done
}

// The Lease carries the summary as three annotations; a report without one (no receivers)
// removes them, and a summary without dead letters removes the last one.
func TestWriteLeaseCarriesTheNotificationSummary(t *testing.T) {
	const ns, pod = "agents", "pay-gateway-0"
	cs := fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}})
	m := &Manifests{o: ManifestOptions{Namespace: ns, PodName: pod}, cs: cs}
	lease := func(r report) map[string]string {
		t.Helper()
		if err := m.writeLease(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		l, err := cs.CoordinationV1().Leases(ns).Get(t.Context(), pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Annotations
	}
	r := newReport("sha256:abc", "rev", nil)
	r.notes = notesReport{reported: true, dead: 2, retrying: 1, lastDead: "hook: HTTP 500: down (approval.requested:apr-1)"}
	a := lease(r)
	if a[v1alpha1.AnnotationNotificationsDead] != "2" || a[v1alpha1.AnnotationNotificationsRetrying] != "1" ||
		a[v1alpha1.AnnotationNotificationsLastDead] != r.notes.lastDead || a[v1alpha1.AnnotationManifestDigest] != "sha256:abc" {
		t.Fatalf("annotations %v", a)
	}
	r.notes = notesReport{reported: true}
	a = lease(r)
	if _, ok := a[v1alpha1.AnnotationNotificationsLastDead]; ok || a[v1alpha1.AnnotationNotificationsDead] != "0" || a[v1alpha1.AnnotationNotificationsRetrying] != "0" {
		t.Fatalf("no dead letters: %v", a)
	}
	r.notes = notesReport{}
	for _, k := range []string{v1alpha1.AnnotationNotificationsDead, v1alpha1.AnnotationNotificationsRetrying, v1alpha1.AnnotationNotificationsLastDead} {
		if v, ok := lease(r)[k]; ok {
			t.Errorf("without a summary %s=%q stays", k, v)
		}
	}
}

// ReportNotifications reads a real store's outbox: its first summary is reported at once,
// a dead letter on the next read; the last dead letter never carries a value to redact and
// is bounded.
func TestReportNotificationsReadsTheOutbox(t *testing.T) {
	ctx := t.Context()
	st := store.NewMemory(nil)
	t.Cleanup(func() { _ = st.Close() })
	if err := st.SetNotificationReceivers(ctx, []store.Receiver{{Name: "hook"}}); err != nil {
		t.Fatal(err)
	}
	f := &fakeTarget{}
	m := &Manifests{o: ManifestOptions{Namespace: "agents", PodName: "pay-gateway-0", Logf: f.logf}, rep: fastReporter(f)}
	go m.rep.run(ctx)
	m.report("sha256:one", "rev 1", nil)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- m.ReportNotifications(rctx, NotificationReportOptions{Outbox: st, Receivers: []string{"hook"},
			Redact: []string{"https://hooks.example/T0/secret-path"}, Interval: 10 * time.Millisecond})
	}()
	waitFor(t, "the first summary", func() bool { _, w, _ := f.snapshot(); return len(w) > 0 && w[len(w)-1].notes.reported })

	if _, err := st.CreateRun(ctx, store.Run{ID: "r1", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	_, err := st.CreateApproval(ctx, store.ApprovalRequest{Tool: "mem.delete", ArgsDigest: "sha256:1", Run: "r1", Actor: "alice", Quorum: 1, Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := st.ClaimNotifications(ctx, "w", []string{"hook"}, time.Minute, 10)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claimed %+v, %v", rows, err)
	}
	long := "dial https://hooks.example/T0/secret-path: " + strings.Repeat("x", 2000)
	if err := st.FinishNotification(ctx, rows[0].ID, "w", store.NotificationDead, time.Time{}, long); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dead letter", func() bool { _, w, _ := f.snapshot(); return len(w) > 0 && w[len(w)-1].notes.dead == 1 })
	_, w, _ := f.snapshot()
	last := w[len(w)-1].notes.lastDead
	if !strings.HasPrefix(last, "hook: dial <redacted>: xxx") || strings.Contains(last, "secret-path") || len(last) != maxReportDeadLetter || !strings.HasSuffix(last, "...") {
		t.Errorf("last dead letter %q (%d bytes)", last, len(last))
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := (&Manifests{}).ReportNotifications(ctx, NotificationReportOptions{Outbox: st}); err == nil {
		t.Error("a report without receivers was accepted")
	}
}
