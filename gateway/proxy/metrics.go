package proxy

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// MetricsPrefix starts the name of every gateway metric.
const MetricsPrefix = "reversi_gateway_"

// LatencyBuckets are the upper bounds, in seconds, of reversi_gateway_call_duration_seconds:
// from 100 µs (a blocked call, or a read from a local stdio upstream) to 30 s (slow upstreams,
// timeouts).
var LatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Outcome label values of reversi_gateway_calls_total. A call that broke a rule and ran anyway
// (advise, observe) counts as would_block whatever the upstream answered; the ledger keeps
// its upstream outcome.
const (
	OutcomeSucceeded  = string(store.Succeeded)
	OutcomeFailed     = string(store.Failed)
	OutcomeUncertain  = string(store.Uncertain)
	OutcomeBlocked    = string(store.Blocked)
	OutcomeWouldBlock = string(store.WouldBlock)
)

// metrics are one Gateway's Prometheus metrics, in their own registry (not the global one, so
// that several gateways in one process, such as tests, do not mix). Served at /metrics in
// HTTP mode (issue 5: calls by tool and outcome, latency, blocks by reason, reloads and reload
// failures, the manifest revision served).
type metrics struct {
	reg            *prometheus.Registry
	calls          *prometheus.CounterVec   // tool, outcome
	latency        *prometheus.HistogramVec // tool
	blocks         *prometheus.CounterVec   // reason, outcome
	reloads        prometheus.Counter
	reloadFailures prometheus.Counter
	limitHits      *prometheus.CounterVec // limit
	policyTime     prometheus.Histogram
	policyRules    *prometheus.CounterVec // rule, effect
	revision       atomic.Pointer[string]
}

// PolicyBuckets are the upper bounds, in seconds, of
// reversi_gateway_policy_evaluation_seconds: from 1 µs (a few rules skipped by their match) to
// 10 ms (conditions near the cost limit).
var PolicyBuckets = []float64{0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.001, 0.01}

// newMetrics builds the registry of g: the gateway's own metrics, the open-sessions gauge and
// the manifest-info gauge (both read g when scraped), and the standard Go and process
// collectors.
func newMetrics(g *Gateway) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricsPrefix + "calls_total",
			Help: "tools/call requests by exposed tool name and outcome (succeeded, failed, uncertain, blocked, would_block).",
		}, []string{"tool", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricsPrefix + "call_duration_seconds",
			Help:    "Time the gateway took to answer a tools/call (decision, journal and upstream), by exposed tool name.",
			Buckets: LatencyBuckets,
		}, []string{"tool"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricsPrefix + "blocks_total",
			Help: "Calls that broke a rule, by the category of the first rule broken and outcome (blocked in enforce; would_block in advise and observe).",
		}, []string{"reason", "outcome"}),
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricsPrefix + "reloads_total",
			Help: "Configuration reloads that were loaded and are being served.",
		}),
		reloadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricsPrefix + "reload_failures_total",
			Help: "Configuration reloads that were rejected (the previous configuration kept serving).",
		}),
		limitHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricsPrefix + "limit_hits_total",
			Help: "Times a limit of gateway.yaml was reached (a listing cut short, a message, body or batch refused, a call refused or timed out), by the limit's field name (call_timeout, or a field of limits:).",
		}, []string{"limit"}),
		policyTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricsPrefix + "policy_evaluation_seconds",
			Help:    "Time the policy took to decide one tools/call: every rule's match and condition, and for limit rules the count and the wait for its place.",
			Buckets: PolicyBuckets,
		}),
		policyRules: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricsPrefix + "policy_rules_fired_total",
			Help: "Policy rules that fired, by rule (<policy>/<rule>) and effect (deny, require_approval, advise, limit).",
		}, []string{"rule", "effect"}),
	}
	empty := ""
	m.revision.Store(&empty)
	// Every reason starts at zero, so that rate() and alerts see the first block.
	for _, c := range engine.Categories {
		m.blocks.WithLabelValues(string(c), OutcomeBlocked)
		m.blocks.WithLabelValues(string(c), OutcomeWouldBlock)
	}
	sessions := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: MetricsPrefix + "sessions",
		Help: "Open MCP sessions on the gateway.",
	}, func() float64 { return float64(g.sessionCount()) })
	for _, l := range config.LimitNames {
		m.limitHits.WithLabelValues(l)
	}
	m.reg.MustRegister(m.calls, m.latency, m.blocks, m.reloads, m.reloadFailures, m.limitHits, m.policyTime, m.policyRules, sessions,
		&manifestInfo{g: g, m: m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// call records one tools/call when the call path returns: start is when it began, d the
// engine's decision (zero when the call was refused before deciding) and out the outcome
// journaled for a forwarded call (zero Status when it was not forwarded, i.e. blocked).
func (m *metrics) call(tool string, start time.Time, d *engine.Decision, out *store.StepOutcome) {
	m.latency.WithLabelValues(tool).Observe(time.Since(start).Seconds())
	if d.PolicyDecision != "" {
		m.policyTime.Observe(d.PolicyTime.Seconds())
		for _, f := range d.Policy {
			m.policyRules.WithLabelValues(f.Rule, string(f.Effect)).Inc()
		}
	}
	outcome := string(out.Status)
	switch {
	case outcome == "":
		// Not forwarded: blocked by a rule, or refused because the run, the shadow run or
		// the intent could not be written (fail closed).
		outcome = OutcomeBlocked
		reason := d.Category
		if d.Action == engine.Allow || reason == "" {
			reason = engine.CategoryOther
		}
		m.blocks.WithLabelValues(string(reason), OutcomeBlocked).Inc()
	case d.WouldBlock:
		outcome = OutcomeWouldBlock
		m.blocks.WithLabelValues(string(d.Category), OutcomeWouldBlock).Inc()
	}
	m.calls.WithLabelValues(tool, outcome).Inc()
}

// limitHit counts one hit of the limit named by its gateway.yaml field (config.LimitNames).
// Safe on a nil *metrics (before New has built them): the hit is then not counted.
func (m *metrics) limitHit(limit string) {
	if m != nil {
		m.limitHits.WithLabelValues(limit).Inc()
	}
}

// reloaded records a reload: ok when the new configuration is served, !ok when it was
// rejected and the previous one kept serving (seed: Hot reload). The reload code calls it
// once per attempt, and setRevision after a successful one.
func (m *metrics) reloaded(ok bool) {
	if ok {
		m.reloads.Inc()
	} else {
		m.reloadFailures.Inc()
	}
}

// setRevision names the source revision of the manifests served (e.g. `main@sha1:<40 hex>`
// from a registry bundle); "" (the default) when they come from local files with no revision.
func (m *metrics) setRevision(revision string) { m.revision.Store(&revision) }

// handler serves the registry in the Prometheus exposition formats.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// sessionCount is the number of open MCP sessions on the gateway's server.
func (g *Gateway) sessionCount() int {
	if g.server == nil {
		return 0
	}
	n := 0
	for range g.server.Sessions() {
		n++
	}
	return n
}

// manifestInfo is reversi_gateway_manifest_info{revision,checksum} 1: the revision set by
// setRevision and the digest of the manifests served (Gateway.Digest).
type manifestInfo struct {
	g *Gateway
	m *metrics
}

var manifestInfoDesc = prometheus.NewDesc(MetricsPrefix+"manifest_info",
	"The manifests served: source revision (empty for local files) and digest of the loaded manifests; always 1.",
	[]string{"revision", "checksum"}, nil)

func (i *manifestInfo) Describe(ch chan<- *prometheus.Desc) { ch <- manifestInfoDesc }

func (i *manifestInfo) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(manifestInfoDesc, prometheus.GaugeValue, 1, *i.m.revision.Load(), i.g.Digest())
}
