package config

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// built is the output of `kubectl kustomize` by "Kind/name" (namespaced objects by
// "Kind/namespace/name").
type built map[string]*unstructured.Unstructured

func kustomize(t *testing.T, dir string) built {
	t.Helper()
	out, err := kubectl(t, "kustomize", dir)
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
	docs := built{}
	for _, doc := range strings.Split(out, "\n---\n") {
		u := object(t, doc)
		key := u.GetKind() + "/" + u.GetName()
		if u.GetNamespace() != "" {
			key = u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()
		}
		docs[key] = u
	}
	return docs
}

// overlay writes a kustomization.yaml with body into a new folder and returns the folder;
// $BASE in body is the path of config/<base> relative to it (kustomize refuses absolute ones).
func overlay(t *testing.T, base, body string) string {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(root, "config", base))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "kustomization.yaml"), strings.ReplaceAll(body, "$BASE", rel))
	return dir
}

// grants expands RBAC rules into "group/resource:verb" (and "@name") strings, sorted.
func grants(t *testing.T, rules any) []string {
	t.Helper()
	var rs []rbacv1.PolicyRule
	switch r := rules.(type) {
	case []rbacv1.PolicyRule:
		rs = r
	case []any:
		for _, x := range r {
			var pr rbacv1.PolicyRule
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(x.(map[string]any), &pr); err != nil {
				t.Fatal(err)
			}
			rs = append(rs, pr)
		}
	case nil:
	default:
		t.Fatalf("rules of type %T", rules)
	}
	var out []string
	for _, r := range rs {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					names := r.ResourceNames
					if len(names) == 0 {
						names = []string{""}
					}
					for _, n := range names {
						s := g + "/" + res + ":" + v
						if n != "" {
							s += "@" + n
						}
						out = append(out, s)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func rulesOf(u *unstructured.Unstructured) any {
	if u == nil {
		return nil
	}
	return u.Object["rules"]
}

// webhooks returns each webhook of the configurations in docs by name, with its configuration's kind.
func webhooks(docs built) map[string]map[string]any {
	out := map[string]map[string]any{}
	for key, u := range docs {
		if !strings.HasSuffix(u.GetKind(), "WebhookConfiguration") {
			continue
		}
		hooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
		for _, h := range hooks {
			m := h.(map[string]any)
			out[m["name"].(string)] = m
			m["configuration"] = key
		}
	}
	return out
}

// config/namespaced, built with kustomize: no CRD and no cluster-wide right (at most a
// ClusterRole that creates reviews), Roles that hold exactly what the generated ClusterRole and
// own-namespace Role of config/rbac grant, bound to the controller's ServiceAccount; the
// Deployment of config/default with --watch-namespaces=$(POD_NAMESPACE) added; every webhook
// of config/default, each limited to the controller's namespace. An overlay's `namespace:`
// moves all of it (the selectors too), and config/namespaced-example watches a second
// namespace as the comment says.
func TestNamespacedInstall(t *testing.T) {
	const ns = "reversi-system"
	docs := kustomize(t, "config/namespaced")
	def := kustomize(t, "config/default")

	// Nothing cluster-wide but the namespace and the webhook configurations (and reviews).
	for key, u := range docs {
		switch u.GetKind() {
		case "CustomResourceDefinition", "ClusterRoleBinding":
			if !(u.GetKind() == "ClusterRoleBinding" && u.GetName() == "reversi-manager-cluster-rolebinding") {
				t.Errorf("config/namespaced holds %s", key)
			}
		case "ClusterRole":
			if u.GetName() != "reversi-manager-cluster-role" {
				t.Errorf("config/namespaced holds %s", key)
				continue
			}
			for _, g := range grants(t, rulesOf(u)) {
				if !strings.HasSuffix(g, "reviews:create") {
					t.Errorf("the namespaced install's ClusterRole grants %s: want only create of reviews", g)
				}
			}
		}
		if u.GetNamespace() != "" && u.GetNamespace() != ns {
			t.Errorf("%s is outside the controller's namespace", key)
		}
	}

	// The Roles grant exactly what config/rbac/role.yaml grants.
	var want, wantOwn []string
	for _, o := range readRoles(t, "config/rbac/role.yaml") {
		if o.Kind == "ClusterRole" {
			want = grants(t, o.Rules)
		} else {
			wantOwn = append(wantOwn, grants(t, o.Rules)...)
		}
	}
	got := append(grants(t, rulesOf(docs["Role/"+ns+"/reversi-manager-role"])), grants(t, rulesOf(docs["ClusterRole/reversi-manager-cluster-role"]))...)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the Role reversi-manager-role (and the review ClusterRole) grant\n%v\nwant the ClusterRole's\n%v", got, want)
	}
	if got := grants(t, rulesOf(docs["Role/"+ns+"/reversi-own-namespace-role"])); !slices.Equal(got, wantOwn) {
		t.Errorf("the Role reversi-own-namespace-role grants %v, want the generated own-namespace Role's %v", got, wantOwn)
	}
	for _, b := range []string{"RoleBinding/" + ns + "/reversi-manager-rolebinding", "RoleBinding/" + ns + "/reversi-own-namespace-rolebinding"} {
		subjects, _, _ := unstructured.NestedSlice(docs[b].Object, "subjects")
		if want := []any{map[string]any{"kind": "ServiceAccount", "name": "reversi-controller-manager", "namespace": ns}}; !reflect.DeepEqual(subjects, want) {
			t.Errorf("%s binds %v, want the controller's ServiceAccount", b, subjects)
		}
	}
	if docs["ServiceAccount/"+ns+"/reversi-controller-manager"] == nil {
		t.Error("no ServiceAccount reversi-controller-manager")
	}

	// The Deployment is config/default's, with the flag.
	dep, defDep := docs["Deployment/"+ns+"/reversi-controller-manager"], def["Deployment/"+ns+"/reversi-controller-manager"]
	if dep == nil || defDep == nil {
		t.Fatal("no Deployment reversi-controller-manager")
	}
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	gotArgs, _, _ := unstructured.NestedStringSlice(c, "args")
	if !slices.Equal(gotArgs, []string{"controller", "--leader-elect", "--watch-namespaces=$(POD_NAMESPACE)"}) {
		t.Errorf("the manager's args %v", gotArgs)
	}
	c["args"] = []any{"controller", "--leader-elect"}
	dep = dep.DeepCopy()
	if err := unstructured.SetNestedSlice(dep.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dep.Object, defDep.Object) {
		t.Errorf("the namespaced Deployment differs from config/default's in more than the flag:\n%v\n%v", dep.Object, defDep.Object)
	}

	// Every webhook of config/default, limited to the namespace.
	hooks, defHooks := webhooks(docs), webhooks(def)
	if len(hooks) != len(defHooks) || len(hooks) == 0 {
		t.Errorf("config/namespaced has %d webhooks, config/default %d", len(hooks), len(defHooks))
	}
	for name := range defHooks {
		h := hooks[name]
		if h == nil {
			t.Errorf("config/namespaced lacks the webhook %s", name)
			continue
		}
		sel, _, _ := unstructured.NestedStringMap(h, "namespaceSelector", "matchLabels")
		svc, _, _ := unstructured.NestedString(h, "clientConfig", "service", "namespace")
		if !reflect.DeepEqual(sel, map[string]string{"kubernetes.io/metadata.name": ns}) || svc != ns {
			t.Errorf("webhook %s: namespaceSelector %v, service in %q; want only %s", name, h["namespaceSelector"], svc, ns)
		}
	}

	// An overlay moves everything, the selectors and the subjects too.
	moved := kustomize(t, overlay(t, "namespaced", "namespace: team-x\nresources:\n- $BASE\n"))
	if moved["Namespace/team-x"] == nil || moved["Deployment/team-x/reversi-controller-manager"] == nil || moved["Role/team-x/reversi-manager-role"] == nil {
		t.Errorf("namespace: team-x did not move the install: %v", keys(moved))
	}
	subjects, _, _ := unstructured.NestedSlice(moved["RoleBinding/team-x/reversi-manager-rolebinding"].Object, "subjects")
	if len(subjects) != 1 || subjects[0].(map[string]any)["namespace"] != "team-x" {
		t.Errorf("after namespace: team-x the RoleBinding binds %v", subjects)
	}
	for name, h := range webhooks(moved) {
		sel, _, _ := unstructured.NestedStringMap(h, "namespaceSelector", "matchLabels")
		if sel["kubernetes.io/metadata.name"] != "team-x" {
			t.Errorf("after namespace: team-x webhook %s selects %v", name, h["namespaceSelector"])
		}
	}

	// The example of more namespaces: Role and binding in team-a, both flags, both namespaces
	// in every selector.
	ex := kustomize(t, "config/namespaced-example")
	if got := grants(t, rulesOf(ex["Role/team-a/reversi-manager-role"])); !slices.Equal(got, grants(t, rulesOf(docs["Role/"+ns+"/reversi-manager-role"]))) {
		t.Errorf("the example's Role in team-a grants %v", got)
	}
	subjects, _, _ = unstructured.NestedSlice(ex["RoleBinding/team-a/reversi-manager-rolebinding"].Object, "subjects")
	if want := []any{map[string]any{"kind": "ServiceAccount", "name": "reversi-controller-manager", "namespace": ns}}; !reflect.DeepEqual(subjects, want) {
		t.Errorf("the example's RoleBinding in team-a binds %v", subjects)
	}
	containers, _, _ = unstructured.NestedSlice(ex["Deployment/"+ns+"/reversi-controller-manager"].Object, "spec", "template", "spec", "containers")
	if a, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args"); !slices.Equal(a[2:], []string{"--watch-namespaces=$(POD_NAMESPACE)", "--watch-namespaces=team-a"}) {
		t.Errorf("the example's args %v", a)
	}
	exHooks := webhooks(ex)
	for name := range defHooks {
		exprs, _, _ := unstructured.NestedSlice(exHooks[name], "namespaceSelector", "matchExpressions")
		_, hasLabels := exHooks[name]["namespaceSelector"].(map[string]any)["matchLabels"]
		if want := []any{map[string]any{"key": "kubernetes.io/metadata.name", "operator": "In", "values": []any{ns, "team-a"}}}; !reflect.DeepEqual(exprs, want) || hasLabels {
			t.Errorf("the example's webhook %s selects %v", name, exHooks[name]["namespaceSelector"])
		}
	}
	for key := range ex {
		if strings.HasPrefix(key, "WatchedNamespaces/") {
			t.Errorf("the example's local-config object %s is in the output", key)
		}
	}
}

func keys(b built) []string {
	var out []string
	for k := range b {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
