package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// fakeAuthorizer answers SubjectAccessReviews from allowed ("verb resource/name" keys, e.g.
// "create deployments" or "get secrets/db-creds"), records each review, and fails every review
// with err when set.
type fakeAuthorizer struct {
	mu      sync.Mutex
	allowed map[string]bool
	err     error
	reviews []authzv1.SubjectAccessReviewSpec
}

func (f *fakeAuthorizer) webhook(t *testing.T) *ReversiGatewayWebhook {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(v1alpha1.NewScheme()).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			sar, ok := obj.(*authzv1.SubjectAccessReview)
			if !ok {
				return c.Create(ctx, obj, opts...)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			f.reviews = append(f.reviews, sar.Spec)
			if f.err != nil {
				return f.err
			}
			a := sar.Spec.ResourceAttributes
			key := a.Verb + " " + a.Resource
			if a.Name != "" {
				key += "/" + a.Name
			}
			if a.Group != "" {
				key = a.Verb + " " + a.Resource + "." + a.Group
			}
			sar.Status.Allowed = f.allowed[key]
			return nil
		},
	}).Build()
	images, err := GatewayImagePolicy("", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &ReversiGatewayWebhook{Client: c, Images: images}
}

func admissionCtx(t *testing.T, op admissionv1.Operation, user authnv1.UserInfo) context.Context {
	return admission.NewContextWithRequest(t.Context(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: op, Namespace: "team-a", Name: "pay", UserInfo: user}})
}

var bobInfo = authnv1.UserInfo{Username: "bob", UID: "uid-bob", Groups: []string{"payments", "system:authenticated"},
	Extra: map[string]authnv1.ExtraValue{"scopes": {"a", "b"}}}

// payGateway references db-creds twice (a header and a command's env), the trusted keys and
// the API key file.
func payGateway(image string) *v1alpha1.ReversiGateway {
	return &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pay"}, Spec: v1alpha1.ReversiGatewaySpec{
		Image: image,
		Upstreams: []v1alpha1.GatewayUpstream{
			{Name: "db", URL: "http://db-mcp/mcp", Headers: []v1alpha1.ValueFrom{{Name: "Authorization", SecretKeyRef: &v1alpha1.SecretKeyReference{Name: "db-creds", Key: "token"}}}},
			{Name: "fs", Command: "fs-mcp", Env: []v1alpha1.ValueFrom{{Name: "TOKEN", SecretKeyRef: &v1alpha1.SecretKeyReference{Name: "db-creds", Key: "fs"}}}},
		},
		TrustedKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
		Auth:                 &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
	}}
}

// Issue 17, ReversiGateway admission: one SubjectAccessReview per right (create deployments.apps
// and, for the sqlite store, persistentvolumeclaims in the namespace, get on each Secret named,
// once per Secret) with the requester's username,
// uid, groups and extra; a refusal names every missing right, with the fields that need it, and
// the image, at once.
func TestReversiGatewayWebhookNamesEveryMissingRight(t *testing.T) {
	f := &fakeAuthorizer{allowed: map[string]bool{"get secrets/gateway-keys": true}}
	w := f.webhook(t)
	_, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), payGateway("attacker.example/exfil:1"))
	var refusal *ReversiGatewayAdmissionError
	if !errors.As(err, &refusal) {
		t.Fatalf("%v, want a ReversiGatewayAdmissionError", err)
	}
	want := `ReversiGateway team-a/pay: user "bob" may not create deployments.apps in namespace "team-a"; ` +
		`may not create persistentvolumeclaims in namespace "team-a"; ` +
		`may not get secret "db-creds" (spec.upstreams[0].headers[0].secretKeyRef, spec.upstreams[1].env[0].secretKeyRef); ` +
		`may not get secret "manifest-keys" (spec.trustedKeysSecretRef): ` +
		`a ReversiGateway runs a Deployment with these Secrets, so its author must be allowed both by hand; ` +
		`spec.image "attacker.example/exfil:1" is not allowed: the controller runs gateway images matching reversi, reversi:*, reversi@sha256:* (reversi controller --gateway-images)`
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("refusal:\n%s\nwant it to start with\n%s", err, want)
	}
	if len(f.reviews) != 5 {
		t.Fatalf("%d reviews, want 5 (a Deployment, its claim, three Secrets): %+v", len(f.reviews), f.reviews)
	}
	var asked []string
	for _, r := range f.reviews {
		a := r.ResourceAttributes
		if r.User != "bob" || r.UID != "uid-bob" || !slices.Equal(r.Groups, bobInfo.Groups) || !slices.Equal(r.Extra["scopes"], authzv1.ExtraValue{"a", "b"}) || a.Namespace != "team-a" {
			t.Errorf("review %+v does not carry bob's user info and namespace", r)
		}
		asked = append(asked, a.Verb+" "+a.Group+"/"+a.Resource+"/"+a.Name)
	}
	slices.Sort(asked)
	if !slices.Equal(asked, []string{"create /persistentvolumeclaims/", "create apps/deployments/", "get /secrets/db-creds", "get /secrets/gateway-keys", "get /secrets/manifest-keys"}) {
		t.Errorf("reviews %q", asked)
	}

	// With every right and an allowed image: admitted.
	f.allowed = map[string]bool{"create deployments.apps": true, "create persistentvolumeclaims": true, "get secrets/db-creds": true, "get secrets/manifest-keys": true, "get secrets/gateway-keys": true}
	for _, image := range []string{"", "reversi:v2", "reversi@sha256:" + digest64} {
		if _, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), payGateway(image)); err != nil {
			t.Errorf("image %q with every right: %v", image, err)
		}
	}
	// The image alone.
	_, err = w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), payGateway("reversi/exfil:1"))
	if !errors.As(err, &refusal) || len(refusal.Missing) != 0 || refusal.Image == nil || strings.Contains(err.Error(), "may not") {
		t.Errorf("an image outside the patterns, every right held: %v", err)
	}
}

// A SubjectAccessReview that fails refuses the gateway (fail closed), and an update that
// leaves spec as it was (metadata: labels, finalizers) passes without one; one that changes
// spec is checked like a create.
func TestReversiGatewayWebhookFailsClosed(t *testing.T) {
	f := &fakeAuthorizer{err: errors.New("the API server is unavailable")}
	w := f.webhook(t)
	_, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), payGateway(""))
	var check *AuthorizationCheckError
	if !errors.As(err, &check) || !strings.Contains(err.Error(), `ReversiGateway team-a/pay: the rights of user "bob" could not be checked, so the gateway is refused`) ||
		!strings.Contains(err.Error(), "the API server is unavailable") {
		t.Errorf("a failing review: %v, want an AuthorizationCheckError", err)
	}

	old := payGateway("")
	meta := old.DeepCopy()
	meta.Labels = map[string]string{"team": "payments"}
	meta.Finalizers = []string{"example.com/keep"}
	f.reviews = nil
	if _, err := w.ValidateUpdate(admissionCtx(t, admissionv1.Update, bobInfo), old, meta); err != nil || len(f.reviews) != 0 {
		t.Errorf("a metadata-only update: %v (%d reviews)", err, len(f.reviews))
	}
	changed := old.DeepCopy()
	changed.Spec.Upstreams[0].Headers = append(changed.Spec.Upstreams[0].Headers, v1alpha1.ValueFrom{Name: "X-Other", SecretKeyRef: &v1alpha1.SecretKeyReference{Name: "other", Key: "k"}})
	if _, err := w.ValidateUpdate(admissionCtx(t, admissionv1.Update, bobInfo), old, changed); !errors.As(err, &check) {
		t.Errorf("an update of spec: %v, want it checked (and refused, the reviews failing)", err)
	}
	if _, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, authnv1.UserInfo{}), payGateway("")); err == nil || !strings.Contains(err.Error(), "no username") {
		t.Errorf("no user: %v", err)
	}
}

func (f *fakeAuthorizer) registryWebhook(t *testing.T) *ManifestRegistryWebhook {
	return &ManifestRegistryWebhook{Client: f.webhook(t).Client}
}

// payRegistry names three Secrets: git credentials and both verification key sets.
func payRegistry() *v1alpha1.ManifestRegistry {
	return &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pay"}, Spec: v1alpha1.ManifestRegistrySpec{
		URL: "https://git.example/pay.git", SecretRef: &v1alpha1.LocalObjectReference{Name: "payments-git"},
		Verify: &v1alpha1.RegistryVerification{ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
			Commit: &v1alpha1.CommitVerification{SecretRef: v1alpha1.LocalObjectReference{Name: "committers"}}},
	}}
}

// Issue 17 (the red team): a ManifestRegistry's author must be allowed to get, by hand, every
// Secret the spec names (the controller sends the git credentials to spec.url); one review
// per Secret with the requester's user info, no Deployment check; a refusal names every
// Secret and its field; a failing review refuses; a metadata-only update and a registry
// naming no Secret need no review.
func TestManifestRegistryWebhook(t *testing.T) {
	f := &fakeAuthorizer{allowed: map[string]bool{"get secrets/manifest-keys": true}}
	w := f.registryWebhook(t)
	_, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), payRegistry())
	var refusal *ManifestRegistryAdmissionError
	want := `ManifestRegistry team-a/pay: user "bob" may not get secret "payments-git" (spec.secretRef); may not get secret "committers" (spec.verify.commit.secretRef): ` +
		`the controller reads these Secrets for the registry (and sends its git credentials to spec.url), so its author must be allowed to read them by hand`
	if !errors.As(err, &refusal) || err.Error() != want {
		t.Errorf("refusal:\n%v\nwant\n%s", err, want)
	}
	if len(f.reviews) != 3 {
		t.Fatalf("%d reviews, want 3: %+v", len(f.reviews), f.reviews)
	}
	for _, r := range f.reviews {
		if r.User != "bob" || r.UID != "uid-bob" || !slices.Equal(r.Groups, bobInfo.Groups) || r.ResourceAttributes.Resource != "secrets" || r.ResourceAttributes.Namespace != "team-a" {
			t.Errorf("review %+v", r)
		}
	}
	f.allowed = map[string]bool{"get secrets/manifest-keys": true, "get secrets/payments-git": true, "get secrets/committers": true}
	if _, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), payRegistry()); err != nil {
		t.Errorf("every Secret readable: %v", err)
	}
	f.reviews, f.allowed = nil, nil
	public := &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "public"}, Spec: v1alpha1.ManifestRegistrySpec{URL: "https://git.example/public.git", Format: v1alpha1.FormatPlain}}
	if _, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), public); err != nil || len(f.reviews) != 0 {
		t.Errorf("a registry naming no Secret: %v (%d reviews)", err, len(f.reviews))
	}
	old := payRegistry()
	meta := old.DeepCopy()
	meta.Annotations = map[string]string{v1alpha1.AnnotationRequestedAt: "now"}
	if _, err := w.ValidateUpdate(admissionCtx(t, admissionv1.Update, bobInfo), old, meta); err != nil || len(f.reviews) != 0 {
		t.Errorf("a metadata-only update: %v (%d reviews)", err, len(f.reviews))
	}
	changed := public.DeepCopy()
	changed.Spec.SecretRef = &v1alpha1.LocalObjectReference{Name: "payments-git"}
	if _, err := w.ValidateUpdate(admissionCtx(t, admissionv1.Update, bobInfo), public, changed); !errors.As(err, &refusal) {
		t.Errorf("an update adding git credentials: %v, want a refusal", err)
	}
	f.err = errors.New("the API server is unavailable")
	var check *AuthorizationCheckError
	if _, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), payRegistry()); !errors.As(err, &check) ||
		!strings.Contains(err.Error(), `ManifestRegistry team-a/pay: the rights of user "bob" could not be checked, so the registry is refused`) {
		t.Errorf("a failing review: %v", err)
	}
}

// Issue 17 (the red team): each distinct Secret a spec names costs one SubjectAccessReview,
// and a spec may name thousands (64 command upstreams with 64 env values each), also in a dry
// run: whoever may create ReversiGateways made the controller send the API server thousands
// of reviews per request. A spec naming more than maxSecretsPerSpec distinct Secrets is
// refused before any review.
func TestReversiGatewayWebhookBoundsReviews(t *testing.T) {
	f := &fakeAuthorizer{allowed: map[string]bool{"create deployments.apps": true, "create persistentvolumeclaims": true}}
	w := f.webhook(t)
	flood := func(n int) *v1alpha1.ReversiGateway {
		gw := payGateway("")
		gw.Spec.TrustedKeysSecretRef, gw.Spec.Auth.KeysSecretRef = nil, &v1alpha1.SecretKeyReference{Name: "s-0", Key: "k"}
		gw.Spec.Upstreams = nil
		for u := range 64 {
			up := v1alpha1.GatewayUpstream{Name: fmt.Sprintf("u%d", u), Command: "fs-mcp"}
			for e := range 64 {
				up.Env = append(up.Env, v1alpha1.ValueFrom{Name: fmt.Sprintf("E%d", e), SecretKeyRef: &v1alpha1.SecretKeyReference{Name: fmt.Sprintf("s-%d", (u*64+e)%n), Key: "k"}})
			}
			gw.Spec.Upstreams = append(gw.Spec.Upstreams, up)
		}
		return gw
	}
	_, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), flood(4096))
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("names 4096 Secrets, more than %d", maxSecretsPerSpec)) || len(f.reviews) != 0 {
		t.Errorf("4096 Secrets: %v (%d reviews), want a refusal before any review", err, len(f.reviews))
	}
	for i := range maxSecretsPerSpec {
		f.allowed[fmt.Sprintf("get secrets/s-%d", i)] = true
	}
	f.reviews = nil
	if _, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), flood(maxSecretsPerSpec)); err != nil || len(f.reviews) != maxSecretsPerSpec+2 {
		t.Errorf("%d Secrets named many times: %v (%d reviews, want %d)", maxSecretsPerSpec, err, len(f.reviews), maxSecretsPerSpec+2)
	}
}
