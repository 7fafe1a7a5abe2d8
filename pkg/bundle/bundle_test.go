package bundle

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
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

const (
	rev    = "main@sha1:0123456789abcdef0123456789abcdef01234567"
	source = "ManifestRegistry agents/payments"
)

// attested is the bundle of snap for source with a Registry snapshot signed by controller.
func attested(t testing.TB, snap *registry.Snapshot, source string, seq int64, controller *signing.Signer) Bundle {
	t.Helper()
	b := FromSnapshot(source, snap)
	index := snap.Index
	if _, err := b.Attest(Snapshot{Source: source, Kind: KindRegistry, Revision: rev, Sequence: seq, Index: &index}, controller); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestShardsRoundTripAndVerify(t *testing.T) {
	snap, trust := signedSnapshot(t, 300)
	ctl := signingtest.NewKey(t)
	b := attested(t, snap, source, 7, ctl.Signer)
	shards, err := b.Shards(64 * 1024)
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) < 3 {
		t.Fatalf("%d shards for ~180 KiB at 64 KiB each", len(shards))
	}
	for i, s := range shards {
		if n := len(s[KeyManifests]) + len(s[KeySnapshots]); n > 64*1024 {
			t.Fatalf("shard %d holds %d bytes", i, n)
		}
		if _, ok := s[KeySnapshots]; ok != (i == 0) {
			t.Fatalf("shard %d: snapshots present = %v", i, ok)
		}
	}
	// Shards arrive in any order.
	shards[0], shards[len(shards)-1] = shards[len(shards)-1], shards[0]
	got, err := Assemble(shards)
	if err != nil {
		t.Fatal(err)
	}
	want := source + " " + rev + " (sequence 7)"
	if got.Revision() != want || len(got.Entries) != 303 || got.Digest() != b.Digest() || got.Digest() != registry.SetDigest(snap.Entries) {
		t.Fatalf("assembled %q, %d entries", got.Revision(), len(got.Entries))
	}
	ms, errs := got.Verify(trust, ctl.Trust)
	if len(errs) > 0 || len(ms) != 303 {
		t.Fatalf("verify: %d %v", len(ms), errs)
	}
	if !strings.Contains(ms[len(ms)-1].Description, "<one> item & more") {
		t.Fatalf("description %q", ms[len(ms)-1].Description)
	}
}

func TestAssembleRefusesIncompleteOrMixedRenderings(t *testing.T) {
	snap, _ := signedSnapshot(t, 200)
	b := FromSnapshot(source, snap)
	shards, err := b.Shards(32 * 1024)
	if err != nil {
		t.Fatal(err)
	}
	fewer := b
	fewer.Entries = b.Entries[1:]
	other, err := fewer.Shards(32 * 1024)
	if err != nil {
		t.Fatal(err)
	}
	with := func(i int, k, v string) []map[string]string {
		out := append([]map[string]string{}, shards...)
		out[i] = map[string]string{}
		for key, val := range shards[i] {
			out[i][key] = val
		}
		out[i][k] = v
		return out
	}
	cases := map[string][]map[string]string{
		"the rendering is incomplete": shards[:2],
		"repeated":                    append([]map[string]string{shards[0], shards[0]}, shards[2:]...),
		"different renderings":        append([]map[string]string{other[0]}, shards[1:]...),
		// Nothing unsigned is read: an added revision is refused, not shown.
		`unknown key "revision"`:      with(0, "revision", "main@sha1:ffffffffffffffffffffffffffffffffffffffff"),
		"which only shard 0 may":      with(1, KeySnapshots, "[]"),
		"the rendering was edited":    with(1, KeyManifests, strings.Replace(shards[1][KeyManifests], `"version":1`, `"version":2`, 1)),
		"snapshots.json is not valid": with(0, KeySnapshots, `[{"snapshot":{},"extra":1}]`),
	}
	for want, set := range cases {
		if _, err := Assemble(set); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
}

func TestVerifyRefusesForgedEntries(t *testing.T) {
	snap, trust := signedSnapshot(t, 0)
	b := FromSnapshot(source, snap)

	forged := FromSnapshot(source, snap)
	forged.Entries[0].Manifest = json.RawMessage(strings.Replace(string(forged.Entries[0].Manifest), "payments:write", "payments:read", 1))
	if _, errs := forged.Verify(trust, nil); len(errs) != 1 || !strings.Contains(errs[0].Error(), "edited after publishing") {
		t.Fatalf("forged manifest: %v", errs)
	}
	unsigned := FromSnapshot(source, snap)
	unsigned.Entries[0].Signature, unsigned.Entries[0].KeyID = "", ""
	if _, errs := unsigned.Verify(trust, nil); len(errs) != 1 || !strings.Contains(errs[0].Error(), "not signed") {
		t.Fatalf("unsigned: %v", errs)
	}
	if _, errs := unsigned.Verify(nil, nil); len(errs) != 0 {
		t.Fatalf("without trust an unsigned entry is accepted: %v", errs)
	}
	otherTrust := signingtest.NewKey(t).Trust
	if _, errs := b.Verify(otherTrust, nil); len(errs) != 3 {
		t.Fatalf("untrusted key: %v", errs)
	}
	// A set that breaks a cross-manifest rule is refused as a whole.
	partial := FromSnapshot(source, snap)
	partial.Entries = partial.Entries[:2] // create_charge without stripe.refund
	if ms, errs := partial.Verify(trust, nil); ms != nil || len(errs) != 1 || !strings.Contains(errs[0].Error(), `tool "stripe.refund" has no manifest`) {
		t.Fatalf("subset: %v", errs)
	}
}

// The set is signed: entries that each verify cannot be swapped for older signed versions,
// joined by another registry's signed entries or dropped, and the snapshot itself cannot be
// edited (sequence, revision) or made by another key. A controller key alone cannot vouch for a
// set the writer did not sign either.
func TestVerifyRefusesSplicedSets(t *testing.T) {
	ctl := signingtest.NewKey(t)
	k := signingtest.NewKey(t)
	docs, errs := manifest.ReadPaths("../../test/fixtures/manifests")
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		t.Fatal(errs, verrs)
	}
	reg := registry.New(filepath.Join(t.TempDir(), "reg"))
	w := registry.WriteOptions{By: "alice", Signer: k.Signer}
	if _, err := reg.Publish(ms, manifest.Approved, w); err != nil {
		t.Fatal(err)
	}
	v1, lerrs := reg.Load(k.Trust)
	if len(lerrs) > 0 {
		t.Fatal(lerrs)
	}
	if _, err := reg.Publish(ms[2:], manifest.Approved, w); err != nil { // stripe.refund v2
		t.Fatal(err)
	}
	v2, lerrs := reg.Load(k.Trust)
	if len(lerrs) > 0 {
		t.Fatal(lerrs)
	}
	other := registry.New(filepath.Join(t.TempDir(), "other"))
	var extra manifest.Manifest
	for _, m := range ms {
		if m.Effect == manifest.ReadOnly {
			extra = *m
		}
	}
	extra.Tool = "stripe.list_customers"
	if _, err := other.Publish([]*manifest.Manifest{&extra}, manifest.Approved, w); err != nil {
		t.Fatal(err)
	}
	otherSnap, lerrs := other.Load(k.Trust)
	if len(lerrs) > 0 {
		t.Fatal(lerrs)
	}
	good := attested(t, v2, source, 20, ctl.Signer)
	if _, errs := good.Verify(k.Trust, ctl.Trust); len(errs) > 0 {
		t.Fatalf("honest: %v", errs)
	}
	entry := func(b Bundle, tool string) int {
		for i, e := range b.Entries {
			if e.Tool == tool {
				return i
			}
		}
		t.Fatalf("no %s", tool)
		return -1
	}
	copyOf := func(b Bundle) Bundle {
		b.Entries = append([]Entry(nil), b.Entries...)
		b.Snapshots = append([]SignedSnapshot(nil), b.Snapshots...)
		return b
	}
	older := copyOf(good)
	older.Entries[entry(older, "stripe.refund")] = FromSnapshot(source, v1).Entries[entry(FromSnapshot(source, v1), "stripe.refund")]
	added := copyOf(good)
	spliced := FromSnapshot(source, otherSnap).Entries[0]
	added.Entries = append(added.Entries, spliced)
	addedOwnSource := copyOf(good)
	spliced.Source = "ManifestRegistry agents/other"
	addedOwnSource.Entries = append(addedOwnSource.Entries, spliced)
	dropped := copyOf(good)
	dropped.Entries = dropped.Entries[1:]
	edited := copyOf(good)
	edited.Snapshots[0].Snapshot.Sequence = 99
	otherCtl := attested(t, v2, source, 20, signingtest.NewKey(t).Signer)
	// A controller that signs a set the writer did not (the v1 index proof over v2's entries).
	v1Index := v1.Index
	wrongProof := FromSnapshot(source, v2)
	if _, err := wrongProof.Attest(Snapshot{Source: source, Kind: KindRegistry, Revision: rev, Sequence: 21, Index: &v1Index}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	// A Registry entry relabelled as coming from a Plain source (whose entries need no writer
	// signature) does not match that source's signed digest.
	plain, err := FromManifests("ManifestRegistry agents/plain", ms[:1])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Attest(Snapshot{Source: "ManifestRegistry agents/plain", Kind: KindPlain, Revision: rev, Sequence: 3}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	unsignedEntry := copyOf(good)
	unsignedEntry.Snapshots = append(unsignedEntry.Snapshots, plain.Snapshots...)
	i := entry(unsignedEntry, "stripe.refund")
	unsignedEntry.Entries[i].Signature, unsignedEntry.Entries[i].KeyID, unsignedEntry.Entries[i].Source = "", "", "ManifestRegistry agents/plain"

	cases := map[string]struct {
		b    Bundle
		want string
	}{
		"older signed version swapped in": {older, "entries were swapped, added or dropped"},
		"entry from another registry":     {added, "entries were swapped, added or dropped"},
		"entry with its own source":       {addedOwnSource, "has no verified snapshot"},
		"entry dropped":                   {dropped, "entries were swapped, added or dropped"},
		"snapshot edited":                 {edited, "not signed by the controller, or edited after"},
		"another controller key":          {otherCtl, "not signed by the controller"},
		"set the writer did not sign":     {wrongProof, "not the versions the writer signed"},
		"entry moved to a Plain source":   {unsignedEntry, "entries were swapped, added or dropped"},
		"no snapshot at all":              {FromSnapshot(source, v2), "has no verified snapshot"},
	}
	for name, c := range cases {
		if out, errs := c.b.Verify(k.Trust, ctl.Trust); out != nil || !containsErr(errs, c.want) {
			t.Errorf("%s: want %q in %v", name, c.want, errs)
		}
	}
	// Plain entries carry no writer signature: with writers set they pass only under a
	// verified Plain snapshot.
	if out, errs := plain.Verify(k.Trust, ctl.Trust); len(errs) > 0 || len(out) != 1 {
		t.Fatalf("plain source under its snapshot: %v", errs)
	}
	noSnap, _ := FromManifests("ManifestRegistry agents/plain", ms[:1])
	if _, errs := noSnap.Verify(k.Trust, nil); !containsErr(errs, "not signed") {
		t.Fatalf("plain entries with writers but no controller keys: %v", errs)
	}
}

func containsErr(errs []error, want string) bool {
	for _, e := range errs {
		if strings.Contains(e.Error(), want) {
			return true
		}
	}
	return false
}

func TestFromManifestsVerifiesWithoutTrustOnly(t *testing.T) {
	docs, errs := manifest.ReadPaths("../../test/fixtures/manifests")
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		t.Fatal(errs, verrs)
	}
	b, err := FromManifests(source, ms)
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
	if out, errs := got.Verify(nil, nil); len(errs) > 0 || len(out) != 3 {
		t.Fatalf("plain bundle: %v", errs)
	}
	_, trust := signedSnapshot(t, 0)
	if _, errs := got.Verify(trust, nil); len(errs) != 3 {
		t.Fatalf("unsigned plain entries with trusted keys: %v", errs)
	}
}

// A rendering in which an enforced tool leans on a draft is refused as a whole: a signed
// draft swapped in for the approved compensation tool (each entry verifies on its own), or a
// plain rendering whose approved tool is compensated by a draft.
func TestVerifyRefusesAnEnforcedToolLeaningOnADraft(t *testing.T) {
	k := signingtest.NewKey(t)
	docs, errs := manifest.ReadPaths("../../test/fixtures/manifests")
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		t.Fatal(errs, verrs)
	}
	reg := registry.New(filepath.Join(t.TempDir(), "reg"))
	o := registry.WriteOptions{By: "alice", Signer: k.Signer}
	if _, err := reg.Publish(ms, manifest.Approved, o); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Publish(ms[2:], manifest.Draft, o); err != nil { // stripe.refund v2, a signed draft
		t.Fatal(err)
	}
	snap, lerrs := reg.Load(k.Trust)
	if len(lerrs) > 0 {
		t.Fatal(lerrs)
	}
	draft, err := reg.ReadVersion("stripe.refund", 2)
	if err != nil {
		t.Fatal(err)
	}
	b := FromSnapshot(rev, snap)
	b.Entries[2] = Entry{Tool: draft.Tool, Entry: draft.Entry, Manifest: draft.Canonical}
	want := `stripe.create_charge: compensation.tool: tool "stripe.refund" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve stripe.refund first (reversi manifests approve stripe.refund, or status: approved in plain files)`
	if out, errs := b.Verify(k.Trust, nil); out != nil || len(errs) != 1 || errs[0].Error() != want {
		t.Fatalf("signed draft swapped in: %v\nwant %s", errs, want)
	}

	refund := *ms[2]
	refund.Status = manifest.Draft
	plain, err := FromManifests(rev, []*manifest.Manifest{ms[0], ms[1], &refund})
	if err != nil {
		t.Fatal(err)
	}
	if out, errs := plain.Verify(nil, nil); out != nil || len(errs) != 1 || errs[0].Error() != want {
		t.Fatalf("plain rendering: %v\nwant %s", errs, want)
	}
}

// A gateway pod accepts only its own gateway's rendering: one gateway snapshot naming it, over
// exactly the rendering's entries and sources; a registry's rendering, another gateway's, or a
// gateway snapshot over other sources does not stand in. With writers, a Plain source must be
// accepted unsigned by the gateway snapshot; no sequence may lie far in the future.
func TestVerifyGatewayBindsTheSources(t *testing.T) {
	ctl := signingtest.NewKey(t)
	snap, trust := signedSnapshot(t, 0)
	now := time.Now()
	gateway := GatewaySource("agents", "pay")
	render := func(gw string, seq int64, unsigned ...string) Bundle {
		b := attested(t, snap, source, 5, ctl.Signer)
		if _, err := b.AttestGateway(Snapshot{Source: gw, Sequence: seq}, unsigned, ctl.Signer); err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := render(gateway, 9)
	if ms, errs := good.VerifyGateway(gateway, trust, ctl.Trust, now); len(errs) > 0 || len(ms) != 3 {
		t.Fatalf("honest: %v", errs)
	}
	if got := good.Revision(); got != source+" "+rev+" (sequence 5)" {
		t.Errorf("revision %q names the gateway snapshot", got)
	}
	plainB, err := FromManifests("ManifestRegistry agents/plain", snap.Manifests)
	if err != nil {
		t.Fatal(err)
	}
	plainUnverified := plainB
	if _, err := plainB.Attest(Snapshot{Source: "ManifestRegistry agents/plain", Kind: KindPlain, Revision: rev, Sequence: 4, CommitSigner: "SHA256:committer"}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	if _, err := plainUnverified.Attest(Snapshot{Source: "ManifestRegistry agents/plain", Kind: KindPlain, Revision: rev, Sequence: 4}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	if _, err := plainUnverified.AttestGateway(Snapshot{Source: gateway, Sequence: 9}, []string{"ManifestRegistry agents/plain"}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	plainGW := plainB
	if _, err := plainGW.AttestGateway(Snapshot{Source: gateway, Sequence: 9}, nil, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	plainOK := plainB
	plainOK.Snapshots = append([]SignedSnapshot(nil), plainB.Snapshots...)
	if _, err := plainOK.AttestGateway(Snapshot{Source: gateway, Sequence: 9}, []string{"ManifestRegistry agents/plain"}, ctl.Signer); err != nil {
		t.Fatal(err)
	}
	otherSources := attested(t, snap, source, 5, ctl.Signer)
	g := plainGW.Snapshots[len(plainGW.Snapshots)-1] // signed over the plain source
	otherSources.Snapshots = append(otherSources.Snapshots, g)
	cases := map[string]struct {
		b    Bundle
		want string
	}{
		"a registry's rendering":       {attested(t, snap, source, 5, ctl.Signer), "0 gateway snapshots"},
		"another gateway's rendering":  {render(GatewaySource("agents", "sandbox"), 9), "another gateway's rendering was put in its place"},
		"a gateway snapshot of others": {otherSources, "another source's rendering was put in its place"},
		"a Plain source not accepted":  {plainGW, "does not accept it unsigned"},
		"a sequence far in the future": {render(gateway, now.UnixMilli()+2*MaxFutureSequence), "lies in the future"},
	}
	for name, c := range cases {
		if ms, errs := c.b.VerifyGateway(gateway, trust, ctl.Trust, now); ms != nil || !containsErr(errs, c.want) {
			t.Errorf("%s: want %q in %v", name, c.want, errs)
		}
	}
	if _, errs := plainOK.VerifyGateway(gateway, trust, ctl.Trust, now); len(errs) > 0 {
		t.Errorf("a Plain source the gateway accepts: %v", errs)
	}
}

// A rendering's refused signatures are typed like a registry load's: an unsigned or untrusted
// entry, a snapshot by another controller key or with a malformed signature, each matched with
// errors.Is (the gateway and the controller never read the text).
func TestVerifySignatureErrorsAreTyped(t *testing.T) {
	snap, trust := signedSnapshot(t, 0)
	ctl := signingtest.NewKey(t)
	unsigned := FromSnapshot(source, snap)
	unsigned.Entries[0].Signature, unsigned.Entries[0].KeyID = "", ""
	malformed := attested(t, snap, source, 7, ctl.Signer)
	malformed.Snapshots[0].Signature = "not base64!"
	cases := map[string]struct {
		b                   Bundle
		writers, controller *signing.TrustSet
		is                  error
	}{
		"entry not signed":               {unsigned, trust, nil, signing.ErrNotSigned},
		"entry by an untrusted writer":   {FromSnapshot(source, snap), signingtest.NewKey(t).Trust, nil, signing.ErrUntrusted},
		"snapshot by another controller": {attested(t, snap, source, 7, signingtest.NewKey(t).Signer), trust, ctl.Trust, signing.ErrUntrusted},
		"snapshot signature malformed":   {malformed, trust, ctl.Trust, signing.ErrMalformedSignature},
	}
	for name, c := range cases {
		_, errs := c.b.Verify(c.writers, c.controller)
		if len(errs) == 0 {
			t.Fatalf("%s: verified", name)
		}
		// The first problem is the signature's (a refused snapshot leaves its entries without one).
		if e := errs[0]; !errors.Is(e, c.is) || !registry.IsSignatureError(e) {
			t.Errorf("%s: %v is not %v", name, e, c.is)
		}
	}
}
