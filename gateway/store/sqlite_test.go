package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/test/pgtest"
)

// crashEnv, when set to a data folder, makes TestCrashHelper write one intent there and exit
// the process with os.Exit, without closing the store.
const crashEnv = "REVERSI_STORE_CRASH_DIR"

// TestMain runs a child's part instead of the tests when the process is the child of a
// test: TestCrashRecovery's, TestKilledAfterIntent's, TestPostgresCrashRecovery's or a
// writer of TestProcessesShareFolder.
func TestMain(m *testing.M) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashChild(dir)
	}
	if dir := os.Getenv(killEnv); dir != "" {
		killChild(dir)
	}
	if spec := os.Getenv(writerEnv); spec != "" {
		writerChild(spec)
	}
	postgresCrashChild() // when the process is TestPostgresCrashRecovery's child
	os.Exit(pgtest.Main(m, &pgServer))
}

// crashMark is the high-water mark the crash children store before they exit.
var crashMark = HighWater{Source: "ManifestRegistry agents/memory", Sequence: 9, Revision: "main@sha1:9999", Digest: "sha256:m9"}

// crashChild writes one completed step, a high-water mark and one intent in dir, then exits
// the process without closing the store.
func crashChild(dir string) {
	ctx := context.Background()
	s, err := OpenSQLite(dir, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if _, err := s.CreateRun(ctx, Run{ID: "crash-run", Actor: "alice"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	done, err := s.RecordIntent(ctx, Intent{Run: "crash-run", Tool: "notes.write", ArgsDigest: "sha256:1"})
	if err == nil {
		_, err = s.RecordOutcome(ctx, "crash-run", done, StepOutcome{Status: Succeeded})
	}
	if err == nil {
		err = s.AdvanceHighWater(ctx, []HighWater{crashMark})
	}
	var step int64
	if err == nil {
		step, err = s.RecordIntent(ctx, Intent{Run: "crash-run", Tool: "notes.delete", ArgsDigest: "sha256:2"})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("STEP %d\n", step)
	os.Exit(0) // no Close, no outcome: as if the gateway died while the call was upstream
}

func TestCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), crashEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	_, after, ok := strings.Cut(string(out), "STEP ")
	if !ok {
		t.Fatalf("child printed no step:\n%s", out)
	}
	step, err := strconv.ParseInt(strings.Fields(after)[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, SQLiteFile+"-wal")); err != nil {
		t.Fatalf("the child should have left its WAL behind: %v", err)
	}

	s, err := OpenSQLite(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	pend := must[[]Record](t)(s.PendingSteps(ctx, "crash-run"))
	if len(pend) != 1 || pend[0].Step != step || pend[0].Tool != "notes.delete" || pend[0].ArgsDigest != "sha256:2" {
		t.Fatalf("pending after the crash: %+v (step %d)", pend, step)
	}
	rec := must[[]Record](t)(s.Recover(ctx))
	if len(rec) != 1 || rec[0].Step != step || rec[0].Status != Uncertain || rec[0].Note != RecoveryNote {
		t.Fatalf("recovered %+v", rec)
	}
	all := must[[]Record](t)(s.Records(ctx, "crash-run", 0, 0))
	kinds := []string{}
	for _, r := range all {
		kinds = append(kinds, fmt.Sprintf("%d:%s/%d%s", r.Seq, r.Kind, r.Step, r.Status))
	}
	if got := strings.Join(kinds, " "); got != "1:intent/1 2:outcome/1succeeded 3:intent/3 4:outcome/3uncertain" {
		t.Fatalf("ledger after recovery: %s", got)
	}
	if r := must[Run](t)(s.GetRun(ctx, "crash-run")); r.Actor != "alice" {
		t.Fatalf("run after the crash: %+v", r)
	}
	wantMarks(t, s, crashMark)
}

// killEnv, when set to a data folder, makes the test binary killChild.
const killEnv = "REVERSI_STORE_KILL_DIR"

// killChild journals calls in dir until it is killed: an intent, "STEP <n>" on stdout once
// RecordIntent has returned, and for every other step its outcome, then "DONE <n>".
func killChild(dir string) {
	ctx := context.Background()
	s, err := OpenSQLite(dir, nil)
	if err == nil {
		_, err = s.CreateRun(ctx, Run{ID: "killed", Actor: "alice"})
	}
	for i := 0; err == nil && i < 100000; i++ { // killed long before
		var step int64
		if step, err = s.RecordIntent(ctx, Intent{Run: "killed", Tool: "notes.write", ArgsDigest: fmt.Sprint(i)}); err != nil {
			break
		}
		fmt.Printf("STEP %d\n", step)
		if i%2 == 0 {
			if _, err = s.RecordOutcome(ctx, "killed", step, StepOutcome{Status: Succeeded}); err == nil {
				fmt.Printf("DONE %d\n", step)
			}
		}
	}
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}

// TestKilledAfterIntent: a gateway killed with SIGKILL at any moment loses nothing it was
// told was journaled: every intent whose RecordIntent returned (intents commit with
// synchronous=NORMAL, then the writer syncs the WAL itself) and every outcome whose
// RecordOutcome returned is in the ledger after a reopen; Recover completes the rest as
// uncertain, and the file is intact. (A process kill does not drop the page cache: that the
// WAL is synced before an intent returns is TestLazyWritesAreFlushed's.)
func TestKilledAfterIntent(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), killEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	steps, done := map[int64]bool{}, map[int64]bool{}
	sc := bufio.NewScanner(out)
	for len(steps) < 200 && sc.Scan() { // kill it mid-stream, wherever it is
		var n int64
		if _, err := fmt.Sscanf(sc.Text(), "STEP %d", &n); err == nil {
			steps[n] = true
		} else if _, err := fmt.Sscanf(sc.Text(), "DONE %d", &n); err == nil {
			done[n] = true
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if len(steps) < 200 {
		t.Fatalf("the child stopped after %d steps: %s", len(steps), stderr.String())
	}
	if err := CheckSQLiteIntegrity(dir); err != nil {
		t.Fatal(err)
	}
	s := must[*SQLite](t)(OpenSQLite(dir, nil))
	defer s.Close()
	ctx := context.Background()
	intents, outcomes := map[int64]bool{}, map[int64]bool{}
	for _, r := range must[[]Record](t)(s.Records(ctx, "killed", 0, 0)) {
		switch r.Kind {
		case KindIntent:
			intents[r.Step] = true
		case KindOutcome:
			outcomes[r.Step] = true
		}
	}
	for n := range steps {
		if !intents[n] {
			t.Errorf("step %d: RecordIntent returned, the intent is not in the ledger", n)
		}
	}
	for n := range done {
		if !outcomes[n] {
			t.Errorf("step %d: RecordOutcome returned, the outcome is not in the ledger", n)
		}
	}
	rec := must[[]Record](t)(s.Recover(ctx))
	if len(rec)+len(outcomes) != len(intents) {
		t.Fatalf("%d intents, %d outcomes, %d recovered", len(intents), len(outcomes), len(rec))
	}
	t.Logf("killed after %d intents (%d reported), %d outcomes (%d reported), %d recovered", len(intents), len(steps), len(outcomes), len(done), len(rec))
}

// TestReopen: everything written before a clean Close is there after OpenSQLite.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	clock := newFakeClock()
	s, err := OpenSQLite(dir, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	must[Run](t)(s.CreateRun(ctx, Run{ID: "r", Actor: "a", Gateway: "g"}))
	step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r", Tool: "t"}))
	must[int64](t)(s.RecordOutcome(ctx, "r", step, StepOutcome{Status: Succeeded, Handle: map[string]any{"id": "x"}}))
	if ok, _, err := s.ClaimKey(ctx, "k", "r", step); !ok || err != nil {
		t.Fatal(ok, err)
	}
	req := newRequest("apr-1")
	req.Quorum = 1
	must[Approval](t)(s.CreateApproval(ctx, req))
	must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "carol", Roles: []string{"finance"}, Approve: true}))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = OpenSQLite(dir, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs := must[[]Record](t)(s.Records(ctx, "r", 0, 0))
	if len(recs) != 2 || recs[1].Handle["id"] != "x" {
		t.Fatalf("records after reopen %+v", recs)
	}
	if ok, h, _ := s.ClaimKey(ctx, "k", "r2", 1); ok || h.Run != "r" || h.Step != step {
		t.Fatalf("key after reopen: %v %+v", ok, h)
	}
	if a := must[Approval](t)(s.GetApproval(ctx, "apr-1")); a.State != ApprovalApproved || len(a.Decisions) != 1 || a.Decisions[0].By != "carol" {
		t.Fatalf("approval after reopen %+v", a)
	}
	if next := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r", Tool: "t"})); next != 3 {
		t.Fatalf("sequence continues after reopen: %d", next)
	}
}

// BenchmarkSQLiteCall measures journaled calls per second and the process's CPU per call:
// one RecordIntent (durable) and one RecordOutcome per call, with 1 and 16 concurrent
// sessions, each in its own run.
func BenchmarkSQLiteCall(b *testing.B) {
	for _, sessions := range []int{1, 16} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			s, err := OpenSQLite(b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			benchCalls(b, s, sessions)
		})
	}
}

// BenchmarkMemoryCall is BenchmarkSQLiteCall against the in-memory store.
func BenchmarkMemoryCall(b *testing.B) {
	for _, sessions := range []int{1, 16} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			s := NewMemory(nil)
			defer s.Close()
			benchCalls(b, s, sessions)
		})
	}
}

// TestGroupCommitIsolation: concurrent writes share transactions, but a request that fails
// (here the second outcome for a step, ErrCompleted) rolls back only itself; every call that
// succeeded is in the ledger, every call that failed left nothing behind.
func TestGroupCommitIsolation(t *testing.T) {
	s, err := OpenSQLite(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const sessions, calls = 16, 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	completed := 0
	for i := range sessions {
		run := must[Run](t)(s.CreateRun(ctx, Run{Actor: "a"})).ID
		wg.Go(func() {
			for range calls {
				step, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "t"})
				if err != nil {
					t.Error(err)
					return
				}
				// two outcomes for the same step at once: exactly one wins
				var inner sync.WaitGroup
				errs := make([]error, 2)
				for j := range errs {
					inner.Go(func() {
						_, errs[j] = s.RecordOutcome(ctx, run, step, StepOutcome{Status: Succeeded, Note: fmt.Sprint(i, j)})
					})
				}
				inner.Wait()
				ok := 0
				for _, err := range errs {
					switch {
					case err == nil:
						ok++
					case !errors.Is(err, ErrCompleted):
						t.Errorf("second outcome: %v", err)
					}
				}
				if ok != 1 {
					t.Errorf("step %d: %d outcomes succeeded (%v)", step, ok, errs)
				}
				mu.Lock()
				completed += ok
				mu.Unlock()
			}
			recs, err := s.Records(ctx, run, 0, 0)
			if err != nil {
				t.Error(err)
				return
			}
			if len(recs) != 2*calls {
				t.Errorf("run %s: %d records, want %d", run, len(recs), 2*calls)
			}
			for k, r := range recs {
				if r.Seq != int64(k+1) {
					t.Errorf("run %s: record %d has seq %d", run, k, r.Seq)
				}
			}
		})
	}
	wg.Wait()
	if completed != sessions*calls {
		t.Fatalf("%d outcomes, want %d", completed, sessions*calls)
	}
	for _, r := range must[[]Run](t)(s.ListRuns(ctx, RunFilter{})) {
		if p := must[[]Record](t)(s.PendingSteps(ctx, r.ID)); len(p) != 0 {
			t.Fatalf("run %s: pending %+v", r.ID, p)
		}
	}
	// a caller whose context is already done writes nothing
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.CreateRun(cctx, Run{ID: "never", Actor: "a"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled create: %v", err)
	}
	if _, err := s.GetRun(ctx, "never"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cancelled create wrote the run: %v", err)
	}
}

// TestLazyWritesAreFlushed: an intent returns after the WAL is synced, an outcome without a
// sync, and a sync follows the outcome within lazyFlushInterval when no durable write does
// (and at Close). The file synced is the WAL SQLite writes.
func TestLazyWritesAreFlushed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := must[*SQLite](t)(OpenSQLite(dir, nil))
	wal := s.w.(*sqliteWriter).wal
	must[Run](t)(s.CreateRun(ctx, Run{ID: "lazy", Actor: "alice"}))
	synced := wal.syncs.Load()
	step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "lazy", Tool: "notes.write", ArgsDigest: "sha256:1"}))
	if wal.syncs.Load() != synced+1 || wal.unsynced() {
		t.Fatalf("after an intent: %d syncs (want %d), unsynced %v", wal.syncs.Load(), synced+1, wal.unsynced())
	}
	a, errA := wal.f.Stat()
	b, errB := os.Stat(filepath.Join(dir, SQLiteFile+"-wal"))
	if errA != nil || errB != nil || !os.SameFile(a, b) {
		t.Fatalf("the synced file is not the WAL: %v %v %v", a, b, errors.Join(errA, errB))
	}
	before := time.Now()
	must[int64](t)(s.RecordOutcome(ctx, "lazy", step, StepOutcome{Status: Succeeded}))
	if wal.syncs.Load() != synced+1 && time.Since(before) < lazyFlushInterval {
		t.Fatalf("an outcome synced the WAL: %d syncs", wal.syncs.Load())
	}
	for deadline := time.Now().Add(10 * lazyFlushInterval); wal.unsynced(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the outcome is unsynced after %v", 10*lazyFlushInterval)
		}
	}
	if took := time.Since(before); took < lazyFlushInterval/2 {
		t.Fatalf("the outcome was synced after %v, sooner than a flush is due", took)
	}

	// Close syncs a lazy write that no timer has synced yet.
	must[int64](t)(s.AppendEvent(ctx, Event{Run: "lazy", Kind: KindNote, Note: "last"}))
	if !wal.unsynced() {
		t.Fatal("an event is synced at once")
	}
	n := wal.syncs.Load()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if wal.unsynced() || wal.syncs.Load() != n+1 {
		t.Fatalf("after Close: unsynced %v, %d syncs (want %d)", wal.unsynced(), wal.syncs.Load(), n+1)
	}
}

// TestWALStaysBounded: writes that are one statement each (no transaction of their own, a
// RETURNING row) still let SQLite checkpoint, so the WAL stops growing near its
// wal_autocheckpoint size (1000 pages) instead of holding every write.
func TestWALStaysBounded(t *testing.T) {
	dir := t.TempDir()
	s := must[*SQLite](t)(OpenSQLite(dir, nil))
	defer s.Close()
	ctx := context.Background()
	must[Run](t)(s.CreateRun(ctx, Run{ID: "r", Actor: "a"}))
	const events = 5000 // a frame or more each: 20 MB of WAL without checkpoints
	for i := range events {
		must[int64](t)(s.AppendEvent(ctx, Event{Run: "r", Kind: KindNote, Note: strings.Repeat("x", 100) + fmt.Sprint(i)}))
	}
	var pageSize int64
	if err := queryRow(context.Background(), s.r, `PRAGMA page_size`).Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, SQLiteFile+"-wal"))
	if err != nil {
		t.Fatal(err)
	}
	if limit := 1200 * (pageSize + 24); fi.Size() > limit {
		t.Fatalf("WAL of %d bytes after %d events, want at most %d (checkpoints did not run)", fi.Size(), events, limit)
	}
}
