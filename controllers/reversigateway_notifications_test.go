package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/diff"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
)

// notifyGateway is a gateway with two notification receivers: a signed webhook with every
// filter, and a Slack incoming webhook with none.
func notifyGateway(ns string) *v1alpha1.ReversiGateway {
	return &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ntf"}, Spec: v1alpha1.ReversiGatewaySpec{
		Upstreams: []v1alpha1.GatewayUpstream{{Name: "notes", Command: "notes-mcp"}},
		Auth:      &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
		Notifications: []v1alpha1.GatewayNotification{
			{Name: "approvers-hook", Type: v1alpha1.NotificationWebhook,
				URLSecretRef: v1alpha1.SecretKeyReference{Name: "hooks", Key: "url"},
				SecretRef:    &v1alpha1.SecretKeyReference{Name: "hook-hmac", Key: "key"},
				Events:       []string{"approval.requested", "approval.approved"}, Tools: []string{"payments.*"}, Risk: []string{"high", "critical"}},
			{Name: "approvers-chat", Type: v1alpha1.NotificationSlack, URLSecretRef: v1alpha1.SecretKeyReference{Name: "hooks", Key: "slack"}},
		},
	}}
}

func secretEnv(name, secret, key string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key}}}
}

// Issue 24: spec.notifications renders into gateway.yaml `notifications:` exactly, each URL and
// HMAC key a ${NAME} reference (no Secret value in the ConfigMap), and the gateway container's
// env is exactly the fixed variables then those names, each read from its Secret key
// (valueFrom.secretKeyRef). The gateway's own parser, given the Secrets' values for those
// names, reads the receivers back with their type, URL, key and filters.
func TestGatewayRendersNotifications(t *testing.T) {
	ns := namespace(t)
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	createSecret(t, ns, "hooks", map[string][]byte{"url": []byte("https://hooks.example.com/reversi"), "slack": []byte("https://chat.example.com/services/T0/B0/s3cr3t-path")}) // never read by the controller
	createSecret(t, ns, "hook-hmac", map[string][]byte{"key": []byte("hmac-s3cr3t")})
	create(t, notifyGateway(ns))
	waitGateway(t, ns, "ntf", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))

	cfg := configMap(t, ns, "ntf-config")
	if cfg == nil {
		t.Fatal("no ntf-config")
	}
	data := cfg.Data[GatewayConfigKey]
	var doc struct {
		Notifications []map[string]any `json:"notifications"`
	}
	if err := yaml.Unmarshal([]byte(data), &doc); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"name": "approvers-hook", "type": "webhook", "url": "${REVERSI_NOTIFICATION_0_URL}", "secret": "${REVERSI_NOTIFICATION_0_SECRET}",
			"events": []any{"approval.requested", "approval.approved"}, "tools": []any{"payments.*"}, "risk": []any{"high", "critical"}},
		{"name": "approvers-chat", "type": "slack", "url": "${REVERSI_NOTIFICATION_1_URL}"},
	}
	if !reflect.DeepEqual(doc.Notifications, want) {
		t.Errorf("gateway.yaml notifications (-want +got):\n%s", diff.Diff(want, doc.Notifications))
	}
	for _, v := range []string{"hooks.example.com", "s3cr3t"} {
		if strings.Contains(data, v) {
			t.Errorf("gateway.yaml holds %q:\n%s", v, data)
		}
	}

	var dep appsv1.Deployment
	get(t, ns, "ntf-gateway", &dep)
	sum := sha256.Sum256([]byte(data))
	wantEnv := []corev1.EnvVar{
		{Name: PodNameEnv, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
		{Name: ControllerKeysEnv, Value: string(ctlKey.PublicPEM)},
		{Name: ConfigDigestEnv, Value: "sha256:" + hex.EncodeToString(sum[:])},
		secretEnv("REVERSI_NOTIFICATION_0_URL", "hooks", "url"),
		secretEnv("REVERSI_NOTIFICATION_0_SECRET", "hook-hmac", "key"),
		secretEnv("REVERSI_NOTIFICATION_1_URL", "hooks", "slack"),
	}
	if got := dep.Spec.Template.Spec.Containers[0].Env; !reflect.DeepEqual(got, wantEnv) {
		t.Errorf("gateway container env (-want +got):\n%s", diff.Diff(wantEnv, got))
	}

	values := map[string]string{"REVERSI_NOTIFICATION_0_URL": "https://hooks.example.com/reversi", "REVERSI_NOTIFICATION_0_SECRET": "hmac-s3cr3t",
		"REVERSI_NOTIFICATION_1_URL": "https://chat.example.com/services/T0/B0/s3cr3t-path"}
	g, errs := config.Parse("gateway.yaml", []byte(data), func(n string) (string, bool) { v, ok := values[n]; return v, ok })
	if len(errs) > 0 {
		t.Fatalf("gateway.yaml refused: %v\n%s", errs, data)
	}
	wantN := []config.Notification{
		{Name: "approvers-hook", Type: config.NotifyWebhook, URL: "https://hooks.example.com/reversi", Secret: "hmac-s3cr3t",
			Events: []string{"approval.requested", "approval.approved"}, Tools: []string{"payments.*"}, Risk: []string{"high", "critical"}},
		{Name: "approvers-chat", Type: config.NotifySlack, URL: "https://chat.example.com/services/T0/B0/s3cr3t-path"},
	}
	for i := range g.Notifications {
		g.Notifications[i].Where, g.Notifications[i].Field = "", "" // positions in the file
	}
	if !reflect.DeepEqual(g.Notifications, wantN) {
		t.Errorf("parsed receivers (-want +got):\n%s", diff.Diff(wantN, g.Notifications))
	}
}

// Issue 24, admission (the API server's webhook, real RBAC): the receivers' Secrets are
// Secrets the author reads through the gateway, so an author who may not get the HMAC key's
// Secret is refused, the field named; with it the gateway is admitted.
func TestReversiGatewayAdmissionNotificationSecrets(t *testing.T) {
	ns := namespace(t)
	const carol = "carol@corp.example"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway-author"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversigateways"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"gateway-keys", "hooks"}, Verbs: []string{"get"}},
	}}
	create(t, role)
	create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway-author"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "gateway-author"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: carol}}})
	as := clientAs(t, carol, "uid-carol")
	err := as.Create(t.Context(), notifyGateway(ns))
	const noSecret = `user "carol@corp.example" may not get secret "hook-hmac" (spec.notifications[0].secretRef)`
	if err == nil || !strings.Contains(err.Error(), noSecret) {
		t.Fatalf("create: %v, want a refusal saying %q", err, noSecret)
	}
	if strings.Contains(err.Error(), `secret "hooks"`) {
		t.Errorf("refusal names a readable Secret: %v", err)
	}
	role.Rules[3].ResourceNames = append(role.Rules[3].ResourceNames, "hook-hmac")
	if err := k8s.Update(t.Context(), role); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string { // the authorizer's cache of RBAC
		if err := as.Create(t.Context(), notifyGateway(ns)); err != nil {
			return err.Error()
		}
		return ""
	})
}
