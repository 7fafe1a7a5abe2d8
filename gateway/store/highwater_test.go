package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	srcMemory = "ManifestRegistry agents/memory"
	srcFiles  = "ManifestRegistry agents/files"
	srcTools  = "ToolManifests agents/gw"
)

func hw(source string, seq int64, revision, digest string) HighWater {
	return HighWater{Source: source, Sequence: seq, Revision: revision, Digest: digest}
}

// wantMarks checks the stored marks (Updated aside) against want, in order.
func wantMarks(t *testing.T, s Store, want ...HighWater) []HighWater {
	t.Helper()
	got, err := s.HighWaters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("marks %+v, want %+v", got, want)
	}
	for i := range got {
		g := got[i]
		if g.Updated.IsZero() {
			t.Fatalf("mark %+v has no Updated time", g)
		}
		g.Updated = time.Time{}
		if g != want[i] {
			t.Fatalf("mark %d is %+v, want %+v", i, got[i], want[i])
		}
	}
	return got
}

// wantDowngrade checks that err is a *DowngradeError refusing exactly the offered marks (in
// Source order) and returns it.
func wantDowngrade(t *testing.T, err error, offered ...HighWater) *DowngradeError {
	t.Helper()
	wantErr(t, err, ErrDowngrade)
	var de *DowngradeError
	if !errors.As(err, &de) {
		t.Fatalf("error %T %v, want a *DowngradeError", err, err)
	}
	if len(de.Refused) != len(offered) {
		t.Fatalf("refused %+v, want the offered marks %+v", de.Refused, offered)
	}
	for i, d := range de.Refused {
		if d.Offered != offered[i] {
			t.Fatalf("refusal %d offered %+v, want %+v", i, d.Offered, offered[i])
		}
	}
	return de
}

// TestHighWaterAdvance: marks are stored and read back sorted by source; a higher sequence
// advances a mark; an equal mark (also with another revision) changes nothing, not even
// Updated. Source: issue 15 ("No going back").
func TestHighWaterAdvance(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		wantMarks(t, s)
		if err := s.AdvanceHighWater(ctx, nil); err != nil {
			t.Fatalf("empty batch: %v", err)
		}
		m7 := hw(srcMemory, 7, "main@sha1:aaaa", "sha256:m7")
		f3 := hw(srcFiles, 3, "main@sha1:bbbb", "sha256:f3")
		t0 := hw(srcTools, 0, "", "sha256:t0") // sequence 0 is a sequence
		if err := s.AdvanceHighWater(ctx, []HighWater{m7, f3, t0}); err != nil {
			t.Fatal(err)
		}
		first := wantMarks(t, s, f3, m7, t0)
		if !first[0].Updated.Equal(first[1].Updated) || !first[1].Updated.Equal(first[2].Updated) {
			t.Fatalf("one batch, several Updated times: %+v", first)
		}

		clock.Advance(time.Minute)
		other := m7
		other.Revision = "main@sha1:cccc" // a commit that left the signed set as it was
		for _, batch := range [][]HighWater{{m7}, {other, f3}, {f3, t0}} {
			if err := s.AdvanceHighWater(ctx, batch); err != nil {
				t.Fatalf("equal marks %+v: %v", batch, err)
			}
		}
		if again := wantMarks(t, s, f3, m7, t0); !again[1].Updated.Equal(first[1].Updated) {
			t.Fatalf("an equal mark changed Updated: %v, was %v", again[1].Updated, first[1].Updated)
		}

		m8 := hw(srcMemory, 8, "main@sha1:dddd", "sha256:m8")
		if err := s.AdvanceHighWater(ctx, []HighWater{f3, m8}); err != nil {
			t.Fatal(err)
		}
		got := wantMarks(t, s, f3, m8, t0)
		if !got[1].Updated.After(first[1].Updated) || !got[0].Updated.Equal(first[0].Updated) {
			t.Fatalf("Updated after advancing only %s: %+v (before %+v)", srcMemory, got, first)
		}
	})
}

// TestHighWaterDowngrade: a batch with a lower sequence is refused as a whole (its newer and
// new marks are not stored either), naming every refused source with both sequences.
func TestHighWaterDowngrade(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		m7 := hw(srcMemory, 7, "main@sha1:aaaa", "sha256:m7")
		f3 := hw(srcFiles, 3, "main@sha1:bbbb", "sha256:f3")
		if err := s.AdvanceHighWater(ctx, []HighWater{m7, f3}); err != nil {
			t.Fatal(err)
		}

		m5 := hw(srcMemory, 5, "main@sha1:0000", "sha256:m5")
		f4 := hw(srcFiles, 4, "main@sha1:eeee", "sha256:f4")
		t1 := hw(srcTools, 1, "", "sha256:t1")
		de := wantDowngrade(t, s.AdvanceHighWater(ctx, []HighWater{t1, m5, f4}), m5)
		if st := de.Refused[0].Stored; st.Sequence != 7 || st.Revision != m7.Revision || st.Digest != m7.Digest {
			t.Fatalf("refusal names the stored mark %+v, want %+v", st, m7)
		}
		want := "snapshot of ManifestRegistry agents/memory has sequence 5 (digest sha256:m5), older than 7 " +
			"(revision main@sha1:aaaa, digest sha256:m7) which this gateway already served: an older state " +
			"was put back (a replayed rendering, or an older registry folder); serve the newer one again, or publish the older rules as a new version (reversi manifests rollback)"
		if de.Error() != want {
			t.Fatalf("message\n%s\nwant\n%s", de.Error(), want)
		}
		wantMarks(t, s, f3, m7)

		// Two refused sources: both named, in source order.
		f2 := hw(srcFiles, 2, "main@sha1:1111", "sha256:f2")
		m6 := hw(srcMemory, 6, "main@sha1:2222", "sha256:m6")
		de = wantDowngrade(t, s.AdvanceHighWater(ctx, []HighWater{m6, t1, f2}), f2, m6)
		for _, part := range []string{"agents/files has sequence 2", "older than 3", "main@sha1:bbbb",
			"agents/memory has sequence 6", "older than 7", "main@sha1:aaaa"} {
			if !strings.Contains(de.Error(), part) {
				t.Errorf("message %q does not say %q", de.Error(), part)
			}
		}
		wantMarks(t, s, f3, m7)
	})
}

// TestHighWaterSameSequence: the same sequence with another digest is refused (two different
// snapshots cannot share a sequence), and the batch's other marks are not stored.
func TestHighWaterSameSequence(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		m7 := hw(srcMemory, 7, "main@sha1:aaaa", "sha256:m7")
		if err := s.AdvanceHighWater(ctx, []HighWater{m7}); err != nil {
			t.Fatal(err)
		}
		forged := hw(srcMemory, 7, "main@sha1:aaaa", "sha256:forged")
		f1 := hw(srcFiles, 1, "main@sha1:bbbb", "sha256:f1")
		de := wantDowngrade(t, s.AdvanceHighWater(ctx, []HighWater{forged, f1}), forged)
		if st := de.Refused[0].Stored; st.Digest != m7.Digest || st.Sequence != 7 {
			t.Fatalf("refusal names the stored mark %+v, want %+v", st, m7)
		}
		for _, part := range []string{`digest "sha256:forged"`, "already served sequence 7", "sha256:m7", "cannot share a sequence"} {
			if !strings.Contains(de.Error(), part) {
				t.Errorf("message %q does not say %q", de.Error(), part)
			}
		}
		wantMarks(t, s, m7)
	})
}

// TestHighWaterInvalid: an empty source, a negative sequence or two marks of one source make
// the batch invalid; nothing of it is stored.
func TestHighWaterInvalid(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		ok := hw(srcFiles, 1, "main@sha1:bbbb", "sha256:f1")
		for _, bad := range []HighWater{
			hw("", 1, "main@sha1:aaaa", "sha256:x"),
			hw(srcMemory, -1, "main@sha1:aaaa", "sha256:x"),
			hw(srcFiles, 2, "main@sha1:cccc", "sha256:f2"),
		} {
			wantErr(t, s.AdvanceHighWater(ctx, []HighWater{ok, bad}), ErrInvalid)
		}
		wantMarks(t, s)
	})
}

// TestHighWaterRestart: the marks survive the gateway stopping and starting again (SQLite:
// the file closed and opened; Postgres: a new instance on the schema), and a downgrade is
// still refused afterwards.
func TestHighWaterRestart(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		m7 := hw(srcMemory, 7, "main@sha1:aaaa", "sha256:m7")
		if err := s.AdvanceHighWater(ctx, []HighWater{m7}); err != nil {
			t.Fatal(err)
		}
		s = restart(t, s)
		wantMarks(t, s, m7)
		m6 := hw(srcMemory, 6, "main@sha1:0000", "sha256:m6")
		wantDowngrade(t, s.AdvanceHighWater(ctx, []HighWater{m6}), m6)
		wantMarks(t, s, m7)
	})
}

// TestHighWaterConcurrent: many goroutines advance marks with random sequences at once, first
// one source per batch, then two sources per batch (in either order). No one ever sees a mark
// go down or below a sequence it stored, a refusal always names a higher stored sequence, and
// the marks end at the highest sequence offered.
func TestHighWaterConcurrent(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		raceMarks(t, s)
	})
}

// raceMarks runs the races of TestHighWaterConcurrent with the goroutines spread over stores
// (replicas or processes sharing the same data).
func raceMarks(t *testing.T, stores ...Store) {
	t.Helper()
	// One source: a check and a write that are not atomic lose updates here. Two sources: the
	// rows are locked in one order (no deadlock) and written together.
	advanceConcurrently(t, []string{srcTools}, stores...)
	advanceConcurrently(t, []string{srcMemory, srcFiles}, stores...)
}

// advanceConcurrently races batches of one mark per source, all with one sequence per batch.
func advanceConcurrently(t *testing.T, sources []string, stores ...Store) {
	t.Helper()
	ctx := context.Background()
	const workers, rounds = 16, 20
	var highest atomic.Int64
	highest.Store(-1)
	at := func(src string, seq int64) HighWater {
		return hw(src, seq, fmt.Sprintf("main@sha1:%040d", seq), fmt.Sprintf("sha256:%d", seq))
	}
	// Every round starts all workers at once, with sequences that mostly exceed the previous
	// rounds' (so writers collide) and sometimes fall below them (so refusals race writes).
	var starts [rounds]chan struct{}
	var ends [rounds]sync.WaitGroup
	for r := range rounds {
		starts[r] = make(chan struct{})
		ends[r].Add(workers)
	}
	var wg sync.WaitGroup
	for w := range workers {
		s := stores[w%len(stores)]
		rng := rand.New(rand.NewPCG(15, uint64(w)))
		wg.Go(func() {
			seen := int64(-1) // the lowest sequence this worker may still see
			for r := range rounds {
				<-starts[r]
				seq := int64(r)*100 + rng.Int64N(150)
				for old := highest.Load(); seq > old && !highest.CompareAndSwap(old, seq); old = highest.Load() {
				}
				var batch []HighWater
				for _, src := range sources {
					batch = append(batch, at(src, seq))
				}
				rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] }) // the store orders the locks
				var de *DowngradeError
				switch err := s.AdvanceHighWater(ctx, batch); {
				case err == nil:
					seen = max(seen, seq)
				case errors.As(err, &de):
					for _, d := range de.Refused {
						if d.Stored.Sequence <= seq {
							t.Errorf("sequence %d refused for stored %+v", seq, d.Stored)
						}
					}
				default:
					t.Errorf("advance to %d: %v", seq, err)
				}
				marks, err := s.HighWaters(ctx)
				if err != nil {
					t.Error(err)
				}
				for _, m := range marks {
					if !slices.Contains(sources, m.Source) {
						continue
					}
					if m.Sequence < seen {
						t.Errorf("mark %+v is lower than %d, which was stored or seen before", m, seen)
					}
					if w := at(m.Source, m.Sequence); m.Digest != w.Digest || m.Revision != w.Revision {
						t.Errorf("mark %+v mixes two writes", m)
					}
					seen = max(seen, m.Sequence)
				}
				ends[r].Done()
			}
		})
	}
	for r := range rounds {
		close(starts[r])
		ends[r].Wait()
	}
	wg.Wait()
	top := highest.Load()
	for _, s := range stores {
		marks, err := s.HighWaters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, src := range sources {
			i := slices.IndexFunc(marks, func(m HighWater) bool { return m.Source == src })
			if i < 0 {
				t.Fatalf("no mark of %s", src)
			}
			if m, want := marks[i], at(src, top); m.Sequence != want.Sequence || m.Digest != want.Digest || m.Revision != want.Revision {
				t.Fatalf("mark %+v at the end, want the highest offered %+v", m, want)
			}
		}
	}
}

// TestSQLiteHighWaterSharedFile: two stores on one SQLite file (two processes of one data
// folder) race as in TestHighWaterConcurrent, and each sees the other's marks.
func TestSQLiteHighWaterSharedFile(t *testing.T) {
	dir := t.TempDir()
	var stores []Store
	for range 2 {
		s, err := OpenSQLite(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	raceMarks(t, stores...)
}
