package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// The admission webhooks of the gateway's own objects (issue 16), served by
// `reversi controller` with the Approval webhooks. All fail closed. The validating ones also
// see the status subresource (a separate rule: reversiruns/status, approvalrequests/status).
// +kubebuilder:webhook:path=/mutate-reversi-dev-v1alpha1-approvalrequest,mutating=true,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=approvalrequests,verbs=create,versions=v1alpha1,name=mapprovalrequest.reversi.dev,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-reversi-dev-v1alpha1-approvalrequest,mutating=false,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=approvalrequests;approvalrequests/status,verbs=create;update,versions=v1alpha1,name=vapprovalrequest.reversi.dev,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/mutate-reversi-dev-v1alpha1-reversirun,mutating=true,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=reversiruns,verbs=create,versions=v1alpha1,name=mreversirun.reversi.dev,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-reversi-dev-v1alpha1-reversirun,mutating=false,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=reversiruns;reversiruns/status,verbs=create;update,versions=v1alpha1,name=vreversirun.reversi.dev,admissionReviewVersions=v1

// Paths of the gateway objects' webhooks.
const (
	MutateApprovalRequestPath   = "/mutate-reversi-dev-v1alpha1-approvalrequest"
	ValidateApprovalRequestPath = "/validate-reversi-dev-v1alpha1-approvalrequest"
	MutateReversiRunPath        = "/mutate-reversi-dev-v1alpha1-reversirun"
	ValidateReversiRunPath      = "/validate-reversi-dev-v1alpha1-reversirun"
)

// serviceAccountPrefix starts the username of every ServiceAccount.
const serviceAccountPrefix = "system:serviceaccount:"

// GatewayServiceAccountUsername is the username a ReversiGateway's pods authenticate as: its
// ServiceAccount <gateway>-gateway in its namespace.
func GatewayServiceAccountUsername(namespace, gateway string) string {
	return serviceAccountPrefix + namespace + ":" + gateway + "-gateway"
}

// GatewayIdentities names the users that standalone gateways (`reversi gateway --kubeconfig`)
// authenticate as: "NAMESPACE/GATEWAY" → username, NAMESPACE "*" for every namespace
// (`reversi controller --gateway-identity`, Options.GatewayIdentities).
type GatewayIdentities map[string]string

// ParseGatewayIdentity parses NAMESPACE/GATEWAY=USERNAME (NAMESPACE may be *). Errors say
// which part is missing.
func ParseGatewayIdentity(s string) (key, username string, err error) {
	k, user, ok := strings.Cut(s, "=")
	ns, gw, ok2 := strings.Cut(k, "/")
	if !ok || !ok2 || ns == "" || gw == "" || user == "" || strings.Contains(gw, "/") {
		return "", "", fmt.Errorf("gateway identity %q: write NAMESPACE/GATEWAY=USERNAME (NAMESPACE may be *), e.g. agents/pay=system:serviceaccount:agents:pay-standalone", s)
	}
	return ns + "/" + gw, user, nil
}

// GatewayAdmissionError is a refusal of the gateway objects' webhooks: the object, the field
// and why, with what to do.
type GatewayAdmissionError struct {
	Kind, Namespace, Name string
	Field                 string
	Why                   string
}

func (e *GatewayAdmissionError) Error() string {
	return fmt.Sprintf("%s %s/%s: %s: %s", e.Kind, e.Namespace, e.Name, e.Field, e.Why)
}

// GatewayObjectsWebhook admits ApprovalRequests and ReversiRuns (issue 16, "admission for the
// gateway's own objects"):
//   - create: only by an identity of the gateway spec.gateway names: the ServiceAccount of
//     that ReversiGateway (which must exist), or a user Identities names for it. The mutating
//     half stamps the annotation reversi.dev/created-by with the username (a different value
//     written by the creator is refused); it never changes afterwards.
//   - update of the object (ReversiRun spec.rollback, the consumedAt mirror): refused to the
//     identity of any other gateway; operators keep what their RBAC grants.
//   - status: a ReversiRun's only by its gateway's identity; an ApprovalRequest's only by the
//     controller (Controller), which decides it.
type GatewayObjectsWebhook struct {
	// Reader finds ReversiGateways (the manager's cached client).
	Reader client.Reader
	// Identities are the standalone gateways' users.
	Identities GatewayIdentities
	// Controller is the controller's own username (Options.ControllerUsername).
	Controller string
}

// SetupWebhookWithManager registers the four handlers (the *Path constants) on the manager's
// webhook server.
func (w *GatewayObjectsWebhook) SetupWebhookWithManager(srv webhook.Server) error {
	if w.Reader == nil || w.Controller == "" {
		return errors.New("the gateway objects' webhooks need a reader and the controller's username")
	}
	for path, h := range map[string]admission.HandlerFunc{
		MutateApprovalRequestPath: w.mutate, ValidateApprovalRequestPath: w.validate,
		MutateReversiRunPath: w.mutate, ValidateReversiRunPath: w.validate,
	} {
		srv.Register(path, &webhook.Admission{Handler: h})
	}
	return nil
}

// gatewayObject is the part of an ApprovalRequest or ReversiRun the webhooks judge.
type gatewayObject struct {
	u       *unstructured.Unstructured
	kind    string
	gateway string // spec.gateway
}

func (w *GatewayObjectsWebhook) decode(req admission.Request, raw []byte) (*gatewayObject, error) {
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(raw, &u.Object); err != nil {
		return nil, fmt.Errorf("decoding the %s: %w", req.Kind.Kind, err)
	}
	gw, _, _ := unstructured.NestedString(u.Object, "spec", "gateway")
	kind := req.Kind.Kind
	if kind == "" {
		kind = u.GetKind()
	}
	if u.GetNamespace() == "" {
		u.SetNamespace(req.Namespace)
	}
	return &gatewayObject{u: u, kind: kind, gateway: gw}, nil
}

func (o *gatewayObject) refuse(field, format string, a ...any) admission.Response {
	err := &GatewayAdmissionError{Kind: o.kind, Namespace: o.u.GetNamespace(), Name: o.u.GetName(), Field: field, Why: fmt.Sprintf(format, a...)}
	return admission.Denied(err.Error())
}

const createdByField = "metadata.annotations[" + v1alpha1.AnnotationCreatedBy + "]"

// mutate stamps reversi.dev/created-by on create.
func (w *GatewayObjectsWebhook) mutate(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	o, err := w.decode(req, req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	user := req.UserInfo.Username
	if user == "" {
		return o.refuse("user", "the API server sent no username")
	}
	ann := o.u.GetAnnotations()
	if v, ok := ann[v1alpha1.AnnotationCreatedBy]; ok && v != user {
		return o.refuse(createdByField, "is %q but you are %q: leave it out, the webhook writes the creator", v, user)
	}
	if ann == nil {
		ann = map[string]string{}
	}
	ann[v1alpha1.AnnotationCreatedBy] = user
	o.u.SetAnnotations(ann)
	b, err := json.Marshal(o.u.Object)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, b)
}

// validate judges create, update and status writes (see GatewayObjectsWebhook).
func (w *GatewayObjectsWebhook) validate(ctx context.Context, req admission.Request) admission.Response {
	o, err := w.decode(req, req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	user := req.UserInfo.Username
	if user == "" {
		return o.refuse("user", "the API server sent no username")
	}
	ns := o.u.GetNamespace()
	switch req.Operation {
	case admissionv1.Create:
		owners, err := w.owners(ctx, ns, o.gateway)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if !slices.Contains(owners, user) {
			return o.refuse("spec.gateway", "only gateway %s creates its %ss (%s); you are %q", o.gateway, o.kind, describe(owners, ns, o.gateway), user)
		}
		if got := o.u.GetAnnotations()[v1alpha1.AnnotationCreatedBy]; got != user {
			return o.refuse(createdByField, "is %q, not the creator %q: the mutating webhook m%s.reversi.dev must run before this one (check the MutatingWebhookConfiguration)", got, user, strings.ToLower(o.kind))
		}
		if o.kind == "ApprovalRequest" {
			// A request belongs to a run of its own gateway (issue 16 review: another gateway's
			// requests naming this gateway's runs flooded their audit view).
			run, _, _ := unstructured.NestedString(o.u.Object, "spec", "run")
			var rr v1alpha1.ReversiRun
			switch err := w.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: run}, &rr); {
			case err == nil && rr.Spec.Gateway != o.gateway:
				return o.refuse("spec.run", "names run %s of gateway %s: a gateway asks for approvals in its own runs only", run, rr.Spec.Gateway)
			case err != nil && !apierrors.IsNotFound(err):
				return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading ReversiRun %s/%s: %w", ns, run, err))
			}
		}
		return admission.Allowed("")
	case admissionv1.Update:
	default:
		return admission.Allowed("")
	}
	old, err := w.decode(req, req.OldObject.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if a, b := old.u.GetAnnotations()[v1alpha1.AnnotationCreatedBy], o.u.GetAnnotations()[v1alpha1.AnnotationCreatedBy]; a != b {
		return o.refuse(createdByField, "is immutable (it was %q): leave it as it is", a)
	}
	if old.gateway != o.gateway {
		return o.refuse("spec.gateway", "is immutable (it was %q)", old.gateway)
	}
	if req.SubResource == "status" {
		if o.kind == "ApprovalRequest" {
			if user != w.Controller {
				return o.refuse("status", "only the controller (%q) decides an ApprovalRequest; you are %q: create an Approval instead", w.Controller, user)
			}
			return admission.Allowed("")
		}
		owners, err := w.owners(ctx, ns, o.gateway)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if !slices.Contains(owners, user) {
			return o.refuse("status", "only gateway %s writes the status of its runs (%s); you are %q", o.gateway, describe(owners, ns, o.gateway), user)
		}
		return admission.Allowed("")
	}
	if user == w.Controller {
		return admission.Allowed("")
	}
	owners, err := w.owners(ctx, ns, o.gateway)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if slices.Contains(owners, user) {
		return admission.Allowed("")
	}
	other, err := w.gatewaysOf(ctx, user)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if len(other) > 0 {
		return o.refuse("spec", "you are %q, the identity of gateway %s, and this object belongs to gateway %s: a gateway changes only its own %ss", user, strings.Join(other, ", "), o.gateway, o.kind)
	}
	return admission.Allowed("") // an operator: RBAC decides
}

// owners are the usernames that act as gateway gw of namespace ns: the ServiceAccount of the
// ReversiGateway ns/gw when the gateway controls it, and the users Identities names for ns/gw
// and */gw.
func (w *GatewayObjectsWebhook) owners(ctx context.Context, ns, gw string) ([]string, error) {
	var out []string
	for _, k := range []string{ns + "/" + gw, "*/" + gw} {
		if u, ok := w.Identities[k]; ok {
			out = append(out, u)
		}
	}
	if gw == "" {
		return out, nil
	}
	switch ok, err := w.controlsServiceAccount(ctx, ns, gw); {
	case err != nil:
		return nil, err
	case ok:
		out = append(out, GatewayServiceAccountUsername(ns, gw))
	}
	return out, nil
}

// controlsServiceAccount reports whether the ReversiGateway ns/gw exists and controls the
// ServiceAccount <gw>-gateway: a ServiceAccount of that name made by someone else (which the
// reconciler refuses as an OwnershipConflict) is nobody's gateway identity (issue 17).
func (w *GatewayObjectsWebhook) controlsServiceAccount(ctx context.Context, ns, gw string) (bool, error) {
	var rg v1alpha1.ReversiGateway
	switch err := w.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: gw}, &rg); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading ReversiGateway %s/%s: %w", ns, gw, err)
	}
	var sa corev1.ServiceAccount
	switch err := w.Reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: namesOf(&rg).object}, &sa); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading ServiceAccount %s/%s: %w", ns, namesOf(&rg).object, err)
	}
	return metav1.IsControlledBy(&sa, &rg), nil
}

// gatewaysOf are the gateways ("namespace/name") user is an identity of: a ServiceAccount
// <gw>-gateway that its ReversiGateway controls, or a user Identities names.
func (w *GatewayObjectsWebhook) gatewaysOf(ctx context.Context, user string) ([]string, error) {
	var out []string
	for k, u := range w.Identities {
		if u == user {
			out = append(out, k)
		}
	}
	if rest, ok := strings.CutPrefix(user, serviceAccountPrefix); ok {
		ns, sa, _ := strings.Cut(rest, ":")
		if gw, ok := strings.CutSuffix(sa, "-gateway"); ok && gw != "" {
			switch ok, err := w.controlsServiceAccount(ctx, ns, gw); {
			case err != nil:
				return nil, err
			case ok:
				out = append(out, ns+"/"+gw)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// describe says who may act as gateway gw, or how to name one when nobody may.
func describe(owners []string, ns, gw string) string {
	if len(owners) == 0 {
		return fmt.Sprintf("no ReversiGateway %s exists in namespace %s (or it does not control its ServiceAccount %s-gateway) and no --gateway-identity names it: create the ReversiGateway, or run the controller with --gateway-identity %s/%s=USERNAME for a standalone gateway", gw, ns, gw, ns, gw)
	}
	return "its identity is " + strings.Join(owners, " or ")
}
