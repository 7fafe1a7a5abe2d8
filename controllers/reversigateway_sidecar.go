package controllers

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// Container upstreams (issue 23): each runs as a native sidecar of the gateway pod (an init
// container with restartPolicy Always, so it starts before the gateway and stops after it),
// its entrypoint `reversi stdio-bridge`, which runs the server as its child and serves its
// stdio on a Unix socket in BridgeSocketDir, where the gateway connects (`socket:` in
// gateway.yaml). The bridge is the gateway image's own binary, copied by the init container
// CopyBinaryContainer into an emptyDir at BridgeBinDir (the image is FROM scratch: `reversi
// copy-binary` does the copy). The pod mounts no ServiceAccount token of its own accord:
// the gateway container alone gets one, from a projected volume at ServiceAccountDir.
const (
	// GatewayBinary is the reversi binary in the gateway image (its ENTRYPOINT).
	GatewayBinary = "/reversi"
	// CopyBinaryContainer is the init container that copies the bridge.
	CopyBinaryContainer = "reversi-bin"
	// BridgeBinDir holds the bridge (the reversi binary), BridgeBinary is its path.
	BridgeBinDir = "/reversi-bin"
	BridgeBinary = BridgeBinDir + "/reversi"
	// BridgeSocketDir holds a sidecar's socket, /run/reversi/<upstream>.sock. Each sidecar
	// has its own folder (an emptyDir), so a server cannot reach or replace another's socket;
	// the gateway container mounts each one at /run/reversi/<upstream>/ (GatewaySocket).
	BridgeSocketDir = "/run/reversi"
	// ServiceAccountDir is where client-go's in-cluster config reads the token, the CA and
	// the namespace.
	ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	// UpstreamContainerPrefix starts a sidecar's name: upstream-<upstream name>.
	UpstreamContainerPrefix = "upstream-"

	binVolume = "reversi-bin"
	apiVolume = "kube-api-access"
	// maxUpstreamEmptyDir bounds an upstream's emptyDir volume; defaultUpstreamEmptyDir is
	// its size when unset.
	maxUpstreamEmptyDir     = "1Gi"
	defaultUpstreamEmptyDir = "64Mi"
	// tokenExpirationSeconds is the lifetime of the gateway's projected token (what the
	// ServiceAccount admission plugin gives the kube-api-access volume; the kubelet renews it).
	tokenExpirationSeconds = 3607
)

// BridgeSocket is the socket of the upstream name in its sidecar (the bridge's --listen).
func BridgeSocket(name string) string { return BridgeSocketDir + "/" + name + ".sock" }

// GatewaySocket is the same socket in the gateway container (gateway.yaml's socket:), where
// the sidecar's folder is mounted at /run/reversi/<name>/.
func GatewaySocket(name string) string { return BridgeSocketDir + "/" + name + "/" + name + ".sock" }

// socketVolume is the emptyDir of upstream i's socket folder.
func socketVolume(i int) string { return upstreamVolumeName(i, "run") }

// hasContainerUpstreams reports whether any upstream of gw is a container.
func hasContainerUpstreams(gw *v1alpha1.ReversiGateway) bool {
	for _, u := range gw.Spec.Upstreams {
		if u.Container != nil {
			return true
		}
	}
	return false
}

// bridgeSession is the session mode of a container upstream in gateway.yaml and the bridge's
// --session: per_client for session PerClient, else shared (the default of stdio servers).
func bridgeSession(u v1alpha1.GatewayUpstream) string {
	if u.Session == "PerClient" {
		return "per_client"
	}
	return "shared"
}

// checkContainerUpstreams refuses what the CRD's schema cannot: an emptyDir sizeLimit that
// is not above 0 and at most maxUpstreamEmptyDir (a quantity in a CEL rule costs more than
// the schema's budget for 64 upstreams of 8 volumes); and, again, a mount path the schema
// refuses (checkMountPath).
func checkContainerUpstreams(gw *v1alpha1.ReversiGateway) error {
	limit := resource.MustParse(maxUpstreamEmptyDir)
	var errs []error
	for i, u := range gw.Spec.Upstreams {
		if u.Container == nil {
			continue
		}
		for j, v := range u.Container.Volumes {
			if err := checkMountPath(v.MountPath); err != nil {
				errs = append(errs, fmt.Errorf("spec.upstreams[%d].container.volumes[%d].mountPath %w", i, j, err))
			}
			if e := v.EmptyDir; e != nil && e.SizeLimit != nil && (e.SizeLimit.Sign() <= 0 || e.SizeLimit.Cmp(limit) > 0) {
				errs = append(errs, fmt.Errorf("spec.upstreams[%d].container.volumes[%d].emptyDir.sizeLimit is %s: give a size above 0 and at most %s", i, j, e.SizeLimit, maxUpstreamEmptyDir))
			}
		}
	}
	return errors.Join(errs...)
}

// checkMountPath refuses what the CRD's schema does (an installed CRD may be older than the
// controller): a mount path that is not absolute and clean (path.Clean: no //, . or ..
// segments, no trailing /), /, /tmp, or one in BridgeSocketDir or BridgeBinDir; to the
// runtime "/run//reversi" is /run/reversi, whose volume would shadow the socket folder.
func checkMountPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/") || path.Clean(p) != p:
		return fmt.Errorf("%q is not an absolute, clean path (no //, . or .. segments): write it so", p)
	case p == "/" || p == "/tmp" || p == BridgeSocketDir || strings.HasPrefix(p, BridgeSocketDir+"/") || p == BridgeBinDir || strings.HasPrefix(p, BridgeBinDir+"/"):
		return fmt.Errorf("%q is the sidecar's own (/, /tmp, %s, %s): mount elsewhere", p, BridgeSocketDir, BridgeBinDir)
	}
	return nil
}

// restricted is the security context of the pod's containers other than the gateway: non-root,
// no privilege escalation, no capability, the runtime's seccomp profile, and a read-only root
// filesystem unless readOnlyRoot is false.
func restricted(readOnlyRoot bool) *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(readOnlyRoot), AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// copyBinaryContainer is the init container that puts the bridge into the binVolume.
func copyBinaryContainer(image string) corev1.Container {
	return corev1.Container{
		Name: CopyBinaryContainer, Image: image, Args: []string{"copy-binary", BridgeBinary},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
		SecurityContext: restricted(true),
		VolumeMounts:    []corev1.VolumeMount{{Name: binVolume, MountPath: BridgeBinDir}},
	}
}

// upstreamVolumeName is the pod's name of volume name of upstream i.
func upstreamVolumeName(i int, name string) string {
	return fmt.Sprintf("%s%d-%s", UpstreamContainerPrefix, i, name)
}

// sidecar is the native sidecar of container upstream i (u.Container set) and the volumes
// only it mounts: its /tmp and those of its spec. Its environment and mounts are its spec's
// alone, plus the bridge (read-only) and the socket folder.
func sidecar(i int, u v1alpha1.GatewayUpstream) (corev1.Container, []corev1.Volume) {
	c := u.Container
	tmp := upstreamVolumeName(i, "tmp")
	mounts := []corev1.VolumeMount{
		{Name: binVolume, MountPath: BridgeBinDir, ReadOnly: true},
		{Name: socketVolume(i), MountPath: BridgeSocketDir},
		{Name: tmp, MountPath: "/tmp"},
	}
	volumes := []corev1.Volume{emptyDir(socketVolume(i), resource.MustParse("1Mi")), emptyDir(tmp, resource.MustParse(defaultUpstreamEmptyDir))}
	for _, v := range c.Volumes {
		name := upstreamVolumeName(i, v.Name)
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: v.MountPath, ReadOnly: v.EmptyDir == nil})
		volumes = append(volumes, upstreamVolume(name, v))
	}
	command := append([]string{BridgeBinary, "stdio-bridge", "--listen", "unix://" + BridgeSocket(u.Name), "--session", bridgeSession(u), "--"}, c.Command...)
	sc := c.SecurityContext
	if sc == nil {
		sc = &v1alpha1.UpstreamSecurityContext{}
	}
	security := restricted(ptr.Deref(sc.ReadOnlyRootFilesystem, true))
	security.RunAsUser, security.RunAsGroup = sc.RunAsUser, sc.RunAsGroup
	return corev1.Container{
		Name: UpstreamContainerPrefix + u.Name, Image: c.Image, Command: command, Args: c.Args, WorkingDir: c.WorkingDir,
		Env: upstreamEnv(c.Env), Resources: upstreamResources(c.Resources),
		RestartPolicy:   ptr.To(corev1.ContainerRestartPolicyAlways),
		SecurityContext: security, VolumeMounts: mounts,
	}, volumes
}

// upstreamEnv is the sidecar's environment: exactly the spec's.
func upstreamEnv(env []v1alpha1.UpstreamEnvVar) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range env {
		ev := corev1.EnvVar{Name: e.Name, Value: e.Value}
		switch vf := e.ValueFrom; {
		case vf == nil:
		case vf.SecretKeyRef != nil:
			ev.ValueFrom = &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: vf.SecretKeyRef.Name}, Key: vf.SecretKeyRef.Key}}
		case vf.ConfigMapKeyRef != nil:
			ev.ValueFrom = &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: vf.ConfigMapKeyRef.Name}, Key: vf.ConfigMapKeyRef.Key}}
		}
		out = append(out, ev)
	}
	return out
}

// upstreamResources are the spec's, or the default: requests cpu 50m and memory 64Mi, limit
// memory 512Mi.
func upstreamResources(r *v1alpha1.UpstreamResources) corev1.ResourceRequirements {
	if r == nil {
		return corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
		}
	}
	return corev1.ResourceRequirements{Requests: r.Requests.DeepCopy(), Limits: r.Limits.DeepCopy()}
}

func emptyDir(name string, size resource.Quantity) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size}}}
}

// upstreamVolume is the pod's volume name for v: an emptyDir (default 64Mi), or every key of a
// ConfigMap (0444) or Secret (0440: the pod's fsGroup reads it).
func upstreamVolume(name string, v v1alpha1.UpstreamVolume) corev1.Volume {
	switch {
	case v.ConfigMap != nil:
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: v.ConfigMap.Name}, DefaultMode: ptr.To[int32](0o444)}}}
	case v.Secret != nil:
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: v.Secret.Name, DefaultMode: ptr.To[int32](0o440)}}}
	}
	size := resource.MustParse(defaultUpstreamEmptyDir)
	if v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil {
		size = v.EmptyDir.SizeLimit.DeepCopy()
	}
	return emptyDir(name, size)
}

// apiAccessVolume is the gateway container's ServiceAccount token, CA and namespace, as the
// ServiceAccount admission plugin projects them into pods that automount (kube-api-access):
// the pod does not automount, so that no sidecar gets the token.
func apiAccessVolume() corev1.Volume {
	return corev1.Volume{Name: apiVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o444),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](tokenExpirationSeconds)}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}}}
}

// addSidecars turns pod (gatewayPodSpec's, its first container the gateway's) into one with
// gw's container upstreams: the copy init container (image: the gateway's), then one sidecar
// per container upstream in spec order; each one's socket folder, mounted read-only in the
// gateway container at /run/reversi/<name>; no automounted token, the gateway container's own projected at
// ServiceAccountDir; no service links. Nothing of the gateway container (its env, Secrets, volumes) reaches a
// sidecar.
func addSidecars(pod *corev1.PodSpec, gw *v1alpha1.ReversiGateway, image string) {
	pod.AutomountServiceAccountToken = ptr.To(false)
	// The sidecars share the pod's network and start first: a server could listen on the
	// gateway's port and answer an HTTP probe (and the Service) in its place. The probes become
	// `reversi probe`, which also checks that the gateway process holds every listener there.
	for _, p := range []*corev1.Probe{pod.Containers[0].StartupProbe, pod.Containers[0].LivenessProbe, pod.Containers[0].ReadinessProbe} {
		if p != nil && p.HTTPGet != nil {
			p.ProbeHandler = corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{GatewayBinary, "probe",
				"--port", strconv.Itoa(int(gatewayPort(gw))), "--path", p.HTTPGet.Path}}}
		}
	}
	// No <SERVICE>_SERVICE_HOST variables of the namespace's Services in the sidecars' env
	// (the kubelet still sets KUBERNETES_SERVICE_HOST and _PORT in every container).
	pod.EnableServiceLinks = ptr.To(false)
	pod.InitContainers = []corev1.Container{copyBinaryContainer(image)}
	pod.Volumes = append(pod.Volumes,
		emptyDir(binVolume, resource.MustParse("256Mi")),
		apiAccessVolume())
	g := &pod.Containers[0]
	for i, u := range gw.Spec.Upstreams {
		if u.Container == nil {
			continue
		}
		c, vols := sidecar(i, u)
		pod.InitContainers = append(pod.InitContainers, c)
		pod.Volumes = append(pod.Volumes, vols...)
		// Read-only is enough to connect to a socket (only its creation writes).
		g.VolumeMounts = append(g.VolumeMounts, corev1.VolumeMount{Name: socketVolume(i), MountPath: BridgeSocketDir + "/" + u.Name, ReadOnly: true})
	}
	g.VolumeMounts = append(g.VolumeMounts, corev1.VolumeMount{Name: apiVolume, MountPath: ServiceAccountDir, ReadOnly: true})
}

// upstreamImages are the images of gw's container upstreams with their fields.
func upstreamImages(gw *v1alpha1.ReversiGateway) (fields, images []string) {
	for i, u := range gw.Spec.Upstreams {
		if u.Container != nil {
			fields = append(fields, fmt.Sprintf("spec.upstreams[%d].container.image", i))
			images = append(images, u.Container.Image)
		}
	}
	return fields, images
}

// checkUpstreamImages checks the container upstreams' images against p, and returns every
// refusal (an *ImageNotAllowedError with Upstream set). Other errors are returned as they are.
func checkUpstreamImages(p *ImagePolicy, gw *v1alpha1.ReversiGateway) ([]*ImageNotAllowedError, error) {
	var out []*ImageNotAllowedError
	fields, images := upstreamImages(gw)
	for i, image := range images {
		err := p.Check(fields[i], image)
		var na *ImageNotAllowedError
		switch {
		case err == nil:
		case errors.As(err, &na):
			na.Upstream = true
			out = append(out, na)
		default:
			return nil, err
		}
	}
	return out, nil
}

// joinImageErrors is the refusals' messages, joined by "; ".
func joinImageErrors(errs []*ImageNotAllowedError) string {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}
