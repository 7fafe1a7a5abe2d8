package store

import (
	"context"
	"testing"
	"time"
)

// The counters of policy limit rules: counted per key and from a time on, kept across a
// restart.
func TestLimitCalls(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		k := LimitKey{Rule: "deletions/at-most-5", Scope: "run", Subject: "run-1"}
		other := LimitKey{Rule: "deletions/at-most-5", Scope: "run", Subject: "run-2"}
		t0 := clock.Now()
		for i := range 3 {
			if err := s.AddCall(ctx, k, t0.Add(time.Duration(i)*time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddCall(ctx, other, t0); err != nil {
			t.Fatal(err)
		}
		s = restart(t, s)
		for _, c := range []struct {
			key   LimitKey
			since time.Time
			want  int
		}{{k, time.Time{}, 3}, {k, t0.Add(time.Minute), 2}, {k, t0.Add(time.Hour), 0}, {other, time.Time{}, 1},
			{LimitKey{Rule: "deletions/at-most-5", Scope: "actor", Subject: "run-1"}, time.Time{}, 0}} {
			n, err := s.CountCalls(ctx, c.key, c.since)
			if err != nil || n != c.want {
				t.Fatalf("CountCalls(%+v, %v) = %d, %v; want %d", c.key, c.since, n, err, c.want)
			}
		}
	})
}

// A run keeps the environment it was opened in, across a restart.
func TestRunEnvironment(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		r, err := s.CreateRun(ctx, Run{Actor: "a", Gateway: "gw", Environment: "prod"})
		if err != nil {
			t.Fatal(err)
		}
		s = restart(t, s)
		got, err := s.GetRun(ctx, r.ID)
		if err != nil || got.Environment != "prod" {
			t.Fatalf("GetRun: %+v %v", got, err)
		}
		runs, err := s.ListRuns(ctx, RunFilter{})
		if err != nil || len(runs) != 1 || runs[0].Environment != "prod" {
			t.Fatalf("ListRuns: %+v %v", runs, err)
		}
	})
}
