package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// A request the agent cancelled gets no response over HTTP (MCP, cancellation: "receivers of a
// cancellation notification SHOULD NOT send a response for the cancelled request"). The SDK's
// server writes the handler's result anyway; the TypeScript client then reports a response for
// an unknown id (issue 19). So each POST carrying a call writes through a cancelGate, and a
// POST of notifications/cancelled for that call, in the same session and with the same
// credential, closes the gate: what the SDK writes on that call's stream afterwards is dropped.

// cancelGate is the writer of one call's POST.
type cancelGate struct {
	*deadlineWriter
	auth    string // the Authorization header of the POST
	dropped atomic.Bool
	// whole is held while a reply of known length is written (writeWhole) and while the gate
	// is dropped (drop): a cancel never lands between the header and the body it announces.
	whole sync.Mutex
	// ctx ends when the agent cancels the call (cause errAgentCancelled) or the gate closes:
	// the context of a call the fast path serves (the SDK cancels its own).
	ctx  context.Context
	stop context.CancelCauseFunc
}

func (c *cancelGate) Write(p []byte) (int, error) {
	if c.dropped.Load() {
		return len(p), nil
	}
	return c.deadlineWriter.Write(p)
}

// drop closes the gate: what is written after it is discarded.
func (c *cancelGate) drop() {
	c.whole.Lock()
	c.dropped.Store(true)
	c.whole.Unlock()
}

// writeWhole writes body as a 200 application/json reply with its Content-Length (net/http
// then sends it as it is, not chunked), unless the gate was dropped: it then writes nothing and
// returns false. A drop meanwhile waits until the body is written (its length is promised).
func (c *cancelGate) writeWhole(body []byte) bool {
	c.whole.Lock()
	defer c.whole.Unlock()
	if c.dropped.Load() {
		return false
	}
	h := c.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	c.deadlineWriter.WriteHeader(http.StatusOK)
	_, _ = c.deadlineWriter.Write(body)
	return true
}

func (c *cancelGate) FlushError() error {
	if c.dropped.Load() {
		return nil
	}
	return c.deadlineWriter.FlushError()
}

// cancelGates are the calls' gates by session and request id (one per POST in flight).
type cancelGates struct{ m sync.Map }

func gateKey(session string, id any) string { return session + "\x00" + fmt.Sprint(id) }

// open returns the writer for a POST of body: a gate when it carries one call in a session,
// w otherwise; close forgets the gate. With a gate, req is the call.
func (gs *cancelGates) open(w *deadlineWriter, r *http.Request, body []byte) (out http.ResponseWriter, gate *cancelGate, req *jsonrpc.Request, close func()) {
	session := r.Header.Get("Mcp-Session-Id")
	if t := bytes.TrimSpace(body); session == "" || len(t) == 0 || t[0] != '{' { // blank: the SDK refuses it
		return w, nil, nil, func() {}
	}
	msg, err := decodeMessage(body)
	req, ok := msg.(*jsonrpc.Request)
	if err != nil || !ok {
		return w, nil, nil, func() {}
	}
	if !req.IsCall() {
		if req.Method == "notifications/cancelled" {
			gs.cancel(session, r.Header.Get("Authorization"), req.Params)
		}
		return w, nil, nil, func() {}
	}
	key := gateKey(session, req.ID.Raw())
	// Not ended by the POST's end itself: limitedCall cancels the call then, with ErrClientGone.
	ctx, stop := context.WithCancelCause(context.WithoutCancel(r.Context()))
	g := &cancelGate{deadlineWriter: w, auth: r.Header.Get("Authorization"), ctx: ctx, stop: stop}
	if _, dup := gs.m.LoadOrStore(key, g); dup {
		stop(nil)
		return w, nil, nil, func() {} // an id in use: the SDK refuses it
	}
	return g, g, req, func() { gs.m.CompareAndDelete(key, g); stop(nil) }
}

// cancel closes the gate of the call params names, when the cancel comes with its credential.
func (gs *cancelGates) cancel(session, auth string, params json.RawMessage) {
	var p struct {
		RequestID json.Number `json:"requestId"`
	}
	d := json.NewDecoder(bytes.NewReader(params))
	d.UseNumber()
	if d.Decode(&p) != nil || p.RequestID == "" {
		var s struct {
			RequestID string `json:"requestId"`
		}
		if json.Unmarshal(params, &s) != nil || s.RequestID == "" {
			return
		}
		p.RequestID = json.Number(s.RequestID)
	}
	if v, ok := gs.m.Load(gateKey(session, p.RequestID.String())); ok {
		if g := v.(*cancelGate); g.auth == auth {
			g.drop()
			g.stop(errAgentCancelled)
		}
	}
}
