// Package store is the gateway's durable state: runs, the ledger (intent and outcome of every
// forwarded call, plus reload and note records), duplicate-call keys, the standalone approval
// queue and the high-water marks of the manifest snapshots served. One SQL implementation
// (sqlStore, with a small dialect layer) serves three stores: OpenSQLite (the default: one
// SQLite file under the data folder, WAL), OpenPostgres (gateways with several replicas) and
// NewMemory (SQLite in memory, for tests and throwaway gateways).
//
// Source: DESIGN.md "The call path", seed "MCP gateway" (What happens to a call, Storage,
// Hot reload), issue 5 (ledger and approval queue in a store, crash safety, duplicate keys).
//
// The gateway's order of calls for one forwarded tool call is:
//
//	ok, holder, _ := s.ClaimKey(ctx, key, run, 0) // when the manifest declares idempotency
//	step, _ := s.RecordIntent(ctx, intent)          // durable before the upstream sees the call
//	... forward ...
//	s.QueueOutcome(ctx, run, step, outcome, done) // completes the step (with the next intent)
//
// and on start-up s.Recover(ctx) marks every intent that never got an outcome as uncertain.
package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Errors. Implementations wrap them (test with errors.Is).
var (
	// ErrNotFound: no run, step or approval with that id.
	ErrNotFound = errors.New("store: not found")
	// ErrNotOwner: a run may only be continued by the principal that opened it.
	ErrNotOwner = errors.New("store: the run belongs to another principal")
	// ErrExists: a run or approval with that id already exists.
	ErrExists = errors.New("store: already exists")
	// ErrInvalid: a required field is empty or a value is not one of the allowed ones.
	ErrInvalid = errors.New("store: invalid value")
	// ErrCompleted: the step already has an outcome (a step is completed exactly once).
	ErrCompleted = errors.New("store: the step already has an outcome")
	// ErrNotPending: the approval request was already decided or has expired.
	ErrNotPending = errors.New("store: the approval request is not pending")
	// ErrNotAllowed: the principal may not decide this request (the run's own actor approving,
	// missing role, or a second decision by the same principal).
	ErrNotAllowed = errors.New("store: not allowed to decide this request")
	// ErrNotApproved: an intent (Intent.Approval) or rollback record (RollbackEntry.Approval)
	// names a store-decided request that is pending, denied or expired.
	ErrNotApproved = errors.New("store: the approval request is not approved")
	// ErrConsumed: an intent names an approval that already let its one retry through (a
	// replay). Nothing of the intent is written.
	ErrConsumed = errors.New("store: the approval was already used")
	// ErrMismatch: an intent names an approval of a different run, tool or arguments digest.
	ErrMismatch = errors.New("store: the call does not match the approval request")
	// ErrOtherGateway: a run id that belongs to another gateway (issue 16, "Runs belong to a
	// gateway"). Its text is OtherGatewayText.
	ErrOtherGateway = errors.New("belongs to another gateway")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store: closed")
)

// GatewayJournal is the Run id of the gateway-level journal: records that belong to no agent
// session (reloaded, reload_failed, gateway notes) are appended under it. It always exists and
// is not listed by ListRuns.
const GatewayJournal = ""

// OtherGatewayError is the refusal of a run id that belongs to another gateway: its text is
// "the run <id> belongs to another gateway: ...", the same whether or not the run is in this
// gateway's store (issue 16), and it wraps ErrOtherGateway.
func OtherGatewayError(id string) error {
	return fmt.Errorf("the run %s %w: open a new run (no run id), or continue it on the gateway that opened it", id, ErrOtherGateway)
}

// RunStatus is a run's coarse state as the gateway sees it.
type RunStatus string

const (
	RunActive RunStatus = "active" // a session is attached or was recently
	RunIdle   RunStatus = "idle"   // no session attached
	RunClosed RunStatus = "closed" // will not be continued
)

// Run is one agent session (ReversiRun). Times are UTC with nanosecond precision.
type Run struct {
	ID      string
	Actor   string // the principal that opened the run; only it may continue the run
	Gateway string // the gateway's name
	// Environment is the gateway's --environment when the run opened ("" when none): what the
	// policy's `environment` saw (issue 21).
	Environment  string
	Started      time.Time
	LastActivity time.Time // updated by ContinueRun and by every record appended to the run
	Status       RunStatus
}

// RunFilter selects runs for ListRuns. Empty fields match everything; Limit <= 0 means no limit.
type RunFilter struct {
	Actor   string
	Gateway string
	Status  RunStatus
	Limit   int
}

// Kind is the kind of a ledger record.
type Kind string

const (
	KindIntent       Kind = "intent"        // written before forwarding; Step == Seq
	KindOutcome      Kind = "outcome"       // completes the step Step
	KindReloaded     Kind = "reloaded"      // a configuration change was loaded
	KindReloadFailed Kind = "reload_failed" // a configuration failed to load; Note holds the reason
	KindNote         Kind = "note"          // free text
	// KindApproval is a decision record of an approval request (AppendApproval, and the
	// consumption written by RecordIntent): see ApprovalRecord. Source: issue 16.
	KindApproval Kind = "approval"
	// KindRead is a relayed read that is not a tool call (issue 19): resources/read or
	// prompts/get. Tool is the resource URI or the exposed prompt name, Reason the method,
	// ArgsDigest the digest of the prompt's arguments, Decision allow or block, Note the
	// upstream's error when it failed. No Status: only tool calls have outcomes, so that no
	// read can count as a step (a manifest's requires, the outcome counts).
	KindRead Kind = "read"
	// KindServerRequest is a request an upstream sent the agent through the gateway (issue
	// 19): sampling/createMessage, elicitation/create or roots/list. Reason is the method,
	// Tool the upstream, Step the step of the tool call it came during (0 when none),
	// ArgsDigest the digest of its params, Note what happened (answered, or why not).
	KindServerRequest Kind = "server_request"
)

// eventKinds are the kinds AppendEvent writes.
var eventKinds = []Kind{KindReloaded, KindReloadFailed, KindNote, KindRead, KindServerRequest}

// checkEvent refuses an event AppendEvent does not write (ErrInvalid).
func checkEvent(e Event) error {
	if !slices.Contains(eventKinds, e.Kind) {
		return fmt.Errorf("%w: event kind %q", ErrInvalid, e.Kind)
	}
	return nil
}

// record is the ledger record of e.
func (e Event) record() Record {
	return Record{Run: e.Run, Kind: e.Kind, Step: e.Step, Tool: e.Tool, ArgsDigest: e.ArgsDigest, Reason: e.Reason,
		Decision: e.Decision, Note: e.Note, ManifestVersion: e.ManifestVersion, ManifestChecksum: e.ManifestChecksum}
}

// Status is the outcome of a step.
type Status string

const (
	Succeeded  Status = "succeeded"   // the upstream answered without isError
	Failed     Status = "failed"      // the upstream answered isError
	Uncertain  Status = "uncertain"   // transport error, timeout, or no outcome before a crash
	Blocked    Status = "blocked"     // the gateway refused the call (enforce)
	WouldBlock Status = "would_block" // a rule was broken in advise/observe; the call ran
)

// Statuses lists every Status.
var Statuses = []Status{Succeeded, Failed, Uncertain, Blocked, WouldBlock}

func validStatus(s Status) bool {
	for _, v := range Statuses {
		if v == s {
			return true
		}
	}
	return false
}

// Intent is what the gateway journals before it forwards a call. The arguments themselves are
// never stored: ArgsDigest is their digest (e.g. "sha256:<hex>" of the canonical JSON).
type Intent struct {
	Run            string // required; GatewayJournal is not accepted
	Tool           string // required
	ArgsDigest     string
	Reason         string // _meta["reversi/reason"] or "MCP tools/call <tool>"
	IdempotencyKey string // manifest.DuplicateKey's result, "" when none
	// HoldsKey: this call claimed IdempotencyKey (ClaimKey with step 0), so the intent's step
	// becomes the key's holder step, in the same write.
	HoldsKey         bool
	ManifestVersion  string
	ManifestChecksum string
	Mode             string // enforce | advise | observe
	Decision         string // the engine's decision, e.g. "allow", "block", "would_block"
	// Approval is the id of the approved request this call is the one retry of, "" when
	// none. RecordIntent consumes it in the same transaction as the intent (issue 16:
	// "Consumption is durable and private"): the request must be of Run, Tool and ArgsDigest
	// (ErrMismatch), approved when the store decides it (ErrNotApproved; a request kept in
	// Kubernetes, UID set, has its phase checked by gateway/kube before), and not consumed yet
	// (ErrConsumed: of concurrent intents naming one approval exactly one is written, also
	// across replicas sharing Postgres). The intent record carries the id, and a KindApproval
	// record with event "consumed" follows it in the same transaction.
	Approval string
}

// StepOutcome completes a step.
type StepOutcome struct {
	Status Status // required, one of Statuses
	Note   string // e.g. "result does not match the tool's output schema: ..."
	// CompensationTool and Handle come from manifest.PlanStep (Step.Tool, Step.Handle): only
	// the values the manifest's argument_map names, never the whole arguments or result.
	// Handle must be JSON-encodable.
	CompensationTool string
	Handle           map[string]any
}

// Event is a record that is not part of a step: KindReloaded, KindReloadFailed, KindNote,
// KindRead or KindServerRequest (the fields each kind uses are said at the kind).
type Event struct {
	Run              string // GatewayJournal for gateway-level records
	Kind             Kind
	Note             string
	ManifestVersion  string // for reloaded: the revision now served
	ManifestChecksum string
	// Read and server_request records (issue 19).
	Step       int64
	Tool       string
	Reason     string
	ArgsDigest string
	Decision   string
	// Alert, when set, is the alert this record announces (a refused reload, the kill switch
	// turned on or off, an upstream gone down): AppendEvent writes its notifications for the
	// receivers whose filters admit it in the record's transaction (none when no receiver
	// wants it), and sets its At, Seq (the record's), namespace and idempotency key
	// ("<type>:<object>:<seq>"). Its Type must be an alert type (ErrInvalid). Source: issue 24.
	Alert *Notice
}

// Record is one ledger entry. Seq numbers the records of one run from 1 without gaps. Fields
// that do not apply to a Kind are empty. An outcome record repeats its intent's Tool.
type Record struct {
	Run  string
	Seq  int64
	Kind Kind
	Time time.Time
	Step int64 // intent: its own Seq; outcome: the intent's Seq; otherwise 0

	Tool             string
	ArgsDigest       string
	Reason           string
	IdempotencyKey   string
	ManifestVersion  string
	ManifestChecksum string
	Mode             string
	Decision         string

	Status           Status
	CompensationTool string
	Handle           map[string]any
	Note             string

	// Approval is the request id: on an intent, the approval it consumed; on a KindApproval
	// record, the request the decision is about. Event, Approver, Groups are set on
	// KindApproval records only (see ApprovalRecord); their Decision is Approve or Deny, Reason
	// the approver's reason and IdempotencyKey the record's Once key.
	Approval string
	Event    ApprovalEvent
	Approver string
	Groups   []string
}

// KeyHolder says which step holds a duplicate-call key. Step is 0 when the key was claimed
// before the step's intent was written.
type KeyHolder struct {
	Key     string
	Run     string
	Step    int64
	Claimed time.Time
}

// RecoveryNote is the Note of the uncertain outcomes written by Recover.
const RecoveryNote = "no outcome was journaled before the gateway stopped: the upstream may have acted"

// Store is the gateway's durable state. All methods are safe for concurrent use. Methods that
// write return only after the write is committed (QueueOutcome: see there). Intents, rollback entries, runs, claimed keys,
// approvals and high-water marks are durable when the method returns (for SQLite: in the WAL,
// fsynced). Records
// of what already happened (RecordOutcome, AppendEvent, SetRunStatus, ReleaseKey) survive a
// crash of the gateway when the method returns and reach the disk with the next durable write
// or within a bound (SQLite: 500 ms; PostgreSQL: its WAL writer's delay); a power loss in
// between can lose them, and Recover then completes the step as uncertain.
type Store interface {
	// CreateRun opens a run. An empty ID is replaced by a random "run-<hex>" id; Started and
	// LastActivity are set to now, Status to RunActive. Errors: ErrInvalid (empty Actor),
	// ErrExists.
	CreateRun(ctx context.Context, r Run) (Run, error)
	// GetRun returns one run, ErrNotFound if there is none.
	GetRun(ctx context.Context, id string) (Run, error)
	// ListRuns returns runs, newest Started first.
	ListRuns(ctx context.Context, f RunFilter) ([]Run, error)
	// ContinueRun re-attaches a session to run id: LastActivity becomes now and Status
	// RunActive. Errors: ErrNotFound, ErrNotOwner when actor is not the run's Actor.
	ContinueRun(ctx context.Context, id, actor string) (Run, error)
	// SetRunStatus changes a run's Status. Errors: ErrNotFound, ErrInvalid.
	SetRunStatus(ctx context.Context, id string, status RunStatus) error

	// RecordIntent appends an intent record and returns its Seq, which is the step number.
	// It returns only once the record is durable. Errors: ErrInvalid, ErrNotFound (no run).
	RecordIntent(ctx context.Context, in Intent) (step int64, err error)
	// RecordOutcome appends the outcome of step and returns the outcome record's Seq.
	// Errors: ErrInvalid (unknown status or a Handle that is not JSON), ErrNotFound (no such
	// intent in the run), ErrCompleted (the step already has an outcome).
	RecordOutcome(ctx context.Context, run string, step int64, o StepOutcome) (seq int64, err error)
	// QueueOutcome is RecordOutcome without waiting for the commit (the gateway's call path):
	// the outcome joins the store's next write, typically the session's next intent (SQLite:
	// its batch's transaction; Postgres: its pgx batch), or is committed by itself within 5 ms
	// (the memory store commits it before QueueOutcome returns). Reads and other writes of this
	// store wait for it; other processes (replicas) see it once committed, and a crash of the
	// process before then loses it (Recover completes the step as uncertain). done, if not
	// nil, gets RecordOutcome's answer; it may run on another goroutine (another session's
	// write), before or after QueueOutcome returns, and must neither call the store nor block.
	QueueOutcome(ctx context.Context, run string, step int64, o StepOutcome, done func(seq int64, err error))
	// AppendEvent appends a reloaded, reload_failed, note, read or server_request record and
	// returns its Seq; with e.Alert, the alert's notifications in the same transaction.
	// Errors: ErrInvalid (other kinds, an Alert that is not an alert), ErrNotFound (no run).
	AppendEvent(ctx context.Context, e Event) (seq int64, err error)
	// AppendRollback appends a KindRollback record for step Step of a run and returns its Seq.
	// A record whose status is verification_failed or unrecoverable is announced in its
	// transaction as alert.rollback_failed (issue 24).
	// Errors: ErrInvalid (no run or step, a status not in RollbackStatuses, arguments that are
	// not JSON), ErrNotFound (no run, or Step is not an intent of the run).
	AppendRollback(ctx context.Context, e RollbackEntry) (seq int64, err error)
	// AppendApproval appends a KindApproval decision record (see ApprovalRecord) and returns
	// its Seq. A record whose Once key is already in the run is not written again: ErrExists
	// (the check and the write are one atomic step, also across replicas on Postgres).
	// Errors: ErrInvalid (no request, an unknown event), ErrNotFound (no run), ErrExists.
	AppendApproval(ctx context.Context, r ApprovalRecord) (seq int64, err error)
	// Records returns a run's records with Seq > after, in Seq order, at most limit
	// (limit <= 0: all).
	Records(ctx context.Context, run string, after int64, limit int) ([]Record, error)
	// PendingSteps returns the run's intent records that have no outcome, in Seq order.
	PendingSteps(ctx context.Context, run string) ([]Record, error)
	// Recover completes every intent without an outcome that was written by a process that is
	// gone (for SQLite: an instance whose lock is free; for Memory: every one), in every run, as
	// Uncertain with RecoveryNote, and returns the outcome records it wrote. The gateway calls
	// it on start; the in-flight calls of another live gateway on the same data are left alone.
	Recover(ctx context.Context) ([]Record, error)

	// ClaimKey claims a duplicate-call key for (run, step). ok is true when this call took the
	// key; otherwise holder is the current holder. The claim is atomic (a unique constraint,
	// not a read then a write): of concurrent claims of one key exactly one wins.
	ClaimKey(ctx context.Context, key, run string, step int64) (ok bool, holder KeyHolder, err error)
	// ReleaseKey frees a key (the first call failed or was undone). Releasing a key that is
	// not held is not an error.
	ReleaseKey(ctx context.Context, key string) error

	// CountCalls returns how many calls AddCall recorded under key at or after since (the zero
	// time: ever): the counters of policy limit rules (issue 21, pkg/policy.Counter).
	CountCalls(ctx context.Context, key LimitKey, since time.Time) (int, error)
	// AddCall records one call under key at time at.
	AddCall(ctx context.Context, key LimitKey, at time.Time) error

	// CreateApproval queues a request. An empty ID is replaced by "apr-<hex>"; Created is set
	// to now; Quorum < 1 becomes 1. Errors: ErrInvalid (no Tool, Run or Actor; Expires not
	// after Created; OnTimeout not "", "deny" or "escalate"), ErrExists.
	CreateApproval(ctx context.Context, req ApprovalRequest) (Approval, error)
	// GetApproval returns a request with its state as of now (expiry applied). ErrNotFound.
	GetApproval(ctx context.Context, id string) (Approval, error)
	// ListApprovals returns requests, oldest first, with expiry applied.
	ListApprovals(ctx context.Context, f ApprovalFilter) ([]Approval, error)
	// Decide records one principal's decision and returns the request's new state. See
	// Approval for the rules. The decision is also a KindApproval record of the request's run
	// (event counted, or rejected when the rules refuse it, then approved, denied, expired or
	// escalated when the phase changes), in the same transaction. A request kept in
	// Kubernetes (UID set) is decided there: ErrNotAllowed. Errors: ErrNotFound,
	// ErrNotPending, ErrNotAllowed, ErrInvalid.
	Decide(ctx context.Context, id string, d Decision) (Approval, error)

	// SearchRuns returns the runs f selects, newest Started first (see RunSearch).
	SearchRuns(ctx context.Context, f RunSearch) ([]Run, error)
	// SearchRecords returns the ledger records f selects, newest Time first (then by run, and
	// Seq descending).
	SearchRecords(ctx context.Context, f RecordSearch) ([]Record, error)
	// CountOutcomes returns, for each of runs that exists, how many of its steps ended in each
	// Status. Unknown ids (and GatewayJournal) are left out of the map.
	CountOutcomes(ctx context.Context, runs []string) (map[string]OutcomeCounts, error)
	// HeldKey reports who holds a duplicate-call key, without claiming it (ok false: free).
	HeldKey(ctx context.Context, key string) (holder KeyHolder, ok bool, err error)

	// AdvanceHighWater checks every mark against the stored one of its source and, only when
	// none is older, stores them all in one transaction (Updated set to now). Older: a lower
	// Sequence, or the same Sequence with another Digest (two different snapshots cannot share
	// a sequence). A mark equal to the stored one (same Sequence and Digest) is not a change:
	// the stored mark, its Revision and Updated stay. The check and the write are one atomic
	// step (for Postgres: across replicas), so of concurrent calls a lower sequence never
	// overwrites a higher one. Errors: a *DowngradeError (errors.Is(err, ErrDowngrade)) naming
	// every refused source, and then nothing of the batch is stored; ErrInvalid for an empty
	// Source, a negative Sequence or two marks of one Source; ErrClosed.
	AdvanceHighWater(ctx context.Context, marks []HighWater) error
	// HighWaters returns every stored mark, sorted by Source.
	HighWaters(ctx context.Context) ([]HighWater, error)

	// Close releases the store. Later calls return ErrClosed.
	Close() error
}

// Clock returns the current time; tests replace it.
type Clock func() time.Time

func newID(prefix string) string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return prefix + hex.EncodeToString(b[:])
}
