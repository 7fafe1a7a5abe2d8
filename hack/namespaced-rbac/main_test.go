package main

import (
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

func rule(groups, resources, verbs string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: strings.Split(groups, ","), Resources: strings.Split(resources, ","), Verbs: strings.Split(verbs, ",")}
}

// The ClusterRole's rules become a Role, except create of a review (SubjectAccessReview), which
// goes to the one small ClusterRole; any other cluster-scoped right, a wildcard or a
// non-resource URL cannot be placed and is an error naming it.
func TestSplit(t *testing.T) {
	ns, cl, err := split([]rbacv1.PolicyRule{
		rule(",events.k8s.io", "events", "create,patch"),
		rule("authorization.k8s.io", "subjectaccessreviews", "create"),
		rule("apps", "deployments", "get,list,watch"),
	})
	if err != nil || len(ns) != 2 || len(cl) != 1 || cl[0].Resources[0] != "subjectaccessreviews" {
		t.Fatalf("split = %v, %v, %v", ns, cl, err)
	}
	for bad, want := range map[string]rbacv1.PolicyRule{
		"rbac.authorization.k8s.io/clusterroles is cluster-scoped": rule("rbac.authorization.k8s.io", "roles,clusterroles", "get"),
		"/namespaces is cluster-scoped":                            rule("", "namespaces", "get"),
		"subjectaccessreviews is cluster-scoped":                   rule("authorization.k8s.io", "subjectaccessreviews", "create,get"),
		"a wildcard":                                               rule("", "*", "get"),
		"non-resource URLs":                                        {NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
	} {
		if _, _, err := split([]rbacv1.PolicyRule{want}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%v: %v, want an error with %q", want, err, bad)
		}
	}
}

// With a cluster-scoped review rule, rbac.yaml gains the ClusterRole manager-cluster-role with
// only it, bound to the controller's ServiceAccount; the watched namespaces' Role keeps the rest.
func TestRenderClusterReviews(t *testing.T) {
	gen := []object{
		{Kind: "ClusterRole", Metadata: meta{Name: "manager-role"}, Rules: []rbacv1.PolicyRule{rule("", "secrets", "get"), rule("authorization.k8s.io", "subjectaccessreviews", "create")}},
		{Kind: "Role", Metadata: meta{Name: "manager-role", Namespace: "reversi-system"}, Rules: []rbacv1.PolicyRule{rule("coordination.k8s.io", "leases", "get")}},
	}
	approver := []object{{Kind: "ClusterRole", Metadata: meta{Name: "approver"}, Rules: []rbacv1.PolicyRule{rule("reversi.dev", "approvals", "create")}}}
	files, err := render(gen, approver)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]object{}
	for _, doc := range strings.Split(string(files["rbac.yaml"]), "\n---\n")[1:] {
		var o object
		if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		kinds[o.Kind+"/"+o.Metadata.Name] = o
	}
	cr, crb := kinds["ClusterRole/manager-cluster-role"], kinds["ClusterRoleBinding/manager-cluster-rolebinding"]
	if len(cr.Rules) != 1 || cr.Rules[0].Resources[0] != "subjectaccessreviews" || crb.RoleRef == nil || crb.RoleRef.Name != "manager-cluster-role" || len(crb.Subjects) != 1 {
		t.Errorf("the cluster-wide part: %+v %+v", cr, crb)
	}
	if own := kinds["Role/own-namespace-role"]; len(own.Rules) != 1 || own.Rules[0].Resources[0] != "leases" {
		t.Errorf("own-namespace-role: %+v", own)
	}
	watched := string(files["watched-namespace/role.yaml"])
	if strings.Contains(watched, "subjectaccessreviews") || !strings.Contains(watched, "secrets") {
		t.Errorf("the watched namespaces' Role:\n%s", watched)
	}
	if _, err := render(append(gen, object{Kind: "ClusterRoleBinding", Metadata: meta{Name: "x"}}), approver); err == nil {
		t.Error("an unexpected object in role.yaml was accepted")
	}
}
