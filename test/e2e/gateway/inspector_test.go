package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/test/upstreams"
)

// The gateway's own reversi.* tools pass the MCP Inspector's strict schema check (issue 19):
// `inspector --cli --strict --method tools/list` reports no problem (warning or error) for them,
// on the agent endpoint over stdio and on the operator endpoint over Streamable HTTP, where an
// admin sees every operator tool.

// strictProblem is the head of one problem the Inspector's --strict reports on stderr.
var strictProblem = regexp.MustCompile(`(?m)^(Warning|Error): tool "([^"]+)"`)

// inspectTools runs the Inspector's CLI in strict mode with args and returns the tools it
// listed and the problems it reported, one line each, by tool.
func inspectTools(t *testing.T, args ...string) (tools []string, problems map[string][]string) {
	t.Helper()
	node, cli := upstreams.Inspector(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append(append(cli, "--strict", "--method", "tools/list"), args...)...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(env(), "HOME="+cmd.Dir) // the Inspector's catalog and settings stay in the test
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("inspector %s: %v\nstderr:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var out struct {
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("inspector output %q: %v", stdout.String(), err)
	}
	for _, tool := range out.Tools {
		tools = append(tools, tool.Name)
	}
	problems = map[string][]string{}
	for _, b := range strings.Split(stderr.String(), "\n\n") {
		if m := strictProblem.FindStringSubmatch(b); m != nil {
			problems[m[2]] = append(problems[m[2]], strings.Join(strings.Fields(b), " "))
		}
	}
	return tools, problems
}

// TestInspectorStrict: the agent endpoint over stdio and the operator endpoint over HTTP (as an
// admin: every operator tool) in front of server-memory and the hostile upstream's described
// tool, whose two-type property the Inspector must report on the agent endpoint (so that a
// strict mode reporting nothing at all cannot pass for a clean one).
func TestInspectorStrict(t *testing.T) {
	node, margs, menv := upstreams.Memory(t)
	ups := "upstreams:\n" + upstreamYAML("mem", node, margs, menv) + upstreamYAML("hs", upstreams.Hostile(t), []string{"-list", "described"}, nil)
	// sentinel: the endpoint lists hs.described (the operator endpoint lists reversi.* tools only).
	check := func(t *testing.T, tools []string, problems map[string][]string, want int, sentinel bool) {
		t.Helper()
		n := 0
		for _, name := range tools {
			if strings.HasPrefix(name, "reversi.") {
				n++
			}
		}
		if n < want {
			t.Fatalf("the Inspector listed %d reversi.* tools of %v, want at least %d", n, tools, want)
		}
		if sentinel && len(problems["hs.described"]) == 0 {
			t.Fatalf("the Inspector reported no problem for hs.described, whose input schema has a two-type property: is --strict checking? %v", problems)
		}
		for tool, ps := range problems {
			if strings.HasPrefix(tool, "reversi.") {
				for _, p := range ps {
					t.Error(p)
				}
			}
		}
	}

	t.Run("agent-stdio", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeFile(t, dir, "gateway.yaml", "mode: observe\n"+ups)
		tools, problems := inspectTools(t, "--", bins.reversi, "gateway", "--config", cfg, "--store", "sqlite", "--data", filepath.Join(dir, "data"))
		check(t, tools, problems, 8, true)
	})

	t.Run("operator-http", func(t *testing.T) {
		dir := t.TempDir()
		keys := filepath.Join(dir, "keys.json")
		add := exec.Command(bins.reversi, "gateway", "keys", "add", "--principal", "root", "--role", "admin", "-f", keys)
		add.Env = env()
		out, err := add.Output()
		if err != nil {
			t.Fatalf("keys add: %v", err)
		}
		cfg := writeFile(t, dir, "gateway.yaml", "mode: observe\n"+ups+
			"listen: {host: 127.0.0.1, port: "+strconv.Itoa(freePort(t))+"}\nauth: {keys: "+keys+"}\n")
		url, _ := startHTTP(t, bins.reversi, "gateway", "--config", cfg, "--store", "sqlite", "--data", filepath.Join(dir, "data"))
		op := strings.TrimSuffix(url, "/mcp") + "/operator/mcp"
		// The target first: --header takes every value after it.
		tools, problems := inspectTools(t, op, "--transport", "http", "--header", "Authorization: Bearer "+strings.TrimSpace(string(out)))
		check(t, tools, problems, 15, false)
	})
}
