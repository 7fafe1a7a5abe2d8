package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ErrDowngrade: AdvanceHighWater was given a snapshot older than one the gateway already
// served. The error is a *DowngradeError.
var ErrDowngrade = errors.New("store: older than a snapshot this gateway already served")

// HighWater is the newest snapshot of one manifest source a gateway has served (TUF: the
// snapshot version a client trusts). Source names the source, e.g. "ManifestRegistry
// agents/memory"; Sequence only grows; Revision and Digest are what that snapshot said (signed
// data). Updated is when the store last changed the mark. Source: issue 15 ("No going back":
// a high-water mark per registry in the gateway's store, also after a restart).
type HighWater struct {
	Source   string
	Sequence int64
	Revision string
	Digest   string
	Updated  time.Time
}

// olderThan reports whether mark h is older than the stored mark s of the same source: a
// lower Sequence, or the same Sequence with another Digest (two different snapshots cannot
// share a sequence). The Revision is not compared: a Registry index that two commits left
// unchanged has one sequence and one digest.
func (h HighWater) olderThan(s HighWater) bool {
	return h.Sequence < s.Sequence || (h.Sequence == s.Sequence && h.Digest != s.Digest)
}

// Downgrade is one refused mark: Offered is older than Stored, the mark the store holds.
type Downgrade struct {
	Offered, Stored HighWater
}

func (d Downgrade) String() string {
	stored := describeMark(d.Stored)
	if d.Offered.Sequence < d.Stored.Sequence {
		return fmt.Sprintf("snapshot of %s has sequence %d%s, older than %d%s which this gateway already served: "+
			"an older state was put back (a replayed rendering, or an older registry folder); serve the newer one again, or publish the older rules as a new version (reversi manifests rollback)",
			d.Offered.Source, d.Offered.Sequence, describeMark(HighWater{Digest: d.Offered.Digest}), d.Stored.Sequence, stored)
	}
	return fmt.Sprintf("snapshot of %s has sequence %d with digest %q, but this gateway already served sequence %d%s: "+
		"two different states cannot share a sequence (one was changed after it was signed, or another source took its place)",
		d.Offered.Source, d.Offered.Sequence, d.Offered.Digest, d.Stored.Sequence, stored)
}

// describeMark is " (revision R, digest D)" with the empty parts left out.
func describeMark(h HighWater) string {
	var parts []string
	if h.Revision != "" {
		parts = append(parts, "revision "+h.Revision)
	}
	if h.Digest != "" {
		parts = append(parts, "digest "+h.Digest)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// DowngradeError is AdvanceHighWater's refusal: every mark of the batch that is older than the
// stored one, sorted by Source. errors.Is(err, ErrDowngrade) holds.
type DowngradeError struct {
	Refused []Downgrade
}

func (e *DowngradeError) Error() string {
	msgs := make([]string, len(e.Refused))
	for i, d := range e.Refused {
		msgs[i] = d.String()
	}
	return strings.Join(msgs, "; ")
}

// Unwrap makes errors.Is(err, ErrDowngrade) hold.
func (e *DowngradeError) Unwrap() error { return ErrDowngrade }

// prepareMarks checks a batch for AdvanceHighWater and returns a copy sorted by Source (the
// order rows are locked in, so concurrent batches cannot deadlock). Errors: ErrInvalid for an
// empty Source, a negative Sequence or two marks of one Source.
func prepareMarks(marks []HighWater) ([]HighWater, error) {
	out := slices.Clone(marks)
	slices.SortFunc(out, func(a, b HighWater) int { return cmp.Compare(a.Source, b.Source) })
	for i, h := range out {
		switch {
		case h.Source == "":
			return nil, fmt.Errorf("%w: a high-water mark needs a source", ErrInvalid)
		case h.Sequence < 0:
			return nil, fmt.Errorf("%w: high-water mark of %s: negative sequence %d", ErrInvalid, h.Source, h.Sequence)
		case i > 0 && out[i-1].Source == h.Source:
			return nil, fmt.Errorf("%w: two high-water marks of %s in one batch", ErrInvalid, h.Source)
		}
	}
	return out, nil
}

// sqlAdvanceHighWater stores a mark only if it is newer than the stored one: the check and the
// write are one statement. When it changes no row, the stored mark is equal or newer; in
// Postgres the conflicting row is then locked all the same, so the read that follows in the
// same transaction sees a row no replica can change before the transaction ends.
const sqlAdvanceHighWater = `INSERT INTO high_water (source, sequence, revision, digest, updated) VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT (source) DO UPDATE SET sequence = excluded.sequence, revision = excluded.revision,
		digest = excluded.digest, updated = excluded.updated
	WHERE excluded.sequence > high_water.sequence`

// AdvanceHighWater implements Store. The batch is one durable write: in SQLite the writer
// holds the file's write lock from the first statement, in Postgres the rows are locked in
// Source order (prepareMarks), so concurrent batches cannot deadlock. Each mark is upserted
// conditionally; when that changes no row, the stored mark tells an equal mark from an older
// one. A refusal rolls the write back: nothing of the batch is stored.
func (s *sqlStore) AdvanceHighWater(ctx context.Context, marks []HighWater) error {
	marks, err := prepareMarks(marks)
	if err != nil {
		return err
	}
	if err := s.check(); err != nil {
		return err
	}
	if len(marks) == 0 {
		return nil
	}
	return s.write(ctx, durable, func(ctx context.Context, tx querier) error {
		now := tn(s.stamp())
		var refused []Downgrade
		for _, h := range marks {
			n, err := tx.exec(ctx, sqlAdvanceHighWater, h.Source, h.Sequence, h.Revision, h.Digest, now)
			if err != nil {
				return fmt.Errorf("store: advance high-water mark of %s: %w", h.Source, err)
			}
			if n == 1 {
				continue
			}
			stored, err := scanHighWater(queryRow(ctx, tx, `SELECT `+highWaterCols+` FROM high_water WHERE source = $1`, h.Source))
			if err != nil {
				return fmt.Errorf("store: read high-water mark of %s: %w", h.Source, err)
			}
			if h.olderThan(stored) {
				refused = append(refused, Downgrade{Offered: h, Stored: stored})
			}
		}
		if refused != nil {
			return &DowngradeError{Refused: refused}
		}
		return nil
	})
}

const highWaterCols = `source, sequence, revision, digest, updated`

func scanHighWater(sc interface{ Scan(...any) error }) (HighWater, error) {
	var h HighWater
	var updated int64
	if err := sc.Scan(&h.Source, &h.Sequence, &h.Revision, &h.Digest, &updated); err != nil {
		return HighWater{}, err
	}
	h.Updated = nt(updated)
	return h, nil
}

// HighWaters implements Store.
func (s *sqlStore) HighWaters(ctx context.Context) ([]HighWater, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return collect(ctx, s.r, "read high-water marks", `SELECT `+highWaterCols+` FROM high_water ORDER BY source`, nil,
		func(rows rows) (HighWater, error) { return scanHighWater(rows) })
}
