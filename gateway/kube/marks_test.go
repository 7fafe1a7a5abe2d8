package kube

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
)

// TestMarksCoverPolicies is a replay attack on the pod's high-water marks (issue 21, found by
// the attack review): a ReversiGateway's spec.policies.names changes from [deletions] to
// [content, deletions] and nothing else, so the controller's gateway snapshot may keep its
// sequence (its manifests digest and sources are unchanged). Someone who may edit ConfigMaps
// (not the controller's key) then puts the older rendering back: every signature verifies,
// and a mark of only (sequence, manifests digest) took it as the same state, so the pod
// stopped enforcing content. The marks cover the policies a snapshot binds and enforces: two
// snapshots of one sequence that differ there cannot both be served.
func TestMarksCoverPolicies(t *testing.T) {
	w, ctl := signingtest.NewKey(t), signingtest.NewKey(t)
	docs, errs := manifest.ReadPaths("../../test/fixtures/policy/manifests")
	ms, verrs := manifest.ValidateDocuments(docs)
	ps, perrs := apipolicy.ReadPaths("../../test/fixtures/policy/policy")
	if len(errs)+len(verrs)+len(perrs) > 0 {
		t.Fatal(errs, verrs, perrs)
	}
	reg := registry.New(filepath.Join(t.TempDir(), "reg"))
	o := registry.WriteOptions{By: "alice", Signer: w.Signer}
	if _, err := reg.Publish(ms, manifest.Approved, o); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.PublishPolicies(ps, manifest.Approved, o); err != nil {
		t.Fatal(err)
	}
	snap, lerrs := reg.Load(w.Trust)
	if len(lerrs) > 0 {
		t.Fatal(lerrs)
	}
	const src = "ManifestRegistry agents/payments"
	gw := bundle.GatewaySource("agents", "pay")
	render := func(enforce ...string) bundle.Bundle {
		b := bundle.FromSnapshot(src, snap)
		index := snap.Index
		if _, err := b.Attest(bundle.Snapshot{Source: src, Kind: bundle.KindRegistry, Revision: "main@sha1:1", Sequence: 5, Index: &index}, ctl.Signer); err != nil {
			t.Fatal(err)
		}
		if _, err := b.AttestGateway(bundle.Snapshot{Source: gw, Sequence: 9, PolicyNames: enforce}, nil, ctl.Signer); err != nil {
			t.Fatal(err)
		}
		return b
	}
	loose, tight := render("deletions"), render("content", "deletions")
	for _, b := range []bundle.Bundle{loose, tight} {
		if _, errs := b.VerifyGatewayAll(gw, w.Trust, ctl.Trust, time.Now()); len(errs) > 0 {
			t.Fatal(errs)
		}
	}
	ctx := context.Background()
	st := store.NewMemory(nil)
	if err := st.AdvanceHighWater(ctx, marks(tight)); err != nil {
		t.Fatal(err)
	}
	if err := st.AdvanceHighWater(ctx, marks(tight)); err != nil {
		t.Fatalf("the same rendering again: %v", err)
	}
	err := st.AdvanceHighWater(ctx, marks(loose))
	if !errors.Is(err, store.ErrDowngrade) {
		t.Fatalf("the older rendering with fewer enforced policies was taken as the same state: %v", err)
	}
	t.Logf("refused: %v", err)

	// Without policies a mark is what it was (stores written before policies keep matching).
	plain := bundle.FromSnapshot(src, &registry.Snapshot{Manifests: snap.Manifests, Entries: snap.Entries, Canonical: snap.Canonical})
	if _, err := plain.Attest(bundle.Snapshot{Source: src, Kind: bundle.KindPlain, Sequence: 5}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	for _, m := range marks(plain) {
		if m.Digest != plain.Digest() {
			t.Errorf("mark of %s without policies: digest %q, want %q", m.Source, m.Digest, plain.Digest())
		}
	}
}
