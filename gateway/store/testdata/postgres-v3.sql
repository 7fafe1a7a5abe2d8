-- The Postgres schema before version 4 (issue 16), as OpenPostgres created it before the open
-- intents moved onto the records.
CREATE TABLE IF NOT EXISTS runs (
	id            TEXT COLLATE "C" PRIMARY KEY,
	actor         TEXT COLLATE "C" NOT NULL,
	gateway       TEXT COLLATE "C" NOT NULL,
	started       BIGINT NOT NULL,
	last_activity BIGINT NOT NULL,
	status        TEXT COLLATE "C" NOT NULL,
	next_seq      BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started DESC, id);
CREATE TABLE IF NOT EXISTS records (
	run               TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
	seq               BIGINT NOT NULL,
	kind              TEXT COLLATE "C" NOT NULL,
	time              BIGINT NOT NULL,
	step              BIGINT NOT NULL,
	tool              TEXT COLLATE "C" NOT NULL DEFAULT '',
	args_digest       TEXT COLLATE "C" NOT NULL DEFAULT '',
	reason            TEXT COLLATE "C" NOT NULL DEFAULT '',
	idempotency_key   BYTEA NOT NULL DEFAULT '',
	manifest_version  TEXT COLLATE "C" NOT NULL DEFAULT '',
	manifest_checksum TEXT COLLATE "C" NOT NULL DEFAULT '',
	mode              TEXT COLLATE "C" NOT NULL DEFAULT '',
	decision          TEXT COLLATE "C" NOT NULL DEFAULT '',
	status            TEXT COLLATE "C" NOT NULL DEFAULT '',
	compensation_tool TEXT COLLATE "C" NOT NULL DEFAULT '',
	handle            TEXT COLLATE "C" NOT NULL DEFAULT '',
	note              TEXT COLLATE "C" NOT NULL DEFAULT '',
	PRIMARY KEY (run, seq)
);
-- issue 16: decision records (added to the tables of an older schema)
ALTER TABLE records ADD COLUMN IF NOT EXISTS approval TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN IF NOT EXISTS event TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN IF NOT EXISTS approver TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN IF NOT EXISTS groups TEXT NOT NULL DEFAULT '';
-- a decision record with a Once key is in its run at most once (ApprovalRecord.Once)
CREATE UNIQUE INDEX IF NOT EXISTS records_approval_once ON records (run, approval, idempotency_key)
	WHERE kind = 'approval' AND idempotency_key <> '';
CREATE UNIQUE INDEX IF NOT EXISTS records_one_outcome ON records (run, step) WHERE kind = 'outcome';
CREATE INDEX IF NOT EXISTS records_time ON records (time DESC, run, seq DESC);
CREATE TABLE IF NOT EXISTS pending (
	run      TEXT COLLATE "C" NOT NULL,
	step     BIGINT NOT NULL,
	tool     TEXT COLLATE "C" NOT NULL,
	instance TEXT COLLATE "C" NOT NULL,
	PRIMARY KEY (run, step)
);
CREATE INDEX IF NOT EXISTS pending_instance ON pending (instance);
CREATE TABLE IF NOT EXISTS dup_keys (
	key     BYTEA PRIMARY KEY,
	run     TEXT COLLATE "C" NOT NULL,
	step    BIGINT NOT NULL,
	claimed BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS approvals (
	id          TEXT COLLATE "C" PRIMARY KEY,
	run         TEXT COLLATE "C" NOT NULL,
	tool        TEXT COLLATE "C" NOT NULL,
	args_digest TEXT COLLATE "C" NOT NULL,
	actor       TEXT COLLATE "C" NOT NULL,
	roles       TEXT NOT NULL,
	quorum      INTEGER NOT NULL,
	created     BIGINT NOT NULL,
	expires     BIGINT NOT NULL,
	on_timeout  TEXT NOT NULL,
	escalate_to TEXT NOT NULL,
	reason      TEXT NOT NULL,
	state       TEXT COLLATE "C" NOT NULL,
	decisions   TEXT NOT NULL,
	escalated   BOOLEAN NOT NULL,
	decided     BIGINT NOT NULL,
	consumed    BIGINT NOT NULL
);
-- issue 16: the actor's identity and requests kept in Kubernetes
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS actor_uid TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS actor_email TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS uid TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS spec_digest TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS approvals_run ON approvals (run, created);
CREATE INDEX IF NOT EXISTS approvals_created ON approvals (created, id);
CREATE TABLE IF NOT EXISTS high_water (
	source   TEXT COLLATE "C" PRIMARY KEY,
	sequence BIGINT NOT NULL CHECK (sequence >= 0),
	revision TEXT COLLATE "C" NOT NULL,
	digest   TEXT COLLATE "C" NOT NULL,
	updated  BIGINT NOT NULL
);
INSERT INTO runs (id, actor, gateway, started, last_activity, status) VALUES ('', '', '', 0, 0, 'active') ON CONFLICT DO NOTHING;
