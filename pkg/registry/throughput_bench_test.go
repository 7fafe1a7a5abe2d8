package registry

import "testing"

// BenchmarkVerifyThroughput is signature verification throughput: `reversi manifests verify`
// of a registry of 1,000 tools × 3 versions (every version's checksum, Ed25519 signature and
// validation, plus the canonical-form audit). Reported: versions/s, the lower bound on how fast
// a registry can be reconciled or loaded (issue 10).
func BenchmarkVerifyThroughput(b *testing.B) {
	r, k := benchRegistry(b, 1000)
	versions := 0
	b.ResetTimer()
	for b.Loop() {
		rep, errs := r.Verify(k.Trust)
		if len(errs) > 0 || rep.Versions != 3000 {
			b.Fatal(rep, errs)
		}
		versions += rep.Versions
	}
	b.ReportMetric(float64(versions)/b.Elapsed().Seconds(), "versions/s")
}
