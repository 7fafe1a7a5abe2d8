package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	fastjson "github.com/segmentio/encoding/json"
)

// Raw upstream calls (issue 20). A forwarded tools/call on a stdio upstream's shared session
// is written to the process as one line with an id of the gateway's own ("reversi-<n>", a
// string: the SDK's client numbers its requests), and its answer is taken off the stream
// before the SDK's client would decode it. The SDK still owns the session: initialize, lists,
// notifications (progress among them) and the upstream's own requests. Through the SDK's
// client, the call's request was encoded and its answer decoded and handed across two more
// goroutines.

// rawIDPrefix starts the ids of raw calls.
const rawIDPrefix = "reversi-"

// rawAnswer is the answer to one raw call: its result's bytes, or its error (a *jsonrpc.Error
// from the upstream, a *MessageTooLargeError).
type rawAnswer struct {
	result json.RawMessage
	err    error
}

// rawCall writes one request with method and params (a JSON object, one line) and waits for
// its answer. When ctx ends first, the upstream is sent notifications/cancelled for it (as the
// SDK's client does) and ctx's error is returned. Errors: the upstream's *jsonrpc.Error, a
// *MessageTooLargeError, the stream's end (ErrUpstreamExited or mcp.ErrConnectionClosed), or a
// write's.
func (c *stdioConn) rawCall(ctx context.Context, method string, params []byte) (json.RawMessage, error) {
	id := rawIDPrefix + strconv.FormatUint(c.rawSeq.Add(1), 10)
	ch := make(chan rawAnswer, 1)
	c.rawMu.Lock()
	c.rawWait[id] = ch
	c.rawMu.Unlock()
	defer func() {
		c.rawMu.Lock()
		delete(c.rawWait, id)
		c.rawMu.Unlock()
	}()
	line := make([]byte, 0, len(params)+len(method)+64)
	line = append(line, `{"jsonrpc":"2.0","id":"`...)
	line = append(line, id...)
	line = append(line, `","method":`...)
	line = strconv.AppendQuote(line, method)
	line = append(line, `,"params":`...)
	line = append(line, params...)
	line = append(line, "}\n"...)
	if err := c.write(ctx, line); err != nil {
		return nil, err
	}
	select {
	case a := <-ch:
		return a.result, a.err
	case <-ctx.Done():
		c.cancelRaw(id)
		return nil, ctx.Err()
	case <-c.readDone:
		select {
		case a := <-ch: // answered just before the stream ended
			return a.result, a.err
		default:
		}
		return nil, c.readErr
	case <-c.closed:
		return nil, mcp.ErrConnectionClosed
	}
}

// cancelRaw tells the upstream that the raw call id was cancelled (best effort, within
// answerTimeout: the call has already failed on the gateway's side).
func (c *stdioConn) cancelRaw(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), answerTimeout)
	defer cancel()
	_ = c.write(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"`+id+`","reason":"the agent cancelled the call"}}`+"\n"))
}

// rawWaiting reports whether a raw call waits for its answer.
func (c *stdioConn) rawWaiting() bool {
	c.rawMu.Lock()
	defer c.rawMu.Unlock()
	return len(c.rawWait) > 0
}

// rawLine is what deliverRaw reads of a line.
type rawLine struct {
	ID     json.RawMessage `json:"id"`
	Method json.RawMessage `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64           `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// parseRawLine decodes line's members. They alias line (readLine's own copy, never changed
// after): the result is not copied.
func parseRawLine(line []byte) (rawLine, error) {
	var m rawLine
	err := exactUnmarshal(line, &m, fastjson.DontCopyRawMessage)
	return m, err
}

// deliverRaw hands line to the raw call it answers, and reports whether it did; any other line
// goes on to the SDK. One decode of the line, into raw members.
func (c *stdioConn) deliverRaw(line []byte) bool {
	if !bytes.Contains(line, []byte(`"`+rawIDPrefix)) {
		return false
	}
	m, err := parseRawLine(line)
	if err != nil || m.Method != nil { // the members the SDK's client would read
		return false
	}
	var id string
	if fastjson.Unmarshal(m.ID, &id) != nil {
		return false
	}
	a := rawAnswer{result: m.Result}
	switch {
	case m.Error != nil:
		a = rawAnswer{err: &jsonrpc.Error{Code: m.Error.Code, Message: m.Error.Message, Data: m.Error.Data}}
	case len(m.Result) == 0:
		a = rawAnswer{err: fmt.Errorf("upstream %s: an answer without a result or an error", c.t.name)}
	}
	return c.answerRaw(id, a)
}

// answerRaw gives a to the raw call id, if one waits.
func (c *stdioConn) answerRaw(id string, a rawAnswer) bool {
	c.rawMu.Lock()
	ch, ok := c.rawWait[id]
	delete(c.rawWait, id) // answered: a second answer with the id goes to the SDK, which drops it
	c.rawMu.Unlock()
	if ok {
		ch <- a // buffered, and only this answer is sent on it
	}
	return ok
}

// rawConn is the stdio connection under cs when cs is u's shared session and a raw call can
// go on it: the session speaks a protocol with a handshake (2026-07-28's per-request `_meta`
// is the SDK's to add), so the upstream expects exactly the request the SDK's client writes.
func (u *upstream) rawConn(cs *mcp.ClientSession) *stdioConn {
	if init := cs.InitializeResult(); init == nil || init.ProtocolVersion >= "2026-07-28" {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cs != cs {
		return nil
	}
	pc, ok := u.conn.(*passthroughConn)
	if !ok {
		return nil
	}
	sc, _ := pc.Connection.(*stdioConn)
	return sc
}

// rawToolCall forwards a tools/call on sc: name, the agent's raw arguments (nil: none) and
// meta, the request's `_meta` as it goes upstream.
func rawToolCall(ctx context.Context, sc *stdioConn, name string, args json.RawMessage, meta mcp.Meta) (json.RawMessage, error) {
	p, err := rawToolParams(name, args, meta)
	if err != nil {
		return nil, err
	}
	return sc.rawCall(ctx, "tools/call", p)
}

// rawToolParams are the params of a tools/call as the SDK's client encodes mcp.CallToolParams
// with json.RawMessage arguments, on one line (arguments with line ends are compacted).
func rawToolParams(name string, args json.RawMessage, meta mcp.Meta) ([]byte, error) {
	p := make([]byte, 0, len(args)+len(name)+32)
	p = append(p, `{"name":`...)
	q, err := json.Marshal(name)
	if err != nil {
		return nil, err
	}
	p = append(p, q...)
	if len(args) > 0 {
		if hasLineEnd(args) { // one message per line
			var b bytes.Buffer
			if err := json.Compact(&b, args); err != nil {
				return nil, fmt.Errorf("the arguments are not JSON: %w", err)
			}
			args = b.Bytes()
		}
		p = append(p, `,"arguments":`...)
		p = append(p, args...)
	}
	if len(meta) > 0 {
		mb, err := json.Marshal(meta)
		if err != nil {
			return nil, err
		}
		p = append(p, `,"_meta":`...)
		p = append(p, mb...)
	}
	return append(p, '}'), nil
}

// hasLineEnd reports whether b holds a \r or a \n. Two IndexByte scans (vectorized) are several
// times faster than IndexAny's byte loop over a result of some kilobytes.
func hasLineEnd(b []byte) bool {
	return bytes.IndexByte(b, '\n') >= 0 || bytes.IndexByte(b, '\r') >= 0
}
