package store

import (
	"context"
	"fmt"
	"strings"
)

// dialect is what differs between the SQL databases sqlStore runs on (SQLite in a file or in
// memory, PostgreSQL): column types, row locks, one text function, catalog queries and how the
// driver reports a unique violation. Everything else is sqlStore's and written once: the
// statements use $1, $2, ... placeholders, which pgx takes natively and modernc.org/sqlite binds
// by number (a number may repeat), and only portable SQL (ON CONFLICT, RETURNING, partial
// indexes).
type dialect struct {
	// types fills the schema's type names: {text} (byte-wise ordered text), {int} (64 bits),
	// {key} (opaque bytes with NUL separators: duplicate-call keys), {bool}, and {norowid}
	// (SQLite's WITHOUT ROWID, nothing elsewhere).
	types *strings.Replacer
	// forUpdate ends a SELECT whose rows the transaction holds until it ends: " FOR UPDATE"
	// where replicas write concurrently (Postgres), "" where one writer at a time holds the
	// whole database (SQLite).
	forUpdate string
	// skipLocked ends the SELECT that picks the notifications a worker claims: " FOR UPDATE
	// SKIP LOCKED" where replicas claim concurrently (Postgres: each takes other rows instead
	// of waiting), "" where one writer holds the database (SQLite).
	skipLocked string
	// rowOrder orders rows of one table as they were inserted (SQLite's rowid), else by
	// primary key (id): the tiebreak of requests created at the same instant.
	rowOrder string
	// key is a duplicate-call key as a statement parameter (BYTEA in Postgres wants []byte).
	key func(string) any
	// textMatch is an SQL condition: column c lowered (ASCII letters only, as asciiLower) holds
	// the lowered needle in parameter p.
	textMatch func(c, p string) string
	// columns is a query of the column names of table $1.
	columns string
	// unique reports whether err is a unique or primary-key violation (the driver's typed
	// error, never its text).
	unique func(error) bool
	// seqWith and seqFrom number a record of run $1: an INSERT ... SELECT reads the run's next
	// Seq as s.n from seqFrom, after the WITH clause seqWith ("" or "WITH ... "). They yield
	// no row when the run does not exist. How they keep Seq gapless under concurrent writers
	// is the dialect's: SQLite's writer holds the file's write lock, so the next Seq is
	// max(seq) + 1; Postgres replicas meet in the run's row lock (UPDATE runs ... next_seq).
	seqWith, seqFrom string
	// extraDDL runs after the shared schema: this database's own indexes and settings.
	extraDDL []string
	// outcomeCall, when set, is insertOutcome: a call of a function of the database that
	// numbers the outcome and closes its intent (Postgres: pgOutcomeFunction); outcomeRace
	// reports its error for an intent that a concurrent outcome closed meanwhile (read as
	// ErrCompleted). Else insertOutcome is one INSERT that closes the intent by an UPSERT of
	// its key (SQLite, one writer at a time; see withStatements). Either way an outcome is one
	// statement, which the runner commits by itself (single).
	outcomeCall string
	outcomeRace func(error) bool

	// The numbered inserts (numbered), made from the fields above by withStatements.
	insertIntent, insertOutcome, insertRecord string
}

// withStatements fills d's numbered inserts and returns d.
func (d *dialect) withStatements() *dialect {
	// $1 run, $2 time, $3 tool, $4 args_digest, $5 reason, $6 idempotency_key,
	// $7 manifest_version, $8 manifest_checksum, $9 mode, $10 decision, $11 approval,
	// $12 instance. An intent is its own step, and open until its outcome.
	d.insertIntent = d.numbered(`kind, time, step, tool, args_digest, reason, idempotency_key, manifest_version,
		manifest_checksum, mode, decision, approval, instance, open`,
		`'intent', $2, s.n, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 1`, "", "seq")
	// $1 run, $2 time, $3 step, $4 status, $5 compensation_tool, $6 handle, $7 note: only an
	// open intent gets an outcome (no row otherwise); the outcome repeats its tool.
	open := ` records i WHERE i.run = $1 AND i.seq = $3 AND i.kind = 'intent' AND i.open = 1`
	if d.outcomeCall != "" {
		d.insertOutcome = d.outcomeCall
	} else {
		// The SELECT yields a second row, the intent's own key, which meets the intent in
		// the primary key and so only closes it (ON CONFLICT ... DO UPDATE; the row's other
		// values are never stored). SQLite reads the whole SELECT before it inserts (the
		// table it reads is the one it writes), so both rows come from the open intent, or
		// neither. RETURNING gives both rows: the outcome is the one of kind 'outcome'.
		d.insertOutcome = d.numbered(`kind, time, step, tool, status, compensation_tool, handle, note`,
			`'outcome', $2, i.seq, i.tool, $4, $5, $6, $7`,
			`,`+open+` UNION ALL SELECT $1, i.seq, 'intent', 0, 0, '', '', '', '', '' FROM`+open+
				` ON CONFLICT (run, seq) DO UPDATE SET open = 0`, "seq, tool, kind")
	}
	// $1 run, $2 kind, $3 time, $4 step, $5 tool, ... $20 groups (recordCols after seq)
	d.insertRecord = d.numbered(`kind, time, step, tool, args_digest, reason, idempotency_key, manifest_version,
		manifest_checksum, mode, decision, status, compensation_tool, handle, note, approval, event, approver, groups`,
		`$2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20`, "", "seq")
	return d
}

// numbered is an INSERT into records of run $1 numbered by the dialect: cols and vals follow
// run and seq; rest goes after the FROM (more tables and a WHERE).
func (d *dialect) numbered(cols, vals, rest, returning string) string {
	return d.seqWith + `INSERT INTO records (run, seq, ` + cols + `) SELECT $1, s.n, ` + vals +
		` FROM ` + d.seqFrom + rest + ` RETURNING ` + returning
}

// schemaTables creates the tables of the current schema version (types from dialect.types).
// Existing tables stay as they are: schemaColumns adds what older versions lack.
var schemaTables = []string{
	`CREATE TABLE IF NOT EXISTS runs (
	id            {text} PRIMARY KEY,
	actor         {text} NOT NULL,
	gateway       {text} NOT NULL,
	started       {int} NOT NULL,
	last_activity {int} NOT NULL,
	status        {text} NOT NULL,
	next_seq      {int} NOT NULL DEFAULT 0
)`,
	`CREATE INDEX IF NOT EXISTS runs_started ON runs (started DESC, id)`,
	`CREATE TABLE IF NOT EXISTS records (
	run               {text} NOT NULL REFERENCES runs (id),
	seq               {int} NOT NULL,
	kind              {text} NOT NULL,
	time              {int} NOT NULL,
	step              {int} NOT NULL,
	tool              {text} NOT NULL DEFAULT '',
	args_digest       {text} NOT NULL DEFAULT '',
	reason            {text} NOT NULL DEFAULT '',
	idempotency_key   {key} NOT NULL DEFAULT '',
	manifest_version  {text} NOT NULL DEFAULT '',
	manifest_checksum {text} NOT NULL DEFAULT '',
	mode              {text} NOT NULL DEFAULT '',
	decision          {text} NOT NULL DEFAULT '',
	status            {text} NOT NULL DEFAULT '',
	compensation_tool {text} NOT NULL DEFAULT '',
	handle            {text} NOT NULL DEFAULT '',
	note              {text} NOT NULL DEFAULT '',
	approval          {text} NOT NULL DEFAULT '',
	event             {text} NOT NULL DEFAULT '',
	approver          {text} NOT NULL DEFAULT '',
	groups            {text} NOT NULL DEFAULT '',
	instance          {text} NOT NULL DEFAULT '',
	open              INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (run, seq)
){norowid}`,
	`CREATE TABLE IF NOT EXISTS dup_keys (
	key     {key} PRIMARY KEY,
	run     {text} NOT NULL,
	step    {int} NOT NULL,
	claimed {int} NOT NULL
){norowid}`,
	`CREATE TABLE IF NOT EXISTS approvals (
	id          {text} PRIMARY KEY,
	run         {text} NOT NULL,
	tool        {text} NOT NULL,
	args_digest {text} NOT NULL,
	actor       {text} NOT NULL,
	roles       {text} NOT NULL,
	quorum      INTEGER NOT NULL,
	created     {int} NOT NULL,
	expires     {int} NOT NULL,
	on_timeout  {text} NOT NULL,
	escalate_to {text} NOT NULL,
	reason      {text} NOT NULL,
	state       {text} NOT NULL,
	decisions   {text} NOT NULL,
	escalated   {bool} NOT NULL,
	decided     {int} NOT NULL,
	consumed    {int} NOT NULL,
	actor_uid   {text} NOT NULL DEFAULT '',
	actor_email {text} NOT NULL DEFAULT '',
	uid         {text} NOT NULL DEFAULT '',
	spec_digest {text} NOT NULL DEFAULT ''
)`,
	`CREATE INDEX IF NOT EXISTS approvals_run ON approvals (run, created)`,
	`CREATE INDEX IF NOT EXISTS approvals_created ON approvals (created, id)`,
	// the newest snapshot of each manifest source this gateway served (AdvanceHighWater)
	`CREATE TABLE IF NOT EXISTS high_water (
	source   {text} PRIMARY KEY,
	sequence {int} NOT NULL CHECK (sequence >= 0),
	revision {text} NOT NULL,
	digest   {text} NOT NULL,
	updated  {int} NOT NULL
){norowid}`,
	// the calls counted by policy limit rules (CountCalls, AddCall)
	`CREATE TABLE IF NOT EXISTS limit_calls (
	rule    {text} NOT NULL,
	scope   {text} NOT NULL,
	subject {text} NOT NULL,
	time    {int} NOT NULL
)`,
	`CREATE INDEX IF NOT EXISTS limit_calls_key ON limit_calls (rule, scope, subject, time)`,
	// the notification outbox (notifications.go, issue 24): one row per receiver and notice,
	// written in the transaction of the event it announces
	`CREATE TABLE IF NOT EXISTS notifications (
	id              {text} PRIMARY KEY,
	sink            {text} NOT NULL,
	idempotency_key {text} NOT NULL,
	event           {text} NOT NULL,
	approval        {text} NOT NULL DEFAULT '',
	payload         {text} NOT NULL,
	state           {text} NOT NULL,
	attempts        INTEGER NOT NULL DEFAULT 0,
	created         {int} NOT NULL,
	next_attempt    {int} NOT NULL,
	delivered       {int} NOT NULL DEFAULT 0,
	last_error      {text} NOT NULL DEFAULT '',
	lease_owner     {text} NOT NULL DEFAULT '',
	lease_until     {int} NOT NULL DEFAULT 0,
	UNIQUE (sink, idempotency_key)
)`,
	// the receivers' filters (SetNotificationReceivers): every writer of an event routes by them
	`CREATE TABLE IF NOT EXISTS notification_receivers (
	name    {text} PRIMARY KEY,
	events  {text} NOT NULL,
	tools   {text} NOT NULL,
	risk    {text} NOT NULL,
	updated {int} NOT NULL
)`,
	`CREATE INDEX IF NOT EXISTS notifications_due ON notifications (next_attempt, id) WHERE state = 'pending'`,
	`CREATE INDEX IF NOT EXISTS notifications_created ON notifications (created, id)`,
	// the dead letters (SummarizeNotifications every 2 s in each pod, RetryNotifications):
	// without it, each count reads the whole outbox, delivered rows included
	`CREATE INDEX IF NOT EXISTS notifications_dead ON notifications (created, id) WHERE state = 'dead'`,
	// the gateway-level journal (GatewayJournal)
	`INSERT INTO runs (id, actor, gateway, started, last_activity, status) VALUES ('', '', '', 0, 0, 'active') ON CONFLICT DO NOTHING`,
}

// schemaColumns are the columns later versions added to tables of older stores (CREATE TABLE
// IF NOT EXISTS leaves an existing table as it is); migrate adds the ones a table lacks.
var schemaColumns = []struct{ table, column, def string }{
	// decision records and requests kept in Kubernetes (issue 16)
	{"records", "approval", `{text} NOT NULL DEFAULT ''`},
	{"records", "event", `{text} NOT NULL DEFAULT ''`},
	{"records", "approver", `{text} NOT NULL DEFAULT ''`},
	{"records", "groups", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "actor_uid", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "actor_email", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "uid", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "spec_digest", `{text} NOT NULL DEFAULT ''`},
	// 4: open intents on the record (instance: the store instance, i.e. process, that wrote
	// the intent; open: 1 until its outcome)
	{"records", "instance", `{text} NOT NULL DEFAULT ''`},
	{"records", "open", `INTEGER NOT NULL DEFAULT 0`},
	// the policy's environment the run was served in (issue 21: --environment)
	{"runs", "environment", `{text} NOT NULL DEFAULT ''`},
	// 5: the redacted arguments preview and the tool's risk, for notifications (issue 24)
	{"approvals", "args_preview", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "risk", `{text} NOT NULL DEFAULT ''`},
	// 6: the receivers' namespace filters (issue 24)
	{"notification_receivers", "namespaces", `{text} NOT NULL DEFAULT ''`},
}

// schemaIndexes need the migrated columns.
var schemaIndexes = []string{
	// a decision record with a Once key is in its run at most once (ApprovalRecord.Once)
	`CREATE UNIQUE INDEX IF NOT EXISTS records_approval_once ON records (run, approval, idempotency_key)
	WHERE kind = 'approval' AND idempotency_key <> ''`,
	// the open intents (Recover, PendingSteps): an entry from the intent to its outcome
	`CREATE INDEX IF NOT EXISTS records_open ON records (run, seq, instance) WHERE open = 1`,
}

// migrate creates or upgrades the schema in tx: the tables, the columns older versions lack,
// the open intents of version 3's pending table, the indexes, then the dialect's own
// statements. The caller holds the schema's write lock (tx), so two openers never both add a
// column.
func (d *dialect) migrate(ctx context.Context, tx querier) error {
	for _, q := range schemaTables {
		if _, err := tx.exec(ctx, d.types.Replace(q)); err != nil {
			return err
		}
	}
	have := map[string]map[string]bool{}
	for _, c := range schemaColumns {
		if have[c.table] == nil {
			cols, err := d.columnsOf(ctx, tx, c.table)
			if err != nil {
				return err
			}
			have[c.table] = cols
		}
		if have[c.table][c.column] {
			continue
		}
		if _, err := tx.exec(ctx, d.types.Replace(`ALTER TABLE `+c.table+` ADD COLUMN `+c.column+` `+c.def)); err != nil {
			return err
		}
		have[c.table][c.column] = true
	}
	if err := d.migratePending(ctx, tx); err != nil {
		return err
	}
	for _, q := range append(schemaIndexes, d.extraDDL...) {
		if _, err := tx.exec(ctx, d.types.Replace(q)); err != nil {
			return err
		}
	}
	return nil
}

// migratePending moves the open intents of a version 3 store (a pending table: one row per
// intent without an outcome, with the instance that wrote it) onto their records, and drops
// what version 4 no longer keeps: the pending table and the unique index of outcomes (a step
// is completed once: its outcome is inserted only while its intent is open, and closes it,
// see outcomeTx).
func (d *dialect) migratePending(ctx context.Context, tx querier) error {
	cols, err := d.columnsOf(ctx, tx, "pending")
	if err != nil {
		return err
	}
	if len(cols) > 0 {
		instance := "p.instance"
		if !cols["instance"] {
			instance = "''" // version 1: no instances yet (Recover takes them for gone)
		}
		if _, err := tx.exec(ctx, `UPDATE records SET open = 1, instance = `+instance+` FROM pending p
			WHERE records.run = p.run AND records.seq = p.step AND records.kind = 'intent'`); err != nil {
			return fmt.Errorf("open intents of the pending table: %w", err)
		}
		if _, err := tx.exec(ctx, `DROP TABLE pending`); err != nil {
			return err
		}
	}
	_, err = tx.exec(ctx, `DROP INDEX IF EXISTS records_one_outcome`)
	return err
}

// columnsOf returns the set of table's column names (empty: no such table).
func (d *dialect) columnsOf(ctx context.Context, tx querier, table string) (map[string]bool, error) {
	rows, err := tx.query(ctx, d.columns, table)
	if err != nil {
		return nil, fmt.Errorf("columns of %s: %w", table, err)
	}
	defer rows.Close()
	cols := map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, fmt.Errorf("columns of %s: %w", table, err)
		}
		cols[c] = true
	}
	return cols, rows.Err()
}
