package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// v3Rows are a run of a version 3 store: step 1 completed (outcome 2), step 3 in flight when
// its gateway (instance gw-gone) stopped, so it is in the pending table.
var v3Rows = []string{
	`INSERT INTO runs (id, actor, gateway, started, last_activity, status, next_seq) VALUES ('r1', 'agent-alice', 'gw', 1, 3, 'active', 3)`,
	`INSERT INTO records (run, seq, kind, time, step, tool, status) VALUES ('r1', 1, 'intent', 1, 1, 'notes.write', ''),
		('r1', 2, 'outcome', 2, 1, 'notes.write', 'succeeded'), ('r1', 3, 'intent', 3, 3, 'notes.delete', '')`,
	`INSERT INTO pending (run, step, tool, instance) VALUES ('r1', 3, 'notes.delete', 'gw-gone')`,
}

// checkMigratedV3 checks a store opened on v3Rows: the open intent is pending and recovered,
// the completed step stays completed, and numbering goes on where it stopped.
func checkMigratedV3(t *testing.T, s Store) {
	t.Helper()
	ctx := context.Background()
	if p := must[[]Record](t)(s.PendingSteps(ctx, "r1")); len(p) != 1 || p[0].Step != 3 || p[0].Tool != "notes.delete" {
		t.Fatalf("pending after the migration: %+v", p)
	}
	if rec := must[[]Record](t)(s.Recover(ctx)); len(rec) != 1 || rec[0].Step != 3 || rec[0].Seq != 4 || rec[0].Status != Uncertain {
		t.Fatalf("recovered %+v", rec)
	}
	wantErr(t, must2(s.RecordOutcome(ctx, "r1", 1, StepOutcome{Status: Failed})), ErrCompleted)
	if step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r1", Tool: "notes.write"})); step != 5 {
		t.Fatalf("next step %d, want 5", step)
	}
	var seqs []string
	for _, r := range must[[]Record](t)(s.Records(ctx, "r1", 0, 0)) {
		seqs = append(seqs, fmt.Sprintf("%d:%s/%d", r.Seq, r.Kind, r.Step))
	}
	if got := strings.Join(seqs, " "); got != "1:intent/1 2:outcome/1 3:intent/3 4:outcome/3 5:intent/5" {
		t.Fatalf("ledger after the migration: %s", got)
	}
	if r := must[Run](t)(s.GetRun(ctx, "r1")); !r.LastActivity.After(nt(3)) {
		t.Fatalf("last activity %v: the records appended since do not count", r.LastActivity)
	}
	// version 5: the outbox and the request's preview and risk; 6: the receivers' namespaces
	o := s.(Outbox)
	if err := o.SetNotificationReceivers(ctx, []Receiver{{Name: "hook"}, {Name: "ops", Namespaces: []string{"ops"}}}); err != nil {
		t.Fatal(err)
	}
	a := must[Approval](t)(s.CreateApproval(ctx, ApprovalRequest{Tool: "notes.delete", Run: "r1", Actor: "agent-alice",
		Expires: time.Now().Add(time.Hour), ArgsPreview: `{"id":1}`, Risk: Risk{BlastRadius: "low"}}))
	if l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{})); len(l) != 1 || l[0].Notice.Approval != a.ID ||
		l[0].Notice.ArgumentsPreview != `{"id":1}` || l[0].Notice.Risk.BlastRadius != "low" {
		t.Fatalf("outbox after the migration: %+v", l)
	}
}

// sqliteFixture writes a data folder with the schema in file and the rows, as an older version
// left it, and returns the folder.
func sqliteFixture(t *testing.T, file string, rows ...string) string {
	t.Helper()
	dir := t.TempDir()
	schema, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, SQLiteFile))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range append([]string{string(schema)}, rows...) {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// must2 drops a value, keeping the error (for wantErr).
func must2[T any](_ T, err error) error { return err }

// TestSQLiteMigratesVersion3: a data folder of version 3 (a pending table, the outcomes'
// unique index, runs.next_seq) opens as version 4: its open intent moves onto its record.
func TestSQLiteMigratesVersion3(t *testing.T) {
	dir := sqliteFixture(t, "testdata/schema-v3.sql", v3Rows...)
	s := must[*SQLite](t)(OpenSQLite(dir, nil))
	defer s.Close()
	checkMigratedV3(t, s)
	var v, tables int
	if err := queryRow(context.Background(), s.r, `SELECT (SELECT user_version FROM pragma_user_version),
		(SELECT count(*) FROM sqlite_master WHERE name IN ('pending', 'records_one_outcome', 'flush_mark'))`).Scan(&v, &tables); err != nil || v != 6 || tables != 0 {
		t.Fatalf("user_version %d, %d objects of version 3 left (%v)", v, tables, err)
	}
}

// TestPostgresMigratesVersion3 is TestSQLiteMigratesVersion3 for a schema of OpenPostgres
// before version 4.
func TestPostgresMigratesVersion3(t *testing.T) {
	schema := pgServer.Unique("v3_")
	url := pgURL(schema)
	old, err := os.ReadFile("testdata/postgres-v3.sql")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range append([]string{`CREATE SCHEMA ` + schema, string(old)}, v3Rows...) {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	s := openPG(t, url, nil)
	checkMigratedV3(t, s)
	var left int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace
		AND relname IN ('pending', 'records_one_outcome')`, schema).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d objects of version 3 left (%v)", left, err)
	}
}
