package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Tool metadata pass-through (issue 19, toolmeta.go): every field of an upstream tool reaches
// the agent's tools/list as the upstream sent it, renamed, over each way the gateway reads
// upstreams (stdio, HTTP answering with JSON, HTTP answering with SSE); output_schemas: hide
// removes only outputSchema.

const initLatest = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// toolsByName decodes a tools/list result into each tool's JSON object by name.
func toolsByName(t *testing.T, result json.RawMessage) map[string]map[string]any {
	t.Helper()
	var r struct {
		Tools []map[string]any `json:"tools"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		t.Fatalf("tools/list result %s: %v", result, err)
	}
	out := map[string]map[string]any{}
	for _, tool := range r.Tools {
		out[tool["name"].(string)] = tool
	}
	return out
}

// directStdioTools lists the tools of a stdio server with raw JSON-RPC lines, as the server
// sends them.
func directStdioTools(t *testing.T, cmd string, args, env []string) map[string]map[string]any {
	t.Helper()
	c := upstreams.Command(cmd, args, env)
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(); _ = c.Process.Kill(); _ = c.Wait() })
	_, _ = io.WriteString(in, initLatest+"\n"+`{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n"+`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`+"\n")
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	timer := time.AfterFunc(20*time.Second, func() { _ = c.Process.Kill() })
	defer timer.Stop()
	for sc.Scan() {
		var r rpcReply
		if json.Unmarshal(sc.Bytes(), &r) == nil && string(r.ID) == "2" {
			return toolsByName(t, r.Result)
		}
	}
	t.Fatalf("%s: no tools/list answer: %v", cmd, sc.Err())
	return nil
}

// directHTTPTools lists the tools of a Streamable HTTP server with raw POSTs.
func directHTTPTools(t *testing.T, url string) map[string]map[string]any {
	t.Helper()
	res := post(t, url, initLatest)
	hdr := []string{"Mcp-Protocol-Version", "2025-11-25"}
	if sid := res.Header.Get("Mcp-Session-Id"); sid != "" {
		hdr = append(hdr, "Mcp-Session-Id", sid)
	}
	_ = readBody(t, res)
	post(t, url, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr...)
	return toolsByName(t, httpReply(t, post(t, url, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, hdr...)).Result)
}

// gatewayTools lists the tools of a gateway's /mcp over HTTP with raw POSTs.
func gatewayTools(t *testing.T, gw *Gateway) map[string]map[string]any {
	t.Helper()
	return directHTTPTools(t, serveHTTP(t, gw)+PathAgent)
}

func TestToolMetadataPassesThrough(t *testing.T) {
	hostile := upstreams.Hostile(t)
	jsonURL := hostileHTTP(t, "-list", "described")
	sseURL := hostileHTTP(t, "-list", "described", "-sse")
	ecmd, eargs, eenv := upstreams.Everything(t)
	direct := map[string]map[string]map[string]any{ // upstream -> tool -> JSON, as the upstream lists it
		"ev": directStdioTools(t, ecmd, eargs, eenv),
		"hs": directStdioTools(t, hostile, []string{"-list", "described"}, nil),
		"hj": directHTTPTools(t, jsonURL),
		"he": directHTTPTools(t, sseURL),
	}
	// The upstreams do list what this test is about.
	for up, tool := range map[string]string{"ev": "get-structured-content", "hs": "described", "hj": "described", "he": "described"} {
		d := direct[up][tool]
		for _, field := range []string{"title", "outputSchema", "annotations", "execution"} {
			if d[field] == nil {
				t.Fatalf("%s lists %s without %s: %v", up, tool, field, d)
			}
		}
		if tool == "described" && (d["icons"] == nil || d["_meta"] == nil || d["x-later"] == nil) {
			t.Fatalf("%s lists described without icons, _meta or x-later: %v", up, d)
		}
	}

	for _, setting := range []string{config.OutputSchemasAdvertise, config.OutputSchemasHide} {
		t.Run(setting, func(t *testing.T) {
			cfg := &config.Gateway{Mode: config.ModeObserve, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
				OutputSchemas: setting, Actor: "meta", Upstreams: []config.Upstream{
					stdioUpstream("ev", ecmd, eargs, eenv),
					{Name: "hs", Command: hostile, Args: []string{"-list", "described"}, Namespace: true},
					{Name: "hj", URL: jsonURL, Namespace: true},
					{Name: "he", URL: sseURL, Namespace: true},
				}}
			listed := gatewayTools(t, start(t, cfg, nil).gw)
			n := 0
			for up, tools := range direct {
				for name, want := range tools {
					exposed := up + "." + name
					got := listed[exposed]
					want = maps.Clone(want)
					want["name"] = exposed
					if setting == config.OutputSchemasHide {
						delete(want, "outputSchema")
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%s through the gateway:\n got %s\nwant %s", exposed, jsonOf(got), jsonOf(want))
					}
					n++
				}
			}
			if n < 4*len(direct) {
				t.Fatalf("compared %d tools", n)
			}
			if _, has := listed["ev.get-structured-content"]["outputSchema"]; has != (setting == config.OutputSchemasAdvertise) {
				t.Errorf("%s: ev.get-structured-content lists outputSchema: %v", setting, has)
			}
			// The gateway's own tools keep their output schemas either way.
			if listed[ToolListRuns]["outputSchema"] == nil {
				t.Errorf("%s: %s lost its output schema", setting, ToolListRuns)
			}
		})
	}
}

func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return strings.TrimSpace(string(b))
}
