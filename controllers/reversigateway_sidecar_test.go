package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/testenv"
)

// memGateway fronts a url upstream (a header from a Secret: the gateway's), the container
// upstream memory (env from a literal, a Secret and a ConfigMap; an emptyDir and a ConfigMap
// volume; its own resources and user; one server per agent session) and the container upstream
// everything with every default.
func memGateway(ns string) *v1alpha1.ReversiGateway {
	return &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mem"}, Spec: v1alpha1.ReversiGatewaySpec{
		Upstreams: []v1alpha1.GatewayUpstream{
			{Name: "tickets", URL: "http://tickets-mcp.tools.svc:8080/mcp", Headers: []v1alpha1.ValueFrom{
				{Name: "Authorization", SecretKeyRef: &v1alpha1.SecretKeyReference{Name: "tickets-token", Key: "token"}}}},
			{Name: "memory", Session: "PerClient", Container: &v1alpha1.UpstreamContainer{
				Image: "mcp/memory:1", Command: []string{"node", "/app/dist/index.js"}, Args: []string{"--verbose"}, WorkingDir: "/app",
				Env: []v1alpha1.UpstreamEnvVar{
					{Name: "MEMORY_FILE_PATH", Value: "/data/memory.json"},
					{Name: "API_TOKEN", ValueFrom: &v1alpha1.UpstreamEnvVarSource{SecretKeyRef: &v1alpha1.SecretKeyReference{Name: "mem-token", Key: "token"}}},
					{Name: "LEVEL", ValueFrom: &v1alpha1.UpstreamEnvVarSource{ConfigMapKeyRef: &v1alpha1.ConfigMapKeyReference{Name: "mem-settings", Key: "level"}}},
				},
				Resources: &v1alpha1.UpstreamResources{
					Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("100Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("300Mi"), corev1.ResourceCPU: resource.MustParse("1")}},
				SecurityContext: &v1alpha1.UpstreamSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](1000)},
				Volumes: []v1alpha1.UpstreamVolume{
					{Name: "data", MountPath: "/data", EmptyDir: &v1alpha1.UpstreamEmptyDir{SizeLimit: ptr.To(resource.MustParse("128Mi"))}},
					{Name: "settings", MountPath: "/etc/memory", ConfigMap: &v1alpha1.ConfigMapReference{Name: "mem-files"}},
				},
			}},
			{Name: "everything", Container: &v1alpha1.UpstreamContainer{Image: "mcp/everything:2", Command: []string{"node", "index.js"}}},
		},
		Auth: &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
	}}
}

// memPodSpec is the pod spec memGateway's Deployment must have, exactly, as the API server
// returns it (with its defaults): configDigest is that of the rendered gateway.yaml.
func memPodSpec(ns, configDigest string) corev1.PodSpec {
	q := resource.MustParse
	restricted := func(readOnly bool) *corev1.SecurityContext {
		return &corev1.SecurityContext{RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(readOnly), AllowPrivilegeEscalation: ptr.To(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	}
	memorySC := restricted(true)
	memorySC.RunAsUser, memorySC.RunAsGroup = ptr.To[int64](1000), ptr.To[int64](1000)
	// Exec probes, not HTTP: `reversi probe` also checks that the gateway holds its port (a
	// sidecar could listen there first and answer an HTTP probe).
	probe := func(path string, failures int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/reversi", "probe", "--port", "7431", "--path", path}}},
			TimeoutSeconds: 3, PeriodSeconds: 10, FailureThreshold: failures, SuccessThreshold: 1}
	}
	emptyDir := func(name, size string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(q(size))}}}
	}
	bridge := func(name, session string) []string {
		return []string{"/reversi-bin/reversi", "stdio-bridge", "--listen", "unix:///run/reversi/" + name + ".sock", "--session", session, "--"}
	}
	return corev1.PodSpec{
		ServiceAccountName: "mem-gateway", DeprecatedServiceAccount: "mem-gateway",
		AutomountServiceAccountToken: ptr.To(false), // the gateway container alone gets a token
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532),
			FSGroup: ptr.To[int64](65532), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		InitContainers: []corev1.Container{
			{ // copies the bridge: the gateway image, `reversi copy-binary`
				Name: "reversi-bin", Image: "reversi:latest", Args: []string{"copy-binary", "/reversi-bin/reversi"},
				Resources:       corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": q("10m"), "memory": q("32Mi")}, Limits: corev1.ResourceList{"memory": q("128Mi")}},
				VolumeMounts:    []corev1.VolumeMount{{Name: "reversi-bin", MountPath: "/reversi-bin"}},
				SecurityContext: restricted(true), ImagePullPolicy: corev1.PullAlways,
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			},
			{ // a native sidecar: its env and volumes its spec's alone
				Name: "upstream-memory", Image: "mcp/memory:1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				Command: append(bridge("memory", "per_client"), "node", "/app/dist/index.js"), Args: []string{"--verbose"}, WorkingDir: "/app",
				Env: []corev1.EnvVar{
					{Name: "MEMORY_FILE_PATH", Value: "/data/memory.json"},
					{Name: "API_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "mem-token"}, Key: "token"}}},
					{Name: "LEVEL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "mem-settings"}, Key: "level"}}},
				},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"memory": q("100Mi")}, Limits: corev1.ResourceList{"memory": q("300Mi"), "cpu": q("1")}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "reversi-bin", MountPath: "/reversi-bin", ReadOnly: true},
					{Name: "upstream-1-run", MountPath: "/run/reversi"},
					{Name: "upstream-1-tmp", MountPath: "/tmp"},
					{Name: "upstream-1-data", MountPath: "/data"},
					{Name: "upstream-1-settings", MountPath: "/etc/memory", ReadOnly: true},
				},
				SecurityContext: memorySC, ImagePullPolicy: corev1.PullIfNotPresent,
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			},
			{
				Name: "upstream-everything", Image: "mcp/everything:2", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				Command:   append(bridge("everything", "shared"), "node", "index.js"),
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": q("50m"), "memory": q("64Mi")}, Limits: corev1.ResourceList{"memory": q("512Mi")}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "reversi-bin", MountPath: "/reversi-bin", ReadOnly: true},
					{Name: "upstream-2-run", MountPath: "/run/reversi"},
					{Name: "upstream-2-tmp", MountPath: "/tmp"},
				},
				SecurityContext: restricted(true), ImagePullPolicy: corev1.PullIfNotPresent,
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			},
		},
		Containers: []corev1.Container{{
			Name: "gateway", Image: "reversi:latest",
			Args: []string{"gateway", "--config", "/etc/reversi/config/gateway.yaml", "--kube-configmap", ns + "/mem-manifests",
				"--kubeconfig", "", "--namespace", ns, "--gateway-name", "mem", "--store", "sqlite", "--data", "/var/lib/reversi"},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 7431, Protocol: corev1.ProtocolTCP}},
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
				{Name: ControllerKeysEnv, Value: string(ctlKey.PublicPEM)},
				{Name: "REVERSI_CONFIG_DIGEST", Value: configDigest},
				{Name: "REVERSI_UPSTREAM_0_HEADER_0", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "tickets-token"}, Key: "token"}}},
			},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": q("100m"), "memory": q("128Mi")}, Limits: corev1.ResourceList{"memory": q("512Mi")}},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "config", MountPath: "/etc/reversi/config", ReadOnly: true},
				{Name: "tmp", MountPath: "/tmp"},
				{Name: "data", MountPath: "/var/lib/reversi"},
				{Name: "auth", MountPath: "/etc/reversi/auth", ReadOnly: true},
				{Name: "upstream-1-run", MountPath: "/run/reversi/memory", ReadOnly: true}, // each socket folder its own
				{Name: "upstream-2-run", MountPath: "/run/reversi/everything", ReadOnly: true},
				{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
			},
			StartupProbe: probe("/healthz", 30), LivenessProbe: probe("/healthz", 3), ReadinessProbe: probe("/readyz", 3),
			SecurityContext: &corev1.SecurityContext{RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			ImagePullPolicy:        corev1.PullAlways,
			TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		}},
		Volumes: []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "mem-config"},
				Items: []corev1.KeyToPath{{Key: "gateway.yaml", Path: "gateway.yaml"}}, DefaultMode: ptr.To[int32](0o644)}}},
			emptyDir("tmp", "256Mi"),
			{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "mem-data"}}},
			{Name: "auth", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "gateway-keys", DefaultMode: ptr.To[int32](0o440),
				Items: []corev1.KeyToPath{{Key: "keys.json", Path: "keys.json"}}}}},
			emptyDir("reversi-bin", "256Mi"),
			{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o444), Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
			}}}},
			emptyDir("upstream-1-run", "1Mi"),
			emptyDir("upstream-1-tmp", "64Mi"),
			emptyDir("upstream-1-data", "128Mi"),
			{Name: "upstream-1-settings", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "mem-files"}, DefaultMode: ptr.To[int32](0o444)}}},
			emptyDir("upstream-2-run", "1Mi"),
			emptyDir("upstream-2-tmp", "64Mi"),
		},
		RestartPolicy: corev1.RestartPolicyAlways, TerminationGracePeriodSeconds: ptr.To[int64](30), DNSPolicy: corev1.DNSClusterFirst,
		SchedulerName: "default-scheduler", EnableServiceLinks: ptr.To(false), // no Services' env in the sidecars
	}
}

// Issue 23: a gateway with container upstreams renders, exactly, this pod: the init container
// reversi-bin (the gateway image running `reversi copy-binary /reversi-bin/reversi`), then one
// native sidecar per container upstream (restartPolicy Always) whose command is the bridge
// from the shared volume in front of the server's command, listening on
// /run/reversi/<name>.sock in a folder of its own (mounted read-only in the gateway container
// at /run/reversi/<name>/, so no server reaches another's socket); the
// sidecars run non-root with a read-only root, no privilege escalation, no capability and
// RuntimeDefault seccomp, with an emptyDir /tmp; their env is their spec's alone (the
// secretKeyRef only in the sidecar, the gateway's header Secret only in the gateway); no
// token is automounted and the gateway container alone mounts a projected one where
// client-go's in-cluster config reads it. gateway.yaml names the sockets with their session.
func TestGatewayRendersContainerUpstreams(t *testing.T) {
	ns := namespace(t)
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	create(t, memGateway(ns))
	waitGateway(t, ns, "mem", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))

	cfg := configMap(t, ns, "mem-config")
	if cfg == nil {
		t.Fatal("no mem-config")
	}
	data := cfg.Data[GatewayConfigKey]
	var doc struct {
		Upstreams []map[string]any `json:"upstreams"`
	}
	if err := yaml.Unmarshal([]byte(data), &doc); err != nil {
		t.Fatal(err)
	}
	wantUps := []map[string]any{
		{"name": "tickets", "url": "http://tickets-mcp.tools.svc:8080/mcp", "headers": map[string]any{"Authorization": "${REVERSI_UPSTREAM_0_HEADER_0}"}},
		{"name": "memory", "socket": "/run/reversi/memory/memory.sock", "session": "per_client"},
		{"name": "everything", "socket": "/run/reversi/everything/everything.sock", "session": "shared"},
	}
	if !reflect.DeepEqual(doc.Upstreams, wantUps) {
		t.Errorf("gateway.yaml upstreams:\n%s", diff.Diff(wantUps, doc.Upstreams))
	}

	var dep appsv1.Deployment
	get(t, ns, "mem-gateway", &dep)
	sum := sha256.Sum256([]byte(data))
	want := memPodSpec(ns, "sha256:"+hex.EncodeToString(sum[:]))
	if got := dep.Spec.Template.Spec; !reflect.DeepEqual(got, want) {
		t.Errorf("the pod spec differs (-want +got):\n%s", diff.Diff(want, got))
	}

	// RenderDeployment (what test/image runs the sidecar from) renders the same containers
	// from the same ReversiGateway, but for the API server's defaults of a Deployment.
	var served v1alpha1.ReversiGateway
	get(t, ns, "mem", &served)
	rendered, err := RenderDeployment(&served, "reversi:latest", ctlKey.PublicPEM)
	if err != nil {
		t.Fatal(err)
	}
	reconciled := dep.Spec.Template.Spec.DeepCopy()
	for _, list := range [][]corev1.Container{reconciled.InitContainers, reconciled.Containers} {
		for i := range list {
			list[i].ImagePullPolicy, list[i].TerminationMessagePath, list[i].TerminationMessagePolicy = "", "", ""
		}
	}
	if r := rendered.Spec.Template.Spec; !reflect.DeepEqual(r.InitContainers, reconciled.InitContainers) || !reflect.DeepEqual(r.Containers, reconciled.Containers) {
		t.Errorf("RenderDeployment's containers differ from the reconciler's (-reconciler +RenderDeployment):\n%s",
			diff.Diff(append(reconciled.InitContainers, reconciled.Containers...), append(r.InitContainers, r.Containers...)))
	}

	// What the literal above says, as properties: no sidecar sees a Secret but its own, a
	// volume of the gateway's or a token.
	pod := dep.Spec.Template.Spec
	for _, c := range pod.InitContainers[1:] {
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && r.SecretKeyRef.Name != "mem-token" {
				t.Errorf("sidecar %s reads Secret %s", c.Name, r.SecretKeyRef.Name)
			}
		}
		for _, m := range c.VolumeMounts {
			if slices.Contains([]string{"config", "auth", "data", "tmp", "kube-api-access"}, m.Name) || strings.HasPrefix(m.MountPath, "/var/run/secrets") {
				t.Errorf("sidecar %s mounts %s at %s", c.Name, m.Name, m.MountPath)
			}
		}
	}
}

// Issue 23: a container upstream's readOnlyRootFilesystem: false and its secret volume are
// rendered as written: the sidecar's root is writable (every other restriction kept), the
// Secret is mounted read-only at the spec's path in that sidecar alone (volume
// upstream-<i>-<name>, every key, mode 0440), and neither the gateway container nor another
// sidecar mounts it. The rest of the pod is memPodSpec's, exactly.
func TestGatewayRendersContainerUpstreamWritableRootAndSecret(t *testing.T) {
	ns := namespace(t)
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	gw := memGateway(ns)
	c := gw.Spec.Upstreams[2].Container
	c.SecurityContext = &v1alpha1.UpstreamSecurityContext{ReadOnlyRootFilesystem: ptr.To(false)}
	c.Volumes = []v1alpha1.UpstreamVolume{{Name: "creds", MountPath: "/etc/everything/creds", Secret: &v1alpha1.LocalObjectReference{Name: "everything-creds"}}}
	create(t, gw)
	waitGateway(t, ns, "mem", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))

	cfg := configMap(t, ns, "mem-config")
	if cfg == nil {
		t.Fatal("no mem-config")
	}
	var dep appsv1.Deployment
	get(t, ns, "mem-gateway", &dep)
	sum := sha256.Sum256([]byte(cfg.Data[GatewayConfigKey]))
	want := memPodSpec(ns, "sha256:"+hex.EncodeToString(sum[:]))
	everything := &want.InitContainers[2]
	everything.SecurityContext.ReadOnlyRootFilesystem = ptr.To(false)
	everything.VolumeMounts = append(everything.VolumeMounts, corev1.VolumeMount{Name: "upstream-2-creds", MountPath: "/etc/everything/creds", ReadOnly: true})
	want.Volumes = append(want.Volumes, corev1.Volume{Name: "upstream-2-creds", VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: "everything-creds", DefaultMode: ptr.To[int32](0o440)}}})
	got := dep.Spec.Template.Spec
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the pod spec differs (-want +got):\n%s", diff.Diff(want, got))
	}

	// The same, as properties.
	for _, ic := range got.InitContainers {
		if ro := ic.SecurityContext.ReadOnlyRootFilesystem; ro == nil || *ro != (ic.Name != "upstream-everything") {
			t.Errorf("container %s: readOnlyRootFilesystem %v", ic.Name, ptr.Deref(ro, true))
		}
	}
	for _, ct := range append(slices.Clone(got.InitContainers), got.Containers...) {
		for _, m := range ct.VolumeMounts {
			if m.Name == "upstream-2-creds" && (ct.Name != "upstream-everything" || !m.ReadOnly || m.MountPath != "/etc/everything/creds") {
				t.Errorf("container %s mounts the server's Secret: %+v", ct.Name, m)
			}
		}
	}
}

// Issue 23, the reconciler's backstop: with admission bypassed, a container upstream whose
// image is outside the policy stalls the gateway with ImageNotAllowed, naming the field and
// the flag, and nothing is rendered.
func TestGatewayUpstreamImageNotAllowed(t *testing.T) {
	ns := namespace(t)
	gw := memGateway(ns)
	gw.Spec.Upstreams[2].Container.Image = "attacker.example/everything:1"
	testenv.WithoutAdmission(t, k8s, ns, func() { create(t, gw) })
	got := waitGateway(t, ns, "mem", readyIs(metav1.ConditionFalse, v1alpha1.ReasonImageNotAllowed))
	const want = `spec.upstreams[2].container.image "attacker.example/everything:1" is not allowed: the controller runs upstream container images matching mcp/* (reversi controller --upstream-images`
	if c := condition(got.Status.Conditions, v1alpha1.ConditionReady); !strings.Contains(c.Message, want) {
		t.Errorf("Ready: %q, want it to say %q", c.Message, want)
	}
	if cm := configMap(t, ns, "mem-config"); cm != nil {
		t.Errorf("mem-config was rendered for a disallowed upstream image")
	}
}

// Issue 23, admission (the API server's webhook, real RBAC): an author who may create
// ReversiGateways, Deployments and claims and read the Secret and ConfigMaps of memGateway
// but not the Secret a container upstream's env names, is refused, the field named; so is an
// upstream image outside the policy; both at once. With the Secret readable and the image
// allowed the gateway is admitted.
func TestGatewayContainerUpstreamAdmission(t *testing.T) {
	ns := namespace(t)
	const carol = "carol@corp.example"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway-author"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversigateways"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"tickets-token", "gateway-keys"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"mem-settings", "mem-files"}, Verbs: []string{"get"}},
	}}
	create(t, role)
	create(t, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway-author"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "gateway-author"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: carol}}})
	as := clientAs(t, carol, "uid-carol")
	refused := func(gw *v1alpha1.ReversiGateway, wants ...string) {
		t.Helper()
		err := as.Create(t.Context(), gw)
		if err == nil {
			t.Fatalf("admitted, want a refusal saying %q", wants)
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("refusal:\n%v\nwant it to say %q", err, w)
			}
		}
	}
	const noSecret = `user "carol@corp.example" may not get secret "mem-token" (spec.upstreams[1].container.env[1].valueFrom.secretKeyRef)`
	const noImage = `spec.upstreams[2].container.image "attacker.example/everything:1" is not allowed: the controller runs upstream container images matching mcp/*`
	refused(memGateway(ns), noSecret)
	bad := memGateway(ns)
	bad.Spec.Upstreams[2].Container.Image = "attacker.example/everything:1"
	refused(bad, noSecret, noImage)

	role.Rules[3].ResourceNames = append(role.Rules[3].ResourceNames, "mem-token")
	if err := k8s.Update(t.Context(), role); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string { // the authorizer's cache of RBAC
		err := as.Create(t.Context(), bad)
		if err == nil {
			return "admitted an image outside the policy"
		}
		if strings.Contains(err.Error(), "may not get secret") {
			return "the role change is not seen yet: " + err.Error()
		}
		if !strings.Contains(err.Error(), noImage) {
			t.Fatalf("refusal %v, want the image alone", err)
		}
		return ""
	})
	if err := as.Create(t.Context(), memGateway(ns)); err != nil {
		t.Fatalf("every right and allowed images: %v", err)
	}
}

// Issue 23, the webhook's logic: container upstreams' images are checked against
// UpstreamImages, or the gateway images' policy without it; their Secrets and ConfigMaps
// each cost one review, and a refusal names every missing one with its field.
func TestReversiGatewayWebhookContainerUpstreams(t *testing.T) {
	f := &fakeAuthorizer{allowed: map[string]bool{"create deployments.apps": true, "create persistentvolumeclaims": true,
		"get secrets/tickets-token": true, "get secrets/gateway-keys": true, "get configmaps/mem-files": true}}
	w := f.webhook(t)
	gw := memGateway("team-a")
	_, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), gw)
	var refusal *ReversiGatewayAdmissionError
	if !errors.As(err, &refusal) {
		t.Fatalf("%v, want a ReversiGatewayAdmissionError", err)
	}
	// Without UpstreamImages, the gateway images' policy (reversi, reversi:*, reversi@sha256:*).
	for _, want := range []string{
		`may not get secret "mem-token" (spec.upstreams[1].container.env[1].valueFrom.secretKeyRef)`,
		`may not get configmap "mem-settings" (spec.upstreams[1].container.env[2].valueFrom.configMapKeyRef)`,
		`spec.upstreams[1].container.image "mcp/memory:1" is not allowed: the controller runs upstream container images matching reversi, reversi:*, reversi@sha256:* (reversi controller --upstream-images, by default the --gateway-images patterns)`,
		`spec.upstreams[2].container.image "mcp/everything:2" is not allowed`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal:\n%s\nwant it to say %q", err, want)
		}
	}
	if len(refusal.Missing) != 2 || len(refusal.UpstreamImages) != 2 || refusal.Image != nil || strings.Contains(err.Error(), "mem-files") {
		t.Errorf("refusal %+v", refusal)
	}
	if len(f.reviews) != 7 { // a Deployment, its claim, three Secrets, two ConfigMaps
		t.Errorf("%d reviews, want 7", len(f.reviews))
	}
	f.allowed["get secrets/mem-token"], f.allowed["get configmaps/mem-settings"] = true, true
	if w.UpstreamImages, err = NewImagePolicy([]string{"mcp/*"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), gw); err != nil {
		t.Errorf("every right, images allowed by UpstreamImages: %v", err)
	}
	gw.Spec.Image = "mcp/memory:1" // UpstreamImages do not allow an image as the gateway's
	if _, err := w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), gw); !errors.As(err, &refusal) || refusal.Image == nil || len(refusal.UpstreamImages) != 0 {
		t.Errorf("a server image as spec.image: %v", err)
	}
}

// checkContainerUpstreams refuses an emptyDir sizeLimit the schema lets through (0, negative,
// above 1Gi) and renderConfig reports it.
func TestContainerUpstreamSizeLimit(t *testing.T) {
	for size, ok := range map[string]bool{"1Gi": true, "64Mi": true, "0": false, "-1Mi": false, "1025Mi": false} {
		gw := memGateway("team-a")
		gw.Spec.Upstreams[1].Container.Volumes[0].EmptyDir.SizeLimit = ptr.To(resource.MustParse(size))
		_, err := renderConfig(gw)
		if ok != (err == nil) || !ok && !strings.Contains(err.Error(), "spec.upstreams[1].container.volumes[0].emptyDir.sizeLimit is "+size+": give a size above 0 and at most 1Gi") {
			t.Errorf("sizeLimit %s: %v", size, err)
		}
	}
}

// checkContainerUpstreams refuses, as the CRD does, a mount path that the runtime would take
// for the sidecar's own folders (a doubled slash, . or .. segments), whatever CRD is installed.
func TestContainerUpstreamMountPath(t *testing.T) {
	for p, ok := range map[string]bool{"/data": true, "/run/other": true, "/tmp/x": true, "/reversi-binx": true,
		"//tmp": false, "/run//reversi": false, "//reversi-bin": false, "/data/../run/reversi": false, "/./tmp": false,
		"/tmp": false, "/run/reversi/x": false, "/reversi-bin": false, "/": false, "data": false, "/data/": false} {
		gw := memGateway("team-a")
		gw.Spec.Upstreams[1].Container.Volumes[0].MountPath = p
		_, err := renderConfig(gw)
		if ok != (err == nil) || !ok && !strings.Contains(err.Error(), "spec.upstreams[1].container.volumes[0].mountPath") {
			t.Errorf("mountPath %s: %v", p, err)
		}
	}
}

// An author who may not read a Secret or ConfigMap cannot have it mounted into a server
// they control: a volume's secret and configMap are reviewed as an env's are, each refusal
// naming its field; the gateway's own Secret (gateway-keys, readable) named by a server's
// volume passes only because the author may read it.
func TestReversiGatewayWebhookContainerVolumes(t *testing.T) {
	f := &fakeAuthorizer{allowed: map[string]bool{"create deployments.apps": true, "create persistentvolumeclaims": true,
		"get secrets/tickets-token": true, "get secrets/gateway-keys": true, "get secrets/mem-token": true,
		"get configmaps/mem-files": true, "get configmaps/mem-settings": true}}
	w := f.webhook(t)
	var err error
	if w.UpstreamImages, err = NewImagePolicy([]string{"mcp/*"}); err != nil {
		t.Fatal(err)
	}
	gw := memGateway("team-a")
	c := gw.Spec.Upstreams[2].Container
	c.Volumes = []v1alpha1.UpstreamVolume{
		{Name: "creds", MountPath: "/creds", Secret: &v1alpha1.LocalObjectReference{Name: "db-admin"}},
		{Name: "keys", MountPath: "/keys", Secret: &v1alpha1.LocalObjectReference{Name: "gateway-keys"}},
		{Name: "ca", MountPath: "/ca", ConfigMap: &v1alpha1.ConfigMapReference{Name: "other-gateway-config"}},
	}
	_, err = w.ValidateCreate(admissionCtx(t, admissionv1.Create, bobInfo), gw)
	var refusal *ReversiGatewayAdmissionError
	if !errors.As(err, &refusal) || len(refusal.Missing) != 2 {
		t.Fatalf("%v, want two missing rights", err)
	}
	for _, want := range []string{
		`may not get secret "db-admin" (spec.upstreams[2].container.volumes[0].secret)`,
		`may not get configmap "other-gateway-config" (spec.upstreams[2].container.volumes[2].configMap)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal:\n%s\nwant it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `"gateway-keys"`) {
		t.Errorf("a readable Secret refused: %s", err)
	}
}

// At the limits the schema allows (16 container upstreams among 64, the last at index 63, names
// of 54 characters, 8 volumes of 40-character names each) the rendered Deployment is valid to the
// API server (dry run): names of containers and volumes stay DNS labels and unique, and no two
// sidecars share a volume or a socket folder.
func TestContainerUpstreamsAtTheLimits(t *testing.T) {
	ns := namespace(t)
	gw := &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "limits"},
		Spec: v1alpha1.ReversiGatewaySpec{Auth: &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "k", Key: "keys.json"}}}}
	for i := range 64 {
		u := v1alpha1.GatewayUpstream{Name: fmt.Sprintf("u%d", i), URL: "https://mcp.example.com/mcp"}
		if i >= 48 {
			u = v1alpha1.GatewayUpstream{Name: fmt.Sprintf("%02d", i) + strings.Repeat("n", 52), Container: &v1alpha1.UpstreamContainer{Image: "mcp/a:1", Command: []string{"a"}}}
			for j := range 8 {
				u.Container.Volumes = append(u.Container.Volumes, v1alpha1.UpstreamVolume{Name: fmt.Sprintf("%d", j) + strings.Repeat("v", 39),
					MountPath: fmt.Sprintf("/v%d", j), EmptyDir: &v1alpha1.UpstreamEmptyDir{}})
			}
		}
		gw.Spec.Upstreams = append(gw.Spec.Upstreams, u)
	}
	if err := k8s.Create(t.Context(), gw.DeepCopy(), client.DryRunAll); err != nil {
		t.Fatalf("the ReversiGateway: %v", err)
	}
	rc, err := renderConfig(gw)
	if err != nil {
		t.Fatal(err)
	}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "limits-gateway"}}
	mutateDeployment(d, gw, "reversi:latest", rc, nil)
	if err := k8s.Create(t.Context(), d, client.DryRunAll); err != nil {
		t.Fatalf("the rendered Deployment: %v", err)
	}
	seen := map[string]string{}
	for _, c := range append(slices.Clone(d.Spec.Template.Spec.InitContainers), d.Spec.Template.Spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if c.Name == GatewayContainer || m.Name == binVolume {
				continue
			}
			if other, ok := seen[m.Name]; ok {
				t.Errorf("volume %s is mounted by %s and %s", m.Name, other, c.Name)
			}
			seen[m.Name] = c.Name
		}
	}
}
