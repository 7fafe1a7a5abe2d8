package v1alpha1

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// UpstreamContainer is a stdio MCP server run from its own image as a native sidecar of the
// gateway pod (issue 23). Its fields are those of a Pod's container, bounded to what a stdio
// server needs: the sidecar always runs non-root, without privilege escalation, with every
// capability dropped and the RuntimeDefault seccomp profile, with no ServiceAccount token and
// none of the gateway's Secrets or volumes. The image must be allowed by the controller's
// image policy for upstream containers (reversi controller --upstream-images; by default the
// gateway images' patterns).
type UpstreamContainer struct {
	// Image of the server. It needs no shell and no Reversi: the bridge comes from the gateway
	// image.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`

	// Command runs the server (argv[0] and its first arguments). The image's ENTRYPOINT is not
	// used, because `reversi stdio-bridge` is the sidecar's entrypoint: write it here. As in a
	// Pod, $(VAR) references to the container's env are expanded ($$ for a literal $).
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	Command []string `json:"command"`

	// Args follow the command.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	Args []string `json:"args,omitempty"`

	// Env is the server's whole environment: a literal value, or a key of a Secret or ConfigMap
	// of the gateway's namespace (the author must be allowed to get it: admission checks).
	// Nothing of the gateway's environment is passed on.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Env []UpstreamEnvVar `json:"env,omitempty"`

	// WorkingDir of the server. Default: the image's.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/`
	WorkingDir string `json:"workingDir,omitempty"`

	// Resources of the sidecar. Default: requests cpu 50m and memory 64Mi, limit memory
	// 512Mi.
	// +optional
	Resources *UpstreamResources `json:"resources,omitempty"`

	// SecurityContext offers only what keeps the sidecar's defaults secure: the user and group
	// (never root) and whether the root filesystem is read-only.
	// +optional
	SecurityContext *UpstreamSecurityContext `json:"securityContext,omitempty"`

	// Volumes the server needs, each mounted into the sidecar alone: an emptyDir (scratch or
	// state for the pod's lifetime), or a ConfigMap or Secret of the gateway's namespace,
	// read-only. /tmp is always an emptyDir of its own.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.all(v, self.exists_one(w, w.mountPath == v.mountPath))",message="two volumes have the same mountPath: give each its own"
	Volumes []UpstreamVolume `json:"volumes,omitempty"`
}

// UpstreamEnvVar is one environment variable of an upstream container: value, or valueFrom a
// Secret or ConfigMap key. Values from the downward API (fieldRef, resourceFieldRef) are not
// offered: the server has no business with the pod's identity.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.value) && has(self.valueFrom))",message="value and valueFrom exclude each other: keep one"
type UpstreamEnvVar struct {
	// Name of the variable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z][-._a-zA-Z0-9]*$`
	Name string `json:"name"`

	// Value, literally ($(VAR) expanded as in a Pod). Use valueFrom.secretKeyRef for anything
	// secret.
	// +optional
	// +kubebuilder:validation:MaxLength=32768
	Value string `json:"value,omitempty"`

	// ValueFrom reads the value from a key of a Secret or ConfigMap.
	// +optional
	ValueFrom *UpstreamEnvVarSource `json:"valueFrom,omitempty"`
}

// UpstreamEnvVarSource is where an env value comes from: exactly one of a Secret key or a
// ConfigMap key, of the gateway's namespace.
//
// +kubebuilder:validation:XValidation:rule="has(self.secretKeyRef) != has(self.configMapKeyRef)",message="set exactly one of secretKeyRef or configMapKeyRef"
type UpstreamEnvVarSource struct {
	// SecretKeyRef selects a key of a Secret.
	// +optional
	SecretKeyRef *SecretKeyReference `json:"secretKeyRef,omitempty"`
	// ConfigMapKeyRef selects a key of a ConfigMap.
	// +optional
	ConfigMapKeyRef *ConfigMapKeyReference `json:"configMapKeyRef,omitempty"`
}

// ConfigMapKeyReference selects one key of a ConfigMap in the same namespace.
type ConfigMapKeyReference struct {
	// Name of the ConfigMap.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key in the ConfigMap's data.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// ConfigMapReference names a ConfigMap in the same namespace.
type ConfigMapReference struct {
	// Name of the ConfigMap.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// UpstreamResources are the sidecar's requests and limits: cpu, memory and ephemeral-storage.
type UpstreamResources struct {
	// Requests of the sidecar.
	// +optional
	// +kubebuilder:validation:MaxProperties=3
	// +kubebuilder:validation:XValidation:rule="self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'])",message="requests and limits name cpu, memory or ephemeral-storage"
	Requests corev1.ResourceList `json:"requests,omitempty"`
	// Limits of the sidecar.
	// +optional
	// +kubebuilder:validation:MaxProperties=3
	// +kubebuilder:validation:XValidation:rule="self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'])",message="requests and limits name cpu, memory or ephemeral-storage"
	Limits corev1.ResourceList `json:"limits,omitempty"`
}

// UpstreamSecurityContext is what an upstream container may change of its security context.
// The rest is fixed: runAsNonRoot, allowPrivilegeEscalation false, capabilities drop ALL,
// seccomp RuntimeDefault; no privileged mode, added capabilities, host namespaces, SELinux or
// AppArmor options.
type UpstreamSecurityContext struct {
	// RunAsUser is the server's user id (never 0). Default: the pod's, 65532.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	RunAsUser *int64 `json:"runAsUser,omitempty"`

	// RunAsGroup is the server's primary group id (never 0). Default: the pod's, 65532.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`

	// ReadOnlyRootFilesystem keeps the image's files read-only. Default true; set false only
	// for a server that writes into its image (give it an emptyDir volume instead where it
	// can be told where to write).
	// +optional
	// +kubebuilder:default=true
	ReadOnlyRootFilesystem *bool `json:"readOnlyRootFilesystem,omitempty"`
}

// UpstreamVolume is one volume of an upstream container with where it is mounted: exactly
// one of emptyDir, configMap or secret.
//
// +kubebuilder:validation:XValidation:rule="[has(self.emptyDir), has(self.configMap), has(self.secret)].filter(x, x).size() == 1",message="set exactly one of emptyDir, configMap or secret"
type UpstreamVolume struct {
	// Name of the volume (the pod's volume is upstream-<upstream index>-<name>).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="!(self in ['tmp', 'run'])",message="tmp and run are the sidecar's own /tmp and socket folder volumes: choose another name"
	Name string `json:"name"`

	// MountPath in the sidecar: absolute, not /, /tmp, or in /run/reversi or /reversi-bin
	// (the bridge's socket and binary).
	// +required
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^/[^:]*[^/:]$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|/)[.][.]?(/|$)') && !self.contains('//')",message="mountPath has no empty, . or .. segments: write it absolute and clean (no //)"
	// +kubebuilder:validation:XValidation:rule="self != '/tmp' && !self.matches('^/(run/reversi|reversi-bin)(/|$)')",message="/tmp, /run/reversi and /reversi-bin are the sidecar's own (scratch, the bridge's socket and its binary): mount elsewhere"
	MountPath string `json:"mountPath"`

	// EmptyDir is scratch space for the pod's lifetime, at most sizeLimit (default 64Mi, at
	// most 1Gi).
	// +optional
	EmptyDir *UpstreamEmptyDir `json:"emptyDir,omitempty"`

	// ConfigMap mounts every key of a ConfigMap as a file, read-only.
	// +optional
	ConfigMap *ConfigMapReference `json:"configMap,omitempty"`

	// Secret mounts every key of a Secret as a file (mode 0440), read-only.
	// +optional
	Secret *LocalObjectReference `json:"secret,omitempty"`
}

// UpstreamEmptyDir is an emptyDir volume of an upstream container.
type UpstreamEmptyDir struct {
	// SizeLimit of the volume. Default 64Mi, at most 1Gi (the controller refuses more).
	// +optional
	SizeLimit *resource.Quantity `json:"sizeLimit,omitempty"`
}

// ConfigMapRefs lists every ConfigMap the spec references (the container upstreams' env and
// volumes), one entry per referencing field, as SecretRefs does for Secrets: the sidecar
// reads them with the controller's rights, so ReversiGateway admission checks that the author
// may get each one.
func (s *ReversiGatewaySpec) ConfigMapRefs() []GatewaySecretRef {
	var out []GatewaySecretRef
	for i, u := range s.Upstreams {
		c := u.Container
		if c == nil {
			continue
		}
		for j, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				out = append(out, GatewaySecretRef{Name: e.ValueFrom.ConfigMapKeyRef.Name, Field: fmt.Sprintf("spec.upstreams[%d].container.env[%d].valueFrom.configMapKeyRef", i, j)})
			}
		}
		for j, v := range c.Volumes {
			if v.ConfigMap != nil {
				out = append(out, GatewaySecretRef{Name: v.ConfigMap.Name, Field: fmt.Sprintf("spec.upstreams[%d].container.volumes[%d].configMap", i, j)})
			}
		}
	}
	return out
}
