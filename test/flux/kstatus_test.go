package flux_test

import (
	"context"
	"testing"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/export"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
)

// TestToolManifestKstatus computes the kstatus of a ToolManifest, as the API server returns it,
// with the kstatus of fluxcd/cli-utils (the version kustomize-controller v1.9.6 health checks
// with, status.Compute) in each state of its life: it must be Current exactly when the
// controller found it valid and signed for its current generation. The ToolManifest
// reconciler is called directly (no manager), so each state is observed before the next.
func TestToolManifestKstatus(t *testing.T) {
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c := env.Client
	const ns = "kstatus"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	writer := signingtest.NewKey(t)
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: controllers.TrustedKeysSecret},
		Data: map[string][]byte{"w.pem": writer.PublicPEM}}); err != nil {
		t.Fatal(err)
	}
	r := &controllers.ToolManifestReconciler{Client: c}
	reconcile := func(name string) {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}); err != nil {
			t.Fatalf("reconcile %s: %v", name, err)
		}
	}
	// kstatus is the status kstatus computes for the object as a GET returns it.
	kstatus := func(name string) *status.Result {
		t.Helper()
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("ToolManifest"))
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
			t.Fatal(err)
		}
		res, err := status.Compute(u)
		if err != nil {
			t.Fatalf("status.Compute of ToolManifest %s: %v", name, err)
		}
		return res
	}
	expect := func(what, name string, want status.Status) {
		t.Helper()
		if got := kstatus(name); got.Status != want {
			t.Errorf("%s: kstatus %s (%s), want %s", what, got.Status, got.Message, want)
		}
	}

	dir := t.TempDir()
	publish := func(yaml string) *v1alpha1.ToolManifest {
		t.Helper()
		docs := parseManifests(t, yaml)
		if _, err := registry.New(dir).Publish(docs, manifest.Approved, registry.WriteOptions{By: "alice", Signer: writer.Signer}); err != nil {
			t.Fatal(err)
		}
		snap, errs := registry.New(dir).Load(writer.Trust)
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		tm, err := export.ToolManifest(ns, "db.wipe", snap.Entries["db.wipe"], snap.Canonical["db.wipe"])
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}

	// Created, before the controller has seen it: not Current (kustomize-controller polls
	// right after it applies; an object it found Current here would pass the health check
	// whatever its signature).
	tm := publish(strictWipe)
	if err := c.Create(ctx, tm); err != nil {
		t.Fatal(err)
	}
	expect("created, not reconciled yet", tm.Name, status.InProgressStatus)

	reconcile(tm.Name)
	expect("valid and signed", tm.Name, status.CurrentStatus)

	// An edit that keeps the old signature: in progress until reconciled, then Failed.
	cur := &v1alpha1.ToolManifest{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(tm), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Approval = nil
	if err := c.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	expect("edited, not reconciled yet", tm.Name, status.InProgressStatus)
	reconcile(tm.Name)
	expect("edited without a new signature", tm.Name, status.FailedStatus)

	// The writers' signed export of the change: Current again.
	next := publish(looseWipe)
	if err := c.Get(ctx, client.ObjectKeyFromObject(tm), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec, cur.Annotations = next.Spec, next.Annotations
	if err := c.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	expect("re-signed, not reconciled yet", tm.Name, status.InProgressStatus)
	reconcile(tm.Name)
	expect("re-signed", tm.Name, status.CurrentStatus)

	// No signature at all: Failed (the controller cannot do better until the object changes).
	unsigned := next.DeepCopy()
	unsigned.Name, unsigned.Annotations = "unsigned", nil
	if err := c.Create(ctx, unsigned); err != nil {
		t.Fatal(err)
	}
	expect("unsigned, not reconciled yet", unsigned.Name, status.InProgressStatus)
	reconcile(unsigned.Name)
	expect("unsigned", unsigned.Name, status.FailedStatus)

	// A trusted keys Secret the controller cannot use: Ready=False without Stalled, so in
	// progress (the controller retries; a fixed Secret reconciles it) — never Current.
	var keys corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: controllers.TrustedKeysSecret}, &keys); err != nil {
		t.Fatal(err)
	}
	keys.Data = map[string][]byte{"w.pem": []byte("not a key")}
	if err := c.Update(ctx, &keys); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(tm)}); err == nil {
		t.Errorf("reconcile with an unusable keys Secret: no error to retry with")
	}
	expect("trusted keys unusable", tm.Name, status.InProgressStatus)
}

// parseManifests parses and validates YAML manifest documents.
func parseManifests(t *testing.T, yaml string) []*manifest.Manifest {
	t.Helper()
	docs, errs := manifest.ParseFile("m.yaml", []byte(yaml))
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		t.Fatal(errs, verrs)
	}
	return ms
}
