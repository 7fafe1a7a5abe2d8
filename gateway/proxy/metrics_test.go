package proxy

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/bundle"
)

// Tests of /metrics (issue 5: "calls by tool and outcome, latency histogram, blocks by
// reason, reloads and reload failures, the manifest revision served"), scraped over HTTP and
// parsed with the Prometheus text parser.

// scrape fetches /metrics and parses it.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/plain") // the text format, whatever the default negotiation
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %s, Content-Type %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// sample returns the metric of family name whose labels are exactly labels, or nil.
func sample(fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
				continue next
			}
		}
		return m
	}
	return nil
}

// counter is the value of a counter sample, -1 when absent.
func counter(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	m := sample(fams, name, labels)
	if m == nil || m.GetCounter() == nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestMetrics: after a succeeded call and blocked calls in enforce mode, /metrics counts them
// by tool and outcome and the blocks by reason, observes the latency, counts the open
// session, names the manifests served and counts reloads; the Go and process collectors are
// there too.
func TestMetrics(t *testing.T) {
	ms := loadManifests(t)
	f := start(t, memoryConfig(t, config.ModeAuto), ms)
	base := serveHTTP(t, f.gw)
	cs := httpClient(t, base)

	if res := call(t, cs, "memory.read_graph", map[string]any{}); res.IsError {
		t.Fatalf("read_graph: %v", texts(res))
	}
	if res := call(t, cs, "memory.search_nodes", map[string]any{"query": "x"}); !res.IsError { // no manifest
		t.Fatalf("search_nodes was not blocked: %v", texts(res))
	}
	if res := call(t, cs, "memory.open_nodes", map[string]any{"names": []any{"x"}}); !res.IsError { // denied
		t.Fatalf("open_nodes was not blocked: %v", texts(res))
	}
	if res := call(t, cs, "memory.delete_entities", map[string]any{"entityNames": []any{"x"}}); !res.IsError { // approval
		t.Fatalf("delete_entities was not blocked: %v", texts(res))
	}
	f.gw.metrics.reloaded(true)
	f.gw.metrics.reloaded(false)
	f.gw.metrics.reloaded(false)

	fams := scrape(t, base)
	calls := MetricsPrefix + "calls_total"
	for _, c := range []struct {
		tool, outcome string
		want          float64
	}{
		{"memory.read_graph", OutcomeSucceeded, 1},
		{"memory.search_nodes", OutcomeBlocked, 1},
		{"memory.open_nodes", OutcomeBlocked, 1},
		{"memory.delete_entities", OutcomeBlocked, 1},
		{"memory.read_graph", OutcomeBlocked, -1}, // never seen: no sample
	} {
		if got := counter(fams, calls, map[string]string{"tool": c.tool, "outcome": c.outcome}); got != c.want {
			t.Errorf("%s{tool=%q,outcome=%q} = %v, want %v", calls, c.tool, c.outcome, got, c.want)
		}
	}
	if n := len(fams[calls].GetMetric()); n != 4 {
		t.Errorf("%s has %d samples, want 4", calls, n)
	}

	blocks := MetricsPrefix + "blocks_total"
	for reason, want := range map[string]float64{"no_manifest": 1, "allow_deny": 1, "approval": 1, "scope": 0, "other": 0} {
		if got := counter(fams, blocks, map[string]string{"reason": reason, "outcome": OutcomeBlocked}); got != want {
			t.Errorf("%s{reason=%q,outcome=blocked} = %v, want %v", blocks, reason, got, want)
		}
	}
	if got := counter(fams, blocks, map[string]string{"reason": "no_manifest", "outcome": OutcomeWouldBlock}); got != 0 {
		t.Errorf("%s{reason=no_manifest,outcome=would_block} = %v, want 0", blocks, got)
	}

	lat := sample(fams, MetricsPrefix+"call_duration_seconds", map[string]string{"tool": "memory.read_graph"})
	if lat == nil || lat.GetHistogram().GetSampleCount() != 1 || lat.GetHistogram().GetSampleSum() <= 0 {
		t.Fatalf("call_duration_seconds{tool=memory.read_graph}: %v", lat)
	}
	var bounds []float64
	for _, b := range lat.GetHistogram().GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if want := append(slices.Clone(LatencyBuckets), math.Inf(1)); !slices.Equal(bounds, want) {
		t.Errorf("latency buckets %v, want %v", bounds, want)
	}
	t.Logf("read_graph through the gateway: %.3f ms", 1000*lat.GetHistogram().GetSampleSum())

	if m := sample(fams, MetricsPrefix+"sessions", map[string]string{}); m == nil || m.GetGauge().GetValue() != 1 {
		t.Errorf("sessions gauge %v, want 1", m)
	}
	b, err := bundle.FromManifests("", ms)
	if err != nil {
		t.Fatal(err)
	}
	info := MetricsPrefix + "manifest_info"
	if m := sample(fams, info, map[string]string{"revision": "", "checksum": b.Digest()}); m == nil || m.GetGauge().GetValue() != 1 {
		t.Errorf("%s{checksum=%q}: %v", info, b.Digest(), fams[info])
	}
	if got := counter(fams, MetricsPrefix+"reloads_total", map[string]string{}); got != 1 {
		t.Errorf("reloads_total = %v, want 1", got)
	}
	if got := counter(fams, MetricsPrefix+"reload_failures_total", map[string]string{}); got != 2 {
		t.Errorf("reload_failures_total = %v, want 2", got)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s (Go and process collectors)", name)
		}
	}

	// A revision set by the reload code is served.
	f.gw.metrics.setRevision("main@sha1:0123456789abcdef0123456789abcdef01234567")
	fams = scrape(t, base)
	if m := sample(fams, info, map[string]string{"revision": "main@sha1:0123456789abcdef0123456789abcdef01234567", "checksum": b.Digest()}); m == nil {
		t.Errorf("%s after setRevision: %v", info, fams[info])
	}
	if n := len(fams[info].GetMetric()); n != 1 {
		t.Errorf("%s has %d samples, want 1", info, n)
	}
}

// TestMetricsWouldBlockAndNotForwarded: in advise mode a call that breaks a rule runs and counts
// as would_block with its reason; a call whose upstream is down is not forwarded (failed). The
// second gateway in the process has its own registry (nothing from the first leaks in).
func TestMetricsWouldBlockAndNotForwarded(t *testing.T) {
	mem := killableMemory(t)
	cfg := memoryConfig(t, config.ModeAdvise)
	cfg.Upstreams = []config.Upstream{mem.u}
	f := start(t, cfg, loadManifests(t))
	base := serveHTTP(t, f.gw)
	cs := httpClient(t, base)
	res := call(t, cs, "memory.open_nodes", map[string]any{"names": []any{"x"}}) // denied: runs in advise
	if res.IsError || !strings.Contains(strings.Join(texts(res), ""), "Reversi advisory") {
		t.Fatalf("open_nodes in advise: %v", texts(res))
	}
	mem.hold(t, true) // the upstream goes away for good: the call is not forwarded
	mem.kill(t, syscall.SIGKILL)
	waitDown(t, f.gw)
	if res := call(t, cs, "memory.read_graph", map[string]any{}); !res.IsError {
		t.Fatalf("read_graph with the upstream gone: %v", texts(res))
	}

	fams := scrape(t, base)
	calls := MetricsPrefix + "calls_total"
	if got := counter(fams, calls, map[string]string{"tool": "memory.open_nodes", "outcome": OutcomeWouldBlock}); got != 1 {
		t.Errorf("open_nodes would_block = %v, want 1", got)
	}
	if got := counter(fams, calls, map[string]string{"tool": "memory.read_graph", "outcome": "failed"}); got != 1 {
		t.Errorf("read_graph failed = %v, want 1", got)
	}
	if n := len(fams[calls].GetMetric()); n != 2 {
		t.Errorf("%s has %d samples, want 2 (a registry of its own)", calls, n)
	}
	blocks := MetricsPrefix + "blocks_total"
	if got := counter(fams, blocks, map[string]string{"reason": "allow_deny", "outcome": OutcomeWouldBlock}); got != 1 {
		t.Errorf("blocks_total{allow_deny,would_block} = %v, want 1", got)
	}
	if got := counter(fams, blocks, map[string]string{"reason": "allow_deny", "outcome": OutcomeBlocked}); got != 0 {
		t.Errorf("blocks_total{allow_deny,blocked} = %v, want 0", got)
	}
}

// BenchmarkMetricsCall is the cost metrics add to one call (a counter, a histogram and, for a
// block, a second counter).
func BenchmarkMetricsCall(b *testing.B) {
	m := newMetrics(&Gateway{})
	ok := &store.StepOutcome{Status: store.Succeeded}
	blocked := &engine.Decision{Action: engine.Block, Category: engine.CategoryScope}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if i++; i%4 == 0 {
				m.call("memory.delete_entities", time.Now(), blocked, &store.StepOutcome{})
			} else {
				m.call("memory.read_graph", time.Now(), &engine.Decision{}, ok)
			}
		}
	})
}
