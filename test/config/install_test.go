package config

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// `kubectl apply -k config/default` works against a real API server: first as a server-side
// dry run (every object is admitted: CRDs, RBAC, Deployment, Service), then for real, after
// which the controller's ServiceAccount holds exactly the permissions the RBAC grants.
func TestInstallWithKubectl(t *testing.T) {
	// A server-side dry run persists nothing, so the objects in reversi-system need the
	// namespace to exist already (a real apply creates it first).
	namespace(t, "reversi-system")

	out, err := kubectl(t, "apply", "-k", "config/default", "--dry-run=server")
	if err != nil {
		t.Fatalf("kubectl apply -k config/default --dry-run=server: %v\n%s", err, out)
	}
	for _, want := range []string{
		"namespace/reversi-system",
		"customresourcedefinition.apiextensions.k8s.io/manifestregistries.reversi.dev",
		"customresourcedefinition.apiextensions.k8s.io/toolmanifests.reversi.dev",
		"customresourcedefinition.apiextensions.k8s.io/reversigateways.reversi.dev",
		"customresourcedefinition.apiextensions.k8s.io/approvalrequests.reversi.dev",
		"customresourcedefinition.apiextensions.k8s.io/approvals.reversi.dev",
		"customresourcedefinition.apiextensions.k8s.io/reversiruns.reversi.dev",
		"serviceaccount/reversi-controller-manager",
		"role.rbac.authorization.k8s.io/reversi-manager-role",
		"clusterrole.rbac.authorization.k8s.io/reversi-manager-role",
		"clusterrole.rbac.authorization.k8s.io/reversi-approver",
		"clusterrole.rbac.authorization.k8s.io/reversi-viewer",
		"rolebinding.rbac.authorization.k8s.io/reversi-leader-election-rolebinding",
		"clusterrolebinding.rbac.authorization.k8s.io/reversi-manager-rolebinding",
		"service/reversi-controller-manager-metrics",
		"deployment.apps/reversi-controller-manager",
		"service/reversi-webhook-service",
		"mutatingwebhookconfiguration.admissionregistration.k8s.io/reversi-mutating-webhook-configuration",
		"validatingwebhookconfiguration.admissionregistration.k8s.io/reversi-validating-webhook-configuration",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the dry run does not mention %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "(server dry run)"); n != 19 {
		t.Errorf("%d objects in the server dry run, want 19:\n%s", n, out)
	}

	// The real install registers the Approval webhooks, which point at a manager that does not
	// run here: remove them afterwards so Approvals can be created by the other tests.
	t.Cleanup(func() {
		if out, err := kubectl(t, "delete", "mutatingwebhookconfiguration/reversi-mutating-webhook-configuration",
			"validatingwebhookconfiguration/reversi-validating-webhook-configuration", "--ignore-not-found"); err != nil {
			t.Errorf("removing the webhook configurations: %v\n%s", err, out)
		}
	})

	if out, err := kubectl(t, "apply", "-k", "config/default"); err != nil {
		t.Fatalf("kubectl apply -k config/default: %v\n%s", err, out)
	}
	out, err = kubectl(t, "get", "deployment", "reversi-controller-manager", "-n", "reversi-system",
		"-o", `jsonpath={.spec.template.spec.containers[0].args} {.spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem} {.spec.template.spec.securityContext.runAsNonRoot}`)
	if err != nil || out != `["controller","--leader-elect"] true true` {
		t.Errorf("the manager Deployment: %v %q", err, out)
	}

	sa := "--as=system:serviceaccount:reversi-system:reversi-controller-manager"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "manifestregistries.reversi.dev", "--all-namespaces"}, "yes"},
		{[]string{"patch", "toolmanifests.reversi.dev", "--subresource=status", "-n", "agents"}, "yes"},
		{[]string{"update", "approvalrequests.reversi.dev", "--subresource=status", "-n", "agents"}, "yes"},
		{[]string{"create", "configmaps", "-n", "agents"}, "yes"},
		{[]string{"delete", "configmaps", "-n", "agents"}, "yes"},
		{[]string{"watch", "secrets", "-n", "agents"}, "yes"},
		{[]string{"create", "secrets", "-n", "agents"}, "no"},
		{[]string{"create", "events", "-n", "agents"}, "yes"},
		{[]string{"update", "leases.coordination.k8s.io", "-n", "reversi-system"}, "yes"},
		// The gateway pods' Leases (issue 17), in every namespace a ReversiGateway may be in.
		{[]string{"update", "leases.coordination.k8s.io", "-n", "agents"}, "yes"},
		{[]string{"get", "pods", "-n", "agents"}, "yes"},
		{[]string{"patch", "pods", "-n", "agents"}, "no"},               // issue 17: nothing writes a pod
		{[]string{"create", "deployments.apps", "-n", "agents"}, "yes"}, // ReversiGateway
		{[]string{"create", "roles.rbac.authorization.k8s.io", "-n", "agents"}, "yes"},
		{[]string{"create", "pods", "-n", "agents"}, "no"},
		// What docs/security.md says it cannot do (issue 17, the red team checked each claim).
		{[]string{"create", "pods", "--subresource=exec", "-n", "agents"}, "no"},
		{[]string{"create", "serviceaccounts", "--subresource=token", "-n", "agents"}, "no"},
		{[]string{"create", "clusterroles.rbac.authorization.k8s.io"}, "no"},
		{[]string{"create", "clusterrolebindings.rbac.authorization.k8s.io"}, "no"},
		{[]string{"escalate", "roles.rbac.authorization.k8s.io", "-n", "agents"}, "no"},
		{[]string{"bind", "roles.rbac.authorization.k8s.io", "-n", "agents"}, "no"},
		{[]string{"impersonate", "users"}, "no"},
		{[]string{"create", "secrets", "-n", "kube-system"}, "no"},
		{[]string{"update", "secrets", "-n", "agents"}, "no"},
		{[]string{"create", "secrets", "-n", "reversi-system"}, "yes"}, // its key Secrets
		{[]string{"create", "namespaces"}, "no"},
		// And what it can, which its token carries everywhere: every Lease (kube-system's
		// leader elections, kube-node-lease's heartbeats) and every Deployment.
		{[]string{"delete", "leases.coordination.k8s.io", "-n", "kube-node-lease"}, "yes"},
		{[]string{"update", "deployments.apps", "-n", "kube-system"}, "yes"},
	} {
		out, _ := kubectl(t, append(append([]string{"auth", "can-i"}, c.args...), sa)...)
		lines := strings.Split(strings.TrimSpace(out), "\n") // the answer, after any warning
		if got := lines[len(lines)-1]; got != c.want {
			t.Errorf("can the controller %s? %q, want %s", strings.Join(c.args, " "), got, c.want)
		}
	}
}

// kubectl refuses an unknown field in a ToolManifest, as a user typing it would see.
func TestKubectlRefusesUnknownFields(t *testing.T) {
	ns := namespace(t, "kubectl")
	path := t.TempDir() + "/tm.yaml"
	writeFile(t, path, `apiVersion: reversi.dev/v1alpha1
kind: ToolManifest
metadata: {name: typo}
spec:
  tool: notes.write
  effect: idempotent
  permission: notes:write
  timeout: 30s
`)
	out, err := kubectl(t, "apply", "-n", ns, "-f", path)
	if err == nil || !strings.Contains(out, `unknown field "spec.timeout"`) {
		t.Errorf("kubectl apply with spec.timeout (for timeout_ms): %v\n%s", err, out)
	}
}

// config/with-cert-manager is config/default plus a self-signed Issuer and a Certificate for
// the webhook Service, whose CA cert-manager injects into both webhook configurations (the
// annotation names the Certificate), and whose Secret is the one the manager mounts.
func TestCertManagerOption(t *testing.T) {
	out, err := kubectl(t, "kustomize", "config/with-cert-manager")
	if err != nil {
		t.Fatalf("kubectl kustomize config/with-cert-manager: %v\n%s", err, out)
	}
	docs := map[string]*unstructured.Unstructured{}
	for _, doc := range strings.Split(out, "\n---\n") {
		u := object(t, doc)
		docs[u.GetKind()+"/"+u.GetName()] = u
	}
	cert := docs["Certificate/reversi-serving-cert"]
	if cert == nil || docs["Issuer/reversi-selfsigned-issuer"] == nil {
		t.Fatalf("no Certificate reversi-serving-cert or Issuer reversi-selfsigned-issuer in:\n%s", out)
	}
	svc := docs["Service/reversi-webhook-service"]
	if svc == nil {
		t.Fatal("no webhook Service")
	}
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	if want := svc.GetName() + "." + svc.GetNamespace() + ".svc"; !slices.Contains(dns, want) {
		t.Errorf("the Certificate's dnsNames %v lack %s", dns, want)
	}
	for _, kind := range []string{"MutatingWebhookConfiguration/reversi-mutating-webhook-configuration", "ValidatingWebhookConfiguration/reversi-validating-webhook-configuration"} {
		wh := docs[kind]
		if wh == nil {
			t.Fatalf("no %s", kind)
		}
		if got, want := wh.GetAnnotations()["cert-manager.io/inject-ca-from"], cert.GetNamespace()+"/"+cert.GetName(); got != want {
			t.Errorf("%s: inject-ca-from %q, want %q", kind, got, want)
		}
		hooks, _, _ := unstructured.NestedSlice(wh.Object, "webhooks")
		for _, h := range hooks {
			name, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "service", "name")
			ns, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "service", "namespace")
			if name != svc.GetName() || ns != svc.GetNamespace() {
				t.Errorf("%s calls %s/%s, want the webhook Service %s/%s", kind, ns, name, svc.GetNamespace(), svc.GetName())
			}
		}
	}
	secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	if !strings.Contains(out, "secretName: "+secret) || strings.Count(out, "secretName: "+secret) < 2 {
		t.Errorf("the manager does not mount the Certificate's Secret %s", secret)
	}
}
