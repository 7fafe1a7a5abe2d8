package proxy

import (
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tool metadata pass-through (issue 19). An upstream tool reaches the agent's tools/list as the
// upstream listed it, only renamed to its exposed name: title, description, inputSchema,
// outputSchema, annotations, icons, _meta, execution (MCP 2025-11-25, which go-sdk v1.8.0's
// mcp.Tool has no field for) and any field a later protocol version adds. The gateway keeps
// each tool's JSON as the upstream sent it: upstream.list gives every tools/list page a rawSlot
// with keep, which the connection fills with the page's raw result (stdio: passthroughConn;
// HTTP: bodyLimitTransport), and listMiddleware sends those bytes instead of encoding the
// SDK's decoded tools. A tool whose JSON was not kept (a page that did not decode as expected)
// is sent as decoded, which loses only the fields mcp.Tool lacks.
//
// Output schemas are advertised by default. The gateway checks structured results against them
// itself and drops structuredContent that breaks the schema (the call has happened; the text
// content stays and the mismatch is journaled: seed "MCP gateway", Schema validation). A
// client that validates results (the TypeScript SDK's Client.callTool, 1.32.2) then throws
// "Tool <name> has an output schema but did not return structured content", so the agent loses
// the result of a call that took effect. For such clients gateway.yaml's `output_schemas: hide`
// (ReversiGateway spec.outputSchemas: hide) lists upstream tools without outputSchema; the
// gateway still checks and journals results against the upstream's schemas.

// listedTool is one upstream tool as the gateway lists it: full, and hidden (the same without
// outputSchema; full itself when the tool has none).
type listedTool struct {
	full, hidden json.RawMessage
}

// rawTools returns the JSON of each of tools as page (the raw tools/list result they were
// decoded from) holds it, by index; nil entries, or nil when page does not decode into as many
// tools with the same names in the same order.
func rawTools(page json.RawMessage, tools []*mcp.Tool) []json.RawMessage {
	out := make([]json.RawMessage, len(tools))
	if page == nil {
		return out
	}
	var p struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if json.Unmarshal(page, &p) != nil || len(p.Tools) != len(tools) {
		return out
	}
	for i, raw := range p.Tools {
		var named struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(raw, &named) != nil || named.Name != tools[i].Name {
			return make([]json.RawMessage, len(tools))
		}
		out[i] = raw
	}
	return out
}

// listingBytes is the size of a page's tools as JSON for limits.listing_bytes: the kept bytes
// where there are some (they are what the gateway holds), else the decoded tools re-encoded.
func listingBytes(tools []*mcp.Tool, raws []json.RawMessage) int64 {
	var n int64
	for i, t := range tools {
		if i < len(raws) && raws[i] != nil {
			n += int64(len(raws[i]))
		} else if b, err := json.Marshal(t); err == nil {
			n += int64(len(b))
		}
	}
	return n
}

// exposeTool renames raw, an upstream tool's JSON, to name and makes its hidden form. Errors:
// raw is not a JSON object.
func exposeTool(raw json.RawMessage, name string) (listedTool, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return listedTool{}, fmt.Errorf("the tool's JSON is not an object: %w", err)
	}
	n, err := json.Marshal(name)
	if err != nil {
		return listedTool{}, err
	}
	m["name"] = n
	var lt listedTool
	if lt.full, err = json.Marshal(m); err != nil {
		return listedTool{}, err
	}
	lt.hidden = lt.full
	if _, ok := m["outputSchema"]; ok {
		delete(m, "outputSchema")
		if lt.hidden, err = json.Marshal(m); err != nil {
			return listedTool{}, err
		}
	}
	return lt, nil
}

// listedToolsResult is a tools/list result whose tools are sent as JSON the gateway holds.
type listedToolsResult struct {
	*mcp.ListToolsResult // the SDK's page: cursor, _meta, cache fields (its Tools are not sent)
	tools                []json.RawMessage
}

// MarshalJSON encodes the SDK's page with tools in place of its decoded tools.
func (r *listedToolsResult) MarshalJSON() ([]byte, error) {
	stand := *r.ListToolsResult
	stand.Tools = []*mcp.Tool{}
	b, err := json.Marshal(&stand)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m["tools"], err = json.Marshal(r.tools); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// toolJSON is how listMiddleware lists t, a tool the SDK's server listed: its kept JSON when
// t is the tool ts routes under its name (hidden when hide), otherwise t encoded (without its
// outputSchema when hide and t is an upstream tool).
func toolJSON(ts *toolSet, t *mcp.Tool, hide bool) (json.RawMessage, error) {
	r := ts.routes[t.Name]
	if r != nil && r.tool == t {
		if lt, ok := ts.listed[t.Name]; ok {
			if hide {
				return lt.hidden, nil
			}
			return lt.full, nil
		}
	}
	if hide && r != nil && t.OutputSchema != nil {
		c := *t // the registered tool is shared: change a copy
		c.OutputSchema = nil
		t = &c
	}
	return json.Marshal(t)
}

// listing returns the upstream's last tool list and its tools' kept JSON (same indexes; nil
// entries where not kept), read together.
func (u *upstream) listing() ([]*mcp.Tool, []json.RawMessage) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.tools, u.raw
}
