package store

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Memory is a Store that keeps everything in process memory: nothing survives the process.
// It applies the same rules as the SQLite store. The zero value is not usable: use NewMemory.
type Memory struct {
	mu        sync.Mutex
	now       Clock
	closed    bool
	runs      map[string]*memRun
	keys      map[string]KeyHolder
	approvals map[string]*Approval
	order     []string // approval ids in creation order
	marks     map[string]HighWater
}

type memRun struct {
	run     Run
	records []Record
	outcome map[int64]bool // steps that have an outcome
}

// NewMemory returns an empty in-memory store. A nil clock means time.Now.
func NewMemory(clock Clock) *Memory {
	if clock == nil {
		clock = time.Now
	}
	m := &Memory{now: clock, runs: map[string]*memRun{}, keys: map[string]KeyHolder{}, approvals: map[string]*Approval{},
		marks: map[string]HighWater{}}
	m.runs[GatewayJournal] = &memRun{run: Run{Status: RunActive}, outcome: map[int64]bool{}}
	return m
}

var _ Store = (*Memory)(nil)

func (m *Memory) lock() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// CreateRun implements Store.
func (m *Memory) CreateRun(_ context.Context, r Run) (Run, error) {
	if r.Actor == "" {
		return Run{}, fmt.Errorf("%w: a run needs an actor", ErrInvalid)
	}
	if err := m.lock(); err != nil {
		return Run{}, err
	}
	defer m.mu.Unlock()
	if r.ID == "" {
		r.ID = newID("run-")
	}
	if _, ok := m.runs[r.ID]; ok {
		return Run{}, fmt.Errorf("%w: run %s", ErrExists, r.ID)
	}
	now := m.now().UTC()
	r.Started, r.LastActivity, r.Status = now, now, RunActive
	m.runs[r.ID] = &memRun{run: r, outcome: map[int64]bool{}}
	return r, nil
}

func (m *Memory) getRun(id string) (*memRun, error) {
	r, ok := m.runs[id]
	if !ok || (id == GatewayJournal) {
		return nil, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	return r, nil
}

// GetRun implements Store.
func (m *Memory) GetRun(_ context.Context, id string) (Run, error) {
	if err := m.lock(); err != nil {
		return Run{}, err
	}
	defer m.mu.Unlock()
	r, err := m.getRun(id)
	if err != nil {
		return Run{}, err
	}
	return r.run, nil
}

// ListRuns implements Store.
func (m *Memory) ListRuns(_ context.Context, f RunFilter) ([]Run, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var out []Run
	for id, r := range m.runs {
		if id == GatewayJournal || (f.Actor != "" && r.run.Actor != f.Actor) ||
			(f.Gateway != "" && r.run.Gateway != f.Gateway) || (f.Status != "" && r.run.Status != f.Status) {
			continue
		}
		out = append(out, r.run)
	}
	slices.SortFunc(out, compareRuns)
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// compareRuns orders runs newest Started first, then by id.
func compareRuns(a, b Run) int {
	if c := b.Started.Compare(a.Started); c != 0 {
		return c
	}
	if a.ID < b.ID {
		return -1
	}
	if a.ID > b.ID {
		return 1
	}
	return 0
}

// ContinueRun implements Store.
func (m *Memory) ContinueRun(_ context.Context, id, actor string) (Run, error) {
	if err := m.lock(); err != nil {
		return Run{}, err
	}
	defer m.mu.Unlock()
	r, err := m.getRun(id)
	if err != nil {
		return Run{}, err
	}
	if r.run.Actor != actor {
		return Run{}, fmt.Errorf("%w: run %q; continue a run you opened, or start a new one (no run id)", ErrNotOwner, id)
	}
	r.run.LastActivity, r.run.Status = m.now().UTC(), RunActive
	return r.run, nil
}

// SetRunStatus implements Store.
func (m *Memory) SetRunStatus(_ context.Context, id string, status RunStatus) error {
	if !validRunStatus(status) {
		return fmt.Errorf("%w: run status %q", ErrInvalid, status)
	}
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	r, err := m.getRun(id)
	if err != nil {
		return err
	}
	r.run.Status = status
	return nil
}

func validRunStatus(s RunStatus) bool {
	return s == RunActive || s == RunIdle || s == RunClosed
}

// appendLocked numbers rec in its run and appends it.
func (m *Memory) appendLocked(r *memRun, rec Record) Record {
	rec.Seq = int64(len(r.records)) + 1
	rec.Time = m.now().UTC()
	if rec.Kind == KindIntent {
		rec.Step = rec.Seq
	}
	r.records = append(r.records, rec)
	if rec.Run != GatewayJournal {
		r.run.LastActivity = rec.Time
	}
	return rec
}

// RecordIntent implements Store.
func (m *Memory) RecordIntent(_ context.Context, in Intent) (int64, error) {
	if err := validIntent(in); err != nil {
		return 0, err
	}
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	r, err := m.getRun(in.Run)
	if err != nil {
		return 0, err
	}
	var a *Approval
	if in.Approval != "" {
		var ok bool
		if a, ok = m.approvals[in.Approval]; !ok {
			return 0, fmt.Errorf("%w: approval %s", ErrNotFound, in.Approval)
		}
		if err := a.consume(in.Run, in.Tool, in.ArgsDigest, m.now()); err != nil {
			return 0, err
		}
	}
	rec := m.appendLocked(r, intentRecord(in))
	if h, ok := m.keys[in.IdempotencyKey]; ok && in.HoldsKey && h.Run == in.Run && h.Step == 0 {
		h.Step = rec.Seq
		m.keys[in.IdempotencyKey] = h
	}
	if a != nil {
		c, _, _ := approvalRecord(consumedRecord(a, rec.Seq))
		m.appendLocked(r, c)
	}
	return rec.Seq, nil
}

// intentRecord is the record of in (Seq and Time are set when appended).
func intentRecord(in Intent) Record {
	return Record{Run: in.Run, Kind: KindIntent, Tool: in.Tool, ArgsDigest: in.ArgsDigest,
		Reason: in.Reason, IdempotencyKey: in.IdempotencyKey, ManifestVersion: in.ManifestVersion,
		ManifestChecksum: in.ManifestChecksum, Mode: in.Mode, Decision: in.Decision, Approval: in.Approval}
}

// AppendApproval implements Store.
func (m *Memory) AppendApproval(_ context.Context, ar ApprovalRecord) (int64, error) {
	rec, _, err := approvalRecord(ar)
	if err != nil {
		return 0, err
	}
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	return m.appendApprovalLocked(rec)
}

func (m *Memory) appendApprovalLocked(rec Record) (int64, error) {
	r, ok := m.runs[rec.Run]
	if !ok {
		return 0, fmt.Errorf("%w: run %q", ErrNotFound, rec.Run)
	}
	if rec.IdempotencyKey != "" {
		for _, o := range r.records {
			if o.Kind == KindApproval && o.Approval == rec.Approval && o.IdempotencyKey == rec.IdempotencyKey {
				return 0, fmt.Errorf("%w: the record %s of %s is already in run %q", ErrExists, rec.IdempotencyKey, rec.Approval, rec.Run)
			}
		}
	}
	return m.appendLocked(r, rec).Seq, nil
}

func validIntent(in Intent) error {
	if in.Run == GatewayJournal || in.Tool == "" {
		return fmt.Errorf("%w: an intent needs a run and a tool", ErrInvalid)
	}
	return nil
}

// encodeHandle checks that o is storable and returns the handle as JSON ("" for none).
func encodeHandle(o StepOutcome) (string, error) {
	if !validStatus(o.Status) {
		return "", fmt.Errorf("%w: outcome %q", ErrInvalid, o.Status)
	}
	if o.Handle == nil {
		return "", nil
	}
	b, err := json.Marshal(o.Handle)
	if err != nil {
		return "", fmt.Errorf("%w: the compensation handle is not JSON: %v", ErrInvalid, err)
	}
	return string(b), nil
}

func decodeHandle(s string) (map[string]any, error) {
	if s == "" {
		return nil, nil
	}
	var h map[string]any
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("store: a stored compensation handle is not JSON: %w", err)
	}
	return h, nil
}

// RecordOutcome implements Store.
func (m *Memory) RecordOutcome(_ context.Context, run string, step int64, o StepOutcome) (int64, error) {
	enc, err := encodeHandle(o)
	if err != nil {
		return 0, err
	}
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	r, err := m.getRun(run)
	if err != nil {
		return 0, err
	}
	return m.outcomeLocked(r, step, o, enc)
}

func (m *Memory) outcomeLocked(r *memRun, step int64, o StepOutcome, enc string) (int64, error) {
	if step < 1 || step > int64(len(r.records)) || r.records[step-1].Kind != KindIntent {
		return 0, fmt.Errorf("%w: step %d in run %s", ErrNotFound, step, r.run.ID)
	}
	if r.outcome[step] {
		return 0, fmt.Errorf("%w: step %d in run %s", ErrCompleted, step, r.run.ID)
	}
	h, _ := decodeHandle(enc) // a deep copy, so the caller's map can change afterwards
	rec := m.appendLocked(r, Record{Run: r.run.ID, Kind: KindOutcome, Step: step, Tool: r.records[step-1].Tool,
		Status: o.Status, CompensationTool: o.CompensationTool, Handle: h, Note: o.Note})
	r.outcome[step] = true
	return rec.Seq, nil
}

// AppendEvent implements Store.
func (m *Memory) AppendEvent(_ context.Context, e Event) (int64, error) {
	if err := checkEvent(e); err != nil {
		return 0, err
	}
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	r, ok := m.runs[e.Run]
	if !ok {
		return 0, fmt.Errorf("%w: run %q", ErrNotFound, e.Run)
	}
	rec := m.appendLocked(r, e.record())
	return rec.Seq, nil
}

func copyRecord(rec Record) Record {
	rec.Handle = maps.Clone(rec.Handle)
	rec.Groups = slices.Clone(rec.Groups)
	return rec
}

// Records implements Store.
func (m *Memory) Records(_ context.Context, run string, after int64, limit int) ([]Record, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	r, ok := m.runs[run]
	if !ok {
		return nil, nil
	}
	var out []Record
	for _, rec := range r.records[min(max(after, 0), int64(len(r.records))):] {
		if limit > 0 && len(out) == limit {
			break
		}
		out = append(out, copyRecord(rec))
	}
	return out, nil
}

// PendingSteps implements Store.
func (m *Memory) PendingSteps(_ context.Context, run string) ([]Record, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	r, ok := m.runs[run]
	if !ok {
		return nil, nil
	}
	return pendingLocked(r), nil
}

func pendingLocked(r *memRun) []Record {
	var out []Record
	for _, rec := range r.records {
		if rec.Kind == KindIntent && !r.outcome[rec.Seq] {
			out = append(out, copyRecord(rec))
		}
	}
	return out
}

// Recover implements Store.
func (m *Memory) Recover(context.Context) ([]Record, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	ids := slices.Sorted(maps.Keys(m.runs))
	var out []Record
	for _, id := range ids {
		r := m.runs[id]
		for _, p := range pendingLocked(r) {
			seq, err := m.outcomeLocked(r, p.Seq, StepOutcome{Status: Uncertain, Note: RecoveryNote}, "")
			if err != nil {
				return out, err
			}
			out = append(out, copyRecord(r.records[seq-1]))
		}
	}
	return out, nil
}

// ClaimKey implements Store.
func (m *Memory) ClaimKey(_ context.Context, key, run string, step int64) (bool, KeyHolder, error) {
	if key == "" {
		return false, KeyHolder{}, fmt.Errorf("%w: empty duplicate-call key", ErrInvalid)
	}
	if err := m.lock(); err != nil {
		return false, KeyHolder{}, err
	}
	defer m.mu.Unlock()
	if h, ok := m.keys[key]; ok {
		return false, h, nil
	}
	h := KeyHolder{Key: key, Run: run, Step: step, Claimed: m.now().UTC()}
	m.keys[key] = h
	return true, h, nil
}

// ReleaseKey implements Store.
func (m *Memory) ReleaseKey(_ context.Context, key string) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	delete(m.keys, key)
	return nil
}

// CreateApproval implements Store.
func (m *Memory) CreateApproval(_ context.Context, req ApprovalRequest) (Approval, error) {
	a, err := prepareApproval(req, m.now())
	if err != nil {
		return Approval{}, err
	}
	if err := m.lock(); err != nil {
		return Approval{}, err
	}
	defer m.mu.Unlock()
	if _, ok := m.approvals[a.ID]; ok {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrExists, a.ID)
	}
	m.approvals[a.ID] = &a
	m.order = append(m.order, a.ID)
	return cloneApproval(&a), nil
}

// GetApproval implements Store.
func (m *Memory) GetApproval(_ context.Context, id string) (Approval, error) {
	if err := m.lock(); err != nil {
		return Approval{}, err
	}
	defer m.mu.Unlock()
	a, ok := m.approvals[id]
	if !ok {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrNotFound, id)
	}
	a.settle(m.now())
	return cloneApproval(a), nil
}

// ListApprovals implements Store.
func (m *Memory) ListApprovals(_ context.Context, f ApprovalFilter) ([]Approval, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	now := m.now()
	var out []Approval
	for _, id := range m.order {
		a := m.approvals[id]
		a.settle(now)
		if !f.match(a) {
			continue
		}
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
		out = append(out, cloneApproval(a))
	}
	return out, nil
}

// Decide implements Store.
func (m *Memory) Decide(_ context.Context, id string, d Decision) (Approval, error) {
	if err := m.lock(); err != nil {
		return Approval{}, err
	}
	defer m.mu.Unlock()
	a, ok := m.approvals[id]
	if !ok {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrNotFound, id)
	}
	work := cloneApproval(a)
	recs, err := work.decide(d, m.now())
	if err == nil {
		*a = work
	} else {
		a.settle(m.now())
	}
	for _, r := range recs {
		if rec, _, e := approvalRecord(r); e == nil {
			_, _ = m.appendApprovalLocked(rec) // a run not in this store: nothing to journal it in
		}
	}
	if err != nil {
		return Approval{}, err
	}
	return cloneApproval(a), nil
}

// Close implements Store.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
