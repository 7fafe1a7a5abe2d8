package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// writeGeneratedFolder writes n manifests, one YAML file each, in groups of three like the
// seed's payments example (a read, a compensable write with verification, an idempotent undo).
func writeGeneratedFolder(tb testing.TB, n int) string {
	tb.Helper()
	dir := tb.TempDir()
	for i := 0; i < n; i += 3 {
		g := i / 3
		body := fmt.Sprintf(`- tool: svc%[1]d.get
  description: Read one item.
  effect: read_only
  permission: svc%[1]d:read
- tool: svc%[1]d.create
  description: Create an item.
  effect: compensable
  permission: svc%[1]d:write
  owner: team%[1]d@example.com
  risk: { data_class: financial, blast_radius: high }
  timeout_ms: 30s
  idempotency: { key: "create-{{args.order_id}}", scope: global }
  audit: { retention_days: 365, evidence_export: required, redaction: [$args.token] }
  approval: { roles: [finance], quorum: 2, timeout: 15m, on_timeout: escalate, escalate_to: [cfo] }
  compensation:
    tool: svc%[1]d.undo
    residue: [an entry stays in the history]
    argument_map: { id: $result.id, amount: $args.amount }
    verification: { tool: svc%[1]d.get, arguments: { id: $result.id }, expect: { state: undone }, backoff_ms: 2s }
- tool: svc%[1]d.undo
  description: Undo an item.
  effect: idempotent
  permission: svc%[1]d:write
  retry: { attempts: 3, base_ms: 200ms, max_ms: 5s }
`, g)
		p := filepath.Join(dir, fmt.Sprintf("g%03d", g%100), fmt.Sprintf("svc%d.yaml", g))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

// BenchmarkValidateFolder10k reads and validates (single and cross-manifest) a folder of
// 10,002 manifests in 3,334 files. Target (issue 2): under 1 s per op on a 2-core machine.
func BenchmarkValidateFolder10k(b *testing.B) {
	dir := writeGeneratedFolder(b, 10_000)
	b.ResetTimer()
	for b.Loop() {
		docs, errs := ReadPaths(dir)
		ms, verrs := ValidateDocuments(docs)
		if len(errs)+len(verrs) > 0 || len(ms) != 10_002 {
			b.Fatalf("%d manifests, errors %v %v", len(ms), errs, verrs)
		}
	}
}

// BenchmarkChecksum measures canonical JSON + SHA-256 of one compensable manifest.
func BenchmarkChecksum(b *testing.B) {
	docs, errs := ReadPaths("../../test/fixtures/manifests/payments.yaml")
	ms, verrs := ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		b.Fatal(errs, verrs)
	}
	for b.Loop() {
		if _, err := Checksum(ms[1]); err != nil {
			b.Fatal(err)
		}
	}
}
