package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
)

// Where the gateway container finds its files, and the names the rendering uses. The
// Deployment mounts `<gateway>-config` at GatewayConfigDir and the auth key file at
// GatewayAuthDir; the sqlite store lives in GatewayDataDir.
const (
	GatewayConfigDir   = "/etc/reversi/config"
	GatewayConfigKey   = "gateway.yaml"
	GatewayAuthDir     = "/etc/reversi/auth"
	GatewayAuthKey     = "keys.json"
	GatewayDataDir     = "/var/lib/reversi"
	GatewayContainer   = "gateway"
	GatewayPortName    = "http"
	GatewayUID         = 65532 // distroless "nonroot"
	DefaultGatewayPort = 7431
	// DefaultGatewayImage is the image of a ReversiGateway without spec.image when the
	// controller was not given one (Options.GatewayImage).
	DefaultGatewayImage = "reversi:latest"
	// PodNameEnv tells a gateway pod its own name (downward API): the name of the Lease it
	// reports the manifest digest it serves on (the controller creates that Lease), and its
	// replica name (consumedBy, status.rollback.replica).
	PodNameEnv = "POD_NAME"
	// DatabaseURLEnv carries the postgres store's URL (internal/cli reads it).
	DatabaseURLEnv = "REVERSI_DATABASE_URL"
	// ConfigDigestEnv carries `sha256:<hex>` of the rendered gateway.yaml: the gateway refuses
	// to start on a config file with another digest (the ConfigMap was edited by hand).
	ConfigDigestEnv = "REVERSI_CONFIG_DIGEST"
)

// gatewayNames are the names of a gateway's owned objects.
type gatewayNames struct {
	gw, ns    string
	config    string // <gw>-config
	manifests string // <gw>-manifests (shard 0)
	object    string // ServiceAccount, Role, RoleBinding, Deployment, Service: <gw>-gateway
	data      string // the sqlite PVC: <gw>-data
}

func namesOf(gw *v1alpha1.ReversiGateway) gatewayNames {
	return gatewayNames{gw: gw.Name, ns: gw.Namespace, config: gw.Name + "-config", manifests: gw.Name + "-manifests",
		object: gw.Name + "-gateway", data: gw.Name + "-data"}
}

// manifestShard is the name of shard i of `<gw>-manifests`.
func (n gatewayNames) manifestShard(i int) string {
	if i == 0 {
		return n.manifests
	}
	return n.manifests + "-" + strconv.Itoa(i)
}

// gatewayLabels are the labels of every owned object and the pods' selector.
func gatewayLabels(gw *v1alpha1.ReversiGateway) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":     "reversi-gateway",
		"app.kubernetes.io/instance": gw.Name,
		LabelManagedBy:               ManagedBy,
		v1alpha1.LabelGateway:        gw.Name,
	}
}

func selectorLabels(gw *v1alpha1.ReversiGateway) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "reversi-gateway", v1alpha1.LabelGateway: gw.Name}
}

func gatewayPort(gw *v1alpha1.ReversiGateway) int32 {
	if gw.Spec.Port > 0 {
		return gw.Spec.Port
	}
	return DefaultGatewayPort
}

// renderedConfig is the gateway.yaml of a gateway and the container environment its ${NAME}
// references read (values from Secrets, by secretKeyRef: the Secret values never enter the
// ConfigMap).
type renderedConfig struct {
	data []byte
	env  []corev1.EnvVar
}

// renderConfig writes the gateway.yaml the pod runs with (gateway/config: the seed's field
// names) from the spec, and checks it with the gateway's own parser so that a spec the
// gateway would refuse at start is reported on the ReversiGateway instead of in a crash loop.
func renderConfig(gw *v1alpha1.ReversiGateway) (renderedConfig, error) {
	var rc renderedConfig
	if err := checkContainerUpstreams(gw); err != nil {
		return rc, err
	}
	s := gw.Spec
	doc := map[string]any{}
	if s.Mode != "" {
		doc["mode"] = s.Mode
	}
	if s.UnclassifiedReads != "" {
		doc["unclassified_reads"] = s.UnclassifiedReads
	}
	if s.ValidateSchemas != nil {
		doc["validate_schemas"] = *s.ValidateSchemas
	}
	if s.OutputSchemas != "" {
		doc["output_schemas"] = s.OutputSchemas
	}
	if s.Actor != "" {
		doc["actor"] = s.Actor
	}
	if len(s.Permissions) > 0 {
		doc["permissions"] = s.Permissions
	}
	if len(s.Allow) > 0 {
		doc["allow"] = s.Allow
	}
	if len(s.Deny) > 0 {
		doc["deny"] = s.Deny
	}
	// value returns what the config says for v: the literal, or a ${NAME} reference to an
	// env var of the container (a Secret's key, or a literal that itself contains "${",
	// which gateway.yaml cannot write).
	value := func(envName string, v v1alpha1.ValueFrom) string {
		switch {
		case v.SecretKeyRef != nil:
			rc.env = append(rc.env, corev1.EnvVar{Name: envName, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: v.SecretKeyRef.Name}, Key: v.SecretKeyRef.Key}}})
		case strings.Contains(v.Value, "${"):
			rc.env = append(rc.env, corev1.EnvVar{Name: envName, Value: v.Value})
		default:
			return v.Value
		}
		return "${" + envName + "}"
	}
	var ups []any
	for i, u := range s.Upstreams {
		up := map[string]any{"name": u.Name}
		switch u.Session {
		case "Shared":
			up["session"] = "shared"
		case "PerClient":
			up["session"] = "per_client"
		}
		if u.Resources != nil {
			up["resources"] = *u.Resources
		}
		if u.NamespaceTools != nil {
			up["namespace"] = *u.NamespaceTools
		}
		switch {
		case u.Container != nil:
			// The sidecar's bridge listens there (issue 23); the session is written out, as
			// it is the bridge's too.
			up["socket"] = GatewaySocket(u.Name)
			up["session"] = bridgeSession(u)
		case u.URL != "":
			up["url"] = u.URL
			if len(u.Headers) > 0 {
				h := map[string]any{}
				for j, v := range u.Headers {
					h[v.Name] = value(fmt.Sprintf("REVERSI_UPSTREAM_%d_HEADER_%d", i, j), v)
				}
				up["headers"] = h
			}
		default:
			up["command"] = u.Command
			if len(u.Args) > 0 {
				args := make([]string, len(u.Args))
				for j, a := range u.Args {
					args[j] = value(fmt.Sprintf("REVERSI_UPSTREAM_%d_ARG_%d", i, j), v1alpha1.ValueFrom{Value: a})
				}
				up["args"] = args
			}
			if len(u.Env) > 0 {
				e := map[string]any{}
				for j, v := range u.Env {
					e[v.Name] = value(fmt.Sprintf("REVERSI_UPSTREAM_%d_ENV_%d", i, j), v)
				}
				up["env"] = e
			}
		}
		ups = append(ups, up)
	}
	doc["upstreams"] = ups
	doc["listen"] = map[string]any{"host": "0.0.0.0", "port": gatewayPort(gw)}
	// The names clients reach the pods by: the Service's DNS names first (the first one is
	// the derived resource URL), then loopback for kubectl port-forward.
	svc := namesOf(gw).object
	doc["allowed_hosts"] = []string{svc + "." + gw.Namespace + ".svc", svc + "." + gw.Namespace + ".svc.cluster.local",
		svc + "." + gw.Namespace, svc, "localhost", "127.0.0.1"}
	if a := s.Auth; a != nil {
		au := map[string]any{}
		if a.KeysSecretRef != nil {
			au["keys"] = GatewayAuthDir + "/" + GatewayAuthKey
		}
		if o := a.OIDC; o != nil {
			oi := map[string]any{"issuer": o.Issuer, "audience": o.Audience}
			if len(o.RoleMap) > 0 {
				oi["role_map"] = o.RoleMap
			}
			if o.RoleClaim != "" {
				oi["role_claim"] = o.RoleClaim
			}
			if o.ActorClaim != "" {
				oi["actor_claim"] = o.ActorClaim
			}
			// issue 16: the identity the API server gives the same token
			for k, v := range map[string]string{"actor_prefix": o.ActorPrefix, "uid_claim": o.UIDClaim, "email_claim": o.EmailClaim} {
				if v != "" {
					oi[k] = v
				}
			}
			if o.JWKSURI != "" {
				oi["jwks_uri"] = o.JWKSURI
			}
			au["oidc"] = oi
		}
		doc["auth"] = au
	}
	// The notification receivers (issue 24): URL and HMAC key are ${NAME} references to env
	// vars read from the Secrets, so the values never enter the ConfigMap. The gateway's
	// parser checks the URLs it reads when the pod starts; here they stand for one.
	urls := map[string]bool{}
	if len(s.Notifications) > 0 {
		var ns []any
		for i, n := range s.Notifications {
			ref := func(env string, r v1alpha1.SecretKeyReference) string {
				rc.env = append(rc.env, corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: r.Name}, Key: r.Key}}})
				return "${" + env + "}"
			}
			urlEnv := fmt.Sprintf("REVERSI_NOTIFICATION_%d_URL", i)
			urls[urlEnv] = true
			e := map[string]any{"name": n.Name, "type": strings.ToLower(n.Type), "url": ref(urlEnv, n.URLSecretRef)}
			if n.SecretRef != nil {
				e["secret"] = ref(fmt.Sprintf("REVERSI_NOTIFICATION_%d_SECRET", i), *n.SecretRef)
			}
			for k, l := range map[string][]string{"events": n.Events, "tools": n.Tools, "risk": n.Risk} {
				if len(l) > 0 {
					e[k] = l
				}
			}
			ns = append(ns, e)
		}
		doc["notifications"] = ns
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		return rc, err
	}
	rc.data = data
	defined := map[string]bool{}
	for _, e := range rc.env {
		defined[e.Name] = true
	}
	lookup := func(name string) (string, bool) {
		if urls[name] {
			return "https://receiver.invalid/", true
		}
		return "set", defined[name]
	}
	if _, errs := config.Parse(GatewayConfigKey, data, lookup); len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return rc, errors.New("the rendered gateway.yaml would be refused by the gateway: " + strings.Join(msgs, "; "))
	}
	return rc, nil
}

// gatewayConfigMaps are the names of the ConfigMaps a gateway reads: `<gw>-config` and the
// shards of `<gw>-manifests` (at least one).
func gatewayConfigMaps(gw *v1alpha1.ReversiGateway, shards int) []string {
	n := namesOf(gw)
	cms := []string{n.config}
	for i := range max(shards, 1) {
		cms = append(cms, n.manifestShard(i))
	}
	return cms
}

// gatewayRules are the gateway's permissions, exactly (least privilege, issue 17): every rule
// says why it is there, and names its objects wherever the names are known in advance.
// configMaps are those of gatewayConfigMaps that the ReversiGateway controls or that do not
// exist yet (ownConfigMaps: a ConfigMap of the same name that another owner has is a conflict,
// and the Role must not let the gateway read it); leases are the names of the pods' Leases the
// ReversiGateway controls (podLeases), sorted. Nothing here reaches pods: the replica's name
// comes from $POD_NAME (downward API) and its report goes to its Lease. Nothing updates a
// run's spec (spec.rollback is the operators'), and admission (GatewayObjectsWebhook) keeps
// each gateway to its own ApprovalRequests and ReversiRuns (issue 16).
func gatewayRules(gw *v1alpha1.ReversiGateway, configMaps, leases []string) []rbacv1.PolicyRule {
	var rules []rbacv1.PolicyRule
	if len(configMaps) > 0 { // an empty resourceNames would grant every ConfigMap in the namespace
		// Its gateway.yaml and manifest shards, by name (one informer per object, by field selector).
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: slices.Clone(configMaps), Verbs: []string{"get", "list", "watch"}})
	}
	if ref := gw.Spec.TrustedKeysSecretRef; ref != nil {
		// The trusted writer keys, by name: the pods verify every manifest's signature again.
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{ref.Name}, Verbs: []string{"get", "list", "watch"}})
	}
	if len(leases) > 0 { // an empty resourceNames would grant every Lease in the namespace
		// Its pods' Leases, by name, patch only: each reports the digest it serves (no code runs from it).
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"}, ResourceNames: slices.Clone(leases), Verbs: []string{"patch"}})
	}
	return append(rules,
		// Its approval queue: create per held call, read phases, patch consumedAt (names made per call).
		rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"approvalrequests"}, Verbs: []string{"get", "list", "watch", "create", "patch"}},
		// Its runs: one ReversiRun per agent session (names made per session), read for spec.rollback.
		rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"reversiruns"}, Verbs: []string{"get", "list", "watch", "create"}},
		// Its runs' status: the mirror of the ledger (steps, counts, rollback results).
		rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"reversiruns/status"}, Verbs: []string{"get", "update", "patch"}},
		// The approvers' decisions on its requests, read only (the controller counts them).
		rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"approvals"}, Verbs: []string{"get", "list", "watch"}},
		// Events on the requests it creates (ApprovalRequested, issue 24): create, and patch for
		// an event's series. No read: the gateway sees no one's events.
		rbacv1.PolicyRule{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	)
}

// gatewayArgs are the container's arguments: `reversi gateway` with the rendered config, the
// manifests ConfigMap watched through the API, the approval queue and runs in the namespace
// (in-cluster credentials: --kubeconfig ”), named after the ReversiGateway.
func gatewayArgs(gw *v1alpha1.ReversiGateway) []string {
	n := namesOf(gw)
	args := []string{"gateway",
		"--config", GatewayConfigDir + "/" + GatewayConfigKey,
		"--kube-configmap", n.ns + "/" + n.manifests,
	}
	if ref := gw.Spec.TrustedKeysSecretRef; ref != nil {
		args = append(args, "--kube-trusted-keys", ref.Name)
	}
	args = append(args, "--kubeconfig", "", "--namespace", n.ns, "--gateway-name", gw.Name)
	if storeType(gw) == v1alpha1.StorePostgres {
		args = append(args, "--store", "postgres")
	} else {
		args = append(args, "--store", "sqlite", "--data", GatewayDataDir)
	}
	return args
}

func storeType(gw *v1alpha1.ReversiGateway) string {
	if gw.Spec.Store != nil && gw.Spec.Store.Type == v1alpha1.StorePostgres {
		return v1alpha1.StorePostgres
	}
	return v1alpha1.StoreSQLite
}

// gatewayPodSpec is the pod the Deployment runs: non-root, read-only root filesystem, no
// privilege escalation, every capability dropped, probes on /healthz and /readyz.
func gatewayPodSpec(gw *v1alpha1.ReversiGateway, image string, rc renderedConfig, controllerKeys []byte) corev1.PodSpec {
	n := namesOf(gw)
	cfgSum := sha256.Sum256(rc.data)
	env := []corev1.EnvVar{{Name: PodNameEnv, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
		{Name: ControllerKeysEnv, Value: string(controllerKeys)},
		{Name: ConfigDigestEnv, Value: "sha256:" + hex.EncodeToString(cfgSum[:])}}
	env = append(env, rc.env...)
	mounts := []corev1.VolumeMount{
		{Name: "config", MountPath: GatewayConfigDir, ReadOnly: true},
		{Name: "tmp", MountPath: "/tmp"},
		{Name: "data", MountPath: GatewayDataDir},
	}
	volumes := []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: n.config},
			Items:                []corev1.KeyToPath{{Key: GatewayConfigKey, Path: GatewayConfigKey}}}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("256Mi"))}}},
	}
	if storeType(gw) == v1alpha1.StorePostgres {
		ref := gw.Spec.Store.Postgres.URLSecretRef
		env = append(env, corev1.EnvVar{Name: DatabaseURLEnv, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name}, Key: ref.Key}}})
		// The data folder still holds nothing durable; an emptyDir keeps the root read-only.
		volumes = append(volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	} else {
		volumes = append(volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: n.data}}})
	}
	if a := gw.Spec.Auth; a != nil && a.KeysSecretRef != nil {
		mounts = append(mounts, corev1.VolumeMount{Name: "auth", MountPath: GatewayAuthDir, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: "auth", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: a.KeysSecretRef.Name, DefaultMode: ptr.To[int32](0o440),
			Items: []corev1.KeyToPath{{Key: a.KeysSecretRef.Key, Path: GatewayAuthKey}}}}})
	}
	probe := func(path string, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:   corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString(GatewayPortName)}},
			TimeoutSeconds: 3, PeriodSeconds: 10, FailureThreshold: failures, SuccessThreshold: 1,
		}
	}
	pod := corev1.PodSpec{
		ServiceAccountName:           n.object,
		AutomountServiceAccountToken: ptr.To(true),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](GatewayUID), RunAsGroup: ptr.To[int64](GatewayUID),
			FSGroup: ptr.To[int64](GatewayUID), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{{
			Name: GatewayContainer, Image: image, Args: gatewayArgs(gw), Env: env,
			Ports:          []corev1.ContainerPort{{Name: GatewayPortName, ContainerPort: gatewayPort(gw), Protocol: corev1.ProtocolTCP}},
			StartupProbe:   probe("/healthz", 30),
			LivenessProbe:  probe("/healthz", 3),
			ReadinessProbe: probe("/readyz", 3),
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
			},
			SecurityContext: &corev1.SecurityContext{
				RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
				Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			},
			VolumeMounts: mounts,
		}},
		Volumes: volumes,
	}
	if hasContainerUpstreams(gw) {
		addSidecars(&pod, gw, image)
	}
	return pod
}

// configDigest hashes what a running pod read at start (gateway.yaml and the container
// settings), for the pod template's annotation.
func configDigest(rc renderedConfig, pod corev1.PodSpec) string {
	h := sha256.New()
	h.Write(rc.data)
	fmt.Fprintf(h, "%v\n", pod.Containers[0].Args)
	for _, e := range pod.Containers[0].Env {
		fmt.Fprintf(h, "%s=%s %v\n", e.Name, e.Value, e.ValueFrom)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// mutateDeployment sets the fields of the gateway's Deployment that the controller owns.
func mutateDeployment(d *appsv1.Deployment, gw *v1alpha1.ReversiGateway, image string, rc renderedConfig, controllerKeys []byte) {
	replicas := int32(1)
	if gw.Spec.Replicas != nil {
		replicas = *gw.Spec.Replicas
	}
	pod := gatewayPodSpec(gw, image, rc, controllerKeys)
	d.Labels = mergeLabels(d.Labels, gatewayLabels(gw))
	d.Spec.Replicas = &replicas
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: selectorLabels(gw)}
	if storeType(gw) == v1alpha1.StoreSQLite {
		// One pod holds the sqlite file at a time (a ReadWriteOnce volume).
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	} else {
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType}
	}
	d.Spec.Template.Labels = gatewayLabels(gw)
	d.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationConfigDigest: configDigest(rc, pod)}
	d.Spec.Template.Spec = pod
}

// RenderDeployment is gw's Deployment as the reconciler renders it (renderConfig, then
// mutateDeployment), with image as the gateway image and controllerKeys the controller's
// public keys, without a control plane: for tests that run the rendered containers
// (test/image). It is not defaulted by an API server (image pull policy, termination message).
func RenderDeployment(gw *v1alpha1.ReversiGateway, image string, controllerKeys []byte) (*appsv1.Deployment, error) {
	rc, err := renderConfig(gw)
	if err != nil {
		return nil, err
	}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: gw.Namespace, Name: namesOf(gw).object}}
	mutateDeployment(d, gw, image, rc, controllerKeys)
	return d, nil
}

func mergeLabels(have, want map[string]string) map[string]string {
	if have == nil {
		have = map[string]string{}
	}
	for k, v := range want {
		have[k] = v
	}
	return have
}

// sortedStrings returns the map's keys in order.
func sortedStrings(m map[string][]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
