package registry

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

const policyFixtures = "../../test/fixtures/policy/policy"

func loadPolicyFixtures(t testing.TB) []*apipolicy.Policy {
	t.Helper()
	ps, errs := apipolicy.ReadPaths(policyFixtures)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return ps
}

// policyRegistry is the seed walkthrough's registry with issue 21's four policies published by
// alice as drafts and approved by bob with four eyes.
func policyRegistry(t *testing.T, k keyPair) *Registry {
	t.Helper()
	r := seedRegistry(t, k)
	pub, err := r.PublishPolicies(loadPolicyFixtures(t), "", WriteOptions{By: "alice", Note: "rules", Signer: k.Signer})
	if err != nil {
		t.Fatal(err)
	}
	if len(pub) != 4 || pub[0].Version != 1 || pub[0].Status != manifest.Draft || !pub[0].Signed() {
		t.Fatalf("published %+v", pub)
	}
	// A draft is not served.
	snap, errs := r.Load(k.Trust)
	if len(errs) > 0 || len(snap.Policies) != 0 {
		t.Fatalf("drafts served: %v %v", snap, errs)
	}
	for _, p := range pub {
		if _, err := r.ApprovePolicy(p.Name, 0, true, WriteOptions{By: "alice", Signer: k.Signer}); err == nil || !strings.Contains(err.Error(), "four eyes") {
			t.Fatalf("alice approved her own draft: %v", err)
		}
		a, err := r.ApprovePolicy(p.Name, 0, true, WriteOptions{By: "bob", Signer: k.Signer})
		if err != nil {
			t.Fatal(err)
		}
		if a.Version != 2 || a.Status != manifest.Approved || a.Author != "alice" || a.Approver != "bob" || a.Checksum != p.Checksum || a.Note != "approved from v1" {
			t.Fatalf("approved %+v", a)
		}
	}
	return r
}

func TestPoliciesArePublishedApprovedAndServed(t *testing.T) {
	k := newKey(t)
	r := policyRegistry(t, k)
	snap, errs := r.Load(k.Trust)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if len(snap.Policies) != 4 || snap.PolicyEntries["content"].Version != 2 || len(snap.Manifests) != 3 {
		t.Fatalf("snapshot %+v", snap.PolicyEntries)
	}
	set, cerrs := snap.PolicySet()
	if len(cerrs) > 0 || len(set.Policies()) != 4 {
		t.Fatalf("compiled %v %v", set, cerrs)
	}
	want, _ := apipolicy.SetChecksum(loadPolicyFixtures(t))
	if set.Checksum() != want {
		t.Fatalf("served policy checksum %s, the files' %s", set.Checksum(), want)
	}
	// The index proof covers the served policies: with them it verifies, without any of them
	// (or with one swapped) it does not.
	served, policies := SetDigest(snap.Entries), PolicyDigest(snap.PolicyEntries)
	if err := snap.Index.VerifySet(served, policies, k.Trust); err != nil {
		t.Fatal(err)
	}
	if err := snap.Index.Verify(served, k.Trust); err == nil {
		t.Fatal("the index proof verified with every policy dropped")
	}
	fewer := map[string]Entry{}
	for n, e := range snap.PolicyEntries {
		if n != "content" {
			fewer[n] = e
		}
	}
	if err := snap.Index.VerifySet(served, PolicyDigest(fewer), k.Trust); err == nil {
		t.Fatal("the index proof verified with a policy dropped")
	}
	rep, verrs := r.Verify(k.Trust)
	if len(verrs) > 0 || rep.Policies != 4 || rep.Versions != 6 || rep.Signed != 6 || rep.PolicyVersions != 8 || rep.PolicySigned != 8 {
		t.Fatalf("verify %+v %v", rep, verrs)
	}
	es, err := r.PolicyHistory("content")
	if err != nil || len(es) != 2 || es[1].Approver != "bob" {
		t.Fatalf("history %+v %v", es, err)
	}
}

func TestRegistryWithoutPoliciesKeepsItsIndexMessage(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k)
	data, err := os.ReadFile(filepath.Join(r.Dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "policies") {
		t.Fatalf("index.json without policies names them:\n%s", data)
	}
	idx, err := r.readIndex(false)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := idx.IndexMessage()
	if !strings.HasPrefix(string(msg), "reversi-registry-index:v2:") {
		t.Fatalf("message %s", msg)
	}
}

func TestTamperedPolicyVersionIsRefused(t *testing.T) {
	k := newKey(t)
	r := policyRegistry(t, k)
	file := filepath.Join(r.Dir, "policies", "content", "v2.json")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Loosen the policy: the card-number rule becomes advice.
	edited := strings.Replace(string(data), `"effect": "deny"`, `"effect": "advise"`, 1)
	if edited == string(data) {
		t.Fatalf("nothing to edit in\n%s", data)
	}
	if err := os.WriteFile(file, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, errs := range map[string][]error{"load": loadErrs(r, k.Trust), "load without trust": loadErrs(r, nil), "verify": verifyErrs(r, k.Trust)} {
		if len(errs) == 0 {
			t.Fatalf("%s: the edited policy passed", name)
		}
		msg := errors.Join(errs...).Error()
		if !strings.Contains(msg, "policies/content/v2.json: policy content v2: edited after publishing") || !strings.Contains(msg, "publish changes as a new version") {
			t.Fatalf("%s: %s", name, msg)
		}
	}
}

func loadErrs(r *Registry, trust *signing.TrustSet) []error { _, errs := r.Load(trust); return errs }
func verifyErrs(r *Registry, trust *signing.TrustSet) []error {
	_, errs := r.Verify(trust)
	return errs
}

func TestUnsignedPolicyIsRefusedUnderTrustedKeys(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k)
	// An unsigned approved policy, and the index signed over it: only the version is unsigned.
	if _, err := r.PublishPolicies(loadPolicyFixtures(t)[:1], manifest.Approved, WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Sign(WriteOptions{Signer: k.Signer}); err != nil {
		t.Fatal(err)
	}
	errs := loadErrs(r, k.Trust)
	if len(errs) != 1 || !errors.Is(errs[0], signing.ErrNotSigned) || !IsSignatureError(errs[0]) || !strings.Contains(errs[0].Error(), "reversi policy publish --key") {
		t.Fatalf("unsigned policy: %v", errs)
	}
	if _, errs := r.Load(nil); len(errs) > 0 {
		t.Fatalf("without trust: %v", errs)
	}
}

// A manifest version's signature replayed onto a policy version of the same name, version and
// checksum does not verify: the messages differ (reversi-manifest: vs reversi-policy:).
func TestManifestSignatureDoesNotVerifyAsPolicySignature(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k)
	ps := loadPolicyFixtures(t)[:1]
	if _, err := r.PublishPolicies(ps, manifest.Approved, WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	idx, _ := r.readIndex(false)
	e := idx.Policies[ps[0].Name][0]
	sig, err := k.Signer.Sign(signing.Message(ps[0].Name, e.Version, e.Checksum))
	if err != nil {
		t.Fatal(err)
	}
	e.KeyID, e.Signature = k.Signer.KeyID, base64.StdEncoding.EncodeToString(sig)
	idx.Policies[ps[0].Name][0] = e
	// Write the forged entry into the version file and the index, and re-sign the index (the
	// attacker has a manifest signature but, say, the index key too: only the version counts).
	file := filepath.Join(r.Dir, "policies", ps[0].Name, "v1.json")
	var vf PolicyVersionFile
	data, _ := os.ReadFile(file)
	if err := json.Unmarshal(data, &vf); err != nil {
		t.Fatal(err)
	}
	vf.Entry = e
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // the document's bytes stay the signed ones
	if err := enc.Encode(vf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := idx.sign(k.Signer); err != nil {
		t.Fatal(err)
	}
	ib, _ := json.MarshalIndent(idx, "", "  ")
	if err := os.WriteFile(filepath.Join(r.Dir, IndexFile), ib, 0o644); err != nil {
		t.Fatal(err)
	}
	errs := loadErrs(r, k.Trust)
	if len(errs) != 1 || !errors.Is(errs[0], signing.ErrBadSignature) || !strings.Contains(errs[0].Error(), "not a policy signature") {
		t.Fatalf("replayed manifest signature: %v", errs)
	}
	// The same bytes signed as a policy verify.
	if _, err := VerifyPolicyEntry(ps[0].Name, e, mustCanonical(t, ps[0]), k.Trust, false); err == nil {
		t.Fatal("VerifyPolicyEntry accepted a manifest signature")
	}
}

func mustCanonical(t *testing.T, p *apipolicy.Policy) []byte {
	t.Helper()
	b, err := apipolicy.CanonicalJSON(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPolicyStrayAndDroppedVersions(t *testing.T) {
	k := newKey(t)
	r := policyRegistry(t, k)
	stray := filepath.Join(r.Dir, "policies", "content", "v9.json")
	if err := os.WriteFile(stray, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	msg := errors.Join(loadErrs(r, k.Trust)...).Error()
	if !strings.Contains(msg, "policies/content/v9.json: not listed in index.json: publish through reversi policy") {
		t.Fatal(msg)
	}
}

func TestPublishRefusesAPolicyThatDoesNotCompile(t *testing.T) {
	r := New(filepath.Join(t.TempDir(), "reg"))
	p, errs := apipolicy.Validate(map[string]any{"policy": "broken", "rules": []any{map[string]any{
		"name": "r", "condition": "args.amount >", "effect": "deny", "reason": "x"}}})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if _, err := r.PublishPolicies([]*apipolicy.Policy{p}, "", WriteOptions{By: "alice"}); err == nil || !strings.Contains(err.Error(), "does not compile") {
		t.Fatalf("published a broken policy: %v", err)
	}
	if IsRegistry(r.Dir) {
		t.Fatal("a refused publish wrote index.json")
	}
}
