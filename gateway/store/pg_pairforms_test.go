package store

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
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
// process and the Postgres server, machine-cpu-µs/op from /proc/stat) at 1 and 16 sessions,
// with the outcome recorded by itself (recorded: RecordOutcome, a transaction of its own) and
// queued (QueueOutcome: sent with the session's next intent in one pgx batch, pgRunner), the
// gateway's form. Source: the note on issue 20 (2026-12-04).
func BenchmarkPostgresPairForms(b *testing.B) {
	for _, sessions := range []int{1, 16} {
		for _, form := range []string{"recorded", "queued"} {
			b.Run(fmt.Sprintf("sessions=%d/%s", sessions, form), func(b *testing.B) {
				s := openPG(b, pgURL(""), nil)
				ctx := context.Background()
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
						for range n {
							step, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "crm.create", ArgsDigest: "sha256:abc", Reason: "r", Mode: "enforce", Decision: "allow"})
							if err != nil {
								b.Error(err)
								return
							}
							o := StepOutcome{Status: Succeeded}
							if form == "recorded" {
								_, err = s.RecordOutcome(ctx, run, step, o)
							} else {
								s.QueueOutcome(ctx, run, step, o, func(_ int64, e error) {
									if e != nil {
										b.Error(e)
									}
								})
							}
							if err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				if err := s.w.flush(ctx); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				jiffies := machineBusy(b) - m0
				b.ReportMetric(float64(jiffies)*1e4/float64(b.N), "machine-cpu-µs/op")
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			})
		}
	}
}
