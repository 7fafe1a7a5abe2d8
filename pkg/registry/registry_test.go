package registry

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/pkg/signing"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
)

// keyPair is a test signing key.
type keyPair = signingtest.Key

var newKey = signingtest.NewKey

const payments = "../../test/fixtures/manifests"

func loadFixtures(t testing.TB) []*manifest.Manifest {
	t.Helper()
	docs, errs := manifest.ReadPaths(payments)
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		t.Fatal(errs, verrs)
	}
	return ms
}

// seedRegistry is the seed's walkthrough: publish as alice (draft) and approve as bob with
// four eyes, the tools create_charge leans on first (an approved tool cannot name a draft).
func seedRegistry(t *testing.T, k keyPair) *Registry {
	t.Helper()
	r := New(filepath.Join(t.TempDir(), "reg"))
	alice := WriteOptions{By: "alice", Note: "first draft", Signer: k.Signer}
	pub, err := r.Publish(loadFixtures(t), "", alice)
	if err != nil {
		t.Fatal(err)
	}
	if len(pub) != 3 || pub[1].Tool != "stripe.create_charge" || pub[1].Version != 1 || pub[1].Status != manifest.Draft {
		t.Fatalf("published %+v", pub)
	}
	bob := WriteOptions{By: "bob", Signer: k.Signer}
	for _, tool := range []string{"stripe.get_charge", "stripe.refund", "stripe.create_charge"} {
		p, err := r.Approve(tool, 0, true, bob)
		if err != nil {
			t.Fatal(err)
		}
		if p.Version != 2 || p.Status != manifest.Approved || p.Approver != "bob" || p.Author != "alice" || p.Note != "approved from v1" {
			t.Fatalf("approved %+v", p)
		}
	}
	return r
}

func TestWalkthroughLoadsSignedApprovedVersions(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k)
	snap, errs := r.Load(k.Trust)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if len(snap.Manifests) != 3 || snap.Entries["stripe.create_charge"].Version != 2 {
		t.Fatalf("snapshot %+v", snap.Entries)
	}
	cc := snap.Manifests[0]
	if cc.Tool != "stripe.create_charge" || cc.Status != manifest.Approved || cc.Version != 2 {
		t.Fatalf("loaded %s v%d %s", cc.Tool, cc.Version, cc.Status)
	}
	// approve keeps the approval object (roles, quorum, timeout, escalate_to) as written.
	a := cc.Approval.Rules
	if a == nil || a.Quorum != 2 || a.Roles[0] != "finance" || *a.TimeoutMs != 900000 || a.OnTimeout != "escalate" || a.EscalateTo[0] != "cfo" {
		t.Fatalf("approval rules lost: %+v", cc.Approval)
	}
	rep, errs := r.Verify(k.Trust)
	if len(errs) > 0 || rep.Tools != 3 || rep.Versions != 6 || rep.Signed != 6 {
		t.Fatalf("verify %+v %v", rep, errs)
	}
	if _, err := r.Approve("stripe.refund", 0, true, WriteOptions{By: "carol"}); err == nil || !strings.Contains(err.Error(), "stripe.refund has no pending draft: the newest version, v2, is approved") {
		t.Fatalf("approve with no draft: %v", err)
	}
}

func TestDraftsAreNotLoaded(t *testing.T) {
	r := New(t.TempDir())
	ms := loadFixtures(t)
	if _, err := r.Publish(ms, manifest.Approved, WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Publish(ms[1:2], "", WriteOptions{By: "alice", Note: "v2 draft"}); err != nil {
		t.Fatal(err)
	}
	snap, errs := r.Load(nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if e := snap.Entries["stripe.create_charge"]; e.Version != 1 || e.Status != manifest.Approved {
		t.Fatalf("loaded %+v, want the approved v1 under the v2 draft", e)
	}
	// A tool with only drafts is absent; the approved tools that do not lean on it load.
	r2 := New(t.TempDir())
	if _, err := r2.Publish(ms, "", WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Approve("stripe.refund", 0, true, WriteOptions{By: "bob"}); err != nil {
		t.Fatal(err)
	}
	snap, errs = r2.Load(nil)
	if len(errs) > 0 || len(snap.Manifests) != 1 || snap.Manifests[0].Tool != "stripe.refund" {
		t.Fatalf("errs %v, %d manifests", errs, len(snap.Manifests))
	}
}

// The draft messages of create_charge (fixture order: compensation, then verification).
const (
	refundIsDraft = `compensation.tool: tool "stripe.refund" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve stripe.refund first (reversi manifests approve stripe.refund, or status: approved in plain files)`
	getIsDraft    = `compensation.verification.tool: tool "stripe.get_charge" is only a draft: drafts are not enforced, so compensation.verification.tool cannot use it; approve stripe.get_charge first (reversi manifests approve stripe.get_charge, or status: approved in plain files)`
)

// writeUnchecked writes versions the way writers did before they applied the draft rule (no
// cross-manifest check), each tool with its status: what an old or hand-made registry holds.
func writeUnchecked(t *testing.T, r *Registry, ms []*manifest.Manifest, status map[string]manifest.Status) {
	t.Helper()
	o := WriteOptions{By: "alice"}
	if err := r.update(o, func(idx *Index) error {
		for _, m := range ms {
			approver := ""
			if status[m.Tool] != manifest.Draft {
				approver = "bob"
			}
			if _, err := r.appendVersion(idx, m, status[m.Tool], "alice", approver, o); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// An approved tool whose compensation and verification tools have only drafts does not load:
// the drafts are absent, so its rollback would run tools nobody approved.
func TestLoadRefusesAnApprovedToolLeaningOnDrafts(t *testing.T) {
	r := New(t.TempDir())
	writeUnchecked(t, r, loadFixtures(t), map[string]manifest.Status{
		"stripe.get_charge": manifest.Draft, "stripe.create_charge": manifest.Approved, "stripe.refund": manifest.Draft,
	})
	snap, errs := r.Load(nil)
	want := []string{"index.json: stripe.create_charge v1: " + refundIsDraft, "index.json: stripe.create_charge v1: " + getIsDraft}
	if len(errs) != 2 || errs[0].Error() != want[0] || errs[1].Error() != want[1] {
		t.Fatalf("errors %q\nwant %q", errs, want)
	}
	if p, ok := errs[0].(*Problem); !ok || p.Tool != "stripe.create_charge" {
		t.Fatalf("the problem does not name the tool: %#v", errs[0])
	}
	if _, lerrs := (&Loader{Registry: r}).Reload(nil); len(lerrs) != 2 || snap == nil {
		t.Fatalf("the loader took the set: %v", lerrs)
	}
	// Approving the drafts is the fix; a draft's own references still wait for its approval.
	if _, err := r.Approve("stripe.refund", 0, false, WriteOptions{By: "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Approve("stripe.get_charge", 0, false, WriteOptions{By: "bob"}); err != nil {
		t.Fatal(err)
	}
	if snap, errs := r.Load(nil); len(errs) > 0 || len(snap.Manifests) != 3 {
		t.Fatalf("after approving: %v", errs)
	}
}

// Writers write an enforced version that names a tool which is only a draft (the seed's
// walkthrough approves create_charge before its compensation tool), but warn: the registry does
// not load until that tool is approved too. Other cross-manifest problems still refuse a write.
func TestWritersWarnAboutAnEnforcedVersionLeaningOnDrafts(t *testing.T) {
	r := New(t.TempDir())
	ms := loadFixtures(t)
	if _, err := r.Publish(ms, "", WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	wantWarnings := []string{"stripe.create_charge: " + refundIsDraft + ": the registry does not load until then",
		"stripe.create_charge: " + getIsDraft + ": the registry does not load until then"}
	p, err := r.Approve("stripe.create_charge", 0, true, WriteOptions{By: "bob"})
	if err != nil || !slices.Equal(p.Warnings, wantWarnings) {
		t.Fatalf("approve: %v %q\nwant %q", err, p.Warnings, wantWarnings)
	}
	if _, errs := r.Load(nil); !containsErr(errs, refundIsDraft) {
		t.Fatalf("load of a registry leaning on drafts: %v", errs)
	}
	pub, err := r.Publish(ms[1:2], manifest.Approved, WriteOptions{By: "bob"})
	if err != nil || len(pub) != 1 || !slices.Equal(pub[0].Warnings, wantWarnings) {
		t.Fatalf("publish --status approved: %v %+v", err, pub)
	}
	// A new draft's own references are still checked, and refuse the write.
	bad := *ms[2]
	bad.Requires = []manifest.Requirement{{Tool: "stripe.nope", Status: manifest.RequirementSucceeded}}
	if _, err := r.Publish([]*manifest.Manifest{&bad}, manifest.Draft, WriteOptions{By: "alice"}); err == nil || err.Error() != `stripe.refund: requires[0]: tool "stripe.nope" has no manifest: add its manifest or fix the name` {
		t.Fatalf("a draft naming a missing tool: %v", err)
	}
	// Approving the drafts repairs the registry, with no warning left.
	for _, tool := range []string{"stripe.refund", "stripe.get_charge"} {
		if p, err := r.Approve(tool, 0, false, WriteOptions{By: "bob"}); err != nil || len(p.Warnings) != 0 {
			t.Fatalf("approve %s: %v %q", tool, err, p.Warnings)
		}
	}
	if _, errs := r.Load(nil); len(errs) > 0 {
		t.Fatalf("load after the approvals: %v", errs)
	}
	// A tool that has only a draft cannot replace a deprecated one.
	fresh := *ms[0]
	fresh.Tool = "stripe.get_charge_v2"
	if _, err := r.Publish([]*manifest.Manifest{&fresh}, manifest.Draft, WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Deprecate("stripe.get_charge", "stripe.get_charge_v2", WriteOptions{By: "bob"}); err == nil || !strings.Contains(err.Error(), "--replaced-by: stripe.get_charge_v2 has no [approved deprecated] version") {
		t.Fatalf("deprecate --replaced-by a draft: %v", err)
	}
}

func TestFourEyesRefusesTheAuthor(t *testing.T) {
	r := New(t.TempDir())
	if _, err := r.Publish(loadFixtures(t), "", WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	_, err := r.Approve("stripe.refund", 0, true, WriteOptions{By: "alice"})
	if err == nil || !strings.Contains(err.Error(), "alice wrote stripe.refund v1 and cannot approve it") {
		t.Fatalf("err %v", err)
	}
	if es, _ := r.History("stripe.refund"); len(es) != 1 {
		t.Fatalf("a refused approval wrote a version: %+v", es)
	}
	if _, err := r.Approve("stripe.refund", 0, false, WriteOptions{By: "alice"}); err != nil {
		t.Fatalf("without four eyes: %v", err)
	}
}

func TestDeprecateAndRollback(t *testing.T) {
	r := New(t.TempDir())
	ms := loadFixtures(t)
	if _, err := r.Publish(ms, manifest.Approved, WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Deprecate("stripe.get_charge", "stripe.nope", WriteOptions{By: "bob"}); err == nil || !strings.Contains(err.Error(), "stripe.nope is not in the registry") {
		t.Fatalf("unknown replacement: %v", err)
	}
	p, err := r.Deprecate("stripe.refund", "stripe.get_charge", WriteOptions{By: "bob"})
	if err != nil || p.Version != 2 || p.Status != manifest.Deprecated {
		t.Fatalf("deprecate %+v %v", p, err)
	}
	snap, errs := r.Load(nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if m := snap.Manifests[2]; m.Tool != "stripe.refund" || m.Status != manifest.Deprecated || m.ReplacedBy != "stripe.get_charge" {
		t.Fatalf("deprecated manifest %+v", m)
	}
	p, err = r.Rollback("stripe.refund", 1, WriteOptions{By: "carol"})
	if err != nil || p.Version != 3 || p.Status != manifest.Approved || p.Note != "rollback to v1" || p.Approver != "carol" {
		t.Fatalf("rollback %+v %v", p, err)
	}
	v1, _ := r.ReadVersion("stripe.refund", 1)
	v3, _ := r.ReadVersion("stripe.refund", 3)
	v1.Manifest.Version = 3
	if !manifest.JSONEqual(v1.Manifest, v3.Manifest) {
		t.Fatalf("rollback changed the manifest:\n%+v\n%+v", v1.Manifest, v3.Manifest)
	}
	if es, _ := r.History("stripe.refund"); len(es) != 3 {
		t.Fatalf("history %+v", es)
	}
}

func TestPublishChecksReferencesAgainstTheRegistry(t *testing.T) {
	r := New(t.TempDir())
	ms := loadFixtures(t)
	// create_charge alone: its compensation and verification tools are not registered.
	if _, err := r.Publish(ms[1:2], "", WriteOptions{By: "alice"}); err == nil || !strings.Contains(err.Error(), `tool "stripe.refund" has no manifest`) {
		t.Fatalf("err %v", err)
	}
	if _, err := r.Publish([]*manifest.Manifest{ms[0], ms[2]}, "", WriteOptions{By: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Publish(ms[1:2], "", WriteOptions{By: "alice"}); err != nil {
		t.Fatalf("references now registered: %v", err)
	}
}

// tamper helpers ---------------------------------------------------------------------------

func versionFile(t *testing.T, r *Registry, tool string, v int) string {
	rel, err := versionPath(tool, v)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(r.Dir, filepath.FromSlash(rel))
}

func editJSON(t *testing.T, path string, edit func(m map[string]any)) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func indexEntry(m map[string]any, tool string, v int) map[string]any {
	return m["tools"].(map[string]any)[tool].([]any)[v-1].(map[string]any)
}

// Every fault is refused by verify and by load, with a message naming it, and a Loader keeps
// the snapshot of its last good load.
func TestTamperingIsRefusedAndTheLastGoodLoadStays(t *testing.T) {
	other := newKey(t)
	cases := []struct {
		name    string
		trustFn func(k keyPair) *signing.TrustSet
		tamper  func(t *testing.T, r *Registry, k keyPair)
		want    string
	}{
		{"version file edited after publishing", nil, func(t *testing.T, r *Registry, k keyPair) {
			editJSON(t, versionFile(t, r, "stripe.create_charge", 2), func(m map[string]any) {
				m["manifest"].(map[string]any)["permission"] = "payments:read"
			})
		}, "edited after publishing"},
		{"index checksum changed", nil, func(t *testing.T, r *Registry, k keyPair) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) {
				indexEntry(m, "stripe.refund", 2)["checksum"] = strings.Repeat("0", 64)
			})
		}, "index.json disagrees with tools/stripe.refund/v2.json ([checksum] differ)"},
		{"index status changed", nil, func(t *testing.T, r *Registry, k keyPair) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) {
				indexEntry(m, "stripe.refund", 2)["status"] = "deprecated"
			})
		}, "index.json disagrees with tools/stripe.refund/v2.json ([status] differ)"},
		{"signature by an untrusted key", func(keyPair) *signing.TrustSet { return other.Trust }, func(*testing.T, *Registry, keyPair) {}, "which is not trusted"},
		{"missing signature with a trusted key", nil, func(t *testing.T, r *Registry, k keyPair) {
			for _, p := range []string{versionFile(t, r, "stripe.refund", 2)} {
				editJSON(t, p, func(m map[string]any) { delete(m, "signature"); delete(m, "key_id") })
			}
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) {
				e := indexEntry(m, "stripe.refund", 2)
				delete(e, "signature")
				delete(e, "key_id")
			})
		}, "not signed, but trusted keys are set"},
		{"signature copied from v1 onto v2", nil, func(t *testing.T, r *Registry, k keyPair) {
			var sig any
			editJSON(t, versionFile(t, r, "stripe.refund", 1), func(m map[string]any) { sig = m["signature"] })
			editJSON(t, versionFile(t, r, "stripe.refund", 2), func(m map[string]any) { m["signature"] = sig })
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { indexEntry(m, "stripe.refund", 2)["signature"] = sig })
		}, "the signature does not verify with key"},
		{"key id that does not match the signing key", func(k keyPair) *signing.TrustSet {
			ts, _ := signing.ParseTrustSet(append(append([]byte{}, k.PublicPEM...), other.PublicPEM...))
			return ts
		}, func(t *testing.T, r *Registry, k keyPair) {
			set := func(m map[string]any) { m["key_id"] = other.Signer.KeyID }
			editJSON(t, versionFile(t, r, "stripe.refund", 2), set)
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { set(indexEntry(m, "stripe.refund", 2)) })
		}, "does not verify with key " + other.Signer.KeyID},
		{"truncated version file", nil, func(t *testing.T, r *Registry, k keyPair) {
			p := versionFile(t, r, "stripe.get_charge", 2)
			data, _ := os.ReadFile(p)
			if err := os.WriteFile(p, data[:len(data)/2], 0o644); err != nil {
				t.Fatal(err)
			}
		}, "the file is damaged"},
		{"non-JSON version file", nil, func(t *testing.T, r *Registry, k keyPair) {
			if err := os.WriteFile(versionFile(t, r, "stripe.get_charge", 2), []byte("tool: yaml\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "not valid registry JSON"},
		{"tool folder escaping the registry", nil, func(t *testing.T, r *Registry, k keyPair) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) {
				tools := m["tools"].(map[string]any)
				tools[".."] = tools["stripe.refund"]
			})
		}, `tool name ".." cannot be a folder name`},
		{"version file replaced by a symlink out of the registry", nil, func(t *testing.T, r *Registry, k keyPair) {
			outside := filepath.Join(t.TempDir(), "v2.json")
			data, _ := os.ReadFile(versionFile(t, r, "stripe.refund", 2))
			_ = os.WriteFile(outside, data, 0o644)
			p := versionFile(t, r, "stripe.refund", 2)
			_ = os.Remove(p)
			if err := os.Symlink(outside, p); err != nil {
				t.Fatal(err)
			}
		}, "path escapes from parent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := newKey(t)
			r := seedRegistry(t, k)
			l := &Loader{Registry: r}
			good, errs := l.Reload(k.Trust)
			if len(errs) > 0 || good == nil {
				t.Fatal(errs)
			}
			c.tamper(t, r, k)
			trust := k.Trust
			if c.trustFn != nil {
				trust = c.trustFn(k)
			}
			if _, errs := r.Verify(trust); !containsErr(errs, c.want) {
				t.Errorf("verify: want %q in %v", c.want, errs)
			}
			got, errs := l.Reload(trust)
			if !containsErr(errs, c.want) {
				t.Errorf("load: want %q in %v", c.want, errs)
			}
			if got != good || l.Current() != good {
				t.Errorf("a refused load changed the current snapshot")
			}
		})
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

func TestVerifyReportsStrayFiles(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k)
	stray := versionFile(t, r, "stripe.refund", 9)
	if err := os.WriteFile(stray, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs := r.Verify(k.Trust); !containsErr(errs, "tools/stripe.refund/v9.json: not listed in index.json") {
		t.Fatalf("errs %v", errs)
	}
	// The writer refuses to overwrite a file it did not list either.
	for i := 3; i < 9; i++ {
		_ = os.WriteFile(versionFile(t, r, "stripe.refund", i), []byte("{}"), 0o644)
	}
	if _, err := r.Deprecate("stripe.refund", "", WriteOptions{By: "bob"}); err == nil || !strings.Contains(err.Error(), "versions are immutable") {
		t.Fatalf("overwrote an unlisted file: %v", err)
	}
}

// Rotation: with both keys trusted, versions signed by either load; dropping a key from the
// set stops trusting it at once.
func TestKeyRotation(t *testing.T) {
	oldK, newK := newKey(t), newKey(t)
	r := New(t.TempDir())
	ms := loadFixtures(t)
	if _, err := r.Publish(ms, manifest.Approved, WriteOptions{By: "alice", Signer: oldK.Signer}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Publish(ms[2:], manifest.Approved, WriteOptions{By: "alice", Signer: newK.Signer}); err != nil {
		t.Fatal(err)
	}
	both, err := signing.ParseTrustSet(append(append([]byte{}, oldK.PublicPEM...), newK.PublicPEM...))
	if err != nil {
		t.Fatal(err)
	}
	l := &Loader{Registry: r}
	if _, errs := l.Reload(both); len(errs) > 0 {
		t.Fatal(errs)
	}
	if _, errs := l.Reload(newK.Trust); !containsErr(errs, "signed by key "+oldK.Signer.KeyID+", which is not trusted") {
		t.Fatalf("old key still trusted: %v", errs)
	}
	// Re-sign what the old key signed (a rollback publishes it again) and the new key alone suffices.
	for _, tool := range []string{"stripe.create_charge", "stripe.get_charge"} {
		if _, err := r.Rollback(tool, 1, WriteOptions{By: "alice", Signer: newK.Signer}); err != nil {
			t.Fatal(err)
		}
	}
	if _, errs := l.Reload(newK.Trust); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// Eight writers at once on one registry: no lost version, no torn index.
func TestConcurrentWriters(t *testing.T) {
	k := newKey(t)
	r := New(t.TempDir())
	ms := loadFixtures(t)
	if _, err := r.Publish(ms, manifest.Approved, WriteOptions{By: "seed", Signer: k.Signer}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8*5)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				o := WriteOptions{By: fmt.Sprintf("w%d", w), Note: fmt.Sprintf("w%d-%d", w, i), Signer: k.Signer}
				if w%2 == 0 {
					_, err := r.Publish(ms[2:], "", o)
					errs <- err
				} else {
					o.By = "approver"
					_, err := r.Approve("stripe.refund", 0, false, o)
					if err != nil && strings.Contains(err.Error(), "has no pending draft") {
						err = nil // raced ahead of the publishers: nothing to approve yet
					}
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	es, err := r.History("stripe.refund")
	if err != nil {
		t.Fatal(err)
	}
	notes := map[string]bool{}
	for _, e := range es {
		notes[e.Note] = true
	}
	for w := 0; w < 8; w += 2 {
		for i := 0; i < 5; i++ {
			if !notes[fmt.Sprintf("w%d-%d", w, i)] {
				t.Errorf("lost version w%d-%d", w, i)
			}
		}
	}
	rep, verrs := r.Verify(k.Trust)
	if len(verrs) > 0 || rep.Versions != len(es)+2 {
		t.Fatalf("verify %+v %v", rep, verrs)
	}
}

func TestSignatureIsBase64OfEd25519(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k)
	es, _ := r.History("stripe.create_charge")
	sig, err := base64.StdEncoding.DecodeString(es[1].Signature)
	if err != nil || len(sig) != 64 || es[1].KeyID != k.Signer.KeyID {
		t.Fatalf("signature %q key %q", es[1].Signature, es[1].KeyID)
	}
	if err := k.Trust.Verify(es[1].KeyID, sig, signing.Message("stripe.create_charge", 2, es[1].Checksum)); err != nil {
		t.Fatal(err)
	}
}

func TestLoadPath(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k)
	if ms, errs := LoadPath(r.Dir, k.Trust); len(errs) > 0 || len(ms) != 3 {
		t.Fatalf("registry: %d %v", len(ms), errs)
	}
	if ms, errs := LoadPath(payments, nil); len(errs) > 0 || len(ms) != 3 {
		t.Fatalf("plain: %d %v", len(ms), errs)
	}
	_, errs := LoadPath(payments, k.Trust)
	want := payments + " is not a registry, but trusted manifest keys are set (manifest_public_key): plain manifest files carry no signatures to check; publish them to a signed registry (reversi manifests publish --key), or unset manifest_public_key"
	var pe *PlainTrustError
	if len(errs) != 1 || errs[0].Error() != want || !errors.As(errs[0], &pe) {
		t.Fatalf("trust on plain files: %v\nwant %s", errs, want)
	}
	// Plain files with an approved tool compensated by a draft: the gateway's --manifests.
	dir := t.TempDir()
	plain := "- tool: pay.charge\n  effect: compensable\n  permission: pay:write\n  compensation: {tool: pay.refund}\n" +
		"- tool: pay.refund\n  effect: idempotent\n  permission: pay:write\n  status: draft\n"
	if err := os.WriteFile(filepath.Join(dir, "pay.yaml"), []byte(plain), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs = LoadPath(dir, nil)
	want = filepath.Join(dir, "pay.yaml") + `:4: pay.charge: compensation.tool: tool "pay.refund" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve pay.refund first (reversi manifests approve pay.refund, or status: approved in plain files)`
	if len(errs) != 1 || errs[0].Error() != want {
		t.Fatalf("plain files leaning on a draft: %v\nwant %s", errs, want)
	}
	editJSON(t, versionFile(t, r, "stripe.refund", 2), func(m map[string]any) { m["note"] = "changed" })
	if ms, errs := LoadPath(r.Dir, k.Trust); ms != nil || !containsErr(errs, "[note] differ") {
		t.Fatalf("tampered registry: %d %v", len(ms), errs)
	}
}

// Characters encoding/json escapes by default (<, >, &) and non-ASCII text survive a round trip:
// the stored bytes compact back to the canonical JSON the checksum covers.
func TestSpecialCharactersRoundTrip(t *testing.T) {
	m, errs := manifest.Validate(map[string]any{"tool": "t.read", "effect": "read_only", "permission": "p", "description": "reads <a> & <b> — ünïcode"})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	k := newKey(t)
	r := New(t.TempDir())
	if _, err := r.Publish([]*manifest.Manifest{m}, manifest.Approved, WriteOptions{By: "a", Signer: k.Signer}); err != nil {
		t.Fatal(err)
	}
	snap, errs := r.Load(k.Trust)
	if len(errs) > 0 || snap.Manifests[0].Description != m.Description {
		t.Fatalf("%v %+v", errs, snap)
	}
	if _, errs := r.Verify(k.Trust); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// A stored manifest rewritten by hand into another valid but non-canonical form, with the
// checksums updated to match, still loads (the checksum binds the bytes interpreted) but the
// audit refuses it.
func TestVerifyRefusesNonCanonicalManifest(t *testing.T) {
	r := New(t.TempDir())
	if _, err := r.Publish(loadFixtures(t)[:1], manifest.Approved, WriteOptions{By: "a"}); err != nil {
		t.Fatal(err)
	}
	body := `{"tool":"stripe.get_charge","effect":"read_only","permission":"payments:read","status":"approved","version":1}`
	sum := sha256hex(body)
	editJSON(t, versionFile(t, r, "stripe.get_charge", 1), func(m map[string]any) {
		m["manifest"] = json.RawMessage(body)
		m["checksum"] = sum
	})
	editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { indexEntry(m, "stripe.get_charge", 1)["checksum"] = sum })
	if _, errs := r.Load(nil); len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	if _, errs := r.Verify(nil); !containsErr(errs, "not in canonical form") {
		t.Fatalf("verify: %v", errs)
	}
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// The index is signed too: dropping a tool's newest version (a silent downgrade), dropping a
// whole tool, or rewriting an approver in both the index and the version file breaks it; an
// emptied or missing index never loads as an empty registry.
func TestIndexEditsAreRefused(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(t *testing.T, r *Registry)
		want   string
	}{
		{"newest version dropped", func(t *testing.T, r *Registry) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) {
				tools := m["tools"].(map[string]any)
				tools["stripe.refund"] = tools["stripe.refund"].([]any)[:1]
			})
			_ = os.Remove(versionFile(t, r, "stripe.refund", 2))
		}, "index.json: signature does not verify"},
		{"whole tool dropped", func(t *testing.T, r *Registry) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) {
				delete(m["tools"].(map[string]any), "stripe.create_charge")
			})
			_ = os.RemoveAll(filepath.Dir(versionFile(t, r, "stripe.create_charge", 1)))
		}, "index.json: signature does not verify"},
		{"approver rewritten everywhere", func(t *testing.T, r *Registry) {
			set := func(m map[string]any) { m["approver"] = "mallory" }
			editJSON(t, versionFile(t, r, "stripe.refund", 2), set)
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { set(indexEntry(m, "stripe.refund", 2)) })
		}, "index.json: signature does not verify"},
		{"index emptied", func(t *testing.T, r *Registry) {
			if err := os.WriteFile(filepath.Join(r.Dir, IndexFile), []byte(`{"format":"`+Format+`","tools":{}}`), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "lists no tools"},
		{"index deleted", func(t *testing.T, r *Registry) {
			if err := os.Remove(filepath.Join(r.Dir, IndexFile)); err != nil {
				t.Fatal(err)
			}
		}, "is not a registry"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := newKey(t)
			r := seedRegistry(t, k)
			c.tamper(t, r)
			if _, errs := r.Load(k.Trust); !containsErr(errs, strings.TrimPrefix(c.want, "index.json: ")) {
				t.Errorf("load: want %q in %v", c.want, errs)
			}
			if _, errs := r.Verify(k.Trust); !containsErr(errs, strings.TrimPrefix(c.want, "index.json: ")) {
				t.Errorf("verify: want %q in %v", c.want, errs)
			}
		})
	}
	// Without trusted keys an emptied index is still refused, and unlisted files are named.
	k := newKey(t)
	r := seedRegistry(t, k)
	if err := os.WriteFile(filepath.Join(r.Dir, IndexFile), []byte(`{"format":"`+Format+`","tools":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs := r.Load(nil); !containsErr(errs, "lists no tools") || !containsErr(errs, "not listed in index.json") {
		t.Fatalf("unsigned emptied index: %v", errs)
	}
}

// Every write moves the sequence on, and the index signature covers it and the served set: a
// reader with only the served versions (a gateway) can tell the exact set the writer signed.
func TestIndexSequenceAndProof(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k) // publish (1 write) + 3 approvals
	snap, errs := r.Load(k.Trust)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if snap.Index.Sequence != 4 {
		t.Fatalf("sequence after 4 writes = %d", snap.Index.Sequence)
	}
	served := SetDigest(snap.Entries)
	if err := snap.Index.Verify(served, k.Trust); err != nil {
		t.Fatalf("the honest proof: %v", err)
	}
	// Another set (an older version swapped in, or one more entry), or a replayed sequence.
	older := map[string]Entry{}
	for tool, e := range snap.Entries {
		older[tool] = e
	}
	h, _ := r.History("stripe.refund")
	older["stripe.refund"] = h[0]
	more := map[string]Entry{"other.tool": h[0]}
	for tool, e := range snap.Entries {
		more[tool] = e
	}
	for name, set := range map[string]map[string]Entry{"older entry": older, "extra entry": more} {
		if err := snap.Index.Verify(SetDigest(set), k.Trust); err == nil || !strings.Contains(err.Error(), "not the versions the writer signed") {
			t.Errorf("%s: %v", name, err)
		}
	}
	replayed := snap.Index
	replayed.Sequence = 9
	if err := replayed.Verify(served, k.Trust); err == nil {
		t.Error("a proof with another sequence verified")
	}
	// The signature names the registry: another registry's id does not verify, and every
	// registry gets its own id at its first write.
	other := snap.Index
	other.ID = New(filepath.Join(t.TempDir(), "other")).Dir
	if err := other.Verify(served, k.Trust); err == nil {
		t.Error("a proof with another registry id verified")
	}
	r2 := seedRegistry(t, k)
	snap2, _ := r2.Load(k.Trust)
	if len(snap.Index.ID) != 32 || snap2.Index.ID == snap.Index.ID {
		t.Errorf("registry ids %q and %q", snap.Index.ID, snap2.Index.ID)
	}
	if err := snap.Index.Verify(served, newKey(t).Trust); !errors.Is(err, signing.ErrUntrusted) {
		t.Errorf("untrusted writer: %v", err)
	}
	unsigned := snap.Index
	unsigned.Signature = ""
	if err := unsigned.Verify(served, k.Trust); err == nil || !strings.Contains(err.Error(), "not signed") {
		t.Errorf("unsigned: %v", err)
	}
}

// An index written before sequences existed does not load with trust; manifests sign upgrades
// it (next sequence, same versions) and is itself refused without a key or over a damaged registry.
func TestIndexWithoutSequenceAndSign(t *testing.T) {
	k := newKey(t)
	r := seedRegistry(t, k)
	editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { delete(m, "sequence") })
	if _, errs := r.Load(k.Trust); !containsErr(errs, "index.json has no sequence") {
		t.Fatalf("load of an index without a sequence: %v", errs)
	}
	if _, err := r.Sign(WriteOptions{By: "ops"}); err == nil {
		t.Fatal("sign without a key succeeded")
	}
	seq, err := r.Sign(WriteOptions{By: "ops", Signer: k.Signer})
	if err != nil || seq != 1 {
		t.Fatalf("sign: %d %v", seq, err)
	}
	snap, errs := r.Load(k.Trust)
	if len(errs) > 0 || snap.Index.Sequence != 1 || len(snap.Manifests) != 3 {
		t.Fatalf("after sign: %+v %v", snap, errs)
	}
	_ = os.Remove(versionFile(t, r, "stripe.refund", 1))
	if _, err := r.Sign(WriteOptions{By: "ops", Signer: k.Signer}); err == nil || !strings.Contains(err.Error(), "fix them before signing") {
		t.Fatalf("sign over a damaged registry: %v", err)
	}
}

// A refused signature is a typed error (errors.Is on the signing sentinels, IsSignatureError,
// through the *Problem that names the file), whatever the text says; a problem that only
// mentions a signature is not one. The controller reports SignatureVerificationFailed on
// exactly these.
func TestSignatureProblemsAreTyped(t *testing.T) {
	other := newKey(t)
	cases := []struct {
		name   string
		trust  func(k keyPair) *signing.TrustSet
		tamper func(t *testing.T, r *Registry)
		want   string // in the problem's text, which stays what it was
		is     error  // nil: not a signature problem
		file   string // the *Problem's File
	}{
		{name: "untrusted writer", trust: func(keyPair) *signing.TrustSet { return other.Trust }, tamper: func(*testing.T, *Registry) {},
			want: "which is not trusted", is: signing.ErrUntrusted, file: "tools/stripe.refund/v2.json"},
		{name: "version signed for another version", tamper: func(t *testing.T, r *Registry) {
			var sig any
			editJSON(t, versionFile(t, r, "stripe.refund", 1), func(m map[string]any) { sig = m["signature"] })
			editJSON(t, versionFile(t, r, "stripe.refund", 2), func(m map[string]any) { m["signature"] = sig })
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { indexEntry(m, "stripe.refund", 2)["signature"] = sig })
		}, want: "v2: the signature does not verify with key", is: signing.ErrBadSignature, file: "tools/stripe.refund/v2.json"},
		{name: "version unsigned", tamper: func(t *testing.T, r *Registry) {
			drop := func(m map[string]any) { delete(m, "signature"); delete(m, "key_id") }
			editJSON(t, versionFile(t, r, "stripe.refund", 2), drop)
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { drop(indexEntry(m, "stripe.refund", 2)) })
		}, want: "v2: not signed, but trusted keys are set: every version must be signed by one of them; publish again with --key", is: signing.ErrNotSigned, file: "tools/stripe.refund/v2.json"},
		{name: "version signature not base64", tamper: func(t *testing.T, r *Registry) {
			set := func(m map[string]any) { m["signature"] = "not base64!" }
			editJSON(t, versionFile(t, r, "stripe.refund", 2), set)
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { set(indexEntry(m, "stripe.refund", 2)) })
		}, want: "v2: the signature or key id is malformed", is: signing.ErrMalformedSignature, file: "tools/stripe.refund/v2.json"},
		{name: "index edited", tamper: func(t *testing.T, r *Registry) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { delete(m["tools"].(map[string]any), "stripe.get_charge") })
			_ = os.RemoveAll(filepath.Dir(versionFile(t, r, "stripe.get_charge", 1)))
		}, want: "index.json: the signature does not verify with key", is: signing.ErrBadSignature, file: IndexFile},
		{name: "index unsigned", tamper: func(t *testing.T, r *Registry) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { delete(m, "signature"); delete(m, "key_id") })
		}, want: "index.json: index.json is not signed, but trusted keys are set", is: signing.ErrNotSigned, file: IndexFile},
		{name: "index signature not base64", tamper: func(t *testing.T, r *Registry) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { m["signature"] = "not base64!" })
		}, want: "index.json: index.json's signature is malformed", is: signing.ErrMalformedSignature, file: IndexFile},
		{name: "index of an earlier reversi", tamper: func(t *testing.T, r *Registry) {
			editJSON(t, filepath.Join(r.Dir, IndexFile), func(m map[string]any) { delete(m, "sequence") })
		}, want: "index.json: index.json has no sequence or id: it was written by an earlier reversi, whose signature does not cover", is: ErrLegacyIndex, file: IndexFile},
		// Text that mentions a signature: the version file's own copy of the signature edited
		// (index.json, whose signature verifies, disagrees with it) is damage, not a refused
		// signature. Matching "signature" in the text called it one.
		{name: "version file disagrees with index.json on its signature", tamper: func(t *testing.T, r *Registry) {
			editJSON(t, versionFile(t, r, "stripe.refund", 2), func(m map[string]any) { m["signature"] = base64.StdEncoding.EncodeToString(make([]byte, 64)) })
		}, want: "index.json disagrees with tools/stripe.refund/v2.json ([signature] differ)", file: IndexFile},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := newKey(t)
			r := seedRegistry(t, k)
			c.tamper(t, r)
			trust := k.Trust
			if c.trust != nil {
				trust = c.trust(k)
			}
			_, loadErrs := r.Load(trust)
			_, verifyErrs := r.Verify(trust)
			for what, errs := range map[string][]error{"load": loadErrs, "verify": verifyErrs} {
				var found error
				for _, e := range errs {
					if strings.Contains(e.Error(), c.want) {
						found = e
					}
				}
				if found == nil {
					t.Fatalf("%s: want %q in %v", what, c.want, errs)
				}
				var p *Problem
				if !errors.As(found, &p) || p.File != c.file {
					t.Errorf("%s: %v is not a *Problem of %s", what, found, c.file)
				}
				if c.is == nil {
					if IsSignatureError(found) {
						t.Errorf("%s: %q is classified as a signature problem", what, found)
					}
					continue
				}
				if !errors.Is(found, c.is) || !IsSignatureError(found) {
					t.Errorf("%s: %q: errors.Is(%v) = %v, IsSignatureError = %v", what, found, c.is, errors.Is(found, c.is), IsSignatureError(found))
				}
			}
		})
	}
	// The index proof a gateway checks says the same.
	k := newKey(t)
	snap, errs := seedRegistry(t, k).Load(k.Trust)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	served := SetDigest(snap.Entries)
	unsigned, malformed, swapped := snap.Index, snap.Index, snap.Index
	unsigned.Signature = ""
	malformed.Signature = "not base64!"
	swapped.Sequence++
	for name, c := range map[string]struct {
		p  IndexProof
		is error
	}{"unsigned": {unsigned, signing.ErrNotSigned}, "malformed": {malformed, signing.ErrMalformedSignature}, "another sequence": {swapped, signing.ErrBadSignature}} {
		if err := c.p.Verify(served, k.Trust); !errors.Is(err, c.is) || !IsSignatureError(err) {
			t.Errorf("proof %s: %v, want %v", name, err, c.is)
		}
	}
}
