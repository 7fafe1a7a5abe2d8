package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/reversi-gitops/reversi/test/pgtest"
)

// pgServer is this package's throwaway PostgreSQL server (TestMain).
var pgServer *pgtest.Server

// pgURL returns the URL of a store in schema (a fresh one when schema is "").
func pgURL(schema string) string {
	if schema == "" {
		schema = pgServer.Unique("store_")
	}
	return pgServer.URL("postgres", "search_path", schema)
}

func openPG(t testing.TB, url string, clock Clock) *Postgres {
	t.Helper()
	s, err := OpenPostgres(context.Background(), url, clock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The shared suite runs against Postgres too, each test in a schema of its own.
func init() {
	impls = append(impls, impl{"postgres", func(t testing.TB, clock Clock) Store { return openPG(t, pgURL(""), clock) }})
}

// restartPostgres closes s and opens its schema again (a new instance).
func restartPostgres(t *testing.T, s *Postgres) Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return openPG(t, pgURL(s.Schema()), s.now)
}

// TestPostgresGlobalKeyAcrossReplicas: two stores on one schema (two pools, as two gateway
// replicas) claim the same keys at the same moment: exactly one claim of each key wins, and
// every loser, on either replica, is told the same holder. Source: issue 9 (duplicate detection
// with scope: global holds across replicas: a unique constraint, not a read-then-write).
func TestPostgresGlobalKeyAcrossReplicas(t *testing.T) {
	url := pgURL("")
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	ctx := context.Background()
	const rounds, perReplica = 20, 8
	for round := range rounds {
		key := fmt.Sprintf("stripe.charge:cus_%d:4200", round)
		var wins atomic.Int32
		holders := make([]KeyHolder, 2*perReplica)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range holders {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Go(func() {
				<-start
				ok, h, err := s.ClaimKey(ctx, key, fmt.Sprintf("run-%d", i), 0)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					wins.Add(1)
				}
				holders[i] = h
			})
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("round %d: %d claims won, want exactly 1", round, wins.Load())
		}
		for i := range holders {
			if holders[i] != holders[0] {
				t.Fatalf("round %d: replicas disagree on the holder: %+v vs %+v", round, holders[i], holders[0])
			}
		}
		if h, ok, err := b.HeldKey(ctx, key); err != nil || !ok || h != holders[0] {
			t.Fatalf("round %d: held key %+v %v %v", round, h, ok, err)
		}
	}
}

// TestPostgresGaplessAcrossReplicas: 16 sessions on two replicas append intents, outcomes and
// notes to ONE run at once: the run's records are numbered 1..n without a gap or a duplicate,
// and every outcome completes an intent of the same run.
func TestPostgresGaplessAcrossReplicas(t *testing.T) {
	url := pgURL("")
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	ctx := context.Background()
	must[Run](t)(a.CreateRun(ctx, Run{ID: "shared", Actor: "alice"}))
	const writers, calls = 16, 15
	var wg sync.WaitGroup
	for w := range writers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Go(func() {
			for i := range calls {
				step, err := s.RecordIntent(ctx, Intent{Run: "shared", Tool: "crm.create", ArgsDigest: fmt.Sprint(w, i)})
				if err == nil {
					_, err = s.RecordOutcome(ctx, "shared", step, StepOutcome{Status: Succeeded})
				}
				if err == nil && i%5 == 0 {
					_, err = s.AppendEvent(ctx, Event{Run: "shared", Kind: KindNote, Note: fmt.Sprint(w)})
				}
				if err != nil {
					t.Errorf("writer %d call %d: %v", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	want := writers * (2*calls + calls/5)
	for _, s := range []*Postgres{a, b} {
		recs := must[[]Record](t)(s.Records(ctx, "shared", 0, 0))
		if len(recs) != want {
			t.Fatalf("%d records, want %d", len(recs), want)
		}
		intents := map[int64]bool{}
		for i, r := range recs {
			if r.Seq != int64(i+1) {
				t.Fatalf("record %d has seq %d: the numbering has a gap or a duplicate", i, r.Seq)
			}
			switch r.Kind {
			case KindIntent:
				intents[r.Seq] = true
			case KindOutcome:
				if !intents[r.Step] {
					t.Fatalf("outcome %d completes step %d, which is not an earlier intent", r.Seq, r.Step)
				}
				delete(intents, r.Step)
			}
		}
		if len(intents) != 0 {
			t.Fatalf("intents without outcome: %v", intents)
		}
	}
}

// TestPostgresRecoverLeavesLiveReplicas: replica b's start-up recovery must not complete
// replica a's in-flight call (a holds its instance lock); once a has closed, b recovers it as
// uncertain, exactly once even when b and a third replica c recover at the same moment.
func TestPostgresRecoverLeavesLiveReplicas(t *testing.T) {
	url := pgURL("")
	ctx := context.Background()
	a := openPG(t, url, nil)
	must[Run](t)(a.CreateRun(ctx, Run{ID: "ra", Actor: "alice"}))
	inFlight := must[int64](t)(a.RecordIntent(ctx, Intent{Run: "ra", Tool: "slow"}))
	b, c := openPG(t, url, nil), openPG(t, url, nil)
	if rec, err := b.Recover(ctx); err != nil || len(rec) != 0 {
		t.Fatalf("recovery beside a live replica completed %+v (%v), want nothing", rec, err)
	}
	if _, err := a.RecordOutcome(ctx, "ra", inFlight, StepOutcome{Status: Succeeded}); err != nil {
		t.Fatalf("the live replica's real outcome was refused: %v", err)
	}
	left := must[int64](t)(a.RecordIntent(ctx, Intent{Run: "ra", Tool: "slow"}))
	if p := must[[]Record](t)(b.PendingSteps(ctx, "ra")); len(p) != 1 || p[0].Step != left {
		t.Fatalf("pending as seen by another replica: %+v", p)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	got := make([][]Record, 2)
	for i, s := range []*Postgres{b, c} {
		wg.Go(func() {
			var err error
			if got[i], err = s.Recover(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	all := append(got[0], got[1]...)
	if len(all) != 1 || all[0].Run != "ra" || all[0].Step != left || all[0].Status != Uncertain || all[0].Note != RecoveryNote {
		t.Fatalf("recovery after the first replica stopped: b %+v, c %+v", got[0], got[1])
	}
	if p := must[[]Record](t)(c.PendingSteps(ctx, "ra")); len(p) != 0 {
		t.Fatalf("still pending: %+v", p)
	}
}

// TestPostgresHighWaterAcrossReplicas: replicas on one schema share their marks: what one
// advanced the other reads and defends (it refuses a lower sequence), and their goroutines race
// as in TestHighWaterConcurrent without a lower sequence ever winning.
func TestPostgresHighWaterAcrossReplicas(t *testing.T) {
	url := pgURL("")
	ctx := context.Background()
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	m7 := HighWater{Source: "ManifestRegistry agents/memory", Sequence: 7, Revision: "main@sha1:aaaa", Digest: "sha256:m7"}
	if err := a.AdvanceHighWater(ctx, []HighWater{m7}); err != nil {
		t.Fatal(err)
	}
	wantMarks(t, b, m7)
	m6 := HighWater{Source: m7.Source, Sequence: 6, Revision: "main@sha1:0000", Digest: "sha256:m6"}
	if de := wantDowngrade(t, b.AdvanceHighWater(ctx, []HighWater{m6}), m6); de.Refused[0].Stored.Revision != m7.Revision {
		t.Fatalf("replica b refused with %+v, want the mark replica a stored", de.Refused[0])
	}

	race := pgURL("")
	raceMarks(t, openPG(t, race, nil), openPG(t, race, nil))
}

// pgCrashEnv, when set to a database URL, makes the test binary write one intent there and
// exit without closing the store (see postgresCrashChild).
const pgCrashEnv = "REVERSI_STORE_PG_CRASH_URL"

// postgresCrashChild, in TestPostgresCrashRecovery's child process, opens the store, writes a
// run with one intent and a high-water mark, prints its step and exits the process without
// Close.
func postgresCrashChild() {
	url := os.Getenv(pgCrashEnv)
	if url == "" {
		return
	}
	ctx := context.Background()
	s, err := OpenPostgres(ctx, url, nil)
	if err == nil {
		_, err = s.CreateRun(ctx, Run{ID: "crash-run", Actor: "alice"})
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
	fmt.Printf("STEP %d INSTANCE %s\n", step, s.Instance())
	os.Exit(0) // no Close: the server ends the session (and its instance lock) when the process is gone
}

// TestPostgresCrashRecovery: a gateway process dies with a call in flight; the server ends
// its session, so a replica's Recover completes that call as uncertain. (The server notices
// the closed connection asynchronously: Recover is polled until a deadline.)
func TestPostgresCrashRecovery(t *testing.T) {
	url := pgURL("")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pgCrashEnv+"="+url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var step int64
	var instance string
	if _, err := fmt.Sscanf(string(out[strings.Index(string(out), "STEP "):]), "STEP %d INSTANCE %s", &step, &instance); err != nil {
		t.Fatalf("child printed %q: %v", out, err)
	}
	s := openPG(t, url, nil)
	ctx := context.Background()
	if p := must[[]Record](t)(s.PendingSteps(ctx, "crash-run")); len(p) != 1 || p[0].Step != step || p[0].Tool != "notes.delete" {
		t.Fatalf("pending after the crash: %+v", p)
	}
	wantMarks(t, s, crashMark) // the other process's mark, seen by this one
	deadline := time.Now().Add(30 * time.Second)
	var rec []Record
	for len(rec) == 0 && time.Now().Before(deadline) {
		if rec, err = s.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		if len(rec) == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if len(rec) != 1 || rec[0].Step != step || rec[0].Status != Uncertain {
		t.Fatalf("recovered %+v after the crash of instance %s", rec, instance)
	}
}

// TestPostgresLostLockConnection: when the server ends the session that holds a replica's
// instance lock (here pg_terminate_backend, as a failover or an idle-session killer would), a
// peer may now complete that replica's intents, so the replica refuses new intents for as long
// as it cannot retake its lock (here a third session holds it, as a peer does while it
// recovers); once the lock is free again it reconnects and journals again.
func TestPostgresLostLockConnection(t *testing.T) {
	url := pgURL("")
	ctx := context.Background()
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	must[Run](t)(a.CreateRun(ctx, Run{ID: "r", Actor: "alice"}))
	orphan := must[int64](t)(a.RecordIntent(ctx, Intent{Run: "r", Tool: "slow"}))
	peer, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close(ctx)
	// a's watchdog waits (lock.mu) until the lock is out of its reach.
	a.lock.mu.Lock()
	pid := a.lock.conn.PgConn().PID()
	if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1::int, 5000)`, pid); err != nil {
		a.lock.mu.Unlock()
		t.Fatal(err)
	}
	// The peer sees the instance as gone and completes its intent.
	rec, err := b.Recover(ctx)
	if err == nil {
		_, err = peer.Exec(ctx, `SELECT pg_advisory_lock($1)`, a.lock.key(a.Instance()))
	}
	a.lock.mu.Unlock()
	if err != nil || len(rec) != 1 || rec[0].Step != orphan || rec[0].Status != Uncertain {
		t.Fatalf("peer recovery after the lock session ended: %+v %v", rec, err)
	}
	// Within a watchdog period or two the replica notices and refuses intents.
	lostErr := func(err error) bool { return errors.Is(err, errLockLost) }
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := a.RecordIntent(ctx, Intent{Run: "r", Tool: "t"})
		if lostErr(err) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica kept journaling intents after losing its instance lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(2 * postgresWatchdog) // its retries fail while the lock is held elsewhere
	if _, err := a.RecordIntent(ctx, Intent{Run: "r", Tool: "t"}); !lostErr(err) {
		t.Fatalf("intent while the lock is held elsewhere: %v", err)
	}
	if _, err := peer.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		t.Fatal(err)
	}
	var step int64
	for step == 0 {
		step, err = a.RecordIntent(ctx, Intent{Run: "r", Tool: "after"})
		if err != nil && !lostErr(err) {
			t.Fatal(err)
		}
		if step == 0 && time.Now().After(deadline.Add(30*time.Second)) {
			t.Fatal("the replica did not retake its lock once it was free")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rec := must[[]Record](t)(b.Recover(ctx)); len(rec) != 0 {
		t.Fatalf("peer recovered %+v from a replica that has its lock back", rec)
	}
	must[int64](t)(a.RecordOutcome(ctx, "r", step, StepOutcome{Status: Succeeded}))
}

// TestPostgresSchemas: stores in different schemas of one database are separate; the schema
// comes from the URL's search_path, PostgresSchema by default; a bad URL is named in the error
// without its password.
func TestPostgresSchemas(t *testing.T) {
	ctx := context.Background()
	db, err := pgServer.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	def := openPG(t, db, nil)
	if def.Schema() != PostgresSchema {
		t.Fatalf("default schema %q", def.Schema())
	}
	other := openPG(t, db+"&search_path=team_b", nil)
	must[Run](t)(def.CreateRun(ctx, Run{ID: "r", Actor: "a"}))
	if _, err := other.GetRun(ctx, "r"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a run of schema %s is visible in team_b: %v", PostgresSchema, err)
	}
	must[Run](t)(other.CreateRun(ctx, Run{ID: "r", Actor: "b"}))
	c, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var tables int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = ANY($1)`,
		[]string{PostgresSchema, "team_b"}).Scan(&tables); err != nil || tables != 16 {
		t.Fatalf("%d tables in the two schemas (%v), want 8 each", tables, err)
	}
	_, err = OpenPostgres(ctx, "postgres://u:s3cret@127.0.0.1:"+strconv.Itoa(pgServer.Port)+"/postgres?sslmode=bogus", nil)
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "database URL") {
		t.Fatalf("bad URL: %v", err)
	}
}

// BenchmarkPostgresCall is BenchmarkSQLiteCall against Postgres (the package's server, fsync
// and synchronous_commit on): journaled calls per second with 1 and 16 concurrent sessions.
func BenchmarkPostgresCall(b *testing.B) {
	for _, sessions := range []int{1, 16} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			benchCalls(b, openPG(b, pgURL(""), nil), sessions)
		})
	}
}

// benchCalls runs b.N journaled calls (intent, then outcome) over sessions concurrent runs and
// reports calls/s and cpu-µs/op, the CPU time (user + system) of the whole process per call.
func benchCalls(b *testing.B, s Store, sessions int) {
	ctx := context.Background()
	runs := make([]string, sessions)
	for i := range runs {
		r, err := s.CreateRun(ctx, Run{Actor: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		runs[i] = r.ID
	}
	handle := map[string]any{"id": "ch_123", "amount": 42}
	b.ResetTimer()
	cpu0 := cpuTime(b, syscall.RUSAGE_SELF)
	var wg sync.WaitGroup
	for i, run := range runs {
		n := b.N / sessions
		if i < b.N%sessions {
			n++
		}
		wg.Go(func() {
			for range n {
				step, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "crm.create", ArgsDigest: "sha256:abc",
					Reason: "MCP tools/call crm.create", Mode: "enforce", Decision: "allow"})
				if err != nil {
					b.Error(err)
					return
				}
				if _, err := s.RecordOutcome(ctx, run, step, StepOutcome{Status: Succeeded, CompensationTool: "crm.delete", Handle: handle}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	cpu := cpuTime(b, syscall.RUSAGE_SELF) - cpu0
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
}

// cpuTime is the CPU time (user + system) so far of the process (who: syscall.RUSAGE_SELF,
// every thread) or of its waited-for children (syscall.RUSAGE_CHILDREN).
func cpuTime(b *testing.B, who int) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// oneOutcomeWon checks the answers of one round of racing outcomes of one step: exactly one
// nil (committed), every other ErrCompleted.
func oneOutcomeWon(t *testing.T, round int, errs []error) {
	t.Helper()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrCompleted):
			t.Fatalf("round %d racer %d: %v, want nil or ErrCompleted", round, i, err)
		}
	}
	if won != 1 {
		t.Fatalf("round %d: %d outcomes committed for one step, want 1 (%v)", round, won, errs)
	}
}

// TestPostgresConsumeAcrossReplicas: two replicas (two pools on one schema) send the retry of
// one approved call at the same moment, 8 each: exactly one intent is written, and every other
// one is told ErrConsumed and leaves nothing in the ledger. Source: issue 16 ("Consumption is
// durable and private ... shared by replicas through Postgres").
func TestPostgresConsumeAcrossReplicas(t *testing.T) {
	url := pgURL("")
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	ctx := context.Background()
	for round := range 10 {
		run, id := fmt.Sprintf("r%d", round), fmt.Sprintf("apr-%d", round)
		must[Run](t)(a.CreateRun(ctx, Run{ID: run, Actor: "agent-alice"}))
		kept := ApprovalRequest{ID: id, Tool: "stripe.charge", ArgsDigest: "sha256:d", Run: run, Actor: "agent-alice", UID: "u", SpecDigest: "sha256:s"}
		if round%2 == 0 { // store-decided and kept requests alike
			kept.UID, kept.SpecDigest, kept.Expires = "", "", time.Now().Add(time.Hour)
		}
		must[Approval](t)(a.CreateApproval(ctx, kept))
		if !kept.Kept() {
			must[Approval](t)(b.Decide(ctx, id, Decision{By: "carol", Approve: true}))
		}
		var wins atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 16 {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Go(func() {
				<-start
				_, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "stripe.charge", ArgsDigest: "sha256:d", Approval: id})
				switch {
				case err == nil:
					wins.Add(1)
				case !errors.Is(err, ErrConsumed):
					t.Errorf("round %d: %v, want ErrConsumed", round, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("round %d: %d intents consumed the approval, want exactly 1", round, wins.Load())
		}
		want := 2 // the intent and its consumption
		if !kept.Kept() {
			want += 2 // carol's decision and the approval
		}
		if recs := must[[]Record](t)(b.Records(ctx, run, 0, 0)); len(recs) != want {
			t.Fatalf("round %d: %d records, want %d", round, len(recs), want)
		}
	}
}

// TestPostgresOutcomeRaceAcrossReplicas: outcomes of ONE step written at once by both
// replicas (a gateway and a peer's Recover, say): exactly one commits, the others read
// ErrCompleted, and the run's numbering stays gapless (the losers' numbering is rolled back).
func TestPostgresOutcomeRaceAcrossReplicas(t *testing.T) {
	url := pgURL("")
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	ctx := context.Background()
	must[Run](t)(a.CreateRun(ctx, Run{ID: "race", Actor: "alice"}))
	const rounds, racers = 20, 6
	for round := range rounds {
		step := must[int64](t)(a.RecordIntent(ctx, Intent{Run: "race", Tool: "crm.create", ArgsDigest: fmt.Sprint(round)}))
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Go(func() {
				_, errs[i] = s.RecordOutcome(ctx, "race", step, StepOutcome{Status: Succeeded, Note: fmt.Sprint(i)})
			})
		}
		wg.Wait()
		oneOutcomeWon(t, round, errs)
	}
	recs := must[[]Record](t)(b.Records(ctx, "race", 0, 0))
	if len(recs) != 2*rounds {
		t.Fatalf("%d records, want %d (one intent and one outcome per round)", len(recs), 2*rounds)
	}
	for i, r := range recs {
		if r.Seq != int64(i+1) || (i%2 == 1 && (r.Kind != KindOutcome || r.Step != recs[i-1].Seq)) {
			t.Fatalf("record %d: %+v; want seq %d, each outcome after its intent", i, r, i+1)
		}
	}
}
