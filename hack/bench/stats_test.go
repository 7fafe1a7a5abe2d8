package main

import (
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- { // unsorted input, 1..100 ms
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	r := newResult([][]time.Duration{s[:40], s[40:]}, 2*time.Second)
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 99: 99 * time.Millisecond,
		100: 100 * time.Millisecond, 0.5: time.Millisecond} {
		if got := r.percentile(p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if r.calls != 100 || r.perSecond() != 50 {
		t.Errorf("calls %d, %v/s; want 100, 50/s", r.calls, r.perSecond())
	}
}

func TestStatOf(t *testing.T) {
	for _, c := range []struct {
		in       []float64
		min, med float64
	}{{[]float64{3, 1, 2}, 1, 2}, {[]float64{4, 1, 3, 2}, 1, 2.5}, {[]float64{7}, 7, 7}, {nil, 0, 0}} {
		if s := statOf(c.in); s.min != c.min || s.med != c.med {
			t.Errorf("statOf(%v) = %+v, want min %v median %v", c.in, s, c.min, c.med)
		}
	}
}
