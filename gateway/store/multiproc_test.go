package store

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// writerEnv, when set to "<dir> <calls> <run> <upstream>", makes the test binary a
// writerChild.
const writerEnv = "REVERSI_STORE_WRITER"

// writerChild journals calls (intent, upstream time, outcome) in a data folder shared with
// other processes: it opens the store, creates the run unless it exists, prints READY, waits
// for a line on stdin, then makes the calls, printing "CALL <step> <intent latency ns>" after
// each outcome, and exits. upstream (a duration) stands for the upstream's answer.
func writerChild(spec string) {
	f := strings.Fields(spec)
	calls, _ := strconv.Atoi(f[1])
	dir, run := f[0], f[2]
	upstream, _ := time.ParseDuration(f[3])
	ctx := context.Background()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s, err := OpenSQLite(dir, nil)
	if err != nil {
		fail(err)
	}
	if _, err := s.CreateRun(ctx, Run{ID: run, Actor: "alice"}); err != nil && !errors.Is(err, ErrExists) {
		fail(err)
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "READY")
	out.Flush()
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fail(err)
	}
	for i := range calls {
		start := time.Now()
		step, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "notes.write", ArgsDigest: fmt.Sprint(os.Getpid(), i)})
		took := time.Since(start)
		if err != nil {
			fail(err)
		}
		time.Sleep(upstream)
		if _, err := s.RecordOutcome(ctx, run, step, StepOutcome{Status: Succeeded}); err != nil {
			fail(err)
		}
		fmt.Fprintf(out, "CALL %d %d\n", step, took.Nanoseconds())
	}
	out.Flush()
	if err := s.Close(); err != nil {
		fail(err)
	}
	os.Exit(0)
}

// writers runs n writerChild processes of calls each on dir, the i-th in run(i), started at
// the same moment, whose upstream answers after upstream. It returns each process's steps and
// RecordIntent latencies.
func writers(t testing.TB, dir string, n, calls int, upstream time.Duration, run func(i int) string) (steps [][]int64, lat []time.Duration) {
	t.Helper()
	type child struct {
		cmd   *exec.Cmd
		in    io.WriteCloser
		out   *bufio.Scanner
		errb  *strings.Builder
		steps []int64
		lat   []time.Duration
	}
	kids := make([]*child, n)
	for i := range kids {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %s %s", writerEnv, dir, calls, run(i), upstream))
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		c := &child{cmd: cmd, in: in, out: bufio.NewScanner(out), errb: &strings.Builder{}}
		cmd.Stderr = c.errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		kids[i] = c
	}
	for _, c := range kids {
		if !c.out.Scan() || c.out.Text() != "READY" {
			t.Fatalf("writer not ready: %q %s", c.out.Text(), c.errb)
		}
	}
	for _, c := range kids { // all at once
		if _, err := io.WriteString(c.in, "GO\n"); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for _, c := range kids {
		wg.Go(func() {
			for c.out.Scan() {
				var step, ns int64
				if _, err := fmt.Sscanf(c.out.Text(), "CALL %d %d", &step, &ns); err == nil {
					c.steps = append(c.steps, step)
					c.lat = append(c.lat, time.Duration(ns))
				}
			}
		})
	}
	wg.Wait()
	for i, c := range kids {
		if err := c.cmd.Wait(); err != nil || len(c.steps) != calls {
			t.Fatalf("writer %d: %v after %d of %d calls: %s", i, err, len(c.steps), calls, c.errb)
		}
		steps = append(steps, c.steps)
		lat = append(lat, c.lat...)
	}
	return steps, lat
}

// TestProcessesShareFolder: writer processes on one data folder, each in a run of its own and
// half of them also in one shared run, lose nothing: every call each was told was journaled
// has its intent and its one outcome, every run's Seq counts from 1 without a gap or a repeat,
// and nothing is left pending.
func TestProcessesShareFolder(t *testing.T) {
	dir := t.TempDir()
	const procs, calls = 8, 40
	runOf := func(i int) string {
		if i%2 == 0 {
			return "shared"
		}
		return fmt.Sprintf("own-%d", i)
	}
	steps, _ := writers(t, dir, procs, calls, 0, runOf)
	s := must[*SQLite](t)(OpenSQLite(dir, nil))
	defer s.Close()
	ctx := context.Background()
	byRun := map[string][]Record{}
	for i := range procs {
		if _, ok := byRun[runOf(i)]; !ok {
			byRun[runOf(i)] = must[[]Record](t)(s.Records(ctx, runOf(i), 0, 0))
		}
	}
	for run, recs := range byRun {
		outcomes := map[int64]int{}
		for k, r := range recs {
			if r.Seq != int64(k+1) {
				t.Fatalf("run %s: record %d has seq %d", run, k, r.Seq)
			}
			if r.Kind == KindOutcome {
				outcomes[r.Step]++
			}
		}
		if len(recs) != 2*len(outcomes) {
			t.Errorf("run %s: %d records, %d steps with an outcome", run, len(recs), len(outcomes))
		}
		for step, n := range outcomes {
			if n != 1 || recs[step-1].Kind != KindIntent {
				t.Errorf("run %s: step %d has %d outcomes (its record: %s)", run, step, n, recs[step-1].Kind)
			}
		}
	}
	for i, st := range steps {
		recs := byRun[runOf(i)]
		for _, step := range st {
			if step < 1 || step > int64(len(recs)) || recs[step-1].Kind != KindIntent {
				t.Errorf("writer %d: step %d it journaled is not an intent of %s", i, step, runOf(i))
			}
		}
	}
	if n := len(byRun["shared"]); n != 2*calls*procs/2 {
		t.Errorf("shared run: %d records, want %d", n, 2*calls*procs/2)
	}
	if rec := must[[]Record](t)(s.Recover(ctx)); len(rec) != 0 {
		t.Errorf("pending after every writer closed: %+v", rec)
	}
	if err := CheckSQLiteIntegrity(dir); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkProcessesRecordIntent: 1 and 16 processes journal calls (intent, the upstream's
// time, outcome) on one data folder, each in its own run, b.N calls in all; it reports the
// 50th and 99th percentiles of RecordIntent's latency over every process's calls (p50-ms,
// p99-ms). upstream=0s is the journal alone, back to back; upstream=1ms stands for a
// gateway whose upstream answers in a millisecond.
func BenchmarkProcessesRecordIntent(b *testing.B) {
	for _, upstream := range []time.Duration{0, time.Millisecond} {
		for _, procs := range []int{1, 16} {
			b.Run(fmt.Sprintf("upstream=%v/processes=%d", upstream, procs), func(b *testing.B) {
				benchProcesses(b, procs, upstream)
			})
		}
	}
}

// benchProcesses runs b.N calls over procs writer processes and reports the percentiles of
// their intents' latency, the calls per second of them all, and the processes' CPU per call
// (cpu-µs/op: user + system of the children, from getrusage).
func benchProcesses(b *testing.B, procs int, upstream time.Duration) {
	calls := max(b.N/procs, 1)
	cpu0 := cpuTime(b, syscall.RUSAGE_CHILDREN)
	b.ResetTimer()
	_, lat := writers(b, b.TempDir(), procs, calls, upstream, func(i int) string { return fmt.Sprint("run-", i) })
	b.StopTimer()
	cpu := cpuTime(b, syscall.RUSAGE_CHILDREN) - cpu0
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "calls/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(len(lat)), "cpu-µs/op")
	b.ReportMetric(0, "ns/op") // a call's time is not the metric: the latencies are
}

// TestSyncCoversOtherProcess: the stores of a data folder share the commit counters, so one
// store's sync covers another's commits: a lazy commit of b is synced by a's intent, without
// a sync of b's own.
func TestSyncCoversOtherProcess(t *testing.T) {
	dir := t.TempDir()
	a := must[*SQLite](t)(OpenSQLite(dir, nil))
	defer a.Close()
	b := must[*SQLite](t)(OpenSQLite(dir, nil))
	defer b.Close()
	aw, bw := a.w.(*sqliteWriter).wal, b.w.(*sqliteWriter).wal
	if !aw.shared {
		t.Skip("no shared counters on this system")
	}
	ctx := context.Background()
	must[Run](t)(a.CreateRun(ctx, Run{ID: "ra", Actor: "alice"}))
	must[Run](t)(b.CreateRun(ctx, Run{ID: "rb", Actor: "bob"}))
	must[int64](t)(b.AppendEvent(ctx, Event{Run: "rb", Kind: KindNote, Note: "lazy"}))
	if !bw.unsynced() {
		t.Fatal("b's event is synced at once")
	}
	bs, as := bw.syncs.Load(), aw.syncs.Load()
	must[int64](t)(a.RecordIntent(ctx, Intent{Run: "ra", Tool: "notes.write"}))
	if aw.syncs.Load() != as+1 || bw.unsynced() || bw.syncs.Load() != bs {
		t.Fatalf("a synced %d times, b %d times, b unsynced %v: want a's one sync to cover b's event",
			aw.syncs.Load()-as, bw.syncs.Load()-bs, bw.unsynced())
	}
}

// TestSyncCountersOfAnotherBoot: counters left by an earlier boot (the page cache they speak
// of is gone) are reset when the folder is opened; kept, a synced number beyond the new
// commits would let an intent return unsynced.
func TestSyncCountersOfAnotherBoot(t *testing.T) {
	dir := t.TempDir()
	page := make([]byte, 4096)
	copy(page, syncMagic+"00000000-0000-0000-0000-000000000000")
	for _, off := range []int{48, 56} { // commits, synced
		binary.LittleEndian.PutUint64(page[off:], 1<<40)
	}
	if err := os.WriteFile(filepath.Join(dir, syncCountersFile), page, 0o600); err != nil {
		t.Fatal(err)
	}
	s := must[*SQLite](t)(OpenSQLite(dir, nil))
	defer s.Close()
	wal := s.w.(*sqliteWriter).wal
	if !wal.shared {
		t.Skip("no shared counters on this system")
	}
	if wal.ctr.commits.Load() >= 1<<40 || wal.ctr.synced.Load() >= 1<<40 {
		t.Fatalf("counters of another boot kept: %d commits, %d synced", wal.ctr.commits.Load(), wal.ctr.synced.Load())
	}
	ctx := context.Background()
	must[Run](t)(s.CreateRun(ctx, Run{ID: "r", Actor: "alice"}))
	n := wal.syncs.Load()
	must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r", Tool: "notes.write"}))
	if wal.syncs.Load() != n+1 {
		t.Fatalf("the intent returned after %d syncs, want 1", wal.syncs.Load()-n)
	}
}
