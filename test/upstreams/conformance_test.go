package upstreams_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/test/upstreams"
)

// The scenarios and checks of the conformance suite (0.1.16) that server-everything (2026.8.31)
// passes directly over Streamable HTTP. tools-call-simple-text and tools-call-error pass only
// because the server answers a call of an unknown tool (the suite's test_* tools) with an
// isError result holding text.
var (
	directScenarios = []string{
		"server-initialize", "logging-set-level", "ping", "tools-list", "tools-call-simple-text",
		"tools-call-error", "server-sse-multiple-streams", "resources-list", "resources-subscribe",
		"resources-unsubscribe", "prompts-list",
	}
	directChecks = []string{
		"server-initialize/server-initialize", "logging-set-level/logging-set-level", "ping/ping",
		"tools-list/tools-list", "tools-call-simple-text/tools-call-simple-text",
		"tools-call-error/tools-call-error",
		"server-sse-multiple-streams/server-accepts-multiple-post-streams",
		"server-sse-multiple-streams/server-sse-streams-functional",
		"resources-list/resources-list", "resources-subscribe/resources-subscribe",
		"resources-unsubscribe/resources-unsubscribe", "prompts-list/prompts-list",
		"dns-rebinding-protection/localhost-host-valid-accepted",
	}
)

// TestConformanceDirect runs the conformance suite's server scenarios against server-everything
// directly and checks the parser on that real run: the scenarios and checks passing are exactly
// the known ones, and ParseConformance and CompareConformance report changes to the run.
func TestConformanceDirect(t *testing.T) {
	t.Parallel()
	ev := upstreams.StartEverythingHTTP(t)
	outDir := filepath.Join(t.TempDir(), "direct")
	checks := upstreams.RunConformance(t, ev.URL, outDir)

	if got := upstreams.PassingScenarios(checks); !slices.Equal(got, directScenarios) {
		t.Errorf("scenarios passing direct:\n  %v\nwant\n  %v", got, directScenarios)
	}
	if got := upstreams.PassingChecks(checks); !slices.Equal(got, directChecks) {
		t.Errorf("checks passing direct:\n  %v\nwant\n  %v", got, directChecks)
	}
	scenarios := map[string]int{}
	for _, c := range checks {
		scenarios[c.Scenario]++
		if c.ID == "" || c.Status == "" || c.Status == upstreams.CheckFailure && c.Message == "" {
			t.Errorf("check %+v lacks a field", c)
		}
	}
	if len(scenarios) != 30 {
		t.Errorf("%d scenarios, want the 30 of the active suite: %v", len(scenarios), scenarios)
	}
	if c := find(checks, "completion-complete/completion-complete"); c.Status != upstreams.CheckFailure || !strings.Contains(c.Message, "test_prompt_with_arguments not found") {
		t.Errorf("completion-complete: %+v", c)
	}

	t.Run("parse", func(t *testing.T) {
		summary := summaryOf(checks)
		again, err := upstreams.ParseConformance([]byte(summary), outDir)
		if err != nil || !slices.Equal(again, checks) {
			t.Fatalf("reparse: %v\n%v\nwant\n%v", err, again, checks)
		}
		if _, err := upstreams.ParseConformance([]byte("no summary"), outDir); err == nil {
			t.Error("output without a summary parsed")
		}
		wrong := strings.Replace(summary, "✓ ping: 1 passed, 0 failed", "✓ ping: 2 passed, 0 failed", 1)
		if _, err := upstreams.ParseConformance([]byte(wrong), outDir); err == nil || !strings.Contains(err.Error(), "scenario ping") {
			t.Errorf("counts that disagree with checks.json: %v", err)
		}
		// A scenario whose folder is missing is one failure.
		cut := filepath.Join(t.TempDir(), "cut")
		copyDir(t, outDir, cut)
		dirs, _ := filepath.Glob(filepath.Join(cut, "server-ping-*"))
		if len(dirs) != 1 {
			t.Fatalf("result folders of ping: %v", dirs)
		}
		if err := os.RemoveAll(dirs[0]); err != nil {
			t.Fatal(err)
		}
		got, err := upstreams.ParseConformance([]byte(summary), cut)
		if c := find(got, "ping/ping"); err != nil || c.Status != upstreams.CheckFailure || !strings.Contains(c.Message, "no checks.json") {
			t.Errorf("ping without its folder: %v %+v", err, c)
		}
		// Two folders for one scenario are refused.
		twice := filepath.Join(t.TempDir(), "twice")
		copyDir(t, outDir, twice)
		orig, _ := filepath.Glob(filepath.Join(twice, "server-tools-list-*"))
		if len(orig) != 1 {
			t.Fatalf("result folders of tools-list: %v", orig)
		}
		copyDir(t, orig[0], filepath.Join(twice, strings.Replace(filepath.Base(orig[0]), "-20", "-19", 1)))
		if _, err := upstreams.ParseConformance([]byte(summary), twice); err == nil || !strings.Contains(err.Error(), "2 result folders") {
			t.Errorf("two folders for tools-list: %v", err)
		}
	})

	t.Run("compare", func(t *testing.T) {
		var b strings.Builder
		if lost := upstreams.CompareConformance(&b, upstreams.ConformanceRun{Name: "direct", Checks: checks},
			upstreams.ConformanceRun{Name: "same", Checks: checks}); len(lost) != 0 {
			t.Errorf("a run compared with itself lost %v", lost)
		}
		if want := fmt.Sprintf("same: keeps %d of the %d checks and %d of the %d scenarios passing direct; 0 lost, 0 gained", len(directChecks), len(directChecks), len(directScenarios), len(directScenarios)); !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
		var other []upstreams.ConformanceCheck
		for _, c := range checks {
			switch c.Key() {
			case "ping/ping":
				c.Status, c.Message = upstreams.CheckFailure, "Method not found"
			case "tools-list/tools-list":
				continue
			case "dns-rebinding-protection/localhost-host-rebinding-rejected":
				c.Status, c.Message = upstreams.CheckSuccess, ""
			}
			other = append(other, c)
		}
		b.Reset()
		lost := upstreams.CompareConformance(&b, upstreams.ConformanceRun{Name: "direct", Checks: checks},
			upstreams.ConformanceRun{Name: "gateway", Checks: other})
		want := []upstreams.ConformanceLoss{
			{Run: "gateway", Scenario: "ping", ID: "ping", Status: upstreams.CheckFailure, Message: "Method not found"},
			{Run: "gateway", Scenario: "tools-list", ID: "tools-list", Status: upstreams.CheckMissing},
		}
		if !slices.Equal(lost, want) {
			t.Errorf("lost %v, want %v", lost, want)
		}
		table := b.String()
		for _, w := range []string{"scenario/check", "direct", "gateway", "ping/ping", "!FAILURE", "!MISSING",
			fmt.Sprintf("gateway: keeps %d of the %d checks and %d of the %d scenarios passing direct; 2 lost, 1 gained", len(directChecks)-2, len(directChecks), len(directScenarios)-2, len(directScenarios))} {
			if !strings.Contains(table, w) {
				t.Errorf("table lacks %q:\n%s", w, table)
			}
		}
	})
}

func find(checks []upstreams.ConformanceCheck, key string) upstreams.ConformanceCheck {
	for _, c := range checks {
		if c.Key() == key {
			return c
		}
	}
	return upstreams.ConformanceCheck{}
}

// summaryOf writes the CLI's summary block for checks (the format of its "=== SUMMARY ===").
func summaryOf(checks []upstreams.ConformanceCheck) string {
	var b strings.Builder
	b.WriteString("\n\n=== SUMMARY ===\n")
	var order []string
	pass, fail := map[string]int{}, map[string]int{}
	for _, c := range checks {
		if !slices.Contains(order, c.Scenario) {
			order = append(order, c.Scenario)
		}
		switch c.Status {
		case upstreams.CheckSuccess:
			pass[c.Scenario]++
		case upstreams.CheckFailure:
			fail[c.Scenario]++
		}
	}
	for _, s := range order {
		mark := "✓"
		if fail[s] > 0 {
			mark = "✗"
		}
		fmt.Fprintf(&b, "%s %s: %d passed, %d failed\n", mark, s, pass[s], fail[s])
	}
	return b.String()
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
}
