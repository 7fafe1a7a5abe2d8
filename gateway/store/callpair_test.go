package store

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
)

// BenchmarkCallPair measures what the gateway journals per tools/call (gateway/proxy's
// journalIntent and journalOutcome, as the bench's read_only manifest has it): one durable
// RecordIntent with the decision's fields, then its outcome, back to back in one run (one
// session): queued as the gateway does (QueueOutcome: it joins the next intent's
// transaction), or waited for (RecordOutcome, the gateway until 2026-12-02). It reports ns/op
// and cpu-µs/op, the CPU time (user + system) of the whole process per pair. The stores:
// SQLite in a real data folder (the intent fdatasync'd), the memory store and Postgres (the
// package's server).
func BenchmarkCallPair(b *testing.B) {
	for _, queued := range []bool{true, false} {
		name := map[bool]string{true: "outcome=queued", false: "outcome=waited"}[queued]
		b.Run("store=sqlite/"+name, func(b *testing.B) {
			s, err := OpenSQLite(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			benchCallPair(b, s, queued)
		})
	}
	b.Run("store=memory", func(b *testing.B) { // QueueOutcome records at once here
		s := NewMemory(nil)
		defer s.Close()
		benchCallPair(b, s, true)
	})
	b.Run("store=postgres", func(b *testing.B) {
		benchCallPair(b, openPG(b, pgURL(""), nil), false)
	})
}

func benchCallPair(b *testing.B, s Store, queued bool) {
	ctx := context.Background()
	run, err := s.CreateRun(ctx, Run{Actor: "bench", Gateway: "gw"})
	if err != nil {
		b.Fatal(err)
	}
	in := Intent{Run: run.ID, Tool: "memory.read_graph",
		ArgsDigest:      "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
		Reason:          "MCP tools/call memory.read_graph",
		ManifestVersion: "1", ManifestChecksum: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		Mode: "enforce", Decision: "allow"}
	out := StepOutcome{Status: Succeeded}
	var failed atomic.Bool
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b, syscall.RUSAGE_SELF)
	for range b.N {
		step, err := s.RecordIntent(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		if queued {
			s.QueueOutcome(ctx, run.ID, step, out, func(_ int64, err error) {
				if err != nil {
					failed.Store(true)
				}
			})
		} else if _, err := s.RecordOutcome(ctx, run.ID, step, out); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.GetRun(ctx, run.ID); err != nil { // waits for the queued outcomes
		b.Fatal(err)
	}
	b.StopTimer()
	cpu := cpuTime(b, syscall.RUSAGE_SELF) - cpu0
	if failed.Load() {
		b.Fatal("a queued outcome failed")
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
}
