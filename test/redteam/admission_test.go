package redteam

// The acceptance of issue 17's second step, "ReversiGateway admission": creating a
// ReversiGateway allows its author no more than they could do by hand. The world: envtest with
// the webhook configurations of config/webhook, the controller process serving them with its
// default image policy (reversi, reversi:*, reversi@sha256:*), the Secrets db-creds and
// gateway-keys, and users minted by envtest acting with kubectl:
//   - rg-only may create and change ReversiGateways, nothing else;
//   - deployer may also create Deployments and PersistentVolumeClaims and get gateway-keys,
//     but not db-creds;
//   - deploys-only may create ReversiGateways and Deployments and get gateway-keys, but not
//     create PersistentVolumeClaims;
//   - dana, of group gateway-authors, may do all of that by hand through her group: create
//     Deployments and PersistentVolumeClaims and get db-creds and gateway-keys (not
//     payments-admin).
// Without the webhook every refusal below is admitted (RBAC lets each of them create
// ReversiGateways) and the controller renders the Deployment with the Secrets.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
)

// The users of the admission world.
const (
	rgOnly       = "rg-only"
	deployer     = "deployer"
	deploysOnly  = "deploys-only"
	dana         = "dana"
	authorsGroup = "gateway-authors"
)

// admissionWorld is the world of the ReversiGateway admission attacks.
type admissionWorld struct {
	*world
	users map[string]string // username → kubeconfig
}

func newAdmissionWorld(t *testing.T) *admissionWorld {
	w := newControlPlane(t, testenv.Options{Webhooks: true})
	aw := &admissionWorld{world: w, users: map[string]string{}}
	for name, groups := range map[string][]string{rgOnly: nil, deployer: nil, deploysOnly: nil, dana: {authorsGroup}} {
		kc, err := w.env.UserKubeconfig(w.dir, name, groups...)
		must(t, err)
		aw.users[name] = kc
	}
	for _, s := range []string{"db-creds", "gateway-keys", "payments-admin"} {
		must(t, w.k8s.Create(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s}, Data: map[string][]byte{"token": []byte("s3cr3t-" + s), "keys.json": []byte(`{"keys":[]}`)}}))
	}
	role := func(name string, rules ...rbacv1.PolicyRule) {
		must(t, w.k8s.Create(w.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}))
	}
	bind := func(role string, subjects ...rbacv1.Subject) {
		must(t, w.k8s.Create(w.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role}, Subjects: subjects}))
	}
	user := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
	}
	group := rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: authorsGroup}
	role("gateway-author", rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"reversigateways"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch"}})
	bind("gateway-author", user(rgOnly), user(deployer), user(deploysOnly), group)
	role("deployment-creator", rbacv1.PolicyRule{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"create"}})
	bind("deployment-creator", user(deployer), user(deploysOnly), group)
	role("claim-creator", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"create"}})
	bind("claim-creator", user(deployer), group)
	role("gateway-keys-reader", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"gateway-keys"}, Verbs: []string{"get"}})
	bind("gateway-keys-reader", user(deployer), user(deploysOnly), group)
	role("db-creds-reader", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"db-creds"}, Verbs: []string{"get"}})
	bind("db-creds-reader", group)

	wh := w.env.WebhookInstallOptions
	w.controllerFlags = []string{"--webhooks=true", "--webhook-port", strconv.Itoa(wh.LocalServingPort), "--webhook-cert-dir", wh.LocalServingCertDir}
	w.ctrlTemp = filepath.Join(w.dir, "checkouts")
	must(t, os.MkdirAll(w.ctrlTemp, 0o700))
	w.startController(t)
	t.Cleanup(func() { w.controller.Stop() })
	(&approvalsWorld{world: w}).waitWebhookServing(t)
	// The webhook answers: a server-side dry run of a disallowed image is refused by it.
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
		out, err := aw.kubectl(t, "", gatewayYAML("probe", "attacker.example/exfil:1"), "apply", "--dry-run=server", "-f", "-")
		if err == nil || !strings.Contains(out, "vreversigateway.reversi.dev") || strings.Contains(out, "failed calling webhook") {
			return fmt.Sprintf("the ReversiGateway webhook does not refuse a disallowed image: %v %s", err, oneLine(out))
		}
		return ""
	}); err != nil {
		t.Fatalf("world: %v", err)
	}
	return aw
}

// kubectl runs kubectl as user ("" is the admin) with stdin, and returns its output.
func (aw *admissionWorld) kubectl(t testing.TB, user, stdin string, args ...string) (string, error) {
	t.Helper()
	kc := aw.admin
	if user != "" {
		kc = aw.users[user]
	}
	cmd := exec.CommandContext(aw.ctx, aw.env.Kubectl(), append([]string{"--kubeconfig", kc, "-n", ns}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// gatewayYAML is a ReversiGateway fronting one url upstream whose Authorization header comes
// from db-creds, with the API key file of gateway-keys (image "" leaves spec.image out).
func gatewayYAML(name, image string, extra ...string) string {
	img := ""
	if image != "" {
		img = "\n  image: " + image
	}
	return fmt.Sprintf(`apiVersion: reversi.dev/v1alpha1
kind: ReversiGateway
metadata:
  name: %s
spec:%s
  upstreams:
  - name: db
    url: http://db-mcp.tools.svc:8080/mcp
    headers:
    - name: Authorization
      secretKeyRef: {name: db-creds, key: token}%s
  auth:
    keysSecretRef: {name: gateway-keys, key: keys.json}
`, name, img, strings.Join(extra, ""))
}

// refused applies yaml as user and requires the ReversiGateway webhook to refuse it with a
// message containing each of want and none of not; the gateway must not exist afterwards.
func (aw *admissionWorld) refused(t *testing.T, user, name, yaml string, want, not []string) {
	t.Helper()
	out, err := aw.kubectl(t, user, yaml, "apply", "-f", "-")
	if err == nil {
		t.Errorf("ATTACK: %s created ReversiGateway %s: %s", user, name, oneLine(out))
	} else if !strings.Contains(out, `admission webhook "vreversigateway.reversi.dev" denied the request`) {
		t.Errorf("%s: not refused by the ReversiGateway webhook: %v %s", user, err, oneLine(out))
	}
	for _, s := range want {
		if !strings.Contains(out, s) {
			t.Errorf("%s's refusal does not say %q:\n%s", user, s, out)
		}
	}
	for _, s := range not {
		if strings.Contains(out, s) {
			t.Errorf("%s's refusal says %q, a right they hold:\n%s", user, s, out)
		}
	}
	if err := aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: name}, &v1alpha1.ReversiGateway{}); !apierrors.IsNotFound(err) {
		t.Errorf("ReversiGateway %s exists after the refusal: %v", name, err)
	}
}

func TestGatewayAdmission(t *testing.T) {
	aw := newAdmissionWorld(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log (end):\n%s", aw.controller.Tail(6000))
		}
	})
	deployments := `may not create deployments.apps in namespace "` + ns + `"`
	claims := `may not create persistentvolumeclaims in namespace "` + ns + `"`
	dbCreds := `may not get secret "db-creds" (spec.upstreams[0].headers[0].secretKeyRef)`
	keys := `may not get secret "gateway-keys" (spec.auth.keysSecretRef)`
	patterns := "reversi, reversi:*, reversi@sha256:* (reversi controller --gateway-images)"

	// A user who may only create ReversiGateways gets no Deployment out of one.
	t.Run("OnlyReversiGatewayRights", func(t *testing.T) {
		yaml := `apiVersion: reversi.dev/v1alpha1
kind: ReversiGateway
metadata: {name: rg-only-plain}
spec:
  upstreams: [{name: db, url: "http://db-mcp.tools.svc:8080/mcp"}]
`
		aw.refused(t, rgOnly, "rg-only-plain", yaml, []string{`ReversiGateway ` + ns + `/rg-only-plain: user "` + rgOnly + `" ` + deployments,
			"a ReversiGateway runs a Deployment with these Secrets, so its author must be allowed both by hand"}, []string{"may not get secret"})
	})
	// Every missing right at once: the Deployment and both Secrets, with their fields.
	t.Run("EveryMissingRightAtOnce", func(t *testing.T) {
		aw.refused(t, rgOnly, "rg-only-secrets", gatewayYAML("rg-only-secrets", ""), []string{
			`user "` + rgOnly + `" ` + deployments + "; " + claims + "; " + dbCreds + "; " + keys + ": a ReversiGateway runs a Deployment"}, nil)
	})
	// May create Deployments, may not read db-creds: refused naming the Secret and the field.
	t.Run("SecretNotReadableByAuthor", func(t *testing.T) {
		aw.refused(t, deployer, "deployer-db", gatewayYAML("deployer-db", ""), []string{`user "` + deployer + `" ` + dbCreds + ": a ReversiGateway runs"},
			[]string{deployments, "gateway-keys", "persistentvolumeclaims"})
	})
	// May create Deployments, not PersistentVolumeClaims: the sqlite store's claim (of any
	// size and storage class the spec says, bound to any volume that fits) is refused; a
	// postgres store needs none.
	t.Run("VolumeClaimWithoutRights", func(t *testing.T) {
		yaml := `apiVersion: reversi.dev/v1alpha1
kind: ReversiGateway
metadata: {name: big-claim}
spec:
  upstreams: [{name: db, url: "http://db-mcp.tools.svc:8080/mcp"}]
  auth: {keysSecretRef: {name: gateway-keys, key: keys.json}}
  store: {type: sqlite, sqlite: {size: 100Ti, storageClassName: payments-nfs}}
`
		aw.refused(t, deploysOnly, "big-claim", yaml, []string{`user "` + deploysOnly + `" ` + claims + ": a ReversiGateway runs"}, []string{deployments, "may not get secret"})
		postgres := strings.Replace(strings.Replace(yaml, "big-claim", "pg", 1), "store: {type: sqlite, sqlite: {size: 100Ti, storageClassName: payments-nfs}}",
			"store: {type: postgres, postgres: {urlSecretRef: {name: gateway-keys, key: keys.json}}}", 1)
		if out, err := aw.kubectl(t, deploysOnly, postgres, "apply", "--dry-run=server", "-f", "-"); err != nil {
			t.Errorf("%s with a postgres store (no claim): %v\n%s", deploysOnly, err, out)
		}
	})
	// Every right, an image outside the patterns: refused naming the image and the patterns.
	t.Run("ImageOutsidePatterns", func(t *testing.T) {
		aw.refused(t, dana, "exfil", gatewayYAML("exfil", "attacker.example/exfil:1"),
			[]string{`spec.image "attacker.example/exfil:1" is not allowed: the controller runs gateway images matching ` + patterns}, []string{"may not"})
	})

	// A ManifestRegistry's git credentials are a Secret too (issue 17, found by the red team).
	t.Run("RegistryBorrowsSecret", aw.testRegistryBorrowsSecret)

	// The honest author: every right by hand (through her group) and an allowed image.
	t.Run("HonestAuthor", func(t *testing.T) {
		if out, err := aw.kubectl(t, dana, gatewayYAML("pay", "reversi:v1"), "apply", "-f", "-"); err != nil {
			t.Fatalf("dana, who may do all of it by hand, was refused: %v\n%s", err, out)
		}
		var dep appsv1.Deployment
		if err := podrun.Poll(aw.ctx, 30*time.Second, func() string {
			if err := aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: "pay-gateway"}, &dep); err != nil {
				return "the Deployment of pay: " + err.Error() + "; " + conditionText(aw.reversiGateway(t, "pay").Status.Conditions)
			}
			return ""
		}); err != nil {
			t.Fatal(err)
		}
		c := dep.Spec.Template.Spec.Containers[0]
		if c.Image != "reversi:v1" || !strings.Contains(fmt.Sprint(c.Env), "db-creds") {
			t.Errorf("the Deployment runs %s with env %v, want reversi:v1 with db-creds", c.Image, c.Env)
		}
	})
	// An update that adds a Secret its author may not read is refused; the gateway stays.
	t.Run("UpdateAddsUnreadableSecret", func(t *testing.T) {
		before := aw.reversiGateway(t, "pay")
		out, err := aw.kubectl(t, dana, "", "patch", "reversigateway", "pay", "--type=json", "-p",
			`[{"op":"add","path":"/spec/upstreams/0/headers/-","value":{"name":"X-Admin","secretKeyRef":{"name":"payments-admin","key":"token"}}}]`)
		if err == nil {
			t.Errorf("ATTACK: dana added payments-admin to pay: %s", oneLine(out))
		}
		for _, s := range []string{`ReversiGateway ` + ns + `/pay: user "dana" may not get secret "payments-admin" (spec.upstreams[0].headers[1].secretKeyRef)`} {
			if !strings.Contains(out, s) {
				t.Errorf("the refusal does not say %q:\n%s", s, out)
			}
		}
		if strings.Contains(out, "db-creds") || strings.Contains(out, "deployments.apps") {
			t.Errorf("the refusal names a right dana holds:\n%s", out)
		}
		if after := aw.reversiGateway(t, "pay"); after.Generation != before.Generation || len(after.Spec.Upstreams[0].Headers) != 1 {
			t.Errorf("pay changed: generation %d → %d, headers %v", before.Generation, after.Generation, after.Spec.Upstreams[0].Headers)
		}
	})
	// A metadata-only update passes, even by a user who could not write the spec: rg-only
	// labels dana's gateway.
	t.Run("MetadataOnlyUpdatePasses", func(t *testing.T) {
		if out, err := aw.kubectl(t, rgOnly, "", "label", "reversigateway", "pay", "team=payments"); err != nil {
			t.Errorf("rg-only labelling pay: %v\n%s", err, out)
		}
		if got := aw.reversiGateway(t, "pay").Labels["team"]; got != "payments" {
			t.Errorf("label team=%q", got)
		}
		// A spec change by the same user is checked.
		out, err := aw.kubectl(t, rgOnly, "", "patch", "reversigateway", "pay", "--type=merge", "-p", `{"spec":{"replicas":0}}`)
		if err == nil || !strings.Contains(out, `user "`+rgOnly+`" `+deployments+"; "+claims+"; "+dbCreds) {
			t.Errorf("rg-only changing pay's spec: %v\n%s", err, out)
		}
	})
}
