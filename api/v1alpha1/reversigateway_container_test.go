package v1alpha1

import (
	"slices"
	"testing"
)

// Issue 23: ConfigMapRefs lists the ConfigMaps a container upstream reads (env valueFrom and
// volumes), with their fields, and SecretRefs its Secrets; neither lists the other's.
func TestContainerUpstreamRefs(t *testing.T) {
	s := ReversiGatewaySpec{Upstreams: []GatewayUpstream{
		{Name: "a", URL: "http://a/mcp"},
		{Name: "memory", Container: &UpstreamContainer{Image: "mcp/memory:1", Command: []string{"node", "index.js"},
			Env: []UpstreamEnvVar{
				{Name: "PLAIN", Value: "1"},
				{Name: "TOKEN", ValueFrom: &UpstreamEnvVarSource{SecretKeyRef: &SecretKeyReference{Name: "mem-token", Key: "t"}}},
				{Name: "LEVEL", ValueFrom: &UpstreamEnvVarSource{ConfigMapKeyRef: &ConfigMapKeyReference{Name: "mem-settings", Key: "level"}}},
			},
			Volumes: []UpstreamVolume{
				{Name: "data", MountPath: "/data", EmptyDir: &UpstreamEmptyDir{}},
				{Name: "settings", MountPath: "/etc/mem", ConfigMap: &ConfigMapReference{Name: "mem-files"}},
				{Name: "creds", MountPath: "/etc/creds", Secret: &LocalObjectReference{Name: "mem-creds"}},
			}}},
	}}
	wantSecrets := []GatewaySecretRef{{"mem-token", "spec.upstreams[1].container.env[1].valueFrom.secretKeyRef"}, {"mem-creds", "spec.upstreams[1].container.volumes[2].secret"}}
	if got := s.SecretRefs(); !slices.Equal(got, wantSecrets) {
		t.Errorf("SecretRefs %v\nwant %v", got, wantSecrets)
	}
	wantCMs := []GatewaySecretRef{{"mem-settings", "spec.upstreams[1].container.env[2].valueFrom.configMapKeyRef"}, {"mem-files", "spec.upstreams[1].container.volumes[1].configMap"}}
	if got := s.ConfigMapRefs(); !slices.Equal(got, wantCMs) {
		t.Errorf("ConfigMapRefs %v\nwant %v", got, wantCMs)
	}
	if n := len((&ReversiGatewaySpec{}).ConfigMapRefs()); n != 0 {
		t.Errorf("an empty spec has %d ConfigMap references", n)
	}
}
