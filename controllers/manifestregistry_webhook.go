package controllers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// The admission webhook of ManifestRegistry (issue 17, found by the red team), served by
// `reversi controller` with the others; it fails closed.
// +kubebuilder:webhook:path=/validate-reversi-dev-v1alpha1-manifestregistry,mutating=false,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=manifestregistries,verbs=create;update,versions=v1alpha1,name=vmanifestregistry.reversi.dev,admissionReviewVersions=v1

// ValidateManifestRegistryPath is the path of the ManifestRegistry webhook.
const ValidateManifestRegistryPath = "/validate-reversi-dev-v1alpha1-manifestregistry"

// ManifestRegistryWebhook admits a ManifestRegistry only when its author may read, by hand,
// every Secret its spec names (spec.SecretRefs: the git credentials and the verification
// keys). The controller reads those Secrets with its own rights and sends the credentials
// (username and password, or bearerToken) to spec.url, a server the author chooses: without
// this check "create ManifestRegistry" would be "read every basic-auth Secret and bearer token
// of the namespace". On create, and on an update that changes spec (a metadata-only update
// passes), a SubjectAccessReview for the requesting user (username, uid, groups, extra) must
// allow `get secrets` of each. A refusal is a *ManifestRegistryAdmissionError naming every
// Secret at once; a review that fails refuses (*AuthorizationCheckError, Kind
// ManifestRegistry).
type ManifestRegistryWebhook struct {
	// Client creates SubjectAccessReviews (authorization.k8s.io/v1; the manager's client).
	Client client.Client
}

// SetupWebhookWithManager registers the validating webhook (ValidateManifestRegistryPath).
func (w *ManifestRegistryWebhook) SetupWebhookWithManager(mgr ctrl.Manager) error {
	if w.Client == nil {
		return errors.New("the ManifestRegistry webhook needs a client")
	}
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.ManifestRegistry{}).WithValidator(w).Complete()
}

// ManifestRegistryAdmissionError is the webhook's refusal: the Secrets User may not get.
type ManifestRegistryAdmissionError struct {
	Namespace, Name, User string
	Missing               []MissingPermission
}

func (e *ManifestRegistryAdmissionError) Error() string {
	why := make([]string, len(e.Missing))
	for i, m := range e.Missing {
		why[i] = m.String()
	}
	what := "these Secrets"
	for _, m := range e.Missing {
		if m.Resource != "secrets" {
			what = "these objects (a Flux source's files are rendered into this namespace)"
		}
	}
	return fmt.Sprintf("ManifestRegistry %s/%s: user %q %s: the controller reads %s for the registry (and sends its git credentials to spec.url), so its author must be allowed to read them by hand",
		e.Namespace, e.Name, e.User, strings.Join(why, "; "), what)
}

// ValidateCreate checks the author's rights.
func (w *ManifestRegistryWebhook) ValidateCreate(ctx context.Context, reg *v1alpha1.ManifestRegistry) (admission.Warnings, error) {
	return nil, w.validate(ctx, reg)
}

// ValidateUpdate checks them again when spec changed; an update of metadata alone passes.
func (w *ManifestRegistryWebhook) ValidateUpdate(ctx context.Context, old, reg *v1alpha1.ManifestRegistry) (admission.Warnings, error) {
	if equality.Semantic.DeepEqual(old.Spec, reg.Spec) {
		return nil, nil
	}
	return nil, w.validate(ctx, reg)
}

// ValidateDelete allows deletion.
func (w *ManifestRegistryWebhook) ValidateDelete(context.Context, *v1alpha1.ManifestRegistry) (admission.Warnings, error) {
	return nil, nil
}

func (w *ManifestRegistryWebhook) validate(ctx context.Context, reg *v1alpha1.ManifestRegistry) error {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return fmt.Errorf("the admission request is not available: %w", err)
	}
	ns, name := req.Namespace, reg.Name
	if ns == "" {
		ns = reg.Namespace
	}
	if name == "" {
		name = req.Name
	}
	refs := reg.Spec.SecretRefs()
	src := reg.Spec.SourceRef
	if len(refs) == 0 && src == nil {
		return nil
	}
	user := req.UserInfo
	if user.Username == "" {
		return fmt.Errorf("ManifestRegistry %s/%s: the API server sent no username: the author of a registry that names Secrets or a Flux source must be known to check their rights", ns, name)
	}
	missing, err := missingRights(ctx, w.Client, user, ns, nil, refs, nil)
	if err == nil && src != nil {
		// The controller renders the source's files into ConfigMaps of this namespace: its
		// author must be allowed to read the source, wherever it is.
		srcNs := cmp.Or(src.Namespace, ns)
		var more []MissingPermission
		more, err = reviewRights(ctx, w.Client, user, []MissingPermission{{Verb: "get", Resource: fluxResource(src.Kind),
			Namespace: srcNs, Name: src.Name, Fields: []string{"spec.sourceRef"}}})
		missing = append(missing, more...)
	}
	if err != nil {
		return &AuthorizationCheckError{Kind: "ManifestRegistry", Namespace: ns, Name: name, User: user.Username, Err: err}
	}
	if len(missing) == 0 {
		return nil
	}
	return &ManifestRegistryAdmissionError{Namespace: ns, Name: name, User: user.Username, Missing: missing}
}

// fluxResource is the "resource.group" of a Flux source kind (an unknown kind maps to a
// resource no one holds, so the review refuses it).
func fluxResource(kind string) string {
	plural := map[string]string{v1alpha1.SourceKindGitRepository: "gitrepositories", v1alpha1.SourceKindOCIRepository: "ocirepositories", v1alpha1.SourceKindBucket: "buckets"}[kind]
	if plural == "" {
		plural = strings.ToLower(kind)
	}
	return plural + ".source.toolkit.fluxcd.io"
}
