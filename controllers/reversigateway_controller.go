package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// ReversiGatewayReconciler deploys a gateway (DESIGN.md "ReversiGateway"): it renders
// `<gateway>-config` (gateway.yaml) and `<gateway>-manifests` (the manifests of the referenced
// ManifestRegistries and selected ToolManifests, merged, with their signatures so the pods
// verify them again), and owns the ServiceAccount, Role, RoleBinding, Deployment, Service and
// (sqlite) PersistentVolumeClaim. A merge that fails (a tool defined twice, a source not
// ready, a signature that does not verify) leaves the last good rendering in place.
//
// Each gateway pod that runs as the gateway's ServiceAccount gets a coordination.k8s.io Lease
// of its own name, created and controlled by the ReversiGateway (podLeases), which the Role
// lets the gateway patch by name: the pod reports the digest it serves there
// (reversi.dev/manifest-digest after each load), so the gateway needs no right on pods.
//
// Status: kstatus conditions, readyReplicas from the Deployment, the desired manifest digest
// and how many ready pods report it on their Lease.
type ReversiGatewayReconciler struct {
	client.Client
	Recorder recorder.EventRecorder
	// Image is the gateway image when spec.image is empty (DefaultGatewayImage when empty).
	Image string
	// Images are the images a gateway may run (issue 17): a gateway whose image is outside
	// them is Stalled with reason ImageNotAllowed and nothing is rendered. Nil:
	// DefaultGatewayImages of the default image.
	Images *ImagePolicy
	// UpstreamImages are the images container upstreams may run (issue 23): a gateway with an
	// upstream image outside them is Stalled with reason ImageNotAllowed too. Nil: Images.
	UpstreamImages *ImagePolicy
	// MaxShardBytes is the manifest bytes per rendered ConfigMap (bundle.MaxShardBytes when 0).
	MaxShardBytes int
	// Key signs the snapshot of the selected ToolManifests and verifies the registries'
	// renderings; its public keys go into every gateway pod (ControllerKeysEnv). Required.
	Key *SigningKey
	// APIReader reads the gateway from the API server, not the cache (mgr.GetAPIReader()):
	// see ManifestRegistryReconciler.APIReader.
	APIReader client.Reader
}

// gatewayRetry is how soon a gateway waiting for a source or a rollout is looked at again
// when no watch fires.
const gatewayRetry = 30 * time.Second

// SetupWithManager watches gateways, what they own (the pods' Leases carry their reports),
// and what they read: the registries' ConfigMaps, ToolManifests, Secrets and the gateway pods.
func (r *ReversiGatewayReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ReversiGateway{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.Role{}).
		Owns(&rbacv1.RoleBinding{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.PersistentVolumeClaim{}).
		Owns(&coordinationv1.Lease{}).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.gatewaysForRegistryConfigMap)).
		Watches(&v1alpha1.ManifestRegistry{}, handler.EnqueueRequestsFromMapFunc(r.gatewaysForRegistry)).
		Watches(&v1alpha1.ToolManifest{}, handler.EnqueueRequestsFromMapFunc(r.gatewaysInNamespace)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.gatewaysInNamespace)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(gatewayOfPod)).
		Named("reversigateway").
		Complete(r)
}

func (r *ReversiGatewayReconciler) gatewaysInNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	var list v1alpha1.ReversiGatewayList
	if err := r.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, gw := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}})
	}
	return out
}

// gatewaysForRegistryConfigMap maps a registry's rendering to the gateways that load it.
func (r *ReversiGatewayReconciler) gatewaysForRegistryConfigMap(ctx context.Context, obj client.Object) []reconcile.Request {
	reg, ok := obj.GetLabels()[LabelRegistry]
	if !ok {
		return nil
	}
	return r.gatewaysLoading(ctx, obj.GetNamespace(), reg)
}

// gatewaysForRegistry maps a ManifestRegistry (its status names the rendering's shards) to
// the gateways that load it.
func (r *ReversiGatewayReconciler) gatewaysForRegistry(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.gatewaysLoading(ctx, obj.GetNamespace(), obj.GetName())
}

// gatewaysLoading lists the gateways of ns whose spec.manifests.registries names reg.
func (r *ReversiGatewayReconciler) gatewaysLoading(ctx context.Context, ns, reg string) []reconcile.Request {
	var list v1alpha1.ReversiGatewayList
	if err := r.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, gw := range list.Items {
		if m := gw.Spec.Manifests; m != nil && slices.Contains(m.Registries, reg) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}})
		}
	}
	return out
}

func gatewayOfPod(_ context.Context, obj client.Object) []reconcile.Request {
	name, ok := obj.GetLabels()[v1alpha1.LabelGateway]
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
}

// Reconcile renders one gateway and patches its status.
func (r *ReversiGatewayReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	gw := &v1alpha1.ReversiGateway{}
	if err := r.APIReader.Get(ctx, req.NamespacedName, gw); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !gw.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // owner references delete what it owns
	}
	base := gw.DeepCopy()
	res, serr := r.reconcile(ctx, gw)
	gw.Status.ObservedGeneration = gw.Generation
	if serr != nil {
		markFailed(gw, serr.reason, serr.msg, serr.stalled)
		r.event(gw, corev1.EventTypeWarning, serr.reason, serr.msg)
		if err := r.patchStatus(ctx, gw, base); err != nil {
			return ctrl.Result{}, err
		}
		if serr.stalled {
			return ctrl.Result{}, nil // a change to the spec or a source triggers the next attempt
		}
		return ctrl.Result{RequeueAfter: gatewayRetry}, nil
	}
	return res, r.patchStatus(ctx, gw, base)
}

func (r *ReversiGatewayReconciler) patchStatus(ctx context.Context, gw, base *v1alpha1.ReversiGateway) error {
	return client.IgnoreNotFound(r.Status().Patch(ctx, gw, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})))
}

func (r *ReversiGatewayReconciler) event(gw *v1alpha1.ReversiGateway, typ, reason, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(gw, nil, typ, reason, "Reconcile", "%s", note)
	}
}

func (r *ReversiGatewayReconciler) image(gw *v1alpha1.ReversiGateway) string {
	switch {
	case gw.Spec.Image != "":
		return gw.Spec.Image
	case r.Image != "":
		return r.Image
	}
	return DefaultGatewayImage
}

// checkImage refuses a gateway whose image the policy does not allow (issue 17: admission can
// be bypassed or absent, so the reconciler does not render what it would refuse).
func (r *ReversiGatewayReconciler) checkImage(gw *v1alpha1.ReversiGateway) *stepError {
	images := r.Images
	if images == nil {
		patterns, err := DefaultGatewayImages(r.image(&v1alpha1.ReversiGateway{}))
		if err == nil {
			images, err = NewImagePolicy(patterns)
		}
		if err != nil {
			return fail(v1alpha1.ReasonImageNotAllowed, true, "the controller's default gateway image: %v", err)
		}
	}
	field := "spec.image"
	if gw.Spec.Image == "" {
		field = "the controller's default gateway image (--gateway-image)"
	}
	if err := images.Check(field, r.image(gw)); err != nil {
		return fail(v1alpha1.ReasonImageNotAllowed, true, "%v; nothing was rendered or changed", err)
	}
	if r.UpstreamImages != nil {
		images = r.UpstreamImages
	}
	refused, err := checkUpstreamImages(images, gw)
	if err == nil && len(refused) > 0 {
		err = errors.New(joinImageErrors(refused))
	}
	if err != nil {
		return fail(v1alpha1.ReasonImageNotAllowed, true, "%v; nothing was rendered or changed", err)
	}
	return nil
}

// reconcile renders and applies everything, in an order that never leaves a pod without
// access: RBAC first (the Role names the manifest shards), then the ConfigMaps (shard 0
// last), then the Deployment and Service; then it reads the rollout. A gateway whose image is
// not allowed renders nothing.
func (r *ReversiGatewayReconciler) reconcile(ctx context.Context, gw *v1alpha1.ReversiGateway) (ctrl.Result, *stepError) {
	if serr := r.checkImage(gw); serr != nil {
		return ctrl.Result{}, serr
	}
	n := namesOf(gw)
	rc, err := renderConfig(gw)
	if err != nil {
		return ctrl.Result{}, fail(v1alpha1.ReasonInvalidSpec, true, "%v", err)
	}
	trust, serr := r.trust(ctx, gw)
	if serr != nil {
		return ctrl.Result{}, serr
	}
	// What was rendered last, as far as it verifies with the controller's key: sequences and
	// versions grow from it (status can be written by others).
	last := readPrevious(ctx, r.Client, gw, shardsOf(ctx, r.Client, gw.Namespace, n.manifests), r.Key.Trust)
	b, sources, serr := r.merge(ctx, gw, trust, last)
	if serr != nil {
		return ctrl.Result{}, serr
	}
	if serr := r.attestGateway(gw, &b, last); serr != nil {
		return ctrl.Result{}, serr
	}
	shards, err := b.Shards(r.MaxShardBytes)
	if err != nil {
		return ctrl.Result{}, fail(v1alpha1.ReasonStorageFailed, true, "%v: split the tools across gateways or shorten the manifests", err)
	}

	own := func(obj client.Object, mutate func() error) *stepError {
		_, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
			if err := claim(obj, gw, kindOf(obj)); err != nil {
				return err // not ours: nothing is written (issue 17: no adoption)
			}
			obj.SetLabels(mergeLabels(obj.GetLabels(), gatewayLabels(gw)))
			if err := mutate(); err != nil {
				return err
			}
			return controllerutil.SetControllerReference(gw, obj, r.Scheme())
		})
		if err != nil {
			return applyFailure(err, "writing "+kindOf(obj)+" "+obj.GetName())
		}
		return nil
	}
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: gw.Namespace, Name: name} }

	if e := own(&corev1.ServiceAccount{ObjectMeta: meta(n.object)}, func() error { return nil }); e != nil {
		return ctrl.Result{}, e
	}
	// The pods' Leases before the Role that names them; Leases of pods that are gone after it.
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(gw.Namespace), client.MatchingLabels(selectorLabels(gw))); err != nil {
		return ctrl.Result{}, fail(v1alpha1.ReasonApplyFailed, false, "listing the gateway's pods: %v", err)
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) }) // a stable status
	reporting, skipped := leasePods(gw, pods.Items)
	if skipped > 0 {
		r.event(gw, corev1.EventTypeWarning, EventTooManyPods, fmt.Sprintf(
			"%d pods run as the gateway's ServiceAccount with its labels and names: only %d get a Lease to report on (its Deployment's first), %d count as unreported; delete the pods that are not the gateway's",
			len(reporting)+skipped, len(reporting), skipped))
	}
	leases, conflicts, e := r.podLeases(ctx, gw, reporting)
	if e != nil {
		return ctrl.Result{}, e
	}
	// The Role names only the ConfigMaps the gateway controls (or that do not exist yet): one
	// of another owner is a conflict (reported when the ConfigMaps are written, below), and the
	// Role is written before them.
	cms, e := r.ownConfigMaps(ctx, gw, gatewayConfigMaps(gw, len(shards)))
	if e != nil {
		return ctrl.Result{}, e
	}
	role := &rbacv1.Role{ObjectMeta: meta(n.object)}
	if e := own(role, func() error { role.Rules = gatewayRules(gw, cms, leases); return nil }); e != nil {
		return ctrl.Result{}, e
	}
	if e := r.pruneLeases(ctx, gw, leases); e != nil {
		return ctrl.Result{}, e
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: meta(n.object)}
	if e := own(rb, func() error {
		rb.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: n.object}
		rb.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: n.object, Namespace: gw.Namespace}}
		return nil
	}); e != nil {
		return ctrl.Result{}, e
	}
	// gateway.yaml and the manifests: written again whenever their data differs from the
	// rendering, with a RenderingDrift event naming who changed them.
	configSet := shardSet{owner: gw, names: []string{n.config}, shards: []map[string]string{{GatewayConfigKey: string(rc.data)}}, labels: gatewayLabels(gw)}
	drifts, err := configSet.apply(ctx, r.Client, r.Scheme())
	if len(drifts) > 0 {
		r.event(gw, corev1.EventTypeWarning, v1alpha1.EventRenderingDrift, driftNote(gw.Namespace, drifts, "the rendered gateway.yaml (pods refuse to start on another one)"))
	}
	if err != nil {
		return ctrl.Result{}, applyFailure(err, "")
	}
	digest := b.Digest()
	prev := r.renderedDigest(ctx, n)
	set := shardSet{owner: gw, names: shardNames(n.manifests, len(shards)), shards: shards,
		labels: gatewayLabels(gw), annotations: map[string]string{AnnotationRevision: b.Revision()}}
	drifts, err = set.apply(ctx, r.Client, r.Scheme())
	if len(drifts) > 0 {
		r.event(gw, corev1.EventTypeWarning, v1alpha1.EventRenderingDrift, driftNote(gw.Namespace, drifts, "the rendering of digest "+digest))
	}
	if err != nil {
		return ctrl.Result{}, applyFailure(err, "")
	}
	if e := r.deleteStaleShards(ctx, gw, len(shards)); e != nil {
		return ctrl.Result{}, e
	}
	if prev != digest {
		r.event(gw, corev1.EventTypeNormal, v1alpha1.EventManifestsRendered,
			fmt.Sprintf("rendered %d tools into %s, digest %s (%s)", len(b.Entries), n.manifests, digest, b.Revision()))
	}

	if storeType(gw) == v1alpha1.StoreSQLite {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: meta(n.data)}
		if e := own(pvc, func() error {
			if !pvc.CreationTimestamp.IsZero() {
				return nil // a claim's spec is immutable once bound
			}
			size := resource.MustParse("1Gi")
			var class *string
			if s := gw.Spec.Store; s != nil && s.SQLite != nil {
				if s.SQLite.Size != nil {
					size = *s.SQLite.Size
				}
				class = s.SQLite.StorageClassName
			}
			pvc.Spec = corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: class,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			}
			return nil
		}); e != nil {
			return ctrl.Result{}, e
		}
	}
	dep := &appsv1.Deployment{ObjectMeta: meta(n.object)}
	if e := own(dep, func() error { mutateDeployment(dep, gw, r.image(gw), rc, r.Key.PublicPEM); return nil }); e != nil {
		return ctrl.Result{}, e
	}
	svc := &corev1.Service{ObjectMeta: meta(n.object)}
	if e := own(svc, func() error {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
		svc.Spec.Selector = selectorLabels(gw)
		svc.Spec.Ports = []corev1.ServicePort{{Name: GatewayPortName, Port: gatewayPort(gw), TargetPort: intstr.FromString(GatewayPortName), Protocol: corev1.ProtocolTCP}}
		return nil
	}); e != nil {
		return ctrl.Result{}, e
	}
	res, e := r.rollout(ctx, gw, dep, pods.Items, b, digest, sources, trust != nil)
	if e == nil && len(conflicts) > 0 {
		// The rest is rendered; the pods whose Lease name is taken cannot report (not loaded).
		msgs := make([]string, len(conflicts))
		for i, c := range conflicts {
			msgs[i] = c.Error()
		}
		return ctrl.Result{}, fail(v1alpha1.ReasonOwnershipConflict, false, "%s", strings.Join(msgs, "; "))
	}
	return res, e
}

// reportsTo reports whether pod reports on a Lease of gw: it runs as the gateway's own
// ServiceAccount (whoever may create such a pod may already act as that ServiceAccount), its
// name is one the gateway's Deployment gives its pods (gatewayPodPrefix: otherwise whoever may
// create pods would choose the name of a Lease the controller creates, such as another
// component's leader-election Lease not made yet) and it is not being deleted. pod matches
// selectorLabels(gw).
func reportsTo(gw *v1alpha1.ReversiGateway, pod *corev1.Pod) bool {
	return pod.DeletionTimestamp.IsZero() && pod.Spec.ServiceAccountName == namesOf(gw).object &&
		strings.HasPrefix(pod.Name, gatewayPodPrefix(gw))
}

// maxPodLeases bounds how many pods of one gateway get a Lease (and a name in its Role):
// twice the most replicas a gateway may have, room for a rollout's new and old pods. Whoever
// may create pods as the gateway's ServiceAccount could otherwise grow the Role, rewritten on
// every pod event, and the Leases without end.
const maxPodLeases = 200

// EventTooManyPods is the Warning event of a gateway with more pods than maxPodLeases.
const EventTooManyPods = "TooManyPods"

// leasePods are the pods that reportsTo gw, at most maxPodLeases: first those a ReplicaSet of
// the gateway's Deployment controls (by their controller reference: one forged to a
// ReplicaSet that does not exist is garbage collected), then the others, each in the order of
// pods; and how many were left out.
func leasePods(gw *v1alpha1.ReversiGateway, pods []corev1.Pod) ([]corev1.Pod, int) {
	var deployed, others []corev1.Pod
	for i := range pods {
		p := &pods[i]
		if !reportsTo(gw, p) {
			continue
		}
		if c := metav1.GetControllerOf(p); c != nil && c.Kind == "ReplicaSet" && strings.HasPrefix(c.APIVersion, appsv1.GroupName+"/") &&
			strings.HasPrefix(c.Name, namesOf(gw).object+"-") {
			deployed = append(deployed, *p)
		} else {
			others = append(others, *p)
		}
	}
	out := append(deployed, others...)
	if len(out) <= maxPodLeases {
		return out, 0
	}
	return out[:maxPodLeases], len(out) - maxPodLeases
}

// maxGeneratedNamePrefix is how much of a generateName the API server keeps (63 characters
// minus the 5 random ones it appends).
const maxGeneratedNamePrefix = 58

// gatewayPodPrefix is how the names of the gateway Deployment's pods start: the Deployment
// `<gw>-gateway` names its ReplicaSets `<gw>-gateway-<hash>`, and they generate pod names from
// `<gw>-gateway-<hash>-`, of which the API server keeps the first 58 characters.
func gatewayPodPrefix(gw *v1alpha1.ReversiGateway) string {
	p := namesOf(gw).object + "-"
	if len(p) > maxGeneratedNamePrefix {
		p = p[:maxGeneratedNamePrefix]
	}
	return p
}

// podLeases makes sure every pod that reportsTo gw has its Lease: named as the pod, in the
// gateway's namespace, labelled gatewayLabels(gw), controlled by gw (created when missing,
// labels and controller reference restored when they were taken away; its spec and
// annotations are the pod's report and left alone). A Lease the cache does not show as it
// should be is read again from the API server, so one created a moment ago is not created
// twice. It returns the
// names of the Leases gw controls (sorted) and, for each existing Lease of such a name that
// gw does not control, an *OwnershipConflictError: that Lease is neither adopted nor named in
// the Role, and its pod cannot report. Errors: reading or writing a Lease failed.
func (r *ReversiGatewayReconciler) podLeases(ctx context.Context, gw *v1alpha1.ReversiGateway, pods []corev1.Pod) ([]string, []*OwnershipConflictError, *stepError) {
	var names []string
	var conflicts []*OwnershipConflictError
	for i := range pods {
		p := &pods[i]
		if !reportsTo(gw, p) {
			continue
		}
		key := types.NamespacedName{Namespace: gw.Namespace, Name: p.Name}
		lease := &coordinationv1.Lease{}
		if err := r.Get(ctx, key, lease); err == nil && metav1.IsControlledBy(lease, gw) && hasLabels(lease.Labels, gatewayLabels(gw)) {
			names = append(names, p.Name) // the cache shows it as it should be: nothing to write
			continue
		}
		err := r.APIReader.Get(ctx, key, lease)
		switch {
		case apierrors.IsNotFound(err):
			lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: gw.Namespace, Name: p.Name, Labels: gatewayLabels(gw)}}
			if err := controllerutil.SetControllerReference(gw, lease, r.Scheme()); err != nil {
				return nil, nil, applyFailure(err, "creating Lease "+p.Name)
			}
			if err := r.Create(ctx, lease, client.FieldOwner(FieldManager)); err != nil {
				return nil, nil, applyFailure(err, "creating Lease "+p.Name)
			}
		case err != nil:
			return nil, nil, applyFailure(err, "reading Lease "+p.Name)
		default:
			err := claim(lease, gw, "Lease")
			if c := metav1.GetControllerOf(lease); err == nil && c != nil && c.UID != gw.UID {
				// It refers to gw but another object controls it: not ours either.
				err = &OwnershipConflictError{Kind: "Lease", Namespace: lease.Namespace, Name: lease.Name, OwnerKind: "ReversiGateway", Owner: gw.Name}
			}
			var conflict *OwnershipConflictError
			if errors.As(err, &conflict) {
				conflicts = append(conflicts, conflict)
				continue // not ours: not written, not in the Role
			}
			if !metav1.IsControlledBy(lease, gw) || !hasLabels(lease.Labels, gatewayLabels(gw)) {
				// A patch without a resourceVersion: the pod may be writing its report meanwhile.
				base := lease.DeepCopy()
				lease.Labels = mergeLabels(maps.Clone(lease.Labels), gatewayLabels(gw))
				if err := controllerutil.SetControllerReference(gw, lease, r.Scheme()); err != nil {
					return nil, nil, applyFailure(err, "writing Lease "+p.Name)
				}
				if err := r.Patch(ctx, lease, client.MergeFrom(base), client.FieldOwner(FieldManager)); err != nil {
					return nil, nil, applyFailure(err, "writing Lease "+p.Name)
				}
			}
		}
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names, conflicts, nil
}

// ownConfigMaps returns those of names that gw may be granted: ConfigMaps it controls (or
// that refer to it: its own, healed when written) and names no ConfigMap has yet. A ConfigMap
// of another owner is left out (issue 17: the Role grants nothing on an object the controller
// does not control; writing it is then an OwnershipConflict). A name the cache does not know
// is read again from the API server, so a ConfigMap made a moment ago is not granted.
// Errors: reading a ConfigMap failed.
func (r *ReversiGatewayReconciler) ownConfigMaps(ctx context.Context, gw *v1alpha1.ReversiGateway, names []string) ([]string, *stepError) {
	var out []string
	for _, name := range names {
		key := types.NamespacedName{Namespace: gw.Namespace, Name: name}
		cm := &corev1.ConfigMap{}
		err := r.Get(ctx, key, cm)
		if apierrors.IsNotFound(err) {
			err = r.APIReader.Get(ctx, key, cm)
		}
		switch {
		case apierrors.IsNotFound(err):
			out = append(out, name)
		case err != nil:
			return nil, applyFailure(err, "reading ConfigMap "+name)
		case claim(cm, gw, "ConfigMap") == nil:
			out = append(out, name)
		}
	}
	return out, nil
}

// hasLabels reports whether have holds every label of want.
func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// pruneLeases deletes the Leases gw controls in its namespace that are not named in keep
// (their pod is gone, is being deleted, or no longer runs as the gateway's ServiceAccount).
// Errors: listing or deleting failed.
func (r *ReversiGatewayReconciler) pruneLeases(ctx context.Context, gw *v1alpha1.ReversiGateway, keep []string) *stepError {
	var list coordinationv1.LeaseList
	if err := r.List(ctx, &list, client.InNamespace(gw.Namespace)); err != nil {
		return fail(v1alpha1.ReasonApplyFailed, false, "listing Leases: %v", err)
	}
	for i := range list.Items {
		l := &list.Items[i]
		if !metav1.IsControlledBy(l, gw) || slices.Contains(keep, l.Name) {
			continue
		}
		if err := r.Delete(ctx, l, client.Preconditions{UID: &l.UID}); client.IgnoreNotFound(err) != nil {
			return fail(v1alpha1.ReasonApplyFailed, false, "deleting Lease %s of a pod that is gone: %v", l.Name, err)
		}
	}
	return nil
}

// kindOf is the Kind of an object the gateway renders, for messages.
func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *corev1.ServiceAccount:
		return "ServiceAccount"
	case *rbacv1.Role:
		return "Role"
	case *rbacv1.RoleBinding:
		return "RoleBinding"
	case *corev1.PersistentVolumeClaim:
		return "PersistentVolumeClaim"
	case *appsv1.Deployment:
		return "Deployment"
	case *corev1.Service:
		return "Service"
	case *corev1.ConfigMap:
		return "ConfigMap"
	case *coordinationv1.Lease:
		return "Lease"
	}
	return fmt.Sprintf("%T", obj)
}

// applyFailure is the step error of a failed write: OwnershipConflict for an object the
// controller does not control (an *OwnershipConflictError), ApplyFailed otherwise (what names
// the write, "" when err says it).
func applyFailure(err error, what string) *stepError {
	var conflict *OwnershipConflictError
	if errors.As(err, &conflict) {
		return fail(v1alpha1.ReasonOwnershipConflict, false, "%v", conflict)
	}
	if what != "" {
		return fail(v1alpha1.ReasonApplyFailed, false, "%s: %v", what, err)
	}
	return fail(v1alpha1.ReasonApplyFailed, false, "%v", err)
}

// rollout fills the status from the Deployment and the reports on the pods' Leases, and sets
// Ready when every desired pod is ready and serves the desired manifests, and
// NotificationsDelivered from the pods' outbox reports (notifications; it leaves Ready alone). Only a Lease gw
// controls, of a pod that reportsTo gw, counts: the pods' own annotations are ignored (anyone
// with pods patch in the namespace could write them).
func (r *ReversiGatewayReconciler) rollout(ctx context.Context, gw *v1alpha1.ReversiGateway, dep *appsv1.Deployment, pods []corev1.Pod, b bundle.Bundle, digest, sources string, signed bool) (ctrl.Result, *stepError) {
	want := int32(1)
	if gw.Spec.Replicas != nil {
		want = *gw.Spec.Replicas
	}
	sel := labels.SelectorFromSet(selectorLabels(gw))
	gw.Status.Selector = sel.String()
	gw.Status.Replicas = dep.Status.Replicas
	gw.Status.ReadyReplicas = dep.Status.ReadyReplicas
	var leaseList coordinationv1.LeaseList
	if err := r.List(ctx, &leaseList, client.InNamespace(gw.Namespace), client.MatchingLabels{v1alpha1.LabelGateway: gw.Name}); err != nil {
		return ctrl.Result{}, fail(v1alpha1.ReasonApplyFailed, false, "listing the gateway pods' Leases: %v", err)
	}
	reports := map[string]map[string]string{} // pod → its Lease's annotations
	for i := range leaseList.Items {
		if l := &leaseList.Items[i]; metav1.IsControlledBy(l, gw) {
			reports[l.Name] = l.Annotations
		}
	}
	ms := &v1alpha1.GatewayManifestsStatus{DesiredRevision: digest, Tools: int32(len(b.Entries))}
	for _, ss := range b.Snapshots {
		switch s := ss.Snapshot; s.Kind {
		case bundle.KindGateway:
			ms.Sequence, ms.Sources = s.Sequence, s.Sources
		case bundle.KindToolManifests:
			ms.ToolManifestsSequence, ms.ToolManifestsDigest = s.Sequence, s.Digest
			if len(s.Floors) > 0 {
				ms.ToolManifestFloors = map[string]int32{}
				for tool, v := range s.Floors {
					ms.ToolManifestFloors[tool] = int32(v)
				}
			}
		}
	}
	for i := range pods {
		p := &pods[i]
		if !p.DeletionTimestamp.IsZero() || !podReady(p) {
			continue
		}
		var report map[string]string // nil: no Lease of gw, or a pod that does not report to it
		if reportsTo(gw, p) {
			report = reports[p.Name]
		}
		switch served := report[v1alpha1.AnnotationManifestDigest]; {
		case served != "" && served == digest:
			ms.LoadedReplicas++
		default:
			if e := report[v1alpha1.AnnotationManifestError]; e != "" {
				ms.LastLoadError = truncate(p.Name+": "+e, 4096)
			}
			if served == "" {
				served = v1alpha1.UnreportedDigest
			}
			if len(ms.OtherDigests) < 10 {
				ms.OtherDigests = append(ms.OtherDigests, p.Name+"="+served)
			}
		}
	}
	gw.Status.Manifests = ms
	r.notifications(gw, pods, reports)
	note := ""
	if !signed {
		note = "; the pods do not verify signatures: set spec.trustedKeysSecretRef"
	}
	rolledOut := dep.Status.ObservedGeneration >= dep.Generation && dep.Status.UpdatedReplicas >= want &&
		dep.Status.ReadyReplicas >= want && dep.Status.Replicas == dep.Status.UpdatedReplicas
	if rolledOut && ms.LoadedReplicas >= want {
		markReady(gw, v1alpha1.ReasonSucceeded, fmt.Sprintf("%d/%d pods serve %d tools, digest %s (%s)%s", ms.LoadedReplicas, want, ms.Tools, digest, sources, note))
		return ctrl.Result{}, nil
	}
	msg := fmt.Sprintf("waiting for the rollout: %d/%d pods ready, %d serve digest %s (%s)%s", dep.Status.ReadyReplicas, want, ms.LoadedReplicas, digest, sources, note)
	if len(ms.OtherDigests) > 0 {
		msg += "; pods serving another digest: " + strings.Join(ms.OtherDigests, ", ")
	}
	if ms.LastLoadError != "" {
		msg += "; a pod refused it: " + ms.LastLoadError
	}
	setCondition(gw, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress, msg)
	setCondition(gw, v1alpha1.ConditionReconciling, metav1.ConditionTrue, v1alpha1.ReasonRolloutInProgress, msg)
	removeCondition(gw, v1alpha1.ConditionStalled)
	return ctrl.Result{RequeueAfter: gatewayRetry}, nil // the watches on pods and the Deployment usually come first
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// renderedDigest is the digest `<gw>-manifests` holds now ("" when absent).
func (r *ReversiGatewayReconciler) renderedDigest(ctx context.Context, n gatewayNames) string {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, types.NamespacedName{Namespace: n.ns, Name: n.manifests}, &cm); err != nil {
		return ""
	}
	return cm.Data[bundle.KeyDigest]
}

func (r *ReversiGatewayReconciler) deleteStaleShards(ctx context.Context, gw *v1alpha1.ReversiGateway, shards int) *stepError {
	n := namesOf(gw)
	var cms corev1.ConfigMapList
	if err := r.List(ctx, &cms, client.InNamespace(gw.Namespace), client.MatchingLabels{v1alpha1.LabelGateway: gw.Name}); err != nil {
		return fail(v1alpha1.ReasonStorageFailed, false, "listing ConfigMaps: %v", err)
	}
	keep := map[string]bool{n.config: true}
	for i := range shards {
		keep[n.manifestShard(i)] = true
	}
	for i := range cms.Items {
		cm := &cms.Items[i]
		if !keep[cm.Name] && metav1.IsControlledBy(cm, gw) {
			if err := r.Delete(ctx, cm); client.IgnoreNotFound(err) != nil {
				return fail(v1alpha1.ReasonStorageFailed, false, "deleting stale shard %s: %v", cm.Name, err)
			}
		}
	}
	return nil
}

// trust reads spec.trustedKeysSecretRef (nil when unset).
func (r *ReversiGatewayReconciler) trust(ctx context.Context, gw *v1alpha1.ReversiGateway) (*signing.TrustSet, *stepError) {
	ref := gw.Spec.TrustedKeysSecretRef
	if ref == nil {
		return nil, nil
	}
	var s corev1.Secret
	err := r.Get(ctx, types.NamespacedName{Namespace: gw.Namespace, Name: ref.Name}, &s)
	if apierrors.IsNotFound(err) {
		return nil, fail(v1alpha1.ReasonSecretNotFound, false, "trusted keys Secret %s/%s not found: create it, or fix spec.trustedKeysSecretRef", gw.Namespace, ref.Name)
	}
	if err != nil {
		return nil, fail(v1alpha1.ReasonSecretNotFound, false, "reading trusted keys Secret %s/%s: %v", gw.Namespace, ref.Name, err)
	}
	t, err := ParseTrustedKeys(s.Data)
	if err != nil {
		return nil, fail(v1alpha1.ReasonInvalidSecret, true, "trusted keys Secret %s: %v: put Ed25519 public keys (PEM) in it", ref.Name, err)
	}
	return t, nil
}

// ParseTrustedKeys reads a trusted-keys Secret's data: every value is one or more Ed25519
// public keys (PEM), read in key order.
func ParseTrustedKeys(data map[string][]byte) (*signing.TrustSet, error) {
	var pem []byte
	for _, k := range sortedKeys(data) {
		pem = append(append(pem, data[k]...), '\n')
	}
	return signing.ParseTrustSet(pem)
}

// merge builds the gateway's bundle from its sources. Each registry's rendering is assembled
// and verified as a gateway pod would (its signed snapshot, and with trusted keys every
// signature), and must be the one its status names; the selected ToolManifests count when
// Ready=True for their current generation, and their set gets a snapshot signed here. A tool
// defined by two registries is an error naming both (no silent pick); a ToolManifest of a
// tool a registry defines, or of a tool another ToolManifest defines too, is left out with an
// event (objects anyone with ToolManifest rights applies cannot freeze the registries). The
// second result summarises the sources.
func (r *ReversiGatewayReconciler) merge(ctx context.Context, gw *v1alpha1.ReversiGateway, trust *signing.TrustSet, prev previous) (bundle.Bundle, string, *stepError) {
	var parts []bundle.Bundle
	from := map[string][]string{}       // tool -> sources
	policyFrom := map[string][]string{} // policy -> sources
	var summary []string
	m := gw.Spec.Manifests
	if m == nil {
		m = &v1alpha1.GatewayManifests{}
	}
	for _, name := range m.Registries {
		b, e := r.registryBundle(ctx, gw.Namespace, name, trust)
		if e != nil {
			return bundle.Bundle{}, "", e
		}
		if s := b.Snapshots[0].Snapshot; trust != nil && s.Kind == bundle.KindPlain {
			switch {
			case !slices.Contains(m.PlainRegistries, name):
				return bundle.Bundle{}, "", fail(v1alpha1.ReasonSignatureVerificationFailed, false,
					"ManifestRegistry %s is format Plain: its manifests carry no writer signature, and spec.trustedKeysSecretRef says every manifest must have one; list it in spec.manifests.plainRegistries to accept it anyway, or publish it as a signed registry", name)
			case s.CommitSigner == "":
				return bundle.Bundle{}, "", fail(v1alpha1.ReasonSignatureVerificationFailed, false,
					"ManifestRegistry %s is format Plain and does not verify its commits: without writer signatures a signed commit must vouch for its manifests; set its spec.verify.commit", name)
			}
		}
		for _, e := range b.Entries {
			from[e.Tool] = append(from[e.Tool], "ManifestRegistry "+name)
		}
		for _, p := range b.Policies {
			policyFrom[p.Policy] = append(policyFrom[p.Policy], "ManifestRegistry "+name)
		}
		parts = append(parts, b)
		summary = append(summary, fmt.Sprintf("registry %s at %s", name, b.Snapshots[0].Snapshot.Revision))
	}
	if m.Selector != nil {
		b, used, e := r.toolManifests(ctx, gw, m.Selector, prev, from)
		if e != nil {
			return bundle.Bundle{}, "", e
		}
		for _, e := range b.Entries {
			from[e.Tool] = append(from[e.Tool], "ToolManifest "+strings.TrimPrefix(e.Author, "ToolManifest "+gw.Namespace+"/"))
		}
		parts = append(parts, b)
		summary = append(summary, fmt.Sprintf("%d ToolManifests", used))
	}
	var dups []string
	for _, tool := range sortedStrings(from) {
		if srcs := from[tool]; len(srcs) > 1 {
			dups = append(dups, fmt.Sprintf("%s (%s)", tool, strings.Join(srcs, ", ")))
		}
	}
	if len(dups) > 0 {
		return bundle.Bundle{}, "", fail(v1alpha1.ReasonDuplicateTool, true,
			"tools defined by more than one source, the last good rendering stays: %s: remove each from all but one source", strings.Join(dups, "; "))
	}
	for _, name := range sortedStrings(policyFrom) {
		if srcs := policyFrom[name]; len(srcs) > 1 {
			dups = append(dups, fmt.Sprintf("policy %s (%s)", name, strings.Join(srcs, ", ")))
		}
	}
	if len(dups) > 0 {
		return bundle.Bundle{}, "", fail(v1alpha1.ReasonDuplicateTool, true,
			"policies defined by more than one registry, the last good rendering stays: %s: remove each from all but one registry", strings.Join(dups, "; "))
	}
	if n := len(policyFrom); n > 0 {
		summary = append(summary, fmt.Sprintf("%d policies", n))
	}
	if len(summary) == 0 {
		summary = []string{"no manifest sources"}
	}
	return bundle.Merge(parts...), strings.Join(summary, ", "), nil
}

// attestGateway signs the gateway snapshot of b: its sources, which of them it accepts without
// writer signatures, and the digest of all its entries. The sequence stays while all of that
// does.
func (r *ReversiGatewayReconciler) attestGateway(gw *v1alpha1.ReversiGateway, b *bundle.Bundle, prev previous) *stepError {
	src := bundle.GatewaySource(gw.Namespace, gw.Name)
	var unsigned []string
	if m := gw.Spec.Manifests; m != nil {
		for _, name := range m.PlainRegistries {
			unsigned = append(unsigned, "ManifestRegistry "+gw.Namespace+"/"+name)
		}
	}
	unsigned = slices.Sorted(slices.Values(unsigned))
	enforce, serr := enforcedPolicies(gw, *b)
	if serr != nil {
		return serr
	}
	s := bundle.Snapshot{Source: src, Kind: bundle.KindGateway, Digest: b.Digest(), Sources: b.Sources(), Unsigned: unsigned,
		Policies: b.PolicyDigest(), PolicyNames: enforce}
	var recordedSnaps []bundle.Snapshot
	p, havePrev := prev.snapshots[src]
	if havePrev {
		recordedSnaps = append(recordedSnaps, p)
	}
	if st := gw.Status.Manifests; st != nil { // what status says, in the shape of s
		rec := s
		rec.Sequence, rec.Digest, rec.Sources = st.Sequence, st.DesiredRevision, st.Sources
		// Status records no policies: it vouches only for those of the verified previous
		// rendering, and without one for none, so a change of only the policies or of
		// spec.policies.names always gets a new sequence (an older rendering at the same
		// sequence would enforce other policies: gateway pods refuse two such states).
		rec.Policies, rec.PolicyNames = "", nil
		if havePrev {
			rec.Policies, rec.PolicyNames = p.Policies, p.PolicyNames
		}
		recordedSnaps = append(recordedSnaps, rec)
	}
	seq := sequenceFor(s, recordedSnaps...)
	if _, err := b.AttestGateway(bundle.Snapshot{Source: src, Sequence: seq, PolicyNames: enforce}, unsigned, r.Key.Signer); err != nil {
		return fail(v1alpha1.ReasonApplyFailed, false, "signing the gateway snapshot: %v", err)
	}
	return nil
}

// enforcedPolicies are the policies of b the gateway enforces, sorted: spec.policies.names, or
// every policy of b when spec.policies is unset. A name no selected registry serves is an
// error (not stalled: a registry may serve it at its next commit), so a typo never reads as
// "enforced".
func enforcedPolicies(gw *v1alpha1.ReversiGateway, b bundle.Bundle) ([]string, *stepError) {
	have := b.PolicyNames()
	if gw.Spec.Policies == nil {
		return have, nil
	}
	var missing []string
	for _, n := range gw.Spec.Policies.Names {
		if !slices.Contains(have, n) {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return nil, fail(v1alpha1.ReasonSourceNotReady, false,
			"spec.policies.names: %s not served by any of spec.manifests.registries (they serve %v), the last good rendering stays: publish and approve it there (reversi policy publish, approve), or remove it", strings.Join(missing, ", "), have)
	}
	return slices.Sorted(slices.Values(gw.Spec.Policies.Names)), nil
}

// toolManifestsSource is how snapshots name a gateway's selected ToolManifests.
func toolManifestsSource(gw *v1alpha1.ReversiGateway) string {
	return "ToolManifests " + gw.Namespace + "/" + gw.Name
}

// toolManifests is the bundle of the ToolManifests selector selects (Ready for their current
// generation), with a snapshot of the set signed by the controller: the sequence stays while
// the set does and grows when it changes. It returns how many were used.
func (r *ReversiGatewayReconciler) toolManifests(ctx context.Context, gw *v1alpha1.ReversiGateway, selector *metav1.LabelSelector, prev previous, taken map[string][]string) (bundle.Bundle, int, *stepError) {
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return bundle.Bundle{}, 0, fail(v1alpha1.ReasonInvalidSpec, true, "spec.manifests.selector: %v", err)
	}
	var tms v1alpha1.ToolManifestList
	if err := r.List(ctx, &tms, client.InNamespace(gw.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return bundle.Bundle{}, 0, fail(v1alpha1.ReasonApplyFailed, false, "listing ToolManifests: %v", err)
	}
	src := toolManifestsSource(gw)
	// The highest version of each tool this set ever served (the signed snapshot carries it,
	// status records it): a version below it comes back only as a new, higher version, even
	// after the tool was left out for a while (a ToolManifest editor could otherwise apply an
	// older signed export).
	floors := map[string]int{}
	raise := func(tool string, v int) { floors[tool] = max(floors[tool], v) }
	if p, ok := prev.snapshots[src]; ok {
		for tool, v := range p.Floors {
			raise(tool, v)
		}
	}
	if st := gw.Status.Manifests; st != nil {
		for tool, v := range st.ToolManifestFloors {
			raise(tool, int(v))
		}
	}
	for _, e := range prev.entries {
		if e.Source == src {
			raise(e.Tool, e.Version)
		}
	}
	byTool := map[string][]bundle.Entry{}
	for i := range tms.Items {
		tm := &tms.Items[i]
		c := apimeta.FindStatusCondition(tm.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionTrue || tm.Status.ObservedGeneration != tm.Generation {
			continue // invalid or unverified: its own status says why
		}
		e, err := toolManifestEntry(tm)
		if err != nil {
			continue
		}
		switch {
		case e.Version < floors[e.Tool]:
			r.event(gw, corev1.EventTypeWarning, v1alpha1.EventToolManifestDowngrade, fmt.Sprintf(
				"ToolManifest %s holds %s v%d, older than v%d this gateway served: left out; publish the older rules again as a new version (reversi manifests rollback) and export that", tm.Name, e.Tool, e.Version, floors[e.Tool]))
			continue
		case len(taken[e.Tool]) > 0:
			// A registry defines the tool: the registry's rules stay, whatever is applied as an object.
			r.event(gw, corev1.EventTypeWarning, v1alpha1.ReasonDuplicateTool, fmt.Sprintf(
				"ToolManifest %s defines %s, which %s defines too: left out", tm.Name, e.Tool, strings.Join(taken[e.Tool], ", ")))
			continue
		}
		e.Source = src
		byTool[e.Tool] = append(byTool[e.Tool], e)
	}
	var b bundle.Bundle
	for tool, es := range byTool {
		if len(es) > 1 { // two objects, one tool: neither is picked silently
			var names []string
			for _, e := range es {
				names = append(names, strings.TrimPrefix(e.Author, "ToolManifest "))
			}
			slices.Sort(names)
			r.event(gw, corev1.EventTypeWarning, v1alpha1.ReasonDuplicateTool, fmt.Sprintf(
				"ToolManifests %s all define %s: all left out; keep one", strings.Join(names, ", "), tool))
			continue
		}
		b.Entries = append(b.Entries, es[0])
		raise(tool, es[0].Version)
	}
	b = bundle.Merge(b) // sorted
	snap := bundle.Snapshot{Source: src, Kind: bundle.KindToolManifests, Digest: b.SourceDigest(src), Floors: floors}
	var recordedSnaps []bundle.Snapshot
	if p, ok := prev.snapshots[src]; ok {
		recordedSnaps = append(recordedSnaps, p)
	}
	if st := gw.Status.Manifests; st != nil { // what status says, in the shape of snap
		rec := snap
		rec.Sequence, rec.Digest = st.ToolManifestsSequence, st.ToolManifestsDigest
		recordedSnaps = append(recordedSnaps, rec)
	}
	snap.Sequence = sequenceFor(snap, recordedSnaps...)
	if _, err := b.Attest(snap, r.Key.Signer); err != nil {
		return bundle.Bundle{}, 0, fail(v1alpha1.ReasonApplyFailed, false, "signing the ToolManifests snapshot: %v", err)
	}
	return b, len(b.Entries), nil
}

// registryBundle assembles a ManifestRegistry's rendering (its own ConfigMaps) and verifies it
// as a gateway pod would: the controller's snapshot over exactly its entries and, with trust,
// every writer signature. A rendering older than the registry's status says (an edit the
// registry's reconcile has not restored yet) is not used.
func (r *ReversiGatewayReconciler) registryBundle(ctx context.Context, ns, name string, trust *signing.TrustSet) (bundle.Bundle, *stepError) {
	var reg v1alpha1.ManifestRegistry
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &reg); err != nil {
		if apierrors.IsNotFound(err) {
			return bundle.Bundle{}, fail(v1alpha1.ReasonSourceNotReady, false, "ManifestRegistry %s/%s not found: create it, or remove it from spec.manifests.registries", ns, name)
		}
		return bundle.Bundle{}, fail(v1alpha1.ReasonSourceNotReady, false, "reading ManifestRegistry %s: %v", name, err)
	}
	var cms corev1.ConfigMapList
	if err := r.List(ctx, &cms, client.InNamespace(ns), client.MatchingLabels{LabelRegistry: name}); err != nil {
		return bundle.Bundle{}, fail(v1alpha1.ReasonSourceNotReady, false, "listing the ConfigMaps of ManifestRegistry %s: %v", name, err)
	}
	// Only the shards the registry's status names: a ConfigMap someone else labelled and gave
	// the registry as owner is not part of its rendering.
	var shards []map[string]string
	if a := reg.Status.Artifact; a != nil {
		for i := range cms.Items {
			if metav1.IsControlledBy(&cms.Items[i], &reg) && slices.Contains(a.ConfigMaps, cms.Items[i].Name) {
				shards = append(shards, cms.Items[i].Data)
			}
		}
	}
	if len(shards) == 0 {
		return bundle.Bundle{}, fail(v1alpha1.ReasonSourceNotReady, false, "ManifestRegistry %s has no verified rendering yet: see its status", name)
	}
	b, err := bundle.Assemble(shards)
	if err != nil {
		return bundle.Bundle{}, fail(v1alpha1.ReasonSourceNotReady, false, "ManifestRegistry %s: %v", name, err)
	}
	if _, errs := b.Verify(trust, r.Key.Trust); len(errs) > 0 {
		return bundle.Bundle{}, fail(v1alpha1.ReasonSignatureVerificationFailed, false,
			"the rendering of ManifestRegistry %s does not verify (against spec.trustedKeysSecretRef and the controller's key), the last good rendering stays: %v", name, errors.Join(errs...))
	}
	src := registrySource(&reg)
	if len(b.Snapshots) != 1 || b.Snapshots[0].Snapshot.Source != src {
		return bundle.Bundle{}, fail(v1alpha1.ReasonSignatureVerificationFailed, false, "the rendering of ManifestRegistry %s holds snapshots of other sources: it was edited", name)
	}
	if a := reg.Status.Artifact; a != nil && b.Snapshots[0].Snapshot.Sequence < a.Sequence && a.Sequence <= time.Now().UnixMilli()+maxAhead {
		return bundle.Bundle{}, fail(v1alpha1.ReasonSourceNotReady, false, "the rendering of ManifestRegistry %s has sequence %d, older than %d in its status: it was replaced by an older one; waiting for the registry's reconcile to restore it",
			name, b.Snapshots[0].Snapshot.Sequence, a.Sequence)
	}
	return b, nil
}

// toolManifestEntry is a ToolManifest as a bundle entry: the canonical JSON of its spec, its
// checksum, and the signature of its annotations (verified again by the pods).
func toolManifestEntry(tm *v1alpha1.ToolManifest) (bundle.Entry, error) {
	m, err := validateToolManifest(tm)
	if err != nil {
		return bundle.Entry{}, err
	}
	canonical, err := manifest.CanonicalJSON(m)
	if err != nil {
		return bundle.Entry{}, err
	}
	sum := sha256.Sum256(canonical)
	return bundle.Entry{Tool: m.Tool, Manifest: canonical, Entry: registry.Entry{
		Version: m.Version, Status: m.Status, Checksum: hex.EncodeToString(sum[:]),
		Author: "ToolManifest " + tm.Namespace + "/" + tm.Name, Time: tm.CreationTimestamp.UTC(),
		KeyID: tm.Annotations[v1alpha1.AnnotationKeyID], Signature: tm.Annotations[v1alpha1.AnnotationSignature],
	}}, nil
}
