package store

import (
	"context"
	"slices"
)

// SearchRuns implements Store.
func (m *Memory) SearchRuns(_ context.Context, f RunSearch) ([]Run, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var out []Run
	for id, r := range m.runs {
		if id == GatewayJournal || (f.Actor != "" && r.run.Actor != f.Actor) || (f.Status != "" && r.run.Status != f.Status) {
			continue
		}
		if f.recordFilter() && !slices.ContainsFunc(r.records, func(rec Record) bool {
			return matchRecord(&rec, f.Tool, f.Outcome, f.Text)
		}) {
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

// SearchRecords implements Store.
func (m *Memory) SearchRecords(_ context.Context, f RecordSearch) ([]Record, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var out []Record
	for id, r := range m.runs {
		if (f.Actor != "" && (id == GatewayJournal || r.run.Actor != f.Actor)) || (f.Run != "" && id != f.Run) {
			continue
		}
		for i := range r.records {
			if matchRecord(&r.records[i], f.Tool, f.Status, f.Text) {
				out = append(out, copyRecord(r.records[i]))
			}
		}
	}
	slices.SortFunc(out, compareRecordsNewestFirst)
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// compareRecordsNewestFirst orders records newest Time first, then by run, then Seq descending.
func compareRecordsNewestFirst(a, b Record) int {
	if c := b.Time.Compare(a.Time); c != 0 {
		return c
	}
	switch {
	case a.Run < b.Run:
		return -1
	case a.Run > b.Run:
		return 1
	}
	return int(b.Seq - a.Seq)
}

// CountOutcomes implements Store.
func (m *Memory) CountOutcomes(_ context.Context, runs []string) (map[string]OutcomeCounts, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := make(map[string]OutcomeCounts, len(runs))
	for _, id := range runs {
		r, ok := m.runs[id]
		if !ok || id == GatewayJournal {
			continue
		}
		c := OutcomeCounts{}
		for _, rec := range r.records {
			if rec.Kind == KindOutcome {
				c[rec.Status]++
			}
		}
		out[id] = c
	}
	return out, nil
}

// HeldKey implements Store.
func (m *Memory) HeldKey(_ context.Context, key string) (KeyHolder, bool, error) {
	if err := m.lock(); err != nil {
		return KeyHolder{}, false, err
	}
	defer m.mu.Unlock()
	h, ok := m.keys[key]
	return h, ok, nil
}
