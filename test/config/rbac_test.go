package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// rbacObject is a Role or ClusterRole as the install files hold it.
type rbacObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Rules []rbacv1.PolicyRule `json:"rules"`
}

// readRoles reads the Roles and ClusterRoles of a multi-document YAML file of the repository.
func readRoles(t *testing.T, path string) []rbacObject {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	var out []rbacObject
	for _, doc := range strings.Split(string(b), "\n---") {
		var o rbacObject
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if o.Kind == "Role" || o.Kind == "ClusterRole" {
			out = append(out, o)
		}
	}
	return out
}

// forbiddenVerbs let a holder grant, or act with, rights it does not hold (RBAC's escalation
// check lets through whoever holds escalate or bind; impersonate is acting as someone else) or
// sign certificates; "*" is every verb, these included.
var forbiddenVerbs = []string{"escalate", "bind", "impersonate", "approve", "sign", "*"}

// forbiddenResources give a holder another identity or a shell in someone else's pod, or
// cluster-wide RBAC.
var forbiddenResources = []string{"serviceaccounts/token", "pods/exec", "pods/attach", "pods/portforward", "pods/ephemeralcontainers",
	"nodes/proxy", "clusterroles", "clusterrolebindings", "certificatesigningrequests/approval", "*"}

// escalations lists what in rules lets the holder escalate: a forbidden verb or resource, a
// wildcard API group or resource name, a non-resource URL. Empty when there is nothing.
func escalations(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, v := range r.Verbs {
			if slices.Contains(forbiddenVerbs, v) {
				out = append(out, fmt.Sprintf("verb %q on %v", v, r.Resources))
			}
		}
		for _, res := range r.Resources {
			if slices.Contains(forbiddenResources, res) {
				out = append(out, fmt.Sprintf("resource %q", res))
			}
		}
		if slices.Contains(r.APIGroups, "*") {
			out = append(out, fmt.Sprintf("API group \"*\" in %v", r.Resources))
		}
		if slices.Contains(r.ResourceNames, "*") {
			out = append(out, fmt.Sprintf("resource name \"*\" in %v", r.Resources))
		}
		if len(r.NonResourceURLs) > 0 {
			out = append(out, fmt.Sprintf("non-resource URLs %v", r.NonResourceURLs))
		}
	}
	return out
}

// The controller's ClusterRole (config/rbac/role.yaml, generated from controllers/rbac.go)
// and the Roles of the namespaced install (generated from it) carry no escalate, bind or
// impersonate, no wildcard, and nothing that hands out another identity (a ServiceAccount
// token, exec into a pod, cluster-wide RBAC). RBAC's escalation check then holds for the
// controller: a Role it writes (the gateway's) can hold only rights it holds itself.
func TestControllerRBACGrantsNoEscalation(t *testing.T) {
	// The check itself finds each kind of escalation.
	for _, bad := range []rbacv1.PolicyRule{
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles"}, Verbs: []string{"escalate"}},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"rolebindings"}, Verbs: []string{"bind"}},
		{APIGroups: []string{""}, Resources: []string{"users", "serviceaccounts"}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"*"}},
		{APIGroups: []string{"*"}, Resources: []string{"deployments"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"*"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, Verbs: []string{"create"}},
		{NonResourceURLs: []string{"*"}, Verbs: []string{"get"}},
	} {
		if len(escalations([]rbacv1.PolicyRule{bad})) == 0 {
			t.Errorf("the check misses %+v", bad)
		}
	}

	files := []string{"config/rbac/role.yaml", "config/namespaced/rbac.yaml", "config/namespaced/watched-namespace/role.yaml"}
	var clusterRole []rbacv1.PolicyRule
	for _, f := range files {
		roles := readRoles(t, f)
		if len(roles) == 0 {
			t.Errorf("%s holds no Role or ClusterRole", f)
		}
		for _, o := range roles {
			if e := escalations(o.Rules); len(e) > 0 {
				t.Errorf("%s: %s %s grants %s", f, o.Kind, o.Metadata.Name, strings.Join(e, "; "))
			}
			if o.Kind == "ClusterRole" && o.Metadata.Name == "manager-role" {
				clusterRole = o.Rules
			}
		}
	}
	// What the controller's ClusterRole may do to RBAC objects: write Roles and RoleBindings
	// (the gateway's), no more.
	for _, r := range clusterRole {
		if slices.Contains(r.APIGroups, rbacv1.GroupName) && !slices.Equal(r.Resources, []string{"rolebindings", "roles"}) {
			t.Errorf("the ClusterRole's RBAC rule %+v: want rights on roles and rolebindings only", r)
		}
	}
	if clusterRole == nil {
		t.Error("config/rbac/role.yaml has no ClusterRole manager-role")
	}
}
