package redteam

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// credentialTrap is a git server that answers nothing useful and records every Authorization
// header it is sent: the attacker's server.
type credentialTrap struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string
}

func newCredentialTrap(t *testing.T) *credentialTrap {
	c := &credentialTrap{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := r.Header.Get("Authorization"); h != "" {
			c.mu.Lock()
			c.seen = append(c.seen, h)
			c.mu.Unlock()
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *credentialTrap) headers() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.seen...)
}

// registryYAML is a Plain ManifestRegistry reading url with the git credentials of secret.
func registryYAML(name, url, secret string) string {
	return fmt.Sprintf(`apiVersion: reversi.dev/v1alpha1
kind: ManifestRegistry
metadata:
  name: %s
spec:
  url: %s
  format: Plain
  interval: 1h
  secretRef: {name: %s}
`, name, url, secret)
}

// testRegistryBorrowsSecret: the controller reads a ManifestRegistry's spec.secretRef (any
// Secret of the namespace, with the controller's rights) and sends its username and password,
// or its bearerToken, to the URL the spec names. So "create ManifestRegistry" was "read every
// basic-auth Secret and bearer token of the namespace": rg-only, who may create
// ManifestRegistries but read no Secret, points one at their own server with the Secret
// payments-git. Admission must refuse it, naming the Secret; the server must never see it.
func (aw *admissionWorld) testRegistryBorrowsSecret(t *testing.T) {
	must(t, aw.k8s.Create(aw.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments-git"}, Type: corev1.SecretTypeBasicAuth,
		StringData: map[string]string{"username": "payments-bot", "password": "s3cr3t-payments-git"}}))
	must(t, aw.k8s.Create(aw.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "registry-author"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"manifestregistries"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}}}}))
	must(t, aw.k8s.Create(aw.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "registry-author"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "registry-author"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: rgOnly},
			{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: authorsGroup}}}))
	trap := newCredentialTrap(t)
	url := trap.srv.URL + "/payments/manifests.git"

	out, err := aw.kubectl(t, rgOnly, registryYAML("exfil", url, "payments-git"), "apply", "-f", "-")
	if err == nil {
		t.Errorf("ATTACK: %s created ManifestRegistry exfil with the Secret payments-git: %s", rgOnly, oneLine(out))
	} else if want := `may not get secret "payments-git" (spec.secretRef)`; !strings.Contains(out, want) {
		t.Errorf("the refusal does not say %q: %v\n%s", want, err, out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && len(trap.headers()) == 0 {
		time.Sleep(100 * time.Millisecond)
	}
	if h := trap.headers(); len(h) > 0 {
		t.Errorf("ATTACK: the controller sent payments-git's credentials to %s's server: %q", rgOnly, h)
	}
	if err := aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: "exfil"}, &v1alpha1.ManifestRegistry{}); !apierrors.IsNotFound(err) {
		t.Errorf("ManifestRegistry exfil exists: %v", err)
	}

	// A spec change that adds the Secret later is refused too.
	if out, err := aw.kubectl(t, rgOnly, strings.Replace(registryYAML("public", url, "x"), "  secretRef: {name: x}\n", "", 1), "apply", "-f", "-"); err != nil {
		t.Fatalf("%s creating a registry without credentials: %v\n%s", rgOnly, err, out)
	}
	if out, err := aw.kubectl(t, rgOnly, "", "patch", "manifestregistry", "public", "--type=merge", "-p", `{"spec":{"secretRef":{"name":"payments-git"}}}`); err == nil {
		t.Errorf("ATTACK: %s added payments-git to ManifestRegistry public: %s", rgOnly, oneLine(out))
	}
	// dana may read db-creds by hand: her registry with it is admitted (a server-side dry run).
	if out, err := aw.kubectl(t, dana, registryYAML("dana-git", url, "db-creds"), "apply", "--dry-run=server", "-f", "-"); err != nil {
		t.Errorf("dana, who may get db-creds, was refused: %v\n%s", err, out)
	}
	time.Sleep(time.Second)
	if h := trap.headers(); len(h) > 0 {
		t.Errorf("ATTACK: the controller sent credentials to %s's server: %q", rgOnly, h)
	}
}
