package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// fakeRow is a row of path key at n sessions whose repetitions each have calls/s rate, p50
// and p99 (ms) and the proxy CPU µs per call cpu (negative: a direct row).
func fakeRow(key string, n int, rate, p50, p99, cpu float64) *row {
	r := &row{path: &path{key: key, name: key}, sessions: n}
	for range 3 {
		var lat []time.Duration
		for i := range 100 {
			v := p50
			if i >= 98 {
				v = p99
			}
			lat = append(lat, time.Duration(v*float64(time.Millisecond)))
		}
		res := newResult([][]time.Duration{lat}, time.Duration(100/rate*float64(time.Second)))
		s := repetition{res: res, cpu: -1}
		if cpu >= 0 {
			s.cpu, s.procs = time.Duration(cpu*100*float64(time.Microsecond)), 1
		}
		r.samples = append(r.samples, s)
	}
	return r
}

// verdicts renders writeTargets and returns each line's figure (first cell) with its met
// cell.
func verdicts(t *testing.T, rows []*row) map[string]string {
	t.Helper()
	var b bytes.Buffer
	writeTargets(&b, rows)
	out := map[string]string{}
	for _, l := range strings.Split(b.String(), "\n")[2:] {
		cells := strings.Split(strings.Trim(l, "| "), " | ")
		if len(cells) == 6 {
			out[cells[0]] = cells[5]
		}
	}
	return out
}

// TestWriteTargets: each target of issue 20 is judged against its baseline as the issue says
// (a set of rows that holds them all, then one that breaks them all), and a target without its
// rows is "not measured", never met.
func TestWriteTargets(t *testing.T) {
	mk := func(gwCPU, addP50, httpRate, httpP99, pgRate, p99x16 float64) []*row {
		direct := fakeRow("direct", 1, 1000, 1.0, 5, -1)
		rows := []*row{direct,
			fakeRow("floor-journal", 1, 900, 1.2, 5, 100),
			fakeRow("naive", 1, 500, 2, 8, 700),
			fakeRow("mcp-proxy", 1, 300, 3, 9, 2000),
			fakeRow("supergateway", 1, 400, 2.5, 9, 1500),
			fakeRow("gw-stdio", 1, 700, 1.0+addP50, 8, gwCPU),
			fakeRow("gw-http", 1, 600, 1.0+addP50, 9, gwCPU),
			fakeRow("direct1", 64, 2000, 30, 50, -1),
			fakeRow("gw-http", 64, httpRate, 32, httpP99, 900),
			fakeRow("gw-http-pg", 64, pgRate, 35, 70, 900),
			fakeRow("gw-stdio", 16, 500, 20, 8*p99x16, 900),
		}
		for _, r := range rows[1:] {
			if r.path.key != "direct1" {
				r.base = direct
			}
		}
		return rows
	}
	pass := verdicts(t, mk(250, 0.3, 1900, 70, 1600, 2.5))
	fail := verdicts(t, mk(400, 0.5, 1700, 80, 1400, 3.5))
	want := []string{
		"gateway CPU per call, stdio, 1 session, SQLite",
		"gateway CPU per call, stdio, 1 session, SQLite, against the floor",
		"gateway CPU per call, stdio, 1 session, SQLite, against the cheapest proxy",
		"added p50, gw-stdio, 1 session", "added p50, gw-http, 1 session",
		"64 HTTP sessions, SQLite: calls/s", "64 HTTP sessions, SQLite: p99",
		"64 HTTP sessions, PostgreSQL: calls/s",
		"16 stdio gateway processes on one data folder (SQLite): p99",
	}
	for _, fig := range want {
		if pass[fig] != "yes" || fail[fig] != "**no**" {
			t.Errorf("%s: met %q when it holds, %q when it breaks; want yes and **no**", fig, pass[fig], fail[fig])
		}
	}
	if len(pass) != len(want) {
		t.Errorf("%d target lines, want %d: %v", len(pass), len(want), pass)
	}
	none := verdicts(t, []*row{fakeRow("direct", 1, 1000, 1, 5, -1)})
	for fig, met := range none {
		if met != "—" {
			t.Errorf("without the gateway rows %q is %q, want —", fig, met)
		}
	}
	if len(none) == 0 {
		t.Error("without the gateway rows the targets must still be listed (not measured)")
	}
}

// TestWriteSuiteRenders: the suite's section renders from gateway rows alone (the go test
// benchmarks missing), with the targets table first.
func TestWriteSuiteRenders(t *testing.T) {
	rows := []*row{fakeRow("direct", 1, 1000, 1, 5, -1), fakeRow("gw-stdio", 1, 700, 1.3, 8, 250)}
	rows[1].base = rows[0]
	var b bytes.Buffer
	writeSuite(&b, "2 cores", suiteFlags{sizes: "100", sessions: "1", calls: 100, reps: 3}, rows, nil, map[string]benchLines{}, map[string]time.Duration{}, time.Minute)
	s := b.String()
	for _, want := range []string{"### Targets of issue 20", "### Issue 10", "| gw-stdio | 1 | 100 |", "+0.30 / +0.30", "250 / 250"} {
		if !strings.Contains(s, want) {
			t.Errorf("the section lacks %q:\n%s", want, s)
		}
	}
	if i, j := strings.Index(s, "### Targets of issue 20"), strings.Index(s, "### Issue 10"); i > j {
		t.Error("the targets of issue 20 must come first")
	}
}
