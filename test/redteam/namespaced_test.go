package redteam

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// The namespaced install's names: the controller runs in the team's own namespace (ns,
// "agents": config/namespaced moved there by an overlay's `namespace:`), and otherNS is a
// namespace it does not watch.
const (
	otherNS        = "payments"
	controllerSA   = "reversi-controller-manager"
	controllerUser = "system:serviceaccount:" + ns + ":" + controllerSA
)

// kustomizeNamespaced builds config/namespaced moved to namespace ns by an overlay in dir
// (kubectl kustomize of the envtest assets) and returns the output's documents.
func kustomizeNamespaced(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	assets, err := testenv.AssetsDir()
	must(t, err)
	overlay := filepath.Join(dir, "install")
	must(t, os.MkdirAll(overlay, 0o700))
	rel, err := filepath.Rel(overlay, filepath.Join(testenv.Root, "config", "namespaced"))
	must(t, err)
	must(t, os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte("namespace: "+ns+"\nresources:\n- "+rel+"\n"), 0o600))
	out, err := exec.Command(filepath.Join(assets, "kubectl"), "kustomize", overlay).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize config/namespaced (namespace %s): %v\n%s", ns, err, out)
	}
	var docs []*unstructured.Unstructured
	for _, doc := range strings.Split(string(out), "\n---\n") {
		u := &unstructured.Unstructured{}
		must(t, yaml.Unmarshal([]byte(doc), &u.Object))
		docs = append(docs, u)
	}
	return docs
}

func writeDocs(t *testing.T, path string, docs []*unstructured.Unstructured) {
	t.Helper()
	var parts []string
	for _, d := range docs {
		b, err := yaml.Marshal(d.Object)
		must(t, err)
		parts = append(parts, string(b))
	}
	must(t, os.WriteFile(path, []byte(strings.Join(parts, "---\n")), 0o600))
}

// kubectlAdmin runs the envtest kubectl as the admin and returns its combined output.
func (w *world) kubectlAdmin(args ...string) (string, error) {
	out, err := exec.CommandContext(w.ctx, w.env.Kubectl(), append([]string{"--kubeconfig", w.admin}, args...)...).CombinedOutput()
	return string(out), err
}

// TestNamespacedController (issue 17, "the controller can be namespaced"): config/namespaced,
// moved into the team's namespace by an overlay (`namespace: agents`) and applied to envtest
// with kubectl (the CRDs are config/crd's, installed by envtest; the webhook configurations as
// built, namespaceSelector included, pointed by envtest at its local address). The controller
// runs as its Deployment's container (podrun: the container's args with $(POD_NAMESPACE)
// expanded, its env, its webhook certificate mount) with a token of its own ServiceAccount,
// so the API server enforces the install's Roles on everything it does, also RBAC's escalation
// check on the gateway Role it writes. It reconciles in its namespace (a signed registry, and a
// ReversiGateway whose pod serves the agent), leaves a namespace it does not watch alone,
// cannot read a Secret there, and the webhooks see only its namespace (a webhook that the
// selector no longer limits refuses, naming the flag). The rendered Deployments use the
// gateway's own ServiceAccount, whatever the spec and whatever an edit says.
func TestNamespacedController(t *testing.T) {
	dir := t.TempDir()
	docs := kustomizeNamespaced(t, dir)
	hooksFile, installFile := filepath.Join(dir, "webhooks.yaml"), filepath.Join(dir, "install.yaml")
	var hooks, install []*unstructured.Unstructured
	for _, d := range docs {
		if strings.HasSuffix(d.GetKind(), "WebhookConfiguration") {
			hooks = append(hooks, d)
		} else {
			install = append(install, d)
		}
		if d.GetKind() == "CustomResourceDefinition" {
			t.Fatalf("config/namespaced holds the CRD %s: CRDs are installed once, with config/crd", d.GetName())
		}
	}
	if len(hooks) != 2 {
		t.Fatalf("config/namespaced has %d webhook configurations, want 2", len(hooks))
	}
	writeDocs(t, hooksFile, hooks)
	writeDocs(t, installFile, install)

	w := newControlPlane(t, testenv.Options{Webhooks: true, WebhookPaths: []string{hooksFile}})
	must(t, w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: otherNS}}))
	if out, err := w.kubectlAdmin("apply", "-f", installFile); err != nil {
		t.Fatalf("kubectl apply of config/namespaced: %v\n%s", err, out)
	}
	// The webhook serving certificate, where the install mounts it from (envtest's).
	wh := w.env.WebhookInstallOptions
	crt, err := os.ReadFile(filepath.Join(wh.LocalServingCertDir, "tls.crt"))
	must(t, err)
	key, err := os.ReadFile(filepath.Join(wh.LocalServingCertDir, "tls.key"))
	must(t, err)
	must(t, w.k8s.Create(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reversi-webhook-server-cert"},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}))

	// The controller: the Deployment's container, as its ServiceAccount.
	var dep appsv1.Deployment
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: controllerSA}, &dep))
	pod, err := w.kubelet.CreatePod(w.ctx, &dep, controllerSA+"-0")
	must(t, err)
	if pod.Spec.ServiceAccountName != controllerSA {
		t.Fatalf("the controller's pod runs as %q, want %s", pod.Spec.ServiceAccountName, controllerSA)
	}
	c, err := w.kubelet.Prepare(w.ctx, pod, "manager")
	must(t, err)
	if want := []string{"controller", "--leader-elect", "--watch-namespaces=" + ns}; !slices.Equal(c.Args, want) {
		t.Fatalf("the controller's args %v, want %v", c.Args, want)
	}
	certDir := c.Mounts["/tmp/k8s-webhook-server/serving-certs"]
	args := append(slices.Clone(c.Args), "--kubeconfig", c.Kubeconfig, "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--webhook-port", strconv.Itoa(wh.LocalServingPort), "--webhook-cert-dir", certDir, "--temp-dir", c.Mounts["/tmp"])
	env := append(slices.Clone(c.Env), "TMPDIR="+c.Mounts["/tmp"])
	w.controller, err = podrun.Start("controller", reversiBin, args, env, filepath.Join(dir, "controller.log"))
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log (end):\n%s", w.controller.Tail(6000))
		}
		w.controller.Stop()
	})
	aw := &approvalsWorld{world: w}
	aw.waitWebhookServing(t)

	// The same sources in both namespaces: the other namespace's first, so that by the time
	// the team's are reconciled the controller had every chance to touch them.
	w.reversi(t, dir, "keygen", filepath.Join(dir, "writer"))
	w.writerKey = filepath.Join(dir, "writer.key")
	writerPub, err := os.ReadFile(filepath.Join(dir, "writer.pub"))
	must(t, err)
	w.committer = sourcetest.NewSSHKey(t)
	agent, agentKey, err := auth.NewKey("agent-7", auth.Agent, nil, nil)
	must(t, err)
	w.agentKey = agentKey
	keyFile, err := json.Marshal(auth.KeyFile{Keys: []auth.KeyEntry{agent}})
	must(t, err)
	w.memory = w.newGitRegistry(t, memoryReg, "registry")
	w.publish(t, w.memory, memoryV1, "approved")
	w.memory.repo.CommitSigned("memory tools: read the graph, create entities", w.committer)
	verify := &v1alpha1.RegistryVerification{
		ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
		Commit:                &v1alpha1.CommitVerification{Mode: "HEAD", SecretRef: v1alpha1.LocalObjectReference{Name: "committers"}}}
	for name, data := range map[string]map[string][]byte{"manifest-keys": {"platform.pem": writerPub}, "committers": {"platform.sshpub": w.committer.AuthorizedKey}} {
		must(t, w.k8s.Create(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: otherNS, Name: name}, Data: data}))
	}
	must(t, w.k8s.Create(w.ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: otherNS, Name: memoryReg},
		Spec: v1alpha1.ManifestRegistrySpec{URL: w.memory.url, Ref: &v1alpha1.GitRef{Branch: "main"}, Path: w.memory.path, Format: v1alpha1.FormatRegistry,
			Interval: &metav1.Duration{Duration: time.Hour}, Verify: verify}}))
	must(t, w.k8s.Create(w.ctx, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: otherNS, Name: payGW},
		Spec: v1alpha1.ReversiGatewaySpec{Mode: "enforce", Manifests: &v1alpha1.GatewayManifests{Registries: []string{memoryReg}},
			Upstreams: []v1alpha1.GatewayUpstream{{Name: "memory", URL: "http://127.0.0.1:9/mcp"}}}}))

	w.createKeySecrets(t, writerPub, keyFile)
	w.createRegistry(t, w.memory, v1alpha1.FormatRegistry, &v1alpha1.GitRef{Branch: "main"}, verify)
	w.waitReady(t, memoryReg, 60*time.Second)
	trusted := &v1alpha1.LocalObjectReference{Name: "manifest-keys"}
	w.pay = w.startGateway(t, payGW, memoryReg, trusted)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log (end):\n%s", w.pay.proc.Tail(4000))
		}
	})

	t.Run("ReconcilesItsNamespace", func(t *testing.T) {
		// The gateway, its Role written by the controller as its ServiceAccount (the
		// escalation check passed), serves the registry's manifests.
		w.pay.requireAllowed(t, "memory.read_graph", map[string]any{})
		if text, isErr := w.pay.call(t, "memory.create_entities", createArgs); isErr {
			t.Errorf("memory.create_entities (v1, no approval) was refused: %s", text)
		}
		var lease coordinationv1.Lease
		if err := w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "reversi-controller.reversi.dev"}, &lease); err != nil || lease.Spec.HolderIdentity == nil {
			t.Errorf("the leader-election Lease in %s: %v %+v", ns, err, lease.Spec)
		}
		var keys corev1.Secret
		if err := w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "reversi-controller-signing-key"}, &keys); err != nil {
			t.Errorf("the controller's signing key Secret in its namespace: %v", err)
		}
	})

	t.Run("LeavesOtherNamespacesAlone", func(t *testing.T) {
		var reg v1alpha1.ManifestRegistry
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: otherNS, Name: memoryReg}, &reg))
		if reg.Status.ObservedGeneration != 0 || len(reg.Status.Conditions) > 0 || reg.Status.Artifact != nil {
			t.Errorf("ATTACK: the namespaced controller wrote the status of ManifestRegistry %s/%s: %+v", otherNS, memoryReg, reg.Status)
		}
		var gw v1alpha1.ReversiGateway
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: otherNS, Name: payGW}, &gw))
		if gw.Status.ObservedGeneration != 0 || len(gw.Status.Conditions) > 0 {
			t.Errorf("ATTACK: the namespaced controller wrote the status of ReversiGateway %s/%s: %+v", otherNS, payGW, gw.Status)
		}
		for _, obj := range []client.Object{&corev1.ConfigMap{}, &corev1.ServiceAccount{}, &rbacv1.Role{}, &appsv1.Deployment{}} {
			name := payGW + "-gateway"
			if _, ok := obj.(*corev1.ConfigMap); ok {
				name = memoryReg + "-manifests"
			}
			if err := w.k8s.Get(w.ctx, types.NamespacedName{Namespace: otherNS, Name: name}, obj); !apierrors.IsNotFound(err) {
				t.Errorf("ATTACK: %T %s/%s exists in the namespace the controller does not watch (%v)", obj, otherNS, name, err)
			}
		}
	})

	t.Run("RBAC", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"get", "secrets", "-n", ns}, "yes"},
			{[]string{"list", "secrets", "-n", ns}, "yes"},
			{[]string{"get", "secrets", "-n", otherNS}, "no"},
			{[]string{"get", "secrets", "-n", "kube-system"}, "no"},
			{[]string{"list", "secrets", "--all-namespaces"}, "no"},
			{[]string{"create", "roles.rbac.authorization.k8s.io", "-n", ns}, "yes"},
			{[]string{"create", "roles.rbac.authorization.k8s.io", "-n", otherNS}, "no"},
			{[]string{"create", "deployments.apps", "-n", otherNS}, "no"},
			{[]string{"list", "configmaps", "-n", otherNS}, "no"},
			{[]string{"escalate", "roles.rbac.authorization.k8s.io", "-n", ns}, "no"},
			{[]string{"bind", "roles.rbac.authorization.k8s.io", "-n", ns}, "no"},
			{[]string{"impersonate", "users"}, "no"},
			{[]string{"create", "clusterroles.rbac.authorization.k8s.io"}, "no"},
			{[]string{"create", "serviceaccounts", "--subresource=token", "-n", ns}, "no"},
			// What the cluster install's token reaches, this one does not.
			{[]string{"delete", "leases.coordination.k8s.io", "-n", "kube-node-lease"}, "no"},
			{[]string{"update", "deployments.apps", "-n", "kube-system"}, "no"},
		} {
			out, _ := w.kubectlAdmin(append(append([]string{"auth", "can-i"}, c.args...), "--as="+controllerUser, "--as-group=system:serviceaccounts")...)
			lines := strings.Split(strings.TrimSpace(out), "\n") // a warning may come first
			if got := lines[len(lines)-1]; got != c.want {
				t.Errorf("kubectl auth can-i %s --as=%s: %q, want %s", strings.Join(c.args, " "), controllerUser, got, c.want)
			}
		}
	})

	// forged is carol's Approval in namespace nsName claiming to be alice (dry run): the
	// Approval webhook refuses it wherever it is called.
	forged := func(nsName string) error {
		return w.k8s.Create(w.ctx, &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: nsName, Name: "forged-" + strconv.FormatInt(time.Now().UnixNano(), 36)},
			Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: "apr-x"}, Decision: v1alpha1.DecisionApprove,
				Approver: &v1alpha1.Approver{Username: "alice"}}}, client.DryRunAll)
	}
	t.Run("WebhooksOnlyInItsNamespace", func(t *testing.T) {
		if err := forged(ns); err == nil || !strings.Contains(err.Error(), "spec.approver.username") {
			t.Errorf("a forged approver in %s: %v, want the Approval webhook's refusal", ns, err)
		}
		if err := forged(otherNS); err != nil {
			t.Errorf("an Approval in %s reached the namespaced controller's webhooks: %v", otherNS, err)
		}
		// An install whose selector no longer limits a webhook: the controller refuses,
		// naming its namespaces, rather than stamp what it will never count.
		var mut admissionregistrationv1.MutatingWebhookConfiguration
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Name: "reversi-mutating-webhook-configuration"}, &mut))
		saved := mut.DeepCopy()
		for i := range mut.Webhooks {
			mut.Webhooks[i].NamespaceSelector = nil // the API server: every namespace
		}
		must(t, w.k8s.Update(w.ctx, &mut))
		defer func() {
			var cur admissionregistrationv1.MutatingWebhookConfiguration
			must(t, w.k8s.Get(w.ctx, client.ObjectKeyFromObject(saved), &cur))
			saved.ResourceVersion = cur.ResourceVersion
			must(t, w.k8s.Update(w.ctx, saved))
		}()
		if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
			err := forged(otherNS)
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("namespace %q is not watched", otherNS)) || !strings.Contains(err.Error(), "--watch-namespaces="+ns) {
				return fmt.Sprintf("an Approval in %s with the selector removed: %v", otherNS, err)
			}
			return ""
		}); err != nil {
			t.Error(err)
		}
	})

	t.Run("GatewayRunsAsItsOwnServiceAccount", func(t *testing.T) {
		w.testGatewayServiceAccount(t)
	})
}

// testGatewayServiceAccount: the Deployment of a ReversiGateway runs as <gateway>-gateway with
// its token mounted, and nothing in the spec can change that: ReversiGatewaySpec has no field
// for a ServiceAccount, a pod template or a token (by reflection), the API server refuses such
// fields (strict) or drops them, and the Deployment so rendered still runs as its own
// ServiceAccount; a Deployment edited to another ServiceAccount is rendered back.
func (w *world) testGatewayServiceAccount(t *testing.T) {
	runsAsOwn := func(name string) string {
		var d appsv1.Deployment
		if err := w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name + "-gateway"}, &d); err != nil {
			return err.Error() + "; ReversiGateway " + name + ": " + conditionText(w.reversiGateway(t, name).Status.Conditions)
		}
		s := d.Spec.Template.Spec
		// (serviceAccount is the deprecated alias the API server fills in from serviceAccountName.)
		if s.ServiceAccountName != name+"-gateway" || s.AutomountServiceAccountToken == nil || !*s.AutomountServiceAccountToken ||
			(s.DeprecatedServiceAccount != "" && s.DeprecatedServiceAccount != s.ServiceAccountName) {
			return fmt.Sprintf("Deployment %s-gateway runs as %q (automount %v, serviceAccount %q), want %s-gateway with its token", name, s.ServiceAccountName, s.AutomountServiceAccountToken, s.DeprecatedServiceAccount, name)
		}
		return ""
	}
	if why := runsAsOwn(payGW); why != "" {
		t.Error(why)
	}
	if w.pay.pod.Spec.ServiceAccountName != payGW+"-gateway" {
		t.Errorf("the gateway's pod runs as %q", w.pay.pod.Spec.ServiceAccountName)
	}

	// No field of the spec, at any depth, names a ServiceAccount, a token or a pod.
	forbidden := []string{"serviceaccount", "automount", "token", "podtemplate", "template", "podspec", "securitycontext", "volumes"}
	podTypes := []reflect.Type{reflect.TypeFor[corev1.PodSpec](), reflect.TypeFor[corev1.PodTemplateSpec](), reflect.TypeFor[corev1.Container](), reflect.TypeFor[corev1.Volume]()}
	seen := map[reflect.Type]bool{}
	var walk func(typ reflect.Type, path string)
	walk = func(typ reflect.Type, path string) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || seen[typ] {
			return
		}
		seen[typ] = true
		if slices.Contains(podTypes, typ) {
			t.Errorf("ReversiGatewaySpec%s is a %s: a spec author could set the pod's ServiceAccount", path, typ)
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			for _, bad := range forbidden {
				// A container upstream's securityContext and volumes (issue 23) are the
				// project's own types, walked below like the rest: the sidecar's user and
				// read-only root, emptyDir/configMap/secret mounts; no core type, no token.
				if own := path+"."+name == ".upstreams.container.securityContext" || path+"."+name == ".upstreams.container.volumes"; own {
					continue
				}
				if strings.Contains(strings.ToLower(name), bad) {
					t.Errorf("ReversiGatewaySpec%s.%s: a field named like %q", path, name, bad)
				}
			}
			walk(f.Type, path+"."+name)
		}
	}
	walk(reflect.TypeFor[v1alpha1.ReversiGatewaySpec](), "")

	// Trying: fields that would choose the ServiceAccount are refused, or dropped.
	sneaky := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": "ReversiGateway",
			"metadata": map[string]any{"namespace": ns, "name": name},
			"spec": map[string]any{"mode": "enforce", "manifests": map[string]any{"registries": []any{memoryReg}},
				"upstreams":                    []any{map[string]any{"name": "memory", "url": "http://127.0.0.1:9/mcp"}},
				"auth":                         map[string]any{"keysSecretRef": map[string]any{"name": "gateway-keys", "key": "keys.json"}},
				"serviceAccountName":           "payments-sa",
				"automountServiceAccountToken": false,
				"template":                     map[string]any{"spec": map[string]any{"serviceAccountName": "payments-sa"}},
			}}}
		return u
	}
	err := w.k8s.Create(w.ctx, sneaky("sneaky-strict"), client.FieldValidation("Strict"))
	if err == nil || !strings.Contains(err.Error(), `unknown field "spec.serviceAccountName"`) {
		t.Errorf("a ReversiGateway with spec.serviceAccountName (strict): %v, want refused as an unknown field", err)
	}
	must(t, w.k8s.Create(w.ctx, sneaky("sneaky")))
	t.Cleanup(func() {
		_ = w.k8s.Delete(w.ctx, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sneaky"}})
	})
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string { return runsAsOwn("sneaky") }); err != nil {
		t.Error(err)
	}

	// An edit of the Deployment is rendered back.
	patch := []byte(`{"spec":{"template":{"spec":{"serviceAccountName":"payments-sa","automountServiceAccountToken":false}}}}`)
	must(t, w.k8s.Patch(w.ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sneaky-gateway"}}, client.RawPatch(types.StrategicMergePatchType, patch)))
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string { return runsAsOwn("sneaky") }); err != nil {
		t.Error(err)
	}
}
