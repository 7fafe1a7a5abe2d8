// Package v1alpha1 holds the custom resources of the reversi.dev API group, version v1alpha1:
// ManifestRegistry, ToolManifest, ReversiGateway, ApprovalRequest, Approval and ReversiRun.
// All kinds are namespaced and report kstatus-style status (observedGeneration and
// conditions, with Ready as the summary).
//
// The CRDs in config/crd/bases, the RBAC in config/rbac/role.yaml and zz_generated.deepcopy.go
// are generated from these types by controller-tools (`make generate manifests`).
//
// Source: ../shared/DESIGN.md, "Custom resources".
//
// +kubebuilder:object:generate=true
// +groupName=reversi.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "reversi.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds every kind of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// NewScheme returns a scheme with the core Kubernetes kinds and reversi.dev/v1alpha1: what the
// controller, the gateway and the tests read and write.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}
