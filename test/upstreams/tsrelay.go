package upstreams

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// TSRelayFeatures are the features ts-relay.mjs reports, in the order it runs them. A report
// that lacks one of them, or has another, is a failure of the script (TSRelayReport.Lost).
var TSRelayFeatures = []string{
	"ping", "tools_list",
	"resources_list", "resources_read_text", "resources_read_blob", "resources_templates",
	"resources_subscribe", "resources_unsubscribe",
	"prompts_list", "prompts_get_simple", "prompts_get_args",
	"completion_prompt", "completion_resource_template",
	"logging", "progress", "sampling", "elicitation", "roots", "roots_list_changed", "cancel",
}

// TSRelayTimeout bounds one run of ts-relay.mjs (the script's own watchdog fires at 120 s).
const TSRelayTimeout = 150 * time.Second

// TSRelayFeature is one feature's result: whether the script judged it working, why (any
// JSON), and how long it took in milliseconds.
type TSRelayFeature struct {
	OK     bool            `json:"ok"`
	Detail json.RawMessage `json:"detail"`
	MS     int64           `json:"ms"`
}

// TSRelayReport is what ts-relay.mjs prints: a result per feature, the order they ran in, and
// the messages of the client's onerror (e.g. progress notifications for a cancelled request).
type TSRelayReport struct {
	Features map[string]TSRelayFeature `json:"features"`
	Order    []string                  `json:"order"`
	Errors   []string                  `json:"errors"`
	Server   json.RawMessage           `json:"server"`
}

// Lost returns, in TSRelayFeatures order, one line per expected feature that is missing from
// the report or not ok ("<feature>: <detail>"), and one per feature the report has that
// TSRelayFeatures does not name. Empty means every feature worked.
func (r TSRelayReport) Lost() []string {
	var out []string
	for _, name := range TSRelayFeatures {
		f, ok := r.Features[name]
		switch {
		case !ok:
			out = append(out, name+": not reported")
		case !f.OK:
			out = append(out, name+": "+string(f.Detail))
		}
	}
	for name := range r.Features {
		if !slices.Contains(TSRelayFeatures, name) {
			out = append(out, name+": reported but not in TSRelayFeatures")
		}
	}
	return out
}

// TSRelay returns the command line of ts-relay.mjs, the TypeScript SDK client that exercises
// resources, prompts, completions, logging, progress, sampling, elicitation, roots and
// cancellation against server-everything. Append its arguments: "--url", url, and optionally
// "--header", "Name: value" (repeatable) and "--prefix", "everything." (the exposed-name
// prefix of tools and prompts; empty directly). It prints one JSON object (TSRelayReport).
//
// The script resolves the SDK from test/upstreams/node_modules (next to it), whatever
// REVERSI_UPSTREAMS says.
func TSRelay(t testing.TB) (cmd string, args []string) {
	t.Helper()
	return Node(t), []string{sdkScript(t, "ts-relay.mjs")}
}

// RunTSRelay runs ts-relay.mjs against the Streamable HTTP endpoint url with the tool and
// prompt name prefix and extra arguments (e.g. "--header", "Authorization: Bearer x"), within
// TSRelayTimeout, and returns its report. It fails the test when the script crashes (exit
// status 1), times out or prints something that is not a report; features that do not work
// are in the report (see Lost), not failures here.
func RunTSRelay(t testing.TB, url, prefix string, extra ...string) TSRelayReport {
	t.Helper()
	node, script := TSRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), TSRelayTimeout)
	defer cancel()
	argv := append(append(script, "--url", url, "--prefix", prefix), extra...)
	cmd := exec.CommandContext(ctx, node, argv...)
	cmd.Dir = t.TempDir()
	cmd.Env = withoutNodeOptions(os.Environ())
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("ts-relay --url %s: no report within %s\nstdout:\n%s\nstderr:\n%s", url, TSRelayTimeout, stdout.String(), stderr.String())
	}
	if err != nil {
		t.Fatalf("ts-relay --url %s: %v\nstdout:\n%s\nstderr:\n%s", url, err, stdout.String(), stderr.String())
	}
	var rep TSRelayReport
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("ts-relay --url %s printed no report: %v\nstdout:\n%s\nstderr:\n%s", url, err, stdout.String(), stderr.String())
	}
	if rest, _ := io.ReadAll(dec.Buffered()); len(bytes.TrimSpace(rest)) > 0 {
		t.Fatalf("ts-relay --url %s printed more than one JSON object: %s", url, rest)
	}
	return rep
}

// TSRelayTable writes one row per feature of TSRelayFeatures and one column per report (named
// by names): "ok", "LOST" (not ok; see Lost for why) or "MISSING" (not reported).
func TSRelayTable(w io.Writer, names []string, reports ...TSRelayReport) {
	fmt.Fprintf(w, "%-30s", "feature")
	for _, n := range names {
		fmt.Fprintf(w, " %-10s", n)
	}
	fmt.Fprintln(w)
	for _, f := range TSRelayFeatures {
		fmt.Fprintf(w, "%-30s", f)
		for _, r := range reports {
			res, ok := r.Features[f]
			status := "ok"
			switch {
			case !ok:
				status = "MISSING"
			case !res.OK:
				status = "LOST"
			}
			fmt.Fprintf(w, " %-10s", status)
		}
		fmt.Fprintln(w)
	}
}

// CancelReached checks, in msgs (what a server started by StartEverythingHTTP received), that
// ts-relay.mjs's cancelled call reached the upstream and so did its cancellation: a tools/call
// of trigger-long-running-operation with arguments {duration: 2, steps: 4} (under any tool
// name prefix a relay strips), then notifications/cancelled naming its request id in the same
// session. It returns nil or what is missing.
func CancelReached(msgs []HTTPMessage) error {
	type call struct{ session, id string }
	var calls []call
	for _, m := range msgs {
		if m.Method != "tools/call" {
			continue
		}
		var p struct {
			Name      string `json:"name"`
			Arguments struct {
				Duration float64 `json:"duration"`
				Steps    float64 `json:"steps"`
			} `json:"arguments"`
		}
		if json.Unmarshal(m.Params, &p) == nil && p.Name == "trigger-long-running-operation" && p.Arguments.Duration == 2 && p.Arguments.Steps == 4 {
			calls = append(calls, call{m.Session, string(m.ID)})
		}
	}
	if len(calls) == 0 {
		return fmt.Errorf("the upstream received no tools/call of trigger-long-running-operation {duration: 2, steps: 4}")
	}
	for _, m := range msgs {
		if m.Method != "notifications/cancelled" {
			continue
		}
		var p struct {
			RequestID json.RawMessage `json:"requestId"`
		}
		if json.Unmarshal(m.Params, &p) != nil {
			continue
		}
		for _, c := range calls {
			if c.session == m.Session && c.id == string(p.RequestID) {
				return nil
			}
		}
	}
	return fmt.Errorf("the upstream received the call (session %s, id %s) but no notifications/cancelled for it", calls[len(calls)-1].session, calls[len(calls)-1].id)
}
