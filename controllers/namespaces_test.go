package controllers

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

func TestCheckWatchNamespaces(t *testing.T) {
	got, err := CheckWatchNamespaces([]string{"team-b", "team-a", "team-b"})
	if err != nil || !slices.Equal(got, []string{"team-a", "team-b"}) {
		t.Errorf("CheckWatchNamespaces = %v, %v", got, err)
	}
	if got, err := CheckWatchNamespaces(nil); err != nil || len(got) != 0 {
		t.Errorf("no namespaces (every namespace): %v, %v", got, err)
	}
	for _, bad := range []string{"", "$(POD_NAMESPACE)", "Agents", "a/b"} {
		if _, err := CheckWatchNamespaces([]string{"agents", bad}); err == nil || !strings.Contains(err.Error(), "is not a namespace name") {
			t.Errorf("%q: %v, want a refusal", bad, err)
		}
	}
}

// admissionReview posts an AdmissionReview (create of obj, put in namespace ns, by alice) to path on
// mux and returns the response.
func admissionReview(t *testing.T, mux http.Handler, path, ns string, obj client.Object, kind string) *admissionv1.AdmissionResponse {
	t.Helper()
	obj = obj.DeepCopyObject().(client.Object)
	obj.SetNamespace(ns)
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: types.UID("r-" + ns + path), Operation: admissionv1.Create, Namespace: ns, Name: "x",
			Kind:     metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Kind: kind},
			Resource: metav1.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: strings.ToLower(kind) + "s"},
			UserInfo: authnv1.UserInfo{Username: "alice"}, Object: runtime.RawExtension{Raw: raw}}}
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("%s: HTTP %d %s: %v", path, rec.Code, rec.Body.String(), err)
	}
	return out.Response
}

// With Options.WatchNamespaces, every admission webhook Setup registers (the Approval,
// ReversiGateway and ManifestRegistry webhooks, registered through the builder, and the
// ApprovalRequest and ReversiRun webhooks, registered on the server) refuses an object of a namespace outside them, saying which namespaces are
// watched and what to do; an object of a watched namespace reaches the webhook itself. Without
// the option the same object of the other namespace reaches the webhook (every namespace).
func TestWebhooksRefuseUnwatchedNamespaces(t *testing.T) {
	requireEnv(t)
	watched := namespace(t)
	setup := func(namespaces []string) http.Handler {
		mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{Scheme: testEnv.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
			WebhookServer: webhook.NewServer(webhook.Options{Port: -1}),
			Controller:    config.Controller{SkipNameValidation: ptr.To(true)}}) // a second manager of the same reconcilers, never started
		if err != nil {
			t.Fatal(err)
		}
		if err := Setup(mgr, Options{Webhooks: true, ControllerUsername: "the-controller", SigningKey: ctlKey, StampKey: stampKey, WatchNamespaces: namespaces}); err != nil {
			t.Fatal(err)
		}
		return mgr.GetWebhookServer().WebhookMux()
	}
	approval := &v1alpha1.Approval{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Approval"},
		ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: "req"}, Decision: v1alpha1.DecisionApprove}}
	request := &v1alpha1.ApprovalRequest{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ApprovalRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: v1alpha1.ApprovalRequestSpec{Gateway: "pay"}}
	hooks := []struct {
		path, kind string
		obj        client.Object
	}{
		{"/mutate-reversi-dev-v1alpha1-approval", "Approval", approval},
		{"/validate-reversi-dev-v1alpha1-approval", "Approval", approval},
		{MutateApprovalRequestPath, "ApprovalRequest", request},
		{ValidateApprovalRequestPath, "ApprovalRequest", request},
		{MutateReversiRunPath, "ReversiRun", request},
		{ValidateReversiRunPath, "ReversiRun", request},
		{ValidateReversiGatewayPath, "ReversiGateway", &v1alpha1.ReversiGateway{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ReversiGateway"},
			ObjectMeta: metav1.ObjectMeta{Name: "x"}}},
		{ValidateManifestRegistryPath, "ManifestRegistry", &v1alpha1.ManifestRegistry{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ManifestRegistry"},
			ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: v1alpha1.ManifestRegistrySpec{URL: "https://git.example/r.git", SecretRef: &v1alpha1.LocalObjectReference{Name: "git"}}}},
	}

	gated := setup([]string{watched, "team-b"})
	everywhere := setup(nil)
	for _, h := range hooks {
		resp := admissionReview(t, gated, h.path, "elsewhere", h.obj, h.kind)
		msg := ""
		if resp.Result != nil {
			msg = resp.Result.Message
		}
		if resp.Allowed || !strings.Contains(msg, `namespace "elsewhere" is not watched`) || !strings.Contains(msg, "--watch-namespaces="+min(watched, "team-b")) ||
			!strings.Contains(msg, "namespaceSelector") {
			t.Errorf("%s in an unwatched namespace: allowed %v, %q; want a refusal naming the namespace, the watched ones and the fix", h.path, resp.Allowed, msg)
		}
		// In a watched namespace, and in any namespace without the option, the webhook
		// itself answers (whatever it decides, it is not the gate).
		for what, r := range map[string]*admissionv1.AdmissionResponse{
			"a watched namespace":           admissionReview(t, gated, h.path, watched, h.obj, h.kind),
			"another, every one is watched": admissionReview(t, everywhere, h.path, "elsewhere", h.obj, h.kind),
		} {
			if r.Result != nil && strings.Contains(r.Result.Message, "not watched") {
				t.Errorf("%s in %s: %q, want the webhook's own answer", h.path, what, r.Result.Message)
			}
		}
	}
	// The Approval webhook stamps in the watched namespace (it is the real handler).
	if resp := admissionReview(t, gated, "/mutate-reversi-dev-v1alpha1-approval", watched, approval, "Approval"); !resp.Allowed || len(resp.Patch) == 0 {
		t.Errorf("the Approval webhook in a watched namespace: allowed %v, patch %s, result %+v", resp.Allowed, resp.Patch, resp.Result)
	}
}
