package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// writeSuite writes the suite's section: the command, the machine, the targets of issue 20
// from the gateway rows, one table of every figure of issue 10 with its baseline from the same
// run and its target, then the gateway rows in detail.
func writeSuite(w io.Writer, machine string, f suiteFlags, rows []*row, notes []string, res map[string]benchLines, took map[string]time.Duration, total time.Duration) {
	fmt.Fprintf(w, "## `make bench` (issues 10 and 20)\n\n")
	fmt.Fprintf(w, "Command: `make bench` (= `go run ./hack/bench suite -sizes %s -sessions %s -calls %d -warmup %d -warmup-row %d -reps %d`), %s in all.  \n",
		f.sizes, f.sessions, f.calls, f.warmup, f.warmupRow, f.reps, total.Round(time.Second))
	fmt.Fprintf(w, "Machine: %s.  \n", machine)
	fmt.Fprintf(w, "Run: %s. One run; every baseline was measured in the same run, so compare side by side.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintln(w, "### Targets of issue 20 (the call path at the floor)")
	fmt.Fprintln(w)
	writeTargets(w, rows)
	fmt.Fprintln(w, "\n### Issue 10")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| # | figure | measured | baseline (same run) | target | met |")
	fmt.Fprintln(w, "| - | - | - | - | - | - |")
	line := func(n, fig, meas, base, target, met string) {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", n, fig, meas, base, target, met)
	}

	// 1. Gateway (the medians of the rows below).
	for _, k := range []struct {
		key string
		n   int
	}{{"gw-stdio", 1}, {"gw-http", 1}, {"gw-http-pg", 1}, {"gw-stdio", 64}, {"gw-http", 64}} {
		r := findRow(rows, k.key, k.n)
		if r == nil || r.base == nil {
			continue
		}
		added, _ := r.addedP50()
		meas := fmt.Sprintf("%.0f calls/s, p50 %.2f ms, p99 %.2f ms; **added p50 %+.2f ms**", r.rate().med, r.p50().med, r.p99().med, added.med)
		base := fmt.Sprintf("%s: %.0f calls/s, p50 %.2f ms, p99 %.2f ms", r.base.path.name, r.base.rate().med, r.base.p50().med, r.base.p99().med)
		target, met := "added p50 ≤ 0.5 ms", verdict(added.med <= 0.5)
		if k.n > 1 {
			target, met = "≥ 2,000 calls/s (SQLite, 64 sessions)", verdict(r.rate().med >= 2000)
		}
		line("1", fmt.Sprintf("gateway overhead: %s, %d session(s) (medians)", r.path.name, r.sessions), meas, base, target, met)
	}

	// 2. PR to enforcement.
	verify := res["verify"]["BenchmarkVerifyThroughput"]
	vps := verify["versions/s"]
	if pr := res["pr"]["BenchmarkPRToEnforcement"]; pr != nil {
		base := fmt.Sprintf("stages (mean): ReversiGateway status shows the new revision %.0f ms, the pod reports the new digest %.0f ms", pr["rendered-ms"], pr["reloaded-ms"])
		line("2", "PR → enforcement p50 (N=10)", fmt.Sprintf("%.0f ms", pr["p50-ms"]), base, "p50 < 2 s", verdict(pr["p50-ms"] < 2000))
		line("2", "PR → enforcement p99 (N=10, nearest rank: the max)", fmt.Sprintf("%.0f ms", pr["p99-ms"]), "as above", "p99 < 5 s", verdict(pr["p99-ms"] < 5000))
	}

	// 3. Registry scale.
	sizes := []int{}
	for _, s := range strings.Split(f.sizes, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
			sizes = append(sizes, n)
		}
	}
	lower := func(n int) string {
		if vps == 0 {
			return "—"
		}
		return fmt.Sprintf("%s tools at the `manifests verify` rate (row 5): %.2f s", thousands(float64(n)), float64(n)/vps)
	}
	var recPer, relPer []float64
	for _, n := range sizes {
		rc := res["reconcile"][fmt.Sprintf("BenchmarkReconcileScale/tools-%d", n)]
		if rc == nil {
			continue
		}
		s := rc["ns/op"] / 1e9
		meas := fmt.Sprintf("%.2f s; peak heap in use %.1f MB (%.1f MB per 1,000 tools); ConfigMaps %s bytes in %.0f shard(s)",
			s, rc["peak-heapinuse-MB"], rc["peak-heapinuse-MB"]/float64(n)*1000, thousands(rc["cm-bytes"]), rc["shards"])
		target, met := "—", "—"
		if n == 5000 {
			target, met = "< 10 s", verdict(s < 10)
		}
		if n >= 1000 {
			recPer = append(recPer, rc["peak-heapinuse-MB"]/float64(n))
		}
		line("3", fmt.Sprintf("reconcile %s tools (controller)", thousands(float64(n))), meas, lower(n), target, met)
	}
	for _, n := range sizes {
		rl := res["reload"][fmt.Sprintf("BenchmarkReloadScale/tools-%d", n)]
		if rl == nil {
			continue
		}
		s := rl["ns/op"] / 1e9
		meas := fmt.Sprintf("%.0f ms; peak heap in use %.1f MB, retained %.1f MB (%.1f MB per 1,000 tools)",
			s*1000, rl["peak-heapinuse-MB"], rl["retained-MB"], rl["retained-MB"]/float64(n)*1000)
		target, met := "—", "—"
		if n == 5000 {
			target, met = "< 1 s", verdict(s < 1)
		}
		if n >= 1000 {
			relPer = append(relPer, rl["retained-MB"]/float64(n))
		}
		line("3", fmt.Sprintf("gateway reload %s tools (assemble + verify + engine)", thousands(float64(n))), meas, lower(n), target, met)
	}
	linear := func(per []float64) (string, string) {
		if len(per) < 2 {
			return "—", "—"
		}
		lo, hi := math.Inf(1), 0.0
		for _, p := range per {
			lo, hi = min(lo, p), max(hi, p)
		}
		return fmt.Sprintf("MB per 1,000 tools from %.1f to %.1f (max/min %.2f)", lo*1000, hi*1000, hi/lo), verdict(hi/lo <= 1.5)
	}
	m, v := linear(recPer)
	line("3", "controller memory linear in tools (≥ 1,000 tools)", m, "the smallest of those sizes", "linear (max/min per tool ≤ 1.5)", v)
	m, v = linear(relPer)
	line("3", "gateway memory linear in tools (≥ 1,000 tools)", m, "the smallest of those sizes", "linear (max/min per tool ≤ 1.5)", v)

	// 4. Approval.
	if ap := res["approval"]["BenchmarkApprovalLatency"]; ap != nil {
		base := fmt.Sprintf("the kubectl process alone: %.0f ms (mean)", ap["kubectl-ms"])
		line("4", "approval: last quorum `kubectl apply` → retry passes, p50 (N=10)", fmt.Sprintf("%.0f ms (mean %.0f ms)", ap["p50-ms"], ap["ms/approval"]), base, "< 1 s", verdict(ap["p50-ms"] < 1000))
		line("4", "approval, max (N=10)", fmt.Sprintf("%.0f ms", ap["max-ms"]), "as above", "< 1 s", verdict(ap["max-ms"] < 1000))
	}

	// 5. Verification throughput.
	if verify != nil {
		line("5", "signature verification (`manifests verify`, 3,000 versions)", fmt.Sprintf("%.0f versions/s", vps), "—", "— (the lower bound for 2 and 3)", "—")
	}

	fmt.Fprintf(w, "\nStep times: gateway %s, verify %s, reload %s, reconcile %s, PR→enforcement %s, approvals %s (go test times include compiling).\n",
		took["gateway"].Round(time.Second), took["verify"].Round(time.Second), took["reload"].Round(time.Second),
		took["reconcile"].Round(time.Second), took["pr"].Round(time.Second), took["approval"].Round(time.Second))
	fmt.Fprintln(w, "The hot spots of the two slowest paths (pprof) are named in the note on issue 10.")
	fmt.Fprintln(w, "\n### Gateway and proxy rows")
	fmt.Fprintln(w)
	printTable(w, rows, notes)
}

func verdict(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// thousands formats v as an integer with commas.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
