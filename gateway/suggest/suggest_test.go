package suggest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/suggest"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// listed lists a real server's tools as the gateway names them.
func listed(t *testing.T, name string, namespace bool, cmd string, args, env []string) []suggest.Tool {
	t.Helper()
	u := config.Upstream{Name: name, Command: cmd, Args: args, Env: map[string]string{}, Namespace: namespace}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		u.Env[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tools, err := proxy.ListTools(ctx, &config.Gateway{Upstreams: []config.Upstream{u}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tools
}

func byTool(ds []suggest.Draft) map[string]suggest.Draft {
	m := map[string]suggest.Draft{}
	for _, d := range ds {
		m[d.Tool] = d
	}
	return m
}

// validateSet checks the drafts as one set, as `reversi validate DIR` does.
func validateSet(t *testing.T, ds []suggest.Draft) []*manifest.Manifest {
	t.Helper()
	var docs []manifest.Document
	for _, d := range ds {
		ds, errs := manifest.ParseFile(d.File, d.YAML)
		if len(errs) > 0 {
			t.Fatalf("%s: %v", d.File, errs)
		}
		docs = append(docs, ds...)
	}
	ms, errs := manifest.ValidateDocuments(docs)
	if len(errs) > 0 {
		t.Fatalf("drafts do not validate: %v", errs)
	}
	return ms
}

func TestMemoryDrafts(t *testing.T) {
	cmd, args, env := upstreams.Memory(t)
	tools := listed(t, config.FlagUpstreamName, false, cmd, args, env)
	res := suggest.Suggest(tools, nil)
	if len(res.Drafts) != 9 || len(res.Skipped) != 0 || len(res.Refused) != 0 {
		t.Fatalf("drafts %d, skipped %v, refused %v; want 9, none, none", len(res.Drafts), res.Skipped, res.Refused)
	}
	ms := validateSet(t, res.Drafts)
	hashes := map[string]string{}
	for _, tl := range tools {
		h, err := engine.SchemaHash(tl.Tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		hashes[tl.Tool.Name] = h
	}
	for _, m := range ms {
		if m.Status != manifest.Draft || m.SchemaHash != hashes[m.Tool] {
			t.Errorf("%s: status %s, schema_hash %q; want draft and %q", m.Tool, m.Status, m.SchemaHash, hashes[m.Tool])
		}
	}
	d := byTool(res.Drafts)
	type want struct {
		effect     manifest.Effect
		confidence suggest.Confidence
		permission string
		undo       string
	}
	for tool, w := range map[string]want{
		"create_relations":    {manifest.Compensable, suggest.Medium, "memory:write", "delete_relations"},
		"create_entities":     {manifest.Compensable, suggest.Low, "memory:write", "delete_entities"},
		"add_observations":    {manifest.Compensable, suggest.Low, "memory:write", "delete_observations"},
		"delete_entities":     {manifest.Irreversible, suggest.Medium, "memory:write", ""},
		"delete_relations":    {manifest.Irreversible, suggest.Medium, "memory:write", ""},
		"delete_observations": {manifest.Irreversible, suggest.Medium, "memory:write", ""},
		"read_graph":          {manifest.ReadOnly, suggest.Medium, "memory:read", ""},
		"search_nodes":        {manifest.ReadOnly, suggest.Medium, "memory:read", ""},
		"open_nodes":          {manifest.ReadOnly, suggest.Medium, "memory:read", ""},
	} {
		m := d[tool].Manifest
		undo := ""
		if m.Compensation != nil {
			undo = m.Compensation.Tool
		}
		if m.Effect != w.effect || d[tool].Confidence != w.confidence || m.Permission != w.permission || undo != w.undo {
			t.Errorf("%s: effect %s, confidence %s, permission %s, undo %q; want %+v", tool, m.Effect, d[tool].Confidence, m.Permission, undo, w)
		}
	}
	// The same shape on both sides maps straight through; a TODO residue asks for the rest.
	cr := d["create_relations"].Manifest.Compensation
	if cr.ArgumentMap["relations"] != "$args.relations" || len(cr.ArgumentMap) != 1 || !strings.HasPrefix(cr.Residue[0], "TODO") {
		t.Errorf("create_relations compensation = %+v", cr)
	}
	// entityNames cannot be found in create_entities' call: said in a TODO comment, not guessed.
	ce := string(d["create_entities"].YAML)
	if !strings.Contains(ce, "# TODO: entityNames (required by delete_entities)") || d["create_entities"].Manifest.Compensation.ArgumentMap != nil {
		t.Errorf("create_entities draft:\n%s", ce)
	}
	for _, s := range []string{"status: draft", "# confidence: low", "# guessed:", "schema_hash: " + hashes["create_entities"]} {
		if !strings.Contains(ce, s) {
			t.Errorf("create_entities draft lacks %q:\n%s", s, ce)
		}
	}
	if m := d["delete_entities"].Manifest; !m.Approval.Required {
		t.Errorf("delete_entities: approval %+v, want always", m.Approval)
	}

	// With the drafts as manifests, nothing is left to draft.
	again := suggest.Suggest(tools, ms)
	if len(again.Drafts) != 0 || len(again.Skipped) != 9 {
		t.Errorf("second run: %d drafts, %d skipped; want 0 and 9", len(again.Drafts), len(again.Skipped))
	}
	if got := suggest.Drafts(tools, ms[:3]); len(got) != 6 {
		t.Errorf("Drafts with 3 manifests: %d drafts, want 6", len(got))
	}
}

func TestFilesystemDrafts(t *testing.T) {
	cmd, args, env := upstreams.Filesystem(t, t.TempDir())
	tools := listed(t, "fs", true, cmd, args, env)
	res := suggest.Suggest(tools, nil)
	if len(res.Drafts) != len(tools) || len(tools) < 10 || len(res.Refused) != 0 {
		t.Fatalf("%d drafts for %d tools, refused %v", len(res.Drafts), len(tools), res.Refused)
	}
	validateSet(t, res.Drafts)
	d := byTool(res.Drafts)
	for tool, w := range map[string]struct {
		effect     manifest.Effect
		confidence suggest.Confidence
		permission string
	}{
		"fs.write_file":       {manifest.Irreversible, suggest.Medium, "fs:write"},
		"fs.move_file":        {manifest.Irreversible, suggest.Medium, "fs:write"},
		"fs.create_directory": {manifest.Idempotent, suggest.Medium, "fs:write"},
		"fs.read_text_file":   {manifest.ReadOnly, suggest.Medium, "fs:read"},
		"fs.directory_tree":   {manifest.ReadOnly, suggest.Medium, "fs:read"},
	} {
		got, ok := d[tool]
		if !ok {
			t.Errorf("no draft for %s", tool)
			continue
		}
		if got.Manifest.Effect != w.effect || got.Confidence != w.confidence || got.Manifest.Permission != w.permission {
			t.Errorf("%s: %s %s %s, want %+v", tool, got.Manifest.Effect, got.Confidence, got.Manifest.Permission, w)
		}
		if got.File != tool+".yaml" {
			t.Errorf("%s: file %s", tool, got.File)
		}
	}
}

// schema is an object schema with the given string properties, all required.
func schema(props ...string) map[string]any {
	p := map[string]any{}
	var req []any
	for _, k := range props {
		p[k] = map[string]any{"type": "string"}
		req = append(req, k)
	}
	return map[string]any{"type": "object", "properties": p, "required": req}
}

func tool(name string, in map[string]any, a *mcp.ToolAnnotations, meta mcp.Meta, desc string) suggest.Tool {
	return suggest.Tool{Upstream: "shop", Tool: &mcp.Tool{Name: name, InputSchema: in, Annotations: a, Meta: meta, Description: desc}}
}

func ptr[T any](v T) *T { return &v }

// The mcp-compensate convention in its three forms, and name-only guesses. The tools are
// written here because no installed server uses the convention.
func TestConvention(t *testing.T) {
	mutating := &mcp.ToolAnnotations{DestructiveHint: ptr(false)}
	tools := []suggest.Tool{
		tool("shop.place_order", schema("sku"), mutating, mcp.Meta{suggest.MetaKey: map[string]any{
			"tool": "cancel_order", "argument_map": map[string]any{"order_id": "$result.id"}}}, "Place an order."),
		tool("shop.cancel_order", schema("order_id"), &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true}, nil, "Cancel."),
		tool("shop.book", schema("slot"), mutating, mcp.Meta{suggest.CommunityMetaKey: map[string]any{
			"reversibility": "compensable",
			"compensation":  map[string]any{"toolName": "unbook", "parameterMapping": map[string]any{"slot": "$.input.slot", "booking": "$.output.structuredContent.id"}},
			"notes":         "the customer got a confirmation email"}}, "Book a slot."),
		tool("shop.unbook", schema("slot", "booking"), nil, nil, "Unbook."),
		tool("shop.tag", schema("tag"), mutating, nil, "Tag it.\nmcp-compensate: untag"),
		tool("shop.untag", schema("tag"), mutating, nil, "Untag."),
		tool("shop.refund", schema("charge"), mutating, mcp.Meta{suggest.MetaKey: "no_such_tool"}, "Refund."),
		tool("shop.email", schema("to"), mutating, mcp.Meta{suggest.CommunityMetaKey: map[string]any{"reversibility": "irreversible"}}, "Send."),
		tool("shop.get_order", schema("id"), nil, nil, "Read one order."),
	}
	res := suggest.Suggest(tools, nil)
	validateSet(t, res.Drafts)
	d := byTool(res.Drafts)

	po := d["shop.place_order"]
	if po.Confidence != suggest.High || po.Manifest.Compensation.Tool != "shop.cancel_order" || po.Manifest.Compensation.ArgumentMap["order_id"] != "$result.id" {
		t.Errorf("place_order: %s %+v", po.Confidence, po.Manifest.Compensation)
	}
	bk := d["shop.book"].Manifest.Compensation
	if d["shop.book"].Confidence != suggest.High || bk.Tool != "shop.unbook" || bk.ArgumentMap["slot"] != "$args.slot" ||
		bk.ArgumentMap["booking"] != "$result.id" || bk.Residue[0] != "the customer got a confirmation email" {
		t.Errorf("book: %s %+v", d["shop.book"].Confidence, bk)
	}
	// The description form gives no argument_map: guessed from shared names, so not high.
	tg := d["shop.tag"]
	if tg.Confidence != suggest.Medium || tg.Manifest.Compensation.Tool != "shop.untag" || tg.Manifest.Compensation.ArgumentMap["tag"] != "$args.tag" {
		t.Errorf("tag: %s %+v", tg.Confidence, tg.Manifest.Compensation)
	}
	// A named undo the server does not offer is not used, and the comments say so.
	rf := d["shop.refund"]
	if rf.Manifest.Effect != manifest.Irreversible || rf.Confidence != suggest.Low || !strings.Contains(string(rf.YAML), "offers no such tool") {
		t.Errorf("refund: %s\n%s", rf.Manifest.Effect, rf.YAML)
	}
	if d["shop.email"].Manifest.Effect != manifest.Irreversible || d["shop.email"].Confidence != suggest.High {
		t.Errorf("email: %s %s", d["shop.email"].Manifest.Effect, d["shop.email"].Confidence)
	}
	// No annotations: guessed from the name, low.
	if g := d["shop.get_order"]; g.Manifest.Effect != manifest.ReadOnly || g.Confidence != suggest.Low || g.Manifest.Permission != "shop:read" {
		t.Errorf("get_order: %s %s %s", g.Manifest.Effect, g.Confidence, g.Manifest.Permission)
	}
	if u := d["shop.unbook"]; u.Manifest.Effect != manifest.Irreversible || u.Confidence != suggest.Low {
		t.Errorf("unbook: %s %s", u.Manifest.Effect, u.Confidence)
	}
}

// Annotations that contradict the name lower the confidence; a name that is not a manifest
// tool name is refused, not written.
func TestContradictionAndRefusal(t *testing.T) {
	tools := []suggest.Tool{
		tool("delete_all", schema(), &mcp.ToolAnnotations{ReadOnlyHint: true}, nil, "Deletes everything."),
		tool("get thing", schema(), &mcp.ToolAnnotations{ReadOnlyHint: true}, nil, ""),
	}
	res := suggest.Suggest(tools, nil)
	if len(res.Drafts) != 1 || len(res.Refused) != 1 || res.Refused[0].Tool != "get thing" {
		t.Fatalf("drafts %d, refused %v", len(res.Drafts), res.Refused)
	}
	if d := res.Drafts[0]; d.Confidence != suggest.Low || !strings.Contains(string(d.YAML), `readOnlyHint: true, but the name starts with "delete"`) {
		t.Errorf("delete_all: %s\n%s", d.Confidence, d.YAML)
	}
}
