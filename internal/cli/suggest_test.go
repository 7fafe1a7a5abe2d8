package cli

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// upstreamFlagsFor is the --upstream-cmd/--upstream-arg form of a helper's command line.
func upstreamFlagsFor(cmd string, args []string) []string {
	out := []string{"--upstream-cmd", cmd}
	for _, a := range args {
		out = append(out, "--upstream-arg", a)
	}
	return out
}

// The draft lines of server-memory, in the server's order: only create_relations' undo is
// fully mapped; create_entities' and add_observations' undo miss a required argument.
const memoryDraftLines = `drafts/create_entities.yaml low
drafts/create_relations.yaml medium
drafts/add_observations.yaml low
drafts/delete_entities.yaml medium
drafts/delete_observations.yaml medium
drafts/delete_relations.yaml medium
drafts/read_graph.yaml medium
drafts/search_nodes.yaml medium
drafts/open_nodes.yaml medium
9 drafted, 0 skipped (already have manifests)
`

func TestSuggestManifestMemory(t *testing.T) {
	t.Chdir(t.TempDir())
	cmd, args, _ := upstreams.Memory(t)
	up := upstreamFlagsFor(cmd, args)

	code, out, errs := runCLI(append([]string{"suggest-manifest", "-o", "drafts"}, up...)...)
	if code != 0 || out != memoryDraftLines {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant:\n%s", code, out, errs, memoryDraftLines)
	}
	code, out, errs = runCLI("validate", "drafts")
	if code != 0 || out != "ok: 9 tool manifests valid\n" {
		t.Fatalf("validate drafts: %d %q %q", code, out, errs)
	}
	before, err := os.ReadFile("drafts/create_relations.yaml")
	if err != nil {
		t.Fatal(err)
	}

	// Second run with the drafts as manifests: nothing to draft, nothing written.
	code, out, errs = runCLI(append([]string{"suggest-manifest", "-m", "drafts", "-o", "more"}, up...)...)
	if code != 0 || out != "0 drafted, 9 skipped (already have manifests)\n" {
		t.Fatalf("second run: %d %q %q", code, out, errs)
	}
	if _, err := os.Stat("more"); !os.IsNotExist(err) {
		t.Errorf("more/ was created with nothing to write: %v", err)
	}
	// Without -m, the drafts already in the folder are not overwritten.
	code, _, errs = runCLI(append([]string{"suggest-manifest", "-o", "drafts"}, up...)...)
	if code != 1 || !strings.Contains(errs, "drafts/create_entities.yaml exists: remove it, or pass its folder with -m") {
		t.Fatalf("overwrite: %d %q", code, errs)
	}
	if after, _ := os.ReadFile("drafts/create_relations.yaml"); string(after) != string(before) {
		t.Error("a draft was overwritten")
	}

	// Published to a registry the drafts are not enforced; approving one enforces it.
	code, out, errs = runCLI("manifests", "publish", "drafts", "--registry", "reg", "--by", "alice")
	if code != 0 || strings.Count(out, " v1 draft ") != 9 {
		t.Fatalf("publish: %d %q %q", code, out, errs)
	}
	ms, lerrs := LoadManifests("reg")
	if len(ms) != 0 || len(lerrs) != 1 || !strings.Contains(lerrs[0].Error(), "no tool manifests found") {
		t.Fatalf("registry of drafts loads %d manifests, errors %v; want none enforced", len(ms), lerrs)
	}
	for _, tool := range []string{"delete_relations", "create_relations"} { // the compensation tool first
		if code, out, errs = runCLI("manifests", "approve", tool, "--registry", "reg", "--by", "bob", "--four-eyes"); code != 0 {
			t.Fatalf("approve %s: %d %q %q", tool, code, out, errs)
		}
	}
	ms, lerrs = LoadManifests("reg")
	if len(lerrs) != 0 || len(ms) != 2 {
		t.Fatalf("after approval: %d manifests, errors %v; want create_relations and delete_relations", len(ms), lerrs)
	}

	// The engine over the real tools: the approved draft is enforced (schema_hash matches),
	// a tool with only a draft has no manifest.
	g, err := config.FromFlags(config.Flags{UpstreamCmd: cmd, UpstreamArgs: args})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	listed, err := proxy.ListTools(ctx, g, nil)
	if err != nil {
		t.Fatal(err)
	}
	var tools []engine.Tool
	for _, lt := range listed {
		tools = append(tools, engine.Tool{Name: lt.Tool.Name, InputSchema: lt.Tool.InputSchema})
	}
	e, err := engine.New(engine.Config{Manifests: ms, Mode: engine.Enforce, Tools: tools, Store: store.NewMemory(nil)})
	if err != nil {
		t.Fatal(err)
	}
	var relations map[string]any
	_ = json.Unmarshal([]byte(`{"relations":[{"from":"a","to":"b","relationType":"knows"}]}`), &relations)
	d := e.Decide(ctx, engine.Call{Run: "r1", Actor: "agent", Tool: "create_relations", Args: relations})
	if d.Action != engine.Allow || d.Manifest == nil || d.Manifest.Tool != "create_relations" || len(d.Violations) != 0 {
		t.Errorf("create_relations (approved): %+v", d)
	}
	d = e.Decide(ctx, engine.Call{Run: "r1", Actor: "agent", Tool: "create_entities", Args: map[string]any{"entities": []any{}}})
	if d.Action != engine.Block || !d.Unclassified {
		t.Errorf("create_entities (draft only): %+v, want blocked without a manifest", d)
	}
}

// --gateway-config names tools as the gateway exposes them: the seed's line
// `drafts/fs.write_file.yaml medium`.
func TestSuggestManifestGatewayConfigFilesystem(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	cmd, args, _ := upstreams.Filesystem(t, t.TempDir())
	b, _ := json.Marshal(map[string]any{"upstreams": []any{map[string]any{"name": "fs", "command": cmd, "args": args}}})
	if err := os.WriteFile("gateway.yaml", b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI("suggest-manifest", "--gateway-config", "gateway.yaml", "-o", "drafts")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) < 11 || lines[len(lines)-1] != "14 drafted, 0 skipped (already have manifests)" {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{"drafts/fs.write_file.yaml medium", "drafts/fs.create_directory.yaml medium", "drafts/fs.read_text_file.yaml medium"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("no line %q in\n%s", want, out)
		}
	}
	if code, out, errs = runCLI("validate", "drafts"); code != 0 || out != "ok: 14 tool manifests valid\n" {
		t.Fatalf("validate: %d %q %q", code, out, errs)
	}
	wf, _ := os.ReadFile("drafts/fs.write_file.yaml")
	for _, s := range []string{"tool: fs.write_file\n", "status: draft\n", "effect: irreversible # guessed: destructiveHint: true", "permission: fs:write # guessed from the tool's namespace"} {
		if !strings.Contains(string(wf), s) {
			t.Errorf("fs.write_file.yaml lacks %q:\n%s", s, wf)
		}
	}
}

func TestSuggestManifestNeedsUpstreamAndOut(t *testing.T) {
	code, _, errs := runCLI("suggest-manifest", "-o", "x")
	if code != 1 || !strings.Contains(errs, "no upstream: give --upstream-cmd") {
		t.Errorf("%d %q", code, errs)
	}
	code, _, errs = runCLI("suggest-manifest", "--upstream-url", "http://127.0.0.1:1/mcp")
	if code != 1 || !strings.Contains(errs, "-o DIR is required") {
		t.Errorf("%d %q", code, errs)
	}
}
