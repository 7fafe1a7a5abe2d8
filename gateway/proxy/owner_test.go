package proxy

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// oneMessageConn is a Connection that reads msg once.
type oneMessageConn struct {
	mcp.Connection
	msg jsonrpc.Message
}

func (c *oneMessageConn) Read(context.Context) (jsonrpc.Message, error) { return c.msg, nil }

// TestOwnerStamps: what a shared session reads is stamped with its owner in place of what the
// upstream wrote there, on stdio (passthroughConn) and in an SSE event (ids and other lines
// kept); the handlers take the stamp out; other methods are left as they are.
func TestOwnerStamps(t *testing.T) {
	forged := `{"level":"info","data":"x","_meta":{"reversi/owner":"forged","k":"v"}}`
	c := &passthroughConn{Connection: &oneMessageConn{msg: &jsonrpc.Request{Method: "notifications/message", Params: json.RawMessage(forged)}},
		owner: func() string { return "agent-1" }}
	msg, _ := c.Read(context.Background())
	var p mcp.LoggingMessageParams
	if err := json.Unmarshal(msg.(*jsonrpc.Request).Params, &p); err != nil {
		t.Fatal(err)
	}
	if got := takeOwner(&p); got != "agent-1" || p.Meta["k"] != "v" || p.Meta[ownerMeta] != nil || p.Data != "x" {
		t.Errorf("stdio: owner %q, params %+v", got, p)
	}
	roots := &jsonrpc.Request{Method: "roots/list"} // no params at all
	stampOwner(roots, ownerSeveral)
	if !strings.Contains(string(roots.Params), `"reversi/owner":"several"`) {
		t.Errorf("roots/list without params: %s", roots.Params)
	}
	call := &jsonrpc.Request{Method: "tools/call", Params: json.RawMessage(`{"name":"x"}`)}
	stampOwner(call, "agent-1")
	if string(call.Params) != `{"name":"x"}` {
		t.Errorf("another method was stamped: %s", call.Params)
	}
	ev := []byte("event: message\nid: 7\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\n" +
		"data: \"params\":{\"level\":\"info\",\"data\":1}}\n")
	evMsg, err := badEvent(ev)
	if err != nil {
		t.Fatal(err)
	}
	out := string(stampEvent(ev, evMsg, func() string { return "agent-2" }))
	if !strings.HasPrefix(out, "event: message\nid: 7\ndata: {") || strings.Count(out, "data:") != 1 || !strings.Contains(out, `"reversi/owner":"agent-2"`) || !strings.HasSuffix(out, "}\n") {
		t.Errorf("SSE event stamped as %q", out)
	}
	resp := []byte("data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
	respMsg, err := badEvent(resp)
	if err != nil {
		t.Fatal(err)
	}
	if string(stampEvent(resp, respMsg, func() string { return "a" })) != string(resp) {
		t.Errorf("a response was changed")
	}
	if takeOwner((*mcp.ListRootsParams)(nil)) != "" {
		t.Error("nil params")
	}
}
