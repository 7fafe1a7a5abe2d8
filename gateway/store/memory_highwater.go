package store

import (
	"cmp"
	"context"
	"slices"
)

// AdvanceHighWater implements Store. The check and the write happen under the store's lock.
func (m *Memory) AdvanceHighWater(_ context.Context, marks []HighWater) error {
	marks, err := prepareMarks(marks)
	if err != nil {
		return err
	}
	if err := m.lock(); err != nil {
		return err
	}
	defer m.mu.Unlock()
	var refused []Downgrade
	for _, h := range marks {
		if s, ok := m.marks[h.Source]; ok && h.olderThan(s) {
			refused = append(refused, Downgrade{Offered: h, Stored: s})
		}
	}
	if refused != nil {
		return &DowngradeError{Refused: refused}
	}
	now := m.now().UTC()
	for _, h := range marks {
		if s, ok := m.marks[h.Source]; ok && h.Sequence == s.Sequence {
			continue // equal: not a change
		}
		h.Updated = now
		m.marks[h.Source] = h
	}
	return nil
}

// HighWaters implements Store.
func (m *Memory) HighWaters(context.Context) ([]HighWater, error) {
	if err := m.lock(); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var out []HighWater
	for _, h := range m.marks {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b HighWater) int { return cmp.Compare(a.Source, b.Source) })
	return out, nil
}
