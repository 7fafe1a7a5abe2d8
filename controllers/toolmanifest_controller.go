package controllers

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// TrustedKeysSecret is the Secret, in a ToolManifest's namespace, whose data values are the
// Ed25519 public keys (PEM) ToolManifest signatures must verify against.
const TrustedKeysSecret = "reversi-trusted-keys"

// ToolManifestReconciler validates ToolManifest objects with the full validator and, when the
// namespace has trusted keys, verifies the reversi.dev/signature annotation against the
// checksum of the spec (the same message a registry version is signed with).
type ToolManifestReconciler struct {
	client.Client
	// KeysSecret overrides TrustedKeysSecret (the --tool-manifest-keys-secret flag).
	KeysSecret string
}

func (r *ToolManifestReconciler) keysSecret() string {
	if r.KeysSecret != "" {
		return r.KeysSecret
	}
	return TrustedKeysSecret
}

// SetupWithManager watches ToolManifests and the namespace's trusted keys Secret.
func (r *ToolManifestReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ToolManifest{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.manifestsForSecret)).
		Named("toolmanifest").
		Complete(r)
}

func (r *ToolManifestReconciler) manifestsForSecret(ctx context.Context, obj client.Object) []reconcile.Request {
	if obj.GetName() != r.keysSecret() {
		return nil
	}
	var list v1alpha1.ToolManifestList
	if err := r.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, tm := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: tm.Namespace, Name: tm.Name}})
	}
	return out
}

// Reconcile validates one ToolManifest, checks its signature, and patches its status.
func (r *ToolManifestReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	tm := &v1alpha1.ToolManifest{}
	if err := r.Get(ctx, req.NamespacedName, tm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	base := tm.DeepCopy()
	retry := r.reconcile(ctx, tm)
	tm.Status.ObservedGeneration = tm.Generation
	if err := client.IgnoreNotFound(r.Status().Patch(ctx, tm, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, retry
}

// reconcile sets the conditions; it returns an error only for failures worth retrying
// (reading the keys Secret).
func (r *ToolManifestReconciler) reconcile(ctx context.Context, tm *v1alpha1.ToolManifest) error {
	m, err := validateToolManifest(tm)
	if err != nil {
		tm.Status.Checksum = ""
		setCondition(tm, v1alpha1.ConditionValid, metav1.ConditionFalse, v1alpha1.ReasonValidationFailed, err.Error())
		removeCondition(tm, v1alpha1.ConditionSignatureVerified)
		markFailed(tm, v1alpha1.ReasonValidationFailed, err.Error(), true)
		return nil
	}
	sum, err := manifest.Checksum(m)
	if err != nil {
		return err
	}
	tm.Status.Checksum = sum
	setCondition(tm, v1alpha1.ConditionValid, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, fmt.Sprintf("%s v%d %s is valid", m.Tool, m.Version, m.Status))

	trust, err := r.trust(ctx, tm.Namespace)
	if err != nil {
		var reason = v1alpha1.ReasonInvalidSecret
		setCondition(tm, v1alpha1.ConditionSignatureVerified, metav1.ConditionFalse, reason, err.Error())
		markFailed(tm, reason, err.Error(), false)
		return err
	}
	if trust == nil {
		removeCondition(tm, v1alpha1.ConditionSignatureVerified)
		markReady(tm, v1alpha1.ReasonSucceeded, fmt.Sprintf("valid, checksum %s; the signature is not checked: no %s Secret in %s", short(sum), r.keysSecret(), tm.Namespace))
		return nil
	}
	reason, msg, ok := verifyAnnotation(tm, m, sum, trust)
	if !ok {
		setCondition(tm, v1alpha1.ConditionSignatureVerified, metav1.ConditionFalse, reason, msg)
		markFailed(tm, reason, msg, true)
		return nil
	}
	setCondition(tm, v1alpha1.ConditionSignatureVerified, metav1.ConditionTrue, v1alpha1.ReasonVerified, msg)
	markReady(tm, v1alpha1.ReasonSucceeded, fmt.Sprintf("valid and signed, checksum %s", short(sum)))
	return nil
}

// validateToolManifest runs the full validator on the spec, every error at once.
func validateToolManifest(tm *v1alpha1.ToolManifest) (*manifest.Manifest, error) {
	raw, err := tm.ManifestObject()
	if err != nil {
		return nil, err
	}
	m, errs := manifest.Validate(raw)
	if len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
			var fe *manifest.FieldError
			if errors.As(e, &fe) {
				msgs[i] = "spec." + fe.Path + ": " + fe.Message
			}
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	return m, nil
}

// trust reads the namespace's trusted keys; nil when the Secret does not exist.
func (r *ToolManifestReconciler) trust(ctx context.Context, namespace string) (*signing.TrustSet, error) {
	var s corev1.Secret
	err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: r.keysSecret()}, &s)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", namespace, r.keysSecret(), err)
	}
	var pem []byte
	for _, k := range sortedKeys(s.Data) {
		pem = append(append(pem, s.Data[k]...), '\n')
	}
	t, err := signing.ParseTrustSet(pem)
	if err != nil {
		return nil, fmt.Errorf("Secret %s/%s: %w: put Ed25519 public keys (PEM) in it", namespace, r.keysSecret(), err)
	}
	return t, nil
}

// verifyAnnotation checks reversi.dev/signature and reversi.dev/key-id against the message
// `reversi-manifest:<tool>@<version>:<checksum of the spec>`.
func verifyAnnotation(tm *v1alpha1.ToolManifest, m *manifest.Manifest, sum string, trust *signing.TrustSet) (reason, msg string, ok bool) {
	sigText, keyID := tm.Annotations[v1alpha1.AnnotationSignature], tm.Annotations[v1alpha1.AnnotationKeyID]
	if sigText == "" || keyID == "" {
		return v1alpha1.ReasonSignatureMissing, fmt.Sprintf("trusted keys are set but the %s and %s annotations are missing: export the manifest with reversi manifests export --format crd", v1alpha1.AnnotationSignature, v1alpha1.AnnotationKeyID), false
	}
	sig, err := base64.StdEncoding.DecodeString(sigText)
	if err != nil {
		return v1alpha1.ReasonSignatureVerificationFailed, v1alpha1.AnnotationSignature + " is not base64", false
	}
	if err := trust.Verify(keyID, sig, signing.Message(m.Tool, m.Version, sum)); err != nil {
		return v1alpha1.ReasonSignatureVerificationFailed, fmt.Sprintf("%s v%d (checksum %s): %v", m.Tool, m.Version, short(sum), err), false
	}
	return "", fmt.Sprintf("%s v%d signed by key %s", m.Tool, m.Version, keyID), true
}
