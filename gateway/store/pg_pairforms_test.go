package store

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// machineBusy is the machine's busy CPU time so far in clock ticks (/proc/stat's first line,
// all but idle and iowait; 100 ticks a second).
func machineBusy(b *testing.B) int64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(raw), "\n", 2)[0])[1:]
	var busy int64
	for i, v := range f {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy
}

// BenchmarkPostgresPairForms: what a journaled call costs the whole machine (the gateway's
// process and the Postgres server, machine-cpu-µs/op from /proc/stat) at 16 sessions, as the
// store writes it now (two-tx: the durable intent, then the lazy outcome, each a transaction
// of one statement) and as it could (one-batch: the previous call's outcome and this call's
// intent in one transaction, sent as one pgx batch, one round trip), the form SQLite's queued
// outcomes have (QueueOutcome). Source: the note on issue 20 (2026-12-04).
func BenchmarkPostgresPairForms(b *testing.B) {
	for _, form := range []string{"two-tx", "one-batch"} {
		b.Run(form, func(b *testing.B) {
			s := openPG(b, pgURL(""), nil)
			ctx := context.Background()
			const sessions = 16
			runs := make([]string, sessions)
			for i := range runs {
				r, _ := s.CreateRun(ctx, Run{Actor: "bench"})
				runs[i] = r.ID
			}
			b.ResetTimer()
			m0 := machineBusy(b)
			var wg sync.WaitGroup
			for _, run := range runs {
				n := b.N / sessions
				wg.Go(func() {
					var prev int64
					for range n {
						if form == "two-tx" {
							step, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "crm.create", ArgsDigest: "sha256:abc", Reason: "r", Mode: "enforce", Decision: "allow"})
							if err != nil {
								b.Error(err)
								return
							}
							if _, err := s.RecordOutcome(ctx, run, step, StepOutcome{Status: Succeeded}); err != nil {
								b.Error(err)
								return
							}
							continue
						}
						var bt pgx.Batch
						bt.Queue("BEGIN")
						if prev > 0 {
							bt.Queue(s.d.insertOutcome, run, int64(1), prev, "succeeded", "", "", "")
						}
						bt.Queue(s.d.insertIntent, run, int64(1), "crm.create", "sha256:abc", "r", []byte{}, "", "", "enforce", "allow", "", s.instance)
						bt.Queue("COMMIT")
						br := s.pool.SendBatch(ctx, &bt)
						if _, err := br.Exec(); err != nil {
							b.Error(err)
							return
						}
						if prev > 0 {
							rows, err := br.Query()
							if err != nil {
								b.Error(err)
								return
							}
							for rows.Next() {
							}
							rows.Close()
						}
						if err := br.QueryRow().Scan(&prev); err != nil {
							b.Error(err)
							return
						}
						if _, err := br.Exec(); err != nil {
							b.Error(err)
							return
						}
						br.Close()
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			jiffies := machineBusy(b) - m0
			b.ReportMetric(float64(jiffies)*1e4/float64(b.N), "machine-cpu-µs/op")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
	}
}
