package main

import (
	"fmt"
	"io"
	"strings"
)

// findRow returns the row of path key at n sessions, or nil.
func findRow(rows []*row, key string, n int) *row {
	for _, r := range rows {
		if r.path.key == key && r.sessions == n {
			return r
		}
	}
	return nil
}

// proxyKeys are the proxies that users pick or would write (not the floor, not reversi): the
// "cheapest proxy" of issue 20 is the one of them with the least median CPU per call.
var proxyKeys = []string{"naive", "mcp-proxy", "supergateway"}

// writeTargets writes the targets of issue 20 as they stand in rows (one run): each figure
// with its baseline from the same run and whether the target is met. A figure is judged on the
// medians over the repetitions (a ratio is the ratio of the two medians); the min is beside
// it. A target whose rows were not measured is listed as such.
func writeTargets(w io.Writer, rows []*row) {
	fmt.Fprintln(w, "| target | measured (min / median) | baseline, same run (min / median) | median ratio | target | met |")
	fmt.Fprintln(w, "| - | - | - | -: | - | - |")
	line := func(fig, meas, base, ratio, target, met string) {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", fig, meas, base, ratio, target, met)
	}
	missing := func(fig, target string, keys ...string) {
		line(fig, "not measured (rows "+strings.Join(keys, ", ")+")", "—", "—", target, "—")
	}
	cpu := func(r *row) stat { c, _ := r.cpuPerCall(); return c }
	us := func(s stat) string { return fmt.Sprintf("%s / %s µs", thousands(s.min), thousands(s.med)) }
	msec := func(s stat) string { return fmt.Sprintf("%.2f / %.2f ms", s.min, s.med) }
	added := func(r *row) stat { a, _ := r.addedP50(); return a }
	plus := func(s stat) string { return fmt.Sprintf("%+.2f / %+.2f ms", s.min, s.med) }

	// 1. CPU per call, stdio, 1 session, SQLite: against the floor and the cheapest proxy.
	const fig1 = "gateway CPU per call, stdio, 1 session, SQLite"
	gw, floorJ, floor := findRow(rows, "gw-stdio", 1), findRow(rows, "floor-journal", 1), findRow(rows, "floor", 1)
	var cheapest *row
	for _, k := range proxyKeys {
		if r := findRow(rows, k, 1); r != nil && (cheapest == nil || cpu(r).med < cpu(cheapest).med) {
			cheapest = r
		}
	}
	if gw == nil || floorJ == nil || cheapest == nil {
		missing(fig1, "≤ 300 µs; ≤ 3× the floor; < ½ the cheapest proxy", "gw-stdio, floor-journal, and naive, mcp-proxy or supergateway, at 1 session")
	} else {
		g, fj, c := cpu(gw), cpu(floorJ), cpu(cheapest)
		base := fmt.Sprintf("floor, byte relay + fdatasync'd append: %s", us(fj))
		if floor != nil {
			base += fmt.Sprintf("; floor without journal: %s", us(cpu(floor)))
		}
		base += fmt.Sprintf("; cheapest proxy (%s): %s", cheapest.path.name, us(c))
		line(fig1, us(g), base, "—", "≤ 300 µs (as written)", verdict(g.med <= 300))
		line(fig1+", against the floor", us(g), "floor, byte relay + fdatasync'd append: "+us(fj), fmt.Sprintf("%.1f×", g.med/fj.med),
			"≤ 3× the floor", verdict(g.med <= 3*fj.med))
		line(fig1+", against the cheapest proxy", us(g), fmt.Sprintf("%s: %s", cheapest.path.name, us(c)), fmt.Sprintf("%.2f×", g.med/c.med),
			"< ½ the cheapest proxy", verdict(g.med < c.med/2))
	}

	// 2. Added p50 at 1 session, stdio and HTTP, SQLite.
	for _, k := range []string{"gw-stdio", "gw-http"} {
		r := findRow(rows, k, 1)
		fig := "added p50 at 1 session"
		if r == nil || r.base == nil {
			missing(fig, "≤ +0.40 ms", k+" and direct at 1 session")
			continue
		}
		fig = fmt.Sprintf("added p50, %s, 1 session", r.path.name)
		base := fmt.Sprintf("%s p50: %s", r.base.path.name, msec(r.base.p50()))
		if fj := findRow(rows, "floor-journal", 1); fj != nil {
			base += fmt.Sprintf("; the floor with its fdatasync'd append adds %s", plus(added(fj)))
		}
		a := added(r)
		line(fig, fmt.Sprintf("%s (p50 %s)", plus(a), msec(r.p50())), base, "—", "≤ +0.40 ms", verdict(a.med <= 0.4))
	}

	// 3. 64 HTTP sessions on one upstream: throughput and p99 against direct's.
	if r, d := findRow(rows, "gw-http", 64), findRow(rows, "direct1", 64); r == nil || d == nil {
		missing("64 HTTP sessions, SQLite: calls/s and p99", "≥ 90 % of direct's calls/s; p99 ≤ 1.5× direct's", "gw-http and direct1 at 64 sessions")
	} else {
		line("64 HTTP sessions, SQLite: calls/s", rateText(r.rate()), fmt.Sprintf("%s, 64 callers: %s", d.path.name, rateText(d.rate())),
			fmt.Sprintf("%.0f %%", 100*r.rate().med/d.rate().med), "≥ 90 % of direct's", verdict(r.rate().med >= 0.9*d.rate().med))
		line("64 HTTP sessions, SQLite: p99", msec(r.p99()), fmt.Sprintf("%s, 64 callers: %s", d.path.name, msec(d.p99())),
			fmt.Sprintf("%.2f×", r.p99().med/d.p99().med), "≤ 1.5× direct's", verdict(r.p99().med <= 1.5*d.p99().med))
	}

	// 4. PostgreSQL at 64 sessions.
	if r, d := findRow(rows, "gw-http-pg", 64), findRow(rows, "direct1", 64); r == nil || d == nil {
		missing("64 HTTP sessions, PostgreSQL: calls/s", "≥ 75 % of direct's", "gw-http-pg and direct1 at 64 sessions")
	} else {
		line("64 HTTP sessions, PostgreSQL: calls/s", rateText(r.rate()), fmt.Sprintf("%s, 64 callers: %s", d.path.name, rateText(d.rate())),
			fmt.Sprintf("%.0f %%", 100*r.rate().med/d.rate().med), "≥ 75 % of direct's", verdict(r.rate().med >= 0.75*d.rate().med))
	}

	// 5. 16 stdio gateway processes on one data folder.
	if r, one := findRow(rows, "gw-stdio", 16), findRow(rows, "gw-stdio", 1); r == nil || one == nil {
		missing("16 stdio gateway processes on one data folder: p99", "≤ 3× the single process's p99", "gw-stdio at 1 and 16 sessions")
	} else {
		base := "1 gateway process: " + msec(one.p99())
		if d := findRow(rows, "direct", 16); d != nil {
			base += fmt.Sprintf("; direct stdio, 16 processes: %s", msec(d.p99()))
		}
		line("16 stdio gateway processes on one data folder (SQLite): p99", msec(r.p99()), base,
			fmt.Sprintf("%.1f×", r.p99().med/one.p99().med), "≤ 3× the single process's", verdict(r.p99().med <= 3*one.p99().med))
	}
}

func rateText(s stat) string { return fmt.Sprintf("%.0f / %.0f calls/s", s.min, s.med) }
