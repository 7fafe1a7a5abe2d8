package main

import (
	"math"
	"slices"
	"time"
)

// result is one measured row.
type result struct {
	calls int
	wall  time.Duration
	// sorted holds every call's latency, ascending.
	sorted []time.Duration
}

func newResult(samples [][]time.Duration, wall time.Duration) result {
	var all []time.Duration
	for _, s := range samples {
		all = append(all, s...)
	}
	slices.Sort(all)
	return result{calls: len(all), wall: wall, sorted: all}
}

// perSecond is the completed calls per second of wall time (all sessions together).
func (r result) perSecond() float64 { return float64(r.calls) / r.wall.Seconds() }

// percentile is the nearest-rank percentile p (0 < p <= 100) of the samples: the smallest
// sample with at least p% of the samples at or below it (as HdrHistogram reports, without its
// bucketing).
func (r result) percentile(p float64) time.Duration {
	if len(r.sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(r.sorted))))
	return r.sorted[max(rank, 1)-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
