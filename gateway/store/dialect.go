package store

import (
	"context"
	"database/sql"
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
	// extraDDL runs after the shared schema: this database's own indexes and settings.
	extraDDL []string
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
	PRIMARY KEY (run, seq)
){norowid}`,
	// intents without an outcome: inserted with the intent, deleted with the outcome;
	// instance: the store instance (process) that wrote the intent
	`CREATE TABLE IF NOT EXISTS pending (
	run      {text} NOT NULL,
	step     {int} NOT NULL,
	tool     {text} NOT NULL,
	instance {text} NOT NULL DEFAULT '',
	PRIMARY KEY (run, step)
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
	// the gateway-level journal (GatewayJournal)
	`INSERT INTO runs (id, actor, gateway, started, last_activity, status) VALUES ('', '', '', 0, 0, 'active') ON CONFLICT DO NOTHING`,
}

// schemaColumns are the columns later versions added to tables of older stores (CREATE TABLE
// IF NOT EXISTS leaves an existing table as it is); migrate adds the ones a table lacks.
var schemaColumns = []struct{ table, column, def string }{
	// instances
	{"pending", "instance", `{text} NOT NULL DEFAULT ''`},
	// decision records and requests kept in Kubernetes (issue 16)
	{"records", "approval", `{text} NOT NULL DEFAULT ''`},
	{"records", "event", `{text} NOT NULL DEFAULT ''`},
	{"records", "approver", `{text} NOT NULL DEFAULT ''`},
	{"records", "groups", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "actor_uid", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "actor_email", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "uid", `{text} NOT NULL DEFAULT ''`},
	{"approvals", "spec_digest", `{text} NOT NULL DEFAULT ''`},
}

// schemaIndexes need the migrated columns.
var schemaIndexes = []string{
	// a decision record with a Once key is in its run at most once (ApprovalRecord.Once)
	`CREATE UNIQUE INDEX IF NOT EXISTS records_approval_once ON records (run, approval, idempotency_key)
	WHERE kind = 'approval' AND idempotency_key <> ''`,
	// a step is completed at most once, whatever the code above does
	`CREATE UNIQUE INDEX IF NOT EXISTS records_one_outcome ON records (run, step) WHERE kind = 'outcome'`,
}

// migrate creates or upgrades the schema in tx: the tables, the columns older versions lack,
// the indexes, then the dialect's own statements. The caller holds the schema's write lock
// (tx), so two openers never both add a column.
func (d *dialect) migrate(ctx context.Context, tx *sql.Tx) error {
	for _, q := range schemaTables {
		if _, err := tx.ExecContext(ctx, d.types.Replace(q)); err != nil {
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
		if _, err := tx.ExecContext(ctx, d.types.Replace(`ALTER TABLE `+c.table+` ADD COLUMN `+c.column+` `+c.def)); err != nil {
			return err
		}
		have[c.table][c.column] = true
	}
	for _, q := range append(schemaIndexes, d.extraDDL...) {
		if _, err := tx.ExecContext(ctx, d.types.Replace(q)); err != nil {
			return err
		}
	}
	return nil
}

// columnsOf returns the set of table's column names.
func (d *dialect) columnsOf(ctx context.Context, tx *sql.Tx, table string) (map[string]bool, error) {
	rows, err := tx.QueryContext(ctx, d.columns, table)
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
