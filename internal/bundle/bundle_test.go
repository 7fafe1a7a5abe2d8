package bundle

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/internal/registry"
	"github.com/reversi-gitops/reversi/internal/signing"
	"github.com/reversi-gitops/reversi/internal/signing/signingtest"
)

// signedSnapshot publishes n copies of the seed's read tool (plus the seed's three) as
// approved, signed versions and loads them.
func signedSnapshot(t testing.TB, n int) (*registry.Snapshot, *signing.TrustSet) {
	t.Helper()
	dir := t.TempDir()
	k := signingtest.NewKey(t)
	s, trust := k.Signer, k.Trust
	docs, errs := manifest.ReadPaths("../../test/fixtures/manifests")
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		t.Fatal(errs, verrs)
	}
	for i := 0; i < n; i++ {
		m := *ms[0]
		m.Tool = fmt.Sprintf("svc%05d.read", i)
		m.Description = strings.Repeat("Reads <one> item & more. ", 20)
		ms = append(ms, &m)
	}
	reg := registry.New(filepath.Join(dir, "reg"))
	if _, err := reg.Publish(ms, manifest.Approved, registry.WriteOptions{By: "alice", Signer: s}); err != nil {
		t.Fatal(err)
	}
	snap, lerrs := reg.Load(trust)
	if len(lerrs) > 0 {
		t.Fatal(lerrs)
	}
	return snap, trust
}

const rev = "main@sha1:0123456789abcdef0123456789abcdef01234567"

func TestShardsRoundTripAndVerify(t *testing.T) {
	snap, trust := signedSnapshot(t, 300)
	b := FromSnapshot(rev, snap)
	shards, err := b.Shards(64 * 1024)
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) < 3 {
		t.Fatalf("%d shards for ~180 KiB at 64 KiB each", len(shards))
	}
	for i, s := range shards {
		if n := len(s[KeyManifests]); n > 64*1024 {
			t.Fatalf("shard %d holds %d bytes", i, n)
		}
	}
	// Shards arrive in any order.
	shards[0], shards[len(shards)-1] = shards[len(shards)-1], shards[0]
	got, err := Assemble(shards)
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != rev || len(got.Entries) != 303 || got.Digest() != b.Digest() {
		t.Fatalf("assembled %s, %d entries", got.Revision, len(got.Entries))
	}
	ms, errs := got.Verify(trust)
	if len(errs) > 0 || len(ms) != 303 {
		t.Fatalf("verify: %d %v", len(ms), errs)
	}
	if !strings.Contains(ms[len(ms)-1].Description, "<one> item & more") {
		t.Fatalf("description %q", ms[len(ms)-1].Description)
	}
}

func TestAssembleRefusesIncompleteOrMixedRenderings(t *testing.T) {
	snap, _ := signedSnapshot(t, 200)
	shards, err := FromSnapshot(rev, snap).Shards(32 * 1024)
	if err != nil {
		t.Fatal(err)
	}
	other, err := FromSnapshot("main@sha1:ffffffffffffffffffffffffffffffffffffffff", snap).Shards(32 * 1024)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]map[string]string{
		"the rendering is incomplete": shards[:2],
		"repeated":                    append([]map[string]string{shards[0], shards[0]}, shards[2:]...),
		"different renderings":        append([]map[string]string{other[0]}, shards[1:]...),
	}
	for want, set := range cases {
		if _, err := Assemble(set); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	// An edited entry no longer matches the digest.
	edited := append([]map[string]string{}, shards...)
	edited[1] = map[string]string{}
	for k, v := range shards[1] {
		edited[1][k] = v
	}
	edited[1][KeyManifests] = strings.Replace(edited[1][KeyManifests], `"version":1`, `"version":2`, 1)
	if _, err := Assemble(edited); err == nil || !strings.Contains(err.Error(), "the rendering was edited") {
		t.Fatalf("edited: %v", err)
	}
}

func TestVerifyRefusesForgedEntries(t *testing.T) {
	snap, trust := signedSnapshot(t, 0)
	b := FromSnapshot(rev, snap)

	forged := FromSnapshot(rev, snap)
	forged.Entries[0].Manifest = json.RawMessage(strings.Replace(string(forged.Entries[0].Manifest), "payments:write", "payments:read", 1))
	if _, errs := forged.Verify(trust); len(errs) != 1 || !strings.Contains(errs[0].Error(), "edited after publishing") {
		t.Fatalf("forged manifest: %v", errs)
	}
	unsigned := FromSnapshot(rev, snap)
	unsigned.Entries[0].Signature, unsigned.Entries[0].KeyID = "", ""
	if _, errs := unsigned.Verify(trust); len(errs) != 1 || !strings.Contains(errs[0].Error(), "not signed") {
		t.Fatalf("unsigned: %v", errs)
	}
	if _, errs := unsigned.Verify(nil); len(errs) != 0 {
		t.Fatalf("without trust an unsigned entry is accepted: %v", errs)
	}
	otherTrust := signingtest.NewKey(t).Trust
	if _, errs := b.Verify(otherTrust); len(errs) != 3 {
		t.Fatalf("untrusted key: %v", errs)
	}
	// A set that breaks a cross-manifest rule is refused as a whole.
	partial := FromSnapshot(rev, snap)
	partial.Entries = partial.Entries[:2] // create_charge without stripe.refund
	if ms, errs := partial.Verify(trust); ms != nil || len(errs) != 1 || !strings.Contains(errs[0].Error(), `tool "stripe.refund" has no manifest`) {
		t.Fatalf("subset: %v", errs)
	}
}

func TestFromManifestsVerifiesWithoutTrustOnly(t *testing.T) {
	docs, errs := manifest.ReadPaths("../../test/fixtures/manifests")
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		t.Fatal(errs, verrs)
	}
	b, err := FromManifests(rev, ms)
	if err != nil {
		t.Fatal(err)
	}
	shards, err := b.Shards(0)
	if err != nil || len(shards) != 1 {
		t.Fatalf("%d shards, %v", len(shards), err)
	}
	got, err := Assemble(shards)
	if err != nil {
		t.Fatal(err)
	}
	if out, errs := got.Verify(nil); len(errs) > 0 || len(out) != 3 {
		t.Fatalf("plain bundle: %v", errs)
	}
	_, trust := signedSnapshot(t, 0)
	if _, errs := got.Verify(trust); len(errs) != 3 {
		t.Fatalf("unsigned plain entries with trusted keys: %v", errs)
	}
}
