package proxy

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestResultBytesPassThrough: the agent gets the upstream's content and structuredContent bytes,
// not a re-encoding (which would, for one, sort the keys of structuredContent's objects), with
// the envelope the SDK adds for the client's protocol (resultType, the gateway's serverInfo).
func TestResultBytesPassThrough(t *testing.T) {
	mem := filepath.Join(t.TempDir(), "memory.jsonl")
	graph := `{"type":"entity","name":"svc-b","entityType":"service","observations":["zeta","alpha"]}
{"type":"entity","name":"svc-a","entityType":"service","observations":["port 80"]}
{"type":"relation","from":"svc-b","to":"svc-a","relationType":"calls"}
`
	if err := os.WriteFile(mem, []byte(graph), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, args, env := upstreams.MemoryAt(t, mem)
	dcs, dlog := direct(t, cmd, args, env)
	call(t, dcs, "read_graph", map[string]any{})

	cfg := memoryConfig(t, config.ModeEnforce)
	cfg.Upstreams[0].Env = map[string]string{"MEMORY_FILE_PATH": mem}
	f := start(t, cfg, loadManifests(t))
	gcs, glog := f.wireClient(t)
	call(t, gcs, "memory.read_graph", map[string]any{})

	var g, d map[string]json.RawMessage
	through, upstream := glog.last(t), dlog.last(t)
	if err := json.Unmarshal(through, &g); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(upstream, &d); err != nil {
		t.Fatal(err)
	}
	if d["structuredContent"] == nil || !bytes.Contains(d["structuredContent"], []byte(`"name":"svc-b","entityType"`)) {
		t.Fatalf("read_graph's structuredContent is not in the upstream's key order, the test needs it: %s", upstream)
	}
	for _, k := range []string{"content", "structuredContent", "isError"} {
		if !bytes.Equal(g[k], d[k]) {
			t.Errorf("%s through the gateway differs from the upstream's:\n gateway: %s\nupstream: %s", k, g[k], d[k])
		}
	}
	if string(g["resultType"]) != `"complete"` || !bytes.Contains(g["_meta"], []byte(`"name":"`+Name+`"`)) {
		t.Errorf("the envelope the SDK adds is missing: resultType %s, _meta %s", g["resultType"], g["_meta"])
	}
	_, recs := onlyRun(t, f.store)
	if steps := stepsOf(recs, "memory.read_graph"); len(steps) != 1 || steps[0][1].Status != "succeeded" {
		t.Fatalf("ledger: %+v", recs)
	}
}

func TestRawEdits(t *testing.T) {
	raw := json.RawMessage(`{"content":[{"type":"text","text":"{\"id\":7}"}],"structuredContent":{"b":1,"a":2},"_meta":{"k":"v"}}`)
	got, err := rawAppendText(raw, "Reversi advisory")
	if err != nil {
		t.Fatal(err)
	}
	full, err := fullResult(got)
	if err != nil {
		t.Fatal(err)
	}
	if txt := texts(full); len(txt) != 2 || txt[1] != "Reversi advisory" || full.Meta["k"] != "v" || full.StructuredContent == nil {
		t.Fatalf("advisory appended: %s", got)
	}
	got, err = rawEdit(raw, map[string]json.RawMessage{"structuredContent": nil})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(got), "structuredContent") || !strings.Contains(string(got), `"_meta":{"k":"v"}`) {
		t.Fatalf("structuredContent dropped: %s", got)
	}
	if _, err := rawAppendText(json.RawMessage(`{"content":"not a list"}`), "x"); err == nil {
		t.Fatal("appending to content that is not a list must fail")
	}

	// $result from a single text block: the only case that decodes the content.
	light, _, err := lightResult(json.RawMessage(`{"content":[{"type":"text","text":"{\"id\":7}"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	m := &manifest.Manifest{Effect: manifest.Reversible, Compensation: &manifest.Compensation{Tool: "x.undo"}}
	v := resultFor(m, light, json.RawMessage(`{"content":[{"type":"text","text":"{\"id\":7}"}]}`))
	if obj, ok := v.(map[string]any); !ok || obj["id"] != float64(7) {
		t.Fatalf("$result from the text block: %#v", v)
	}
}

// TestRawResultEnvelope: what the SDK set on the stand-in result is added to the raw bytes
// where they lack it; an upstream's own _meta entries are kept, as the SDK keeps them.
func TestRawResultEnvelope(t *testing.T) {
	gw := json.RawMessage(`{"name":"reversi-gateway"}`)
	for _, c := range []struct{ raw, want string }{
		{`{"content":[{"type":"text","text":"x"}],"structuredContent":{"b":1,"a":2}}`,
			`{"_meta":{"k":{"name":"reversi-gateway"}},"content":[{"type":"text","text":"x"}],"structuredContent":{"b":1,"a":2}}`},
		{`{}`, `{"_meta":{"k":{"name":"reversi-gateway"}}}`},
		{`{"content":[],"_meta":{"x":1}}`, `{"_meta":{"k":{"name":"reversi-gateway"},"x":1},"content":[]}`},
		{`{"content":[],"_meta":{"k":"upstream"}}`, `{"_meta":{"k":"upstream"},"content":[]}`},
	} {
		r := &rawResult{CallToolResult: &mcp.CallToolResult{Content: []mcp.Content{}, Meta: mcp.Meta{"k": gw}}, raw: json.RawMessage(c.raw)}
		got, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("%s: %v", c.raw, err)
		}
		// The call path's way: the members as lightResult read them, with no second pass.
		_, env, err := lightResult(json.RawMessage(c.raw))
		if err != nil || !env.known || env.meta != strings.Contains(c.raw, `"_meta"`) {
			t.Fatalf("%s: lightResult's members %+v, %v", c.raw, env, err)
		}
		r.env = env
		if known, err := json.Marshal(r); err != nil || !bytes.Equal(known, got) {
			t.Errorf("%s: with the members known\n got %s (%v)\nwant %s", c.raw, known, err, got)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%s: not JSON: %s", c.raw, got)
		}
		if err := json.Unmarshal([]byte(c.want), &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s:\n got %s\nwant %s", c.raw, got, c.want)
		}
		if sc := `"structuredContent":{"b":1,"a":2}`; strings.Contains(c.raw, sc) && !strings.Contains(string(got), sc) {
			t.Errorf("the upstream's bytes were re-encoded: %s", got)
		}
	}
	// Nothing set on the stand-in (a client of an older protocol): the raw bytes as they are.
	raw := json.RawMessage(`{"content":[],"structuredContent":{"b":1,"a":2}}`)
	if got, _ := json.Marshal(&rawResult{CallToolResult: &mcp.CallToolResult{Content: []mcp.Content{}}, raw: raw}); !bytes.Equal(got, raw) {
		t.Errorf("got %s, want the raw result", got)
	}
}

// TestLightResultEnvelopeMembers: the envelope members lightResult reports (which the reply's
// splice then trusts without reading the result again) are the result's own top-level members
// as a JSON decoder sees them: null values, escaped and case-varied names, duplicates, and the
// same names inside structuredContent (a crafted upstream result could otherwise make the
// reply carry a second _meta or resultType).
func TestLightResultEnvelopeMembers(t *testing.T) {
	for _, raw := range []string{
		`{"content":[],"_meta":null}`,
		`{"content":[],"resultType":null}`,
		`{"content":[],"\u005fmeta":{"a":1}}`,
		`{"content":[],"_META":{"a":1}}`,
		`{"content":[],"_meta":{"a":1},"_meta":null}`,
		`{"content":[],"structuredContent":{"resultType":"x","_meta":{}}}`,
		`{"content":[],"resultTyp\u0065":"x"}`,
		`{"content":[],"structuredContent":"a\u0000b","_meta":{}}`,
	} {
		_, env, err := lightResult(json.RawMessage(raw))
		var m map[string]json.RawMessage
		if err != nil || json.Unmarshal([]byte(raw), &m) != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		_, meta := m["_meta"]
		_, resultType := m["resultType"]
		if !env.known || env.meta != meta || env.resultType != resultType {
			t.Errorf("%s: lightResult %+v, encoding/json sees _meta %v, resultType %v", raw, env, meta, resultType)
		}
	}
}

// TestLightResultComplete: the final-result answer lightResult gives from its one pass
// (env.incomplete) is completeResult's, for crafted results: resultType absent, null,
// "complete" written with an escape, other values, a member of that name spelled with an
// escape or inside structuredContent, duplicate members, and the wrong case.
func TestLightResultComplete(t *testing.T) {
	for raw, complete := range map[string]bool{
		`{"content":[]}`:                                        true,
		`{"content":[],"resultType":"complete"}`:                true,
		`{"content":[],"resultType":null}`:                      true,
		`{"content":[],"resultType":"\u0063omplete"}`:           true,
		`{"content":[],"resultType":"input_required"}`:          false,
		`{"content":[],"resultType":"COMPLETE"}`:                false,
		`{"content":[],"resultType":1}`:                         false,
		`{"content":[],"resultType":{}}`:                        false,
		`{"content":[],"resultTyp\u0065":"input_required"}`:     false,
		`{"content":[],"ResultType":"input_required"}`:          true,
		`{"content":[],"structuredContent":{"resultType":"x"}}`: true,
		// the last of duplicate members counts, as encoding/json reads the object
		`{"content":[],"resultType":"input_required","resultType":"complete"}`: true,
	} {
		if got := completeResult(json.RawMessage(raw)); got != complete {
			t.Errorf("%s: completeResult %v, want %v", raw, got, complete)
		}
		_, env, err := lightResult(json.RawMessage(raw))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if env.incomplete == complete {
			t.Errorf("%s: lightResult incomplete %v, completeResult %v", raw, env.incomplete, complete)
		}
	}
}
