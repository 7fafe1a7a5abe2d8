package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sync/errgroup"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// The admission webhook of ReversiGateway (issue 17), served by `reversi controller` with the
// others. It fails closed: no ReversiGateway is created or changed while it is unreachable.
// Status writes (reversigateways/status, the controller's) do not reach it.
// +kubebuilder:webhook:path=/validate-reversi-dev-v1alpha1-reversigateway,mutating=false,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=reversigateways,verbs=create;update,versions=v1alpha1,name=vreversigateway.reversi.dev,admissionReviewVersions=v1

// ValidateReversiGatewayPath is the path of the ReversiGateway webhook.
const ValidateReversiGatewayPath = "/validate-reversi-dev-v1alpha1-reversigateway"

// sarConcurrency bounds the SubjectAccessReviews one admission request makes at once.
const sarConcurrency = 8

// maxSecretsPerSpec bounds the distinct Secrets one spec may name: each costs a
// SubjectAccessReview at every admission (dry runs too), and a ReversiGateway spec could
// otherwise name thousands.
const maxSecretsPerSpec = 64

// tooManySecrets is the refusal of a spec naming more than maxSecretsPerSpec distinct Secrets
// (nil when it names fewer), made before any review.
func tooManySecrets(kind, ns, name string, refs []v1alpha1.GatewaySecretRef) error {
	return tooManyObjects(kind, ns, name, "Secret", refs)
}

// tooManyObjects is tooManySecrets for refs to objects of another kind (what: "ConfigMap").
func tooManyObjects(kind, ns, name, what string, refs []v1alpha1.GatewaySecretRef) error {
	names := map[string]bool{}
	for _, r := range refs {
		names[r.Name] = true
	}
	if len(names) <= maxSecretsPerSpec {
		return nil
	}
	return fmt.Errorf("%s %s/%s: the spec names %d %ss, more than %d: the author's right to read each is checked at admission; keep the values in fewer %ss (one %s holds many keys)",
		kind, ns, name, len(names), what, maxSecretsPerSpec, what, what)
}

// ReversiGatewayWebhook admits a ReversiGateway only when it allows its author no more than
// they could do by hand (issue 17, "ReversiGateway admission"; DESIGN.md "Trust model": "no
// more than they could do by hand (SubjectAccessReview at admission for Deployments and every
// referenced Secret; image allowlist)"). The controller runs a Deployment for each gateway
// with the Secrets its spec names (env vars, volumes, the Role's get), with the controller's
// own rights; so on create, and on an update that changes spec (a metadata-only update, such
// as a finalizer, passes):
//   - a SubjectAccessReview for the requesting user (the admission request's username, uid,
//     groups and extra) must allow `create deployments.apps` in the namespace, one `create
//     persistentvolumeclaims` with the sqlite store (its claim has the size and storage class
//     the spec says, and binds any volume that fits), and one must allow `get secrets` of
//     each Secret spec.SecretRefs names;
//   - spec.image, when set, must be allowed by Images.
//
// A refusal is a *ReversiGatewayAdmissionError naming every missing permission (with the
// fields that need it) and the image at once. A SubjectAccessReview that fails refuses too
// (*AuthorizationCheckError): the webhook fails closed. The check is of the author at
// admission time only; the reconciler checks the image again (ReasonImageNotAllowed).
type ReversiGatewayWebhook struct {
	// Client creates SubjectAccessReviews (authorization.k8s.io/v1; the manager's client).
	Client client.Client
	// Images are the images a gateway may run (required).
	Images *ImagePolicy
	// UpstreamImages are the images container upstreams may run (issue 23). Nil: Images.
	UpstreamImages *ImagePolicy
}

// SetupWebhookWithManager registers the validating webhook (ValidateReversiGatewayPath) on the
// manager's webhook server.
func (w *ReversiGatewayWebhook) SetupWebhookWithManager(mgr ctrl.Manager) error {
	if w.Client == nil || w.Images == nil {
		return errors.New("the ReversiGateway webhook needs a client and an image policy")
	}
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.ReversiGateway{}).WithValidator(w).Complete()
}

// MissingPermission is a right the author of a ReversiGateway (or ManifestRegistry) lacks:
// Verb on Resource ("deployments.apps", "persistentvolumeclaims" or "secrets") in Namespace, of
// the object Name when not empty; Fields are the spec fields that need it (the Secret
// references).
type MissingPermission struct {
	Verb, Resource, Namespace, Name string
	Fields                          []string
}

func (m MissingPermission) String() string {
	switch m.Resource {
	case "secrets":
		return fmt.Sprintf("may not get secret %q (%s)", m.Name, strings.Join(m.Fields, ", "))
	case "configmaps":
		return fmt.Sprintf("may not get configmap %q (%s)", m.Name, strings.Join(m.Fields, ", "))
	}
	if m.Name != "" {
		return fmt.Sprintf("may not %s %s %q in namespace %q (%s)", m.Verb, m.Resource, m.Name, m.Namespace, strings.Join(m.Fields, ", "))
	}
	return fmt.Sprintf("may not %s %s in namespace %q", m.Verb, m.Resource, m.Namespace)
}

// ReversiGatewayAdmissionError is the webhook's refusal: the permissions User lacks (Missing)
// and the image outside the policy (Image), all at once.
type ReversiGatewayAdmissionError struct {
	Namespace, Name, User string
	Missing               []MissingPermission
	Image                 *ImageNotAllowedError
	// UpstreamImages are the container upstreams' images outside the policy (issue 23).
	UpstreamImages []*ImageNotAllowedError
}

func (e *ReversiGatewayAdmissionError) Error() string {
	var parts []string
	if len(e.Missing) > 0 {
		why := make([]string, len(e.Missing))
		for i, m := range e.Missing {
			why[i] = m.String()
		}
		parts = append(parts, fmt.Sprintf("user %q %s: a ReversiGateway runs a Deployment with these Secrets, so its author must be allowed both by hand",
			e.User, strings.Join(why, "; ")))
	}
	if e.Image != nil {
		parts = append(parts, e.Image.Error())
	}
	if len(e.UpstreamImages) > 0 {
		parts = append(parts, joinImageErrors(e.UpstreamImages))
	}
	return fmt.Sprintf("ReversiGateway %s/%s: %s", e.Namespace, e.Name, strings.Join(parts, "; "))
}

// AuthorizationCheckError is a SubjectAccessReview that could not be made: the object (a
// ReversiGateway, or a ManifestRegistry when Kind says so) is refused (the webhooks fail
// closed).
type AuthorizationCheckError struct {
	Kind                  string // "" is ReversiGateway
	Namespace, Name, User string
	Err                   error
}

func (e *AuthorizationCheckError) Error() string {
	kind, what := "ReversiGateway", "gateway"
	if e.Kind == "ManifestRegistry" {
		kind, what = e.Kind, "registry"
	}
	return fmt.Sprintf("%s %s/%s: the rights of user %q could not be checked, so the %s is refused: %v; try again", kind, e.Namespace, e.Name, e.User, what, e.Err)
}

func (e *AuthorizationCheckError) Unwrap() error { return e.Err }

// ValidateCreate checks the author's rights and the image.
func (w *ReversiGatewayWebhook) ValidateCreate(ctx context.Context, gw *v1alpha1.ReversiGateway) (admission.Warnings, error) {
	return nil, w.validate(ctx, gw)
}

// ValidateUpdate checks them again when spec changed (equality.Semantic); an update of
// metadata alone passes.
func (w *ReversiGatewayWebhook) ValidateUpdate(ctx context.Context, old, gw *v1alpha1.ReversiGateway) (admission.Warnings, error) {
	if equality.Semantic.DeepEqual(old.Spec, gw.Spec) {
		return nil, nil
	}
	return nil, w.validate(ctx, gw)
}

// ValidateDelete allows deletion.
func (w *ReversiGatewayWebhook) ValidateDelete(context.Context, *v1alpha1.ReversiGateway) (admission.Warnings, error) {
	return nil, nil
}

func (w *ReversiGatewayWebhook) validate(ctx context.Context, gw *v1alpha1.ReversiGateway) error {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return fmt.Errorf("the admission request is not available: %w", err)
	}
	ns, name := req.Namespace, gw.Name
	if ns == "" {
		ns = gw.Namespace
	}
	if name == "" {
		name = req.Name
	}
	user := req.UserInfo
	if user.Username == "" {
		return fmt.Errorf("ReversiGateway %s/%s: the API server sent no username: a ReversiGateway's author must be known to check their rights", ns, name)
	}
	refs := gw.Spec.SecretRefs()
	if err := tooManySecrets("ReversiGateway", ns, name, refs); err != nil {
		return err
	}
	cms := gw.Spec.ConfigMapRefs()
	if err := tooManyObjects("ReversiGateway", ns, name, "ConfigMap", cms); err != nil {
		return err
	}
	refusal := &ReversiGatewayAdmissionError{Namespace: ns, Name: name, User: user.Username}
	if gw.Spec.Image != "" {
		if err := w.Images.Check("spec.image", gw.Spec.Image); err != nil {
			if !errors.As(err, &refusal.Image) {
				return err
			}
		}
	}
	upstreamImages := w.UpstreamImages
	if upstreamImages == nil {
		upstreamImages = w.Images
	}
	if refusal.UpstreamImages, err = checkUpstreamImages(upstreamImages, gw); err != nil {
		return err
	}
	creates := []string{"deployments.apps"}
	if storeType(gw) == v1alpha1.StoreSQLite {
		// The sqlite store's PersistentVolumeClaim: of the size and storage class the spec
		// says, bound to any volume that fits.
		creates = append(creates, "persistentvolumeclaims")
	}
	missing, err := missingRights(ctx, w.Client, user, ns, creates, refs, cms)
	if err != nil {
		return &AuthorizationCheckError{Namespace: ns, Name: name, User: user.Username, Err: err}
	}
	refusal.Missing = missing
	if refusal.Image == nil && len(refusal.UpstreamImages) == 0 && len(missing) == 0 {
		return nil
	}
	return refusal
}

// missingRights asks the API server (SubjectAccessReviews with c, at most sarConcurrency at
// once) whether user may create each resource of creates ("deployments.apps",
// "persistentvolumeclaims") in ns, get each Secret of refs and each ConfigMap of configMaps,
// and returns what is refused: the creates first, in order, then the Secrets in the order of
// refs (one entry per Secret, with every field that names it), then the ConfigMaps likewise.
// Errors: a review that could not be made.
func missingRights(ctx context.Context, c client.Client, user authnv1.UserInfo, ns string, creates []string, refs, configMaps []v1alpha1.GatewaySecretRef) ([]MissingPermission, error) {
	var checks []MissingPermission
	for _, res := range creates {
		checks = append(checks, MissingPermission{Verb: "create", Resource: res, Namespace: ns})
	}
	for _, g := range []struct {
		resource string
		refs     []v1alpha1.GatewaySecretRef
	}{{"secrets", refs}, {"configmaps", configMaps}} {
		byName := map[string]int{}
		for _, r := range g.refs {
			if i, ok := byName[r.Name]; ok {
				checks[i].Fields = append(checks[i].Fields, r.Field)
				continue
			}
			byName[r.Name] = len(checks)
			checks = append(checks, MissingPermission{Verb: "get", Resource: g.resource, Namespace: ns, Name: r.Name, Fields: []string{r.Field}})
		}
	}
	return reviewRights(ctx, c, user, checks)
}

// reviewRights asks the API server (SubjectAccessReviews, at most sarConcurrency at once)
// whether user holds each permission of checks ("resource.group" names a group's resource) and
// returns those refused, in order. Errors: a review that could not be made.
func reviewRights(ctx context.Context, c client.Client, user authnv1.UserInfo, checks []MissingPermission) ([]MissingPermission, error) {
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	allowed := make([]bool, len(checks))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(sarConcurrency)
	for i, chk := range checks {
		g.Go(func() error {
			group, resource := "", chk.Resource
			if r, gr, ok := strings.Cut(chk.Resource, "."); ok {
				resource, group = r, gr
			}
			sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: chk.Namespace, Verb: chk.Verb, Group: group, Resource: resource, Name: chk.Name},
			}}
			if err := c.Create(gctx, sar); err != nil {
				return fmt.Errorf("SubjectAccessReview of %s %s %q: %w", chk.Verb, chk.Resource, chk.Name, err)
			}
			allowed[i] = sar.Status.Allowed
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []MissingPermission
	for i, c := range checks {
		if !allowed[i] {
			out = append(out, c)
		}
	}
	return out, nil
}
