package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
)

// TestGatewaySequenceGrowsWithItsPolicies: a change of only what a gateway enforces
// (spec.policies.names; or its registries' policies, with its manifests and sources the same)
// is a new gateway snapshot, with a new sequence. Status records the sequence, the manifests'
// digest and the sources, not the policies, so read alone it took such a change for the same
// snapshot and the controller signed the new selection with the old sequence: a ConfigMap
// editor could then put the older, looser rendering back at the same sequence (the pod's mark
// took it as the same state), and once the pod's marks cover the policies, the pod would
// refuse the new rendering instead. Status vouches for the policies of the verified previous
// rendering only; without one a rendering with policies gets a new sequence.
func TestGatewaySequenceGrowsWithItsPolicies(t *testing.T) {
	r := &ReversiGatewayReconciler{Key: ctlKey}
	const src = "ManifestRegistry agents/payments"
	b := bundle.Bundle{Policies: []bundle.PolicyEntry{
		{Policy: "content", Source: src, Entry: registry.Entry{Version: 1, Status: "approved", Checksum: "aa"}},
		{Policy: "deletions", Source: src, Entry: registry.Entry{Version: 1, Status: "approved", Checksum: "bb"}},
	}}
	if _, err := b.Attest(bundle.Snapshot{Source: src, Kind: bundle.KindPlain, Sequence: 5}, ctlKey.Signer); err != nil {
		t.Fatal(err)
	}
	gw := &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "pay"},
		Spec: v1alpha1.ReversiGatewaySpec{Policies: &v1alpha1.GatewayPolicies{Names: []string{"content", "deletions"}}}}
	gsrc := bundle.GatewaySource("agents", "pay")
	sign := func(prev previous) bundle.Snapshot {
		t.Helper()
		c := b
		c.Snapshots = append([]bundle.SignedSnapshot(nil), b.Snapshots...)
		if serr := r.attestGateway(gw, &c, prev); serr != nil {
			t.Fatal(serr)
		}
		return c.Snapshots[len(c.Snapshots)-1].Snapshot
	}
	first := sign(previous{snapshots: map[string]bundle.Snapshot{}})
	gw.Status.Manifests = &v1alpha1.GatewayManifestsStatus{Sequence: first.Sequence, DesiredRevision: first.Digest, Sources: first.Sources}
	prev := previous{snapshots: map[string]bundle.Snapshot{gsrc: first}}
	if again := sign(prev); again.Sequence != first.Sequence {
		t.Fatalf("the same rendering made again: sequence %d, want %d (the same bytes)", again.Sequence, first.Sequence)
	}

	// Loosened: spec.policies.names drops content.
	gw.Spec.Policies.Names = []string{"deletions"}
	if s := sign(prev); s.Sequence <= first.Sequence {
		t.Errorf("spec.policies.names changed, the gateway snapshot kept sequence %d (was %d)", s.Sequence, first.Sequence)
	}
	// The verified rendering is gone (a ConfigMap editor deleted or broke it): status alone
	// cannot say which policies sequence N enforced.
	if s := sign(previous{snapshots: map[string]bundle.Snapshot{}}); s.Sequence <= first.Sequence {
		t.Errorf("without a verified previous rendering, status alone let sequence %d sign another policy selection", s.Sequence)
	}
}
