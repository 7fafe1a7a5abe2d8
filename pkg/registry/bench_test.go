package registry

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// benchRegistry builds a signed registry of n tools with 3 versions each (a draft, then two
// approved versions): one read tool, one idempotent undo tool, and n-2 compensable tools
// shaped like the seed's stripe.create_charge that reference them.
func benchRegistry(b *testing.B, n int) (*Registry, keyPair) {
	b.Helper()
	k := newKey(b)
	r := New(filepath.Join(b.TempDir(), "reg"))
	fx := loadFixtures(b) // get_charge, create_charge, refund
	read, undo := *fx[0], *fx[2]
	read.Tool, undo.Tool = "svc.read", "svc.undo"
	ms := []*manifest.Manifest{&read, &undo}
	for i := 2; i < n; i++ {
		m := *fx[1]
		comp := *m.Compensation
		ver := *comp.Verification
		m.Tool, comp.Tool, ver.Tool = fmt.Sprintf("svc%05d.create", i), undo.Tool, read.Tool
		comp.Verification, m.Compensation = &ver, &comp
		ms = append(ms, &m)
	}
	o := WriteOptions{By: "alice", Signer: k.Signer}
	for _, status := range []manifest.Status{manifest.Draft, manifest.Approved, manifest.Approved} {
		if _, err := r.Publish(ms, status, o); err != nil {
			b.Fatal(err)
		}
	}
	return r, k
}

// BenchmarkLoad5000x3 loads (newest non-draft version of each tool, checksum and Ed25519
// signature checked, cross-manifest rules) a registry of 5,000 tools with 3 versions each.
// Target (issue 3): under 1 s per op on this 2-core machine.
func BenchmarkLoad5000x3(b *testing.B) {
	r, k := benchRegistry(b, 5000)
	b.ResetTimer()
	for b.Loop() {
		snap, errs := r.Load(k.Trust)
		if len(errs) > 0 || len(snap.Manifests) != 5000 {
			b.Fatal(len(snap.Manifests), errs)
		}
	}
}

// BenchmarkVerify5000x3 checks all 15,000 versions (reversi manifests verify).
func BenchmarkVerify5000x3(b *testing.B) {
	r, k := benchRegistry(b, 5000)
	b.ResetTimer()
	for b.Loop() {
		rep, errs := r.Verify(k.Trust)
		if len(errs) > 0 || rep.Versions != 15000 {
			b.Fatal(rep, errs)
		}
	}
}
