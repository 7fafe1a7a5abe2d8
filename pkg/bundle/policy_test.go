package bundle

import (
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
)

// policySnapshot is a signed registry serving the seed's manifests and issue 21's four
// policies, approved and signed by the writer.
func policySnapshot(t testing.TB) (*registry.Snapshot, signingtest.Key) {
	t.Helper()
	k := signingtest.NewKey(t)
	docs, errs := manifest.ReadPaths("../../test/fixtures/policy/manifests")
	ms, verrs := manifest.ValidateDocuments(docs)
	ps, perrs := apipolicy.ReadPaths("../../test/fixtures/policy/policy")
	if len(errs)+len(verrs)+len(perrs) > 0 {
		t.Fatal(errs, verrs, perrs)
	}
	reg := registry.New(filepath.Join(t.TempDir(), "reg"))
	o := registry.WriteOptions{By: "alice", Signer: k.Signer}
	if _, err := reg.Publish(ms, manifest.Approved, o); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.PublishPolicies(ps, manifest.Approved, o); err != nil {
		t.Fatal(err)
	}
	snap, lerrs := reg.Load(k.Trust)
	if len(lerrs) > 0 || len(snap.Policies) != 4 {
		t.Fatal(lerrs)
	}
	return snap, k
}

func policyNames(ps []*apipolicy.Policy) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return strings.Join(out, ",")
}

// Policies travel with the manifests: shard 0 holds them, the registry's snapshot and the
// gateway's bind them, the gateway snapshot selects which are enforced, and every way of
// changing them in the ConfigMap is refused.
func TestPoliciesTravelSignedInTheRendering(t *testing.T) {
	snap, writer := policySnapshot(t)
	ctl := signingtest.NewKey(t)
	gateway := GatewaySource("agents", "pay")
	now := time.Now()
	render := func(enforce ...string) Bundle {
		b := attested(t, snap, source, 5, ctl.Signer)
		if _, err := b.AttestGateway(Snapshot{Source: gateway, Sequence: 9, PolicyNames: enforce}, nil, ctl.Signer); err != nil {
			t.Fatal(err)
		}
		return b
	}
	all := render("payments", "content", "deletions", "change-freeze")
	shards, err := all.Shards(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := shards[0][KeyPolicies]; !ok || len(shards) != 1 {
		t.Fatalf("shards %v", shards)
	}
	got, err := Assemble(shards)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := got.VerifyGatewayAll(gateway, writer.Trust, ctl.Trust, now)
	if len(errs) > 0 || policyNames(v.Policies) != "change-freeze,content,deletions,payments" || len(v.Manifests) != len(snap.Manifests) {
		t.Fatalf("honest: %v %s", errs, policyNames(v.Policies))
	}
	// spec.policies picks two: only they are enforced, all four are verified.
	v, errs = render("content", "deletions").VerifyGatewayAll(gateway, writer.Trust, ctl.Trust, now)
	if len(errs) > 0 || policyNames(v.Policies) != "content,deletions" {
		t.Fatalf("selection: %v %s", errs, policyNames(v.Policies))
	}
	if v, errs = render().VerifyGatewayAll(gateway, writer.Trust, ctl.Trust, now); len(errs) > 0 || len(v.Policies) != 0 {
		t.Fatalf("none selected: %v %v", errs, v.Policies)
	}

	edit := func(f func(ps []PolicyEntry) []PolicyEntry) Bundle {
		b := render("payments", "content", "deletions", "change-freeze")
		b.Policies = f(append([]PolicyEntry(nil), b.Policies...))
		return b
	}
	loosened := func(ps []PolicyEntry) []PolicyEntry {
		for i := range ps {
			if ps[i].Policy == "content" {
				ps[i].Document = json.RawMessage(strings.Replace(string(ps[i].Document), `"effect":"deny"`, `"effect":"advise"`, 1))
			}
		}
		return ps
	}
	// The attacker edits the policy and fixes its checksum: the signature no longer verifies.
	rechecked := func(ps []PolicyEntry) []PolicyEntry {
		ps = loosened(ps)
		for i := range ps {
			if ps[i].Policy == "content" {
				p, errs := apipolicy.Validate(mustJSON(t, ps[i].Document))
				if len(errs) > 0 {
					t.Fatal(errs)
				}
				ps[i].Checksum, _ = apipolicy.Checksum(p)
			}
		}
		return ps
	}
	// A manifest's signature over the same name, version and checksum, by the writer's key.
	replayed := func(ps []PolicyEntry) []PolicyEntry {
		for i := range ps {
			sig, err := writer.Signer.Sign(signing.Message(ps[i].Policy, ps[i].Version, ps[i].Checksum))
			if err != nil {
				t.Fatal(err)
			}
			ps[i].Signature = base64.StdEncoding.EncodeToString(sig)
		}
		return ps
	}
	dropped := func(ps []PolicyEntry) []PolicyEntry { return ps[1:] }
	draft := func(ps []PolicyEntry) []PolicyEntry { ps[0].Status = manifest.Draft; return ps }
	cases := map[string]struct {
		b    Bundle
		want string
	}{
		"a policy edited":                    {edit(loosened), "policy content v1: edited after publishing"},
		"a policy edited, checksum fixed":    {edit(rechecked), "policies were swapped, added or dropped"},
		"a manifest signature replayed":      {edit(replayed), "not a policy signature by a trusted key"},
		"a policy dropped":                   {edit(dropped), "policies were swapped, added or dropped"},
		"every policy dropped":               {edit(func([]PolicyEntry) []PolicyEntry { return nil }), "its policies' digest is (none)"},
		"a policy marked draft":              {edit(draft), "is a draft"},
		"a policy added from another source": {edit(func(ps []PolicyEntry) []PolicyEntry { ps[0].Source = "ManifestRegistry agents/other"; return ps }), "has no verified snapshot"},
	}
	for name, c := range cases {
		v, errs := c.b.VerifyGatewayAll(gateway, writer.Trust, ctl.Trust, now)
		if v.Policies != nil || v.Manifests != nil || !containsErr(errs, c.want) {
			t.Errorf("%s: want %q in %v", name, c.want, errs)
		}
	}
	// The dropped policy is also refused by the writer's index proof alone (a controller key
	// holder cannot drop a writer's policy either), and by the gateway snapshot's selection.
	b := edit(dropped)
	b.Snapshots = nil
	if _, err := b.Attest(Snapshot{Source: source, Kind: KindRegistry, Revision: rev, Sequence: 6, Index: &snap.Index}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AttestGateway(Snapshot{Source: gateway, Sequence: 10, PolicyNames: []string{"change-freeze", "content", "deletions", "payments"}}, nil, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	_, errs = b.VerifyGatewayAll(gateway, writer.Trust, ctl.Trust, now)
	if !containsErr(errs, "not the versions the writer signed") || !containsErr(errs, "which the rendering lacks") {
		t.Errorf("re-attested without a policy: %v", errs)
	}
}

func mustJSON(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A Plain source's policies carry no writer signature: its controller-signed snapshot binds
// them, and they verify without writer trust for the source.
func TestPlainPoliciesAreBoundByTheSnapshot(t *testing.T) {
	snap, writer := policySnapshot(t)
	ctl := signingtest.NewKey(t)
	const plain = "ManifestRegistry agents/plain"
	b, err := FromManifests(plain, snap.Manifests)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddPolicies(plain, snap.Policies); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Attest(Snapshot{Source: plain, Kind: KindPlain, Revision: rev, Sequence: 3, CommitSigner: "SHA256:x"}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	v, errs := b.VerifyAll(writer.Trust, ctl.Trust)
	if len(errs) > 0 || len(v.Policies) != 4 {
		t.Fatalf("plain: %v", errs)
	}
	b.Policies = b.Policies[:3]
	if _, errs := b.VerifyAll(writer.Trust, ctl.Trust); !containsErr(errs, "policies were swapped, added or dropped") {
		t.Fatalf("plain policy dropped: %v", errs)
	}
}

// A rendering without policies keeps the bytes it had before policies existed.
func TestNoPoliciesNoNewKeys(t *testing.T) {
	snap, _ := signedSnapshot(t, 0)
	ctl := signingtest.NewKey(t)
	b := attested(t, snap, source, 5, ctl.Signer)
	shards, err := b.Shards(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := shards[0][KeyPolicies]; ok || strings.Contains(shards[0][KeySnapshots], "policies") {
		t.Fatalf("a rendering without policies names them: %v", shards[0])
	}
}
