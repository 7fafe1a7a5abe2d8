package store

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestSharedFile: a second opener of the same SQLite file (the `reversi approvals` CLI while a
// gateway runs) waits for a write lock held by someone else instead of failing with
// SQLITE_BUSY, reads while the lock is held, and its writes interleave with the first store's
// without errors. Source: issue 5 ("reversi approvals list|approve|deny operate on the same
// store").
func TestSharedFile(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a, err := OpenSQLite(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	must[Run](t)(a.CreateRun(ctx, Run{ID: "run-a", Actor: "alice"}))
	req := must[Approval](t)(a.CreateApproval(ctx, ApprovalRequest{Tool: "mem.delete_entities", ArgsDigest: "sha256:1",
		Run: "run-a", Actor: "alice", Roles: []string{"finance"}, Quorum: 2, Expires: time.Now().Add(time.Hour)}))

	// A foreign connection without a busy timeout holds the write lock for a while, as the
	// gateway's writer does during a batch (here much longer, to make the wait visible).
	raw, err := sql.Open("sqlite", "file:"+(&url.URL{Path: filepath.Join(dir, SQLiteFile)}).EscapedPath()+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tx, err := raw.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`UPDATE runs SET last_activity = last_activity WHERE id = 'run-a'`); err != nil {
		t.Fatal(err)
	}
	const hold = 400 * time.Millisecond
	released := make(chan struct{})
	go func() {
		time.Sleep(hold)
		if err := tx.Commit(); err != nil {
			t.Error(err)
		}
		close(released)
	}()

	// Reads do not wait for the writer (WAL).
	if l, err := a.ListApprovals(ctx, ApprovalFilter{State: ApprovalPending}); err != nil || len(l) != 1 {
		t.Fatalf("list while another connection writes: %v %v", l, err)
	}
	// A second store opens (its schema statements write) and decides: both wait for the lock.
	start := time.Now()
	b, err := OpenSQLite(dir, nil)
	if err != nil {
		t.Fatalf("second open while the write lock is held: %v", err)
	}
	defer b.Close()
	got, err := b.Decide(ctx, req.ID, Decision{By: "bob", Roles: []string{"finance"}, Approve: true})
	if err != nil || got.State != ApprovalPending || len(got.Decisions) != 1 {
		t.Fatalf("decide from the second store: %+v %v", got, err)
	}
	<-released
	t.Logf("second open + decide waited %v for a lock held %v", time.Since(start), hold)

	// Both stores write at once: every write succeeds, and each sees the other's commits.
	must[Run](t)(b.CreateRun(ctx, Run{ID: "run-b", Actor: "bob"}))
	var wg sync.WaitGroup
	const n = 100
	for _, s := range []struct {
		st  *SQLite
		run string
	}{{a, "run-a"}, {b, "run-b"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				step, err := s.st.RecordIntent(ctx, Intent{Run: s.run, Tool: "mem.read_graph", ArgsDigest: fmt.Sprint(i)})
				if err == nil {
					_, err = s.st.RecordOutcome(ctx, s.run, step, StepOutcome{Status: Succeeded})
				}
				if err != nil {
					t.Errorf("%s write %d: %v", s.run, i, err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := a.Decide(ctx, req.ID, Decision{By: "carol", Roles: []string{"finance"}, Approve: true}); err != nil {
			t.Errorf("decide from the first store: %v", err)
		}
	}()
	wg.Wait()
	for _, s := range []*SQLite{a, b} {
		for _, run := range []string{"run-a", "run-b"} {
			want := 2 * n
			if run == req.Run {
				want += 3 // the decisions of bob and carol, and the approval (decision records)
			}
			if recs := must[[]Record](t)(s.Records(ctx, run, 0, 0)); len(recs) != want {
				t.Errorf("%s sees %d records in %s, want %d", s.Path(), len(recs), run, want)
			}
		}
		if got := must[Approval](t)(s.GetApproval(ctx, req.ID)); got.State != ApprovalApproved || len(got.Decisions) != 2 {
			t.Errorf("approval as seen by one store: %+v", got)
		}
	}
}

// TestRecoverLeavesLiveInstances: two gateways on one data folder. The second one's start-up
// recovery must not complete the first one's in-flight call (it is alive: its instance lock is
// held); once the first is gone, its unfinished call is recovered as uncertain.
func TestRecoverLeavesLiveInstances(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a, err := OpenSQLite(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.CreateRun(ctx, Run{ID: "ra", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	inFlight, err := a.RecordIntent(ctx, Intent{Run: "ra", Tool: "slow"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenSQLite(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if rec, err := b.Recover(ctx); err != nil || len(rec) != 0 {
		t.Fatalf("recovery beside a live gateway completed %+v (%v), want nothing", rec, err)
	}
	if _, err := a.RecordOutcome(ctx, "ra", inFlight, StepOutcome{Status: Succeeded}); err != nil {
		t.Fatalf("the live gateway's real outcome was refused: %v", err)
	}
	left, err := a.RecordIntent(ctx, Intent{Run: "ra", Tool: "slow"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // gone with a call in flight (a crash also frees the lock)
		t.Fatal(err)
	}
	rec, err := b.Recover(ctx)
	if err != nil || len(rec) != 1 || rec[0].Run != "ra" || rec[0].Step != left || rec[0].Status != Uncertain {
		t.Fatalf("recovery after the first gateway stopped: %+v %v", rec, err)
	}
	entries, err := os.ReadDir(filepath.Join(dir, instancesDir))
	if err != nil || len(entries) != 1 || entries[0].Name() != b.instance+".lock" {
		t.Fatalf("instance locks left: %v %v, want only the live one", entries, err)
	}
}

// TestInstancesStartingTogether: stores opening on one folder while others recover never take
// a starting instance for dead (its lock file appears already locked).
func TestInstancesStartingTogether(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	const n = 24
	errs := make(chan error, n)
	stores := make(chan *SQLite, n)
	for range n {
		go func() {
			s, err := OpenSQLite(dir, nil)
			if err == nil {
				_, err = s.Recover(ctx)
				stores <- s
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("open or recover: %v", err)
		}
	}
	close(stores)
	var all []*SQLite
	for s := range stores {
		all = append(all, s)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, instancesDir))
	if len(entries) != len(all) {
		t.Errorf("%d lock files for %d open stores: a live instance's lock was taken for dead", len(entries), len(all))
	}
	for _, s := range all {
		_ = s.Close()
	}
}
