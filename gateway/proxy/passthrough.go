package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	fastjson "github.com/segmentio/encoding/json"
)

// Result pass-through (stdio upstreams). A forwarded call's result is bytes the gateway only
// inspects: whether it is an error, its structuredContent (output schema check, $result values)
// and, rarely, a single text block. Decoding the whole result into the SDK's types and encoding
// it again for the agent was the largest CPU cost of a call (issue 5's benchmark). Instead the
// upstream connection hands forward the result's raw bytes, forward decodes only what the call
// path reads, and the agent gets the upstream's bytes back (with the gateway's own changes:
// structuredContent dropped, an advisory block added).
//
// Only stdio upstreams are wrapped: the SDK type-asserts its Streamable HTTP client connection
// to an unexported interface, which a wrapper would hide.

// rawSlot receives the raw result of one tools/call, or with keep of one tools/list page, sent
// with it in its context.
type rawSlot struct {
	raw    json.RawMessage // set by the reading goroutine before the SDK delivers the response
	forget func()          // set by Write: drops the slot from its connection's pending calls
	// keep leaves the result to the SDK as well (a tools/list page, whose raw tools keep the
	// fields the SDK's types lack: toolmeta.go). HTTP upstreams fill only such slots.
	keep bool
}

// release drops the slot from its connection once the call has returned, answered or not (a
// call cancelled or timed out would otherwise stay pending for the connection's life).
func (s *rawSlot) release() {
	if s.forget != nil {
		s.forget()
	}
}

// fill keeps the result of m when it answers (HTTP: any answer on the stream of the POST
// that carried the slot answers that POST's request). s may be nil.
func (s *rawSlot) fill(m jsonrpc.Message) {
	if r, ok := m.(*jsonrpc.Response); ok && s != nil && r.Error == nil {
		s.raw = r.Result
	}
}

type rawSlotKey struct{}

// passthroughTransport wraps a stdio upstream's transport (see Result pass-through). progress
// is told of each progress notification as it is read (dialer.progress).
type passthroughTransport struct {
	mcp.Transport
	progress func(token string)
	owner    func() string // stamps what is read (owner.go); nil: nothing is stamped
}

func (t passthroughTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &passthroughConn{Connection: c, pending: map[jsonrpc.ID]*rawSlot{}, progress: t.progress, owner: t.owner}, nil
}

// pendingCalls is the number of tools/call slots waiting for an answer.
func (c *passthroughConn) pendingCalls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// passthroughConn notes the slot of each tools/call written with one and fills it from the
// response, which the SDK then decodes as an empty result.
type passthroughConn struct {
	mcp.Connection
	mu       sync.Mutex
	pending  map[jsonrpc.ID]*rawSlot
	progress func(token string)
	owner    func() string
}

func (c *passthroughConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() && (req.Method == "tools/call" || req.Method == "tools/list") {
		if slot, ok := ctx.Value(rawSlotKey{}).(*rawSlot); ok {
			c.mu.Lock()
			c.pending[req.ID] = slot
			c.mu.Unlock()
			id := req.ID
			slot.forget = func() { c.forget(id) } // the caller's goroutine: forward reads it after CallTool
			err := c.Connection.Write(ctx, msg)
			if err != nil {
				c.forget(req.ID)
			}
			return err
		}
	}
	return c.Connection.Write(ctx, msg)
}

func (c *passthroughConn) forget(id jsonrpc.ID) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// emptyResult is what the SDK decodes in place of a passed-through result.
var emptyResult = json.RawMessage(`{"content":[]}`)

func (c *passthroughConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if c.progress != nil {
		if tok, ok := progressToken(msg); ok {
			c.progress(tok)
		}
	}
	if req, ok := msg.(*jsonrpc.Request); ok && c.owner != nil {
		stampOwner(req, c.owner())
	}
	resp, ok := msg.(*jsonrpc.Response)
	if !ok || !resp.ID.IsValid() {
		return msg, err
	}
	c.mu.Lock()
	slot := c.pending[resp.ID]
	delete(c.pending, resp.ID) // answered (or failed): the id may be reused
	c.mu.Unlock()
	switch {
	case slot == nil || resp.Error != nil || len(resp.Result) == 0:
	case slot.keep:
		slot.raw = resp.Result // the SDK decodes the same bytes; neither side changes them
	case completeResult(resp.Result):
		slot.raw = resp.Result
		resp.Result = emptyResult
	}
	return msg, err
}

// completeResult reports whether raw is a final result: its own resultType (not a member of
// that name in structuredContent, say) is absent or "complete". Any other resultType (a
// multi-round-trip input_required) stays with the SDK, which handles it. Without the name in its
// bytes (nor an escape that could spell it) raw is not decoded.
func completeResult(raw json.RawMessage) bool {
	if !bytes.Contains(raw, []byte(`"resultType"`)) && !bytes.Contains(raw, []byte(`\u`)) {
		return true
	}
	var p struct {
		ResultType json.RawMessage `json:"resultType"`
	}
	if exactUnmarshal(raw, &p, fastjson.DontCopyRawMessage) != nil {
		return false
	}
	return p.ResultType == nil || resultComplete(p.ResultType)
}

// resultComplete reports whether the value of a result's resultType member is null or
// "complete" (escapes read as encoding/json reads them); any other value is not a final result.
func resultComplete(v json.RawMessage) bool {
	switch string(v) {
	case "null", `"complete"`:
		return true
	}
	var s *string
	if json.Unmarshal(v, &s) != nil {
		return false
	}
	return s == nil || *s == "complete"
}

// exactUnmarshal is fastjson.Unmarshal with member names matched exactly, as the SDK's decoder
// and the agents' clients match them: "StructuredContent" or "ISERROR" is another member than
// the protocol's, which a case-insensitive decoder would take in its place (the last one given
// wins), so that the gateway would check and journal a member the agent never reads.
// flags adds parse flags (the zero-copy ones, where v may alias b: b must then stay unchanged
// while v is used).
func exactUnmarshal(b []byte, v any, flags ...fastjson.ParseFlags) error {
	f := fastjson.DontMatchCaseInsensitiveStructFields
	for _, x := range flags {
		f |= x
	}
	rest, err := fastjson.Parse(b, v, f)
	if err == nil && len(bytes.TrimSpace(rest)) > 0 {
		err = fmt.Errorf("json: invalid character %q after top-level value", rest[0])
	}
	return err
}

// passedResult is what the gateway reads of a passed-through result: ResultType and Meta only
// for their presence (envelopeMembers), so that the reply needs no second pass.
type passedResult struct {
	IsError           bool            `json:"isError"`
	StructuredContent any             `json:"structuredContent"` // null and absent: nil
	ResultType        json.RawMessage `json:"resultType"`
	Meta              json.RawMessage `json:"_meta"`
}

// lightResult decodes what the call path reads of raw: isError and structuredContent (as any,
// for the output schema check and $result values), and which envelope members raw has (for the
// reply's splice) and whether it is a final result (env.incomplete, completeResult's answer
// from the same pass). Content stays undecoded: Content is an empty (non-nil) slice, so the SDK's
// server sends the result as returned (see passMiddleware). It decodes with segmentio/encoding
// (as the SDK does), which skips the members it does not keep several times faster than
// encoding/json, and without copies: the strings of structuredContent alias raw, which the
// call path never changes (its edits make new bytes: rawEdit).
func lightResult(raw json.RawMessage) (*mcp.CallToolResult, envelopeMembers, error) {
	var p passedResult // one pass: structuredContent is decoded where it stands
	if err := exactUnmarshal(raw, &p, fastjson.ZeroCopy); err != nil {
		return nil, envelopeMembers{}, err
	}
	env := envelopeMembers{known: true, resultType: p.ResultType != nil, meta: p.Meta != nil,
		incomplete: p.ResultType != nil && !resultComplete(p.ResultType)}
	return &mcp.CallToolResult{IsError: p.IsError, Content: []mcp.Content{}, StructuredContent: p.StructuredContent}, env, nil
}

// envelopeMembers says which of the members the SDK's server may add (resultType, `_meta`) a
// raw result object has of its own. The zero value is not known: splice reads raw for it.
type envelopeMembers struct {
	known, resultType, meta bool
	// incomplete (lightResult's): raw's own resultType is neither null nor "complete", as
	// completeResult reads it, so raw is not a final result.
	incomplete bool
}

// envelope reads which envelope members raw, a result object, has.
func envelope(raw json.RawMessage) (envelopeMembers, error) {
	var p struct {
		ResultType json.RawMessage `json:"resultType"`
		Meta       json.RawMessage `json:"_meta"`
	}
	err := exactUnmarshal(raw, &p, fastjson.DontCopyRawMessage)
	return envelopeMembers{known: err == nil, resultType: p.ResultType != nil, meta: p.Meta != nil}, err
}

// fullResult decodes raw as the SDK would have.
func fullResult(raw json.RawMessage) (*mcp.CallToolResult, error) {
	var res mcp.CallToolResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// rawEdit changes members of a raw result: nil drops one, a value replaces it.
func rawEdit(raw json.RawMessage, members map[string]json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	for k, v := range members {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return json.Marshal(m)
}

// rawAppendText appends a text block to raw's content.
func rawAppendText(raw json.RawMessage, text string) (json.RawMessage, error) {
	var r struct {
		Content []json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	block, err := json.Marshal(&mcp.TextContent{Text: text})
	if err != nil {
		return nil, err
	}
	content, err := json.Marshal(append(r.Content, block))
	if err != nil {
		return nil, err
	}
	return rawEdit(raw, map[string]json.RawMessage{"content": content})
}

// passHolder carries a passed-through result from the tool handler to passMiddleware.
type passHolder struct {
	res *mcp.CallToolResult
	raw json.RawMessage
	env envelopeMembers // raw's own envelope members
}

type passHolderKey struct{}

// passThrough asks passMiddleware to send raw as the result res stands for.
// env is which envelope members raw has (lightResult's; the call path's edits keep them).
func passThrough(ctx context.Context, res *mcp.CallToolResult, raw json.RawMessage, env envelopeMembers) {
	if h, ok := ctx.Value(passHolderKey{}).(*passHolder); ok {
		h.res, h.raw, h.env = res, raw, env
	}
}

// rawResult is a tools/call result sent as the upstream's bytes.
type rawResult struct {
	*mcp.CallToolResult
	raw json.RawMessage
	env envelopeMembers // raw's own envelope members
}

// MarshalJSON returns the raw result with what the SDK's server set on the stand-in result (for
// clients of protocol 2026-07-28 on: resultType and the server's _meta entry) added where the
// raw result lacks it, as the SDK does for a result it encodes.
func (r *rawResult) MarshalJSON() ([]byte, error) {
	stand, err := json.Marshal(r.CallToolResult) // small: its content is empty
	if err != nil {
		return nil, err
	}
	var set resultAdditions
	if err := json.Unmarshal(stand, &set); err != nil {
		return nil, err
	}
	return set.splice(r.raw, r.env)
}

// resultAdditions are the members the SDK's server adds to a result: resultType and `_meta`
// entries (nil: none).
type resultAdditions struct {
	ResultType json.RawMessage            `json:"resultType"`
	Meta       map[string]json.RawMessage `json:"_meta"`
}

// splice adds set's members to raw, a result object whose own envelope members are env (read
// from raw when not known), where raw lacks them; raw's own bytes stay as they are in the
// common case (no `_meta` of its own).
func (set resultAdditions) splice(raw json.RawMessage, env envelopeMembers) ([]byte, error) {
	if set.ResultType == nil && len(set.Meta) == 0 {
		return raw, nil
	}
	if !env.known {
		var err error
		if env, err = envelope(raw); err != nil {
			return nil, err
		}
	}
	hasType, hasMeta := env.resultType, env.meta
	if !hasMeta || len(set.Meta) == 0 {
		// The common case: add the members in front, leaving the upstream's bytes as they are.
		var head bytes.Buffer
		head.WriteByte('{')
		if !hasType && set.ResultType != nil {
			head.WriteString(`"resultType":`)
			head.Write(set.ResultType)
			head.WriteByte(',')
		}
		if len(set.Meta) > 0 {
			meta, err := json.Marshal(set.Meta)
			if err != nil {
				return nil, err
			}
			head.WriteString(`"_meta":`)
			head.Write(meta)
			head.WriteByte(',')
		}
		body := bytes.TrimSpace(raw)[1:]                         // after '{'
		if bytes.HasPrefix(bytes.TrimSpace(body), []byte("}")) { // an empty object
			head.Truncate(head.Len() - 1)
		}
		head.Write(body)
		return head.Bytes(), nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if _, ok := m["resultType"]; !ok && set.ResultType != nil {
		m["resultType"] = set.ResultType
	}
	if len(set.Meta) > 0 {
		meta := map[string]json.RawMessage{}
		if old, ok := m["_meta"]; ok {
			if err := json.Unmarshal(old, &meta); err != nil {
				return nil, err
			}
		}
		for k, v := range set.Meta {
			if _, ok := meta[k]; !ok {
				meta[k] = v
			}
		}
		var err error
		if m["_meta"], err = json.Marshal(meta); err != nil {
			return nil, err
		}
	}
	return json.Marshal(m)
}

// passMiddleware gives each tools/call a passHolder and, when the handler filled it, sends
// the raw bytes instead of encoding the result.
func (g *Gateway) passMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		h := &passHolder{}
		res, err := next(context.WithValue(ctx, passHolderKey{}, h), method, req)
		if err == nil && h.raw != nil {
			if r, ok := res.(*mcp.CallToolResult); ok && r == h.res {
				return &rawResult{CallToolResult: r, raw: h.raw, env: h.env}, nil
			}
		}
		return res, err
	}
}
