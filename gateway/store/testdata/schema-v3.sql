-- The SQLite schema of version 3 (issue 16), as OpenSQLite created it before version 4
-- moved the open intents onto the records.
CREATE TABLE IF NOT EXISTS flush_mark (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
	id            TEXT PRIMARY KEY,
	actor         TEXT NOT NULL,
	gateway       TEXT NOT NULL,
	started       INTEGER NOT NULL,
	last_activity INTEGER NOT NULL,
	status        TEXT NOT NULL,
	next_seq      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started DESC, id);
CREATE TABLE IF NOT EXISTS records (
	run               TEXT NOT NULL REFERENCES runs (id),
	seq               INTEGER NOT NULL,
	kind              TEXT NOT NULL,
	time              INTEGER NOT NULL,
	step              INTEGER NOT NULL,
	tool              TEXT NOT NULL DEFAULT '',
	args_digest       TEXT NOT NULL DEFAULT '',
	reason            TEXT NOT NULL DEFAULT '',
	idempotency_key   TEXT NOT NULL DEFAULT '',
	manifest_version  TEXT NOT NULL DEFAULT '',
	manifest_checksum TEXT NOT NULL DEFAULT '',
	mode              TEXT NOT NULL DEFAULT '',
	decision          TEXT NOT NULL DEFAULT '',
	status            TEXT NOT NULL DEFAULT '',
	compensation_tool TEXT NOT NULL DEFAULT '',
	handle            TEXT NOT NULL DEFAULT '',
	note              TEXT NOT NULL DEFAULT '',
	approval          TEXT NOT NULL DEFAULT '',
	event             TEXT NOT NULL DEFAULT '',
	approver          TEXT NOT NULL DEFAULT '',
	groups            TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (run, seq)
) WITHOUT ROWID;
-- a step is completed at most once, whatever the code above does
CREATE UNIQUE INDEX IF NOT EXISTS records_one_outcome ON records (run, step) WHERE kind = 'outcome';
-- intents without an outcome: inserted with the intent, deleted with the outcome
-- instance: the store instance (process) that wrote the intent; '' before instances existed
CREATE TABLE IF NOT EXISTS pending (
	run      TEXT NOT NULL,
	step     INTEGER NOT NULL,
	tool     TEXT NOT NULL,
	instance TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (run, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dup_keys (
	key     TEXT PRIMARY KEY,
	run     TEXT NOT NULL,
	step    INTEGER NOT NULL,
	claimed INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS approvals (
	id          TEXT PRIMARY KEY,
	run         TEXT NOT NULL,
	tool        TEXT NOT NULL,
	args_digest TEXT NOT NULL,
	actor       TEXT NOT NULL,
	roles       TEXT NOT NULL,
	quorum      INTEGER NOT NULL,
	created     INTEGER NOT NULL,
	expires     INTEGER NOT NULL,
	on_timeout  TEXT NOT NULL,
	escalate_to TEXT NOT NULL,
	reason      TEXT NOT NULL,
	state       TEXT NOT NULL,
	decisions   TEXT NOT NULL,
	escalated   INTEGER NOT NULL,
	decided     INTEGER NOT NULL,
	consumed    INTEGER NOT NULL,
	actor_uid   TEXT NOT NULL DEFAULT '',
	actor_email TEXT NOT NULL DEFAULT '',
	uid         TEXT NOT NULL DEFAULT '',
	spec_digest TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS approvals_run ON approvals (run, created);
CREATE INDEX IF NOT EXISTS approvals_created ON approvals (created, id);
-- the newest snapshot of each manifest source this gateway served (AdvanceHighWater)
CREATE TABLE IF NOT EXISTS high_water (
	source   TEXT PRIMARY KEY,
	sequence INTEGER NOT NULL CHECK (sequence >= 0),
	revision TEXT NOT NULL,
	digest   TEXT NOT NULL,
	updated  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO runs (id, actor, gateway, started, last_activity, status) VALUES ('', '', '', 0, 0, 'active');

-- a decision record with a Once key is in its run at most once (ApprovalRecord.Once)
CREATE UNIQUE INDEX IF NOT EXISTS records_approval_once ON records (run, approval, idempotency_key)
	WHERE kind = 'approval' AND idempotency_key != '';
-- 2: high_water (created by CREATE TABLE IF NOT EXISTS in files of version 1)
-- 3: decision records (records.approval, event, approver, groups), approvals.actor_uid,
--    actor_email, uid, spec_digest
PRAGMA user_version = 3;
