package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	fastjson "github.com/segmentio/encoding/json"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// The tools/call fast path (issue 20). go-sdk stays the library for the protocol: sessions,
// initialize, lists, notifications, the relay. A plain tools/call of an upstream tool, though,
// travels past it: the line filter (stdio.go) hands it here as the JSON-RPC message it already
// decoded, the same call path decides and journals it (handle), and the reply is written as
// the upstream's result bytes spliced into a response line. Through the SDK the request was
// decoded twice and the result encoded and compacted twice, more than half of a call's CPU.
//
// Only what the SDK would serve the same way takes the fast path; everything else goes to the
// SDK as before: a session the SDK has not initialized yet, a call with a progress token, a
// multi-round-trip retry (inputResponses, requestState), a name that is not an upstream tool
// (reversi.* tools, unknown names), or a 2026-07-28 request `_meta` the SDK would refuse.
// Decoding uses the SDK's library and options (segmentio, case-sensitive names), so the fast
// path reads the same name and arguments the SDK would.

// fastParams is what the fast path reads of tools/call params.
type fastParams struct {
	Name           string                     `json:"name"`
	Arguments      json.RawMessage            `json:"arguments"`
	Meta           map[string]json.RawMessage `json:"_meta"`
	InputResponses json.RawMessage            `json:"inputResponses"`
	RequestState   json.RawMessage            `json:"requestState"`
}

// fastCalls serves the fast path of one stdio session and cancels its calls.
type fastCalls struct {
	g   *Gateway
	out io.Writer     // the client's stdout (whole lines, one Write each)
	sdk *stdioCancels // the calls passed to the SDK (nil: none noted)
	ss  atomic.Pointer[mcp.ServerSession]

	ctx    context.Context // ends with the session: its calls' parent
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // the calls taken
	warm   warmWorkers    // the goroutines that run them

	mu      sync.Mutex
	live    map[string]*fastCall // by idKey of the request id
	stopped bool                 // the session ended: no call is taken any more
}

type fastCall struct {
	cancel    context.CancelCauseFunc
	cancelled bool // the client cancelled it: no response (stdiocancel.go)
}

func newFastCalls(g *Gateway, out io.Writer, sdk *stdioCancels) *fastCalls {
	ctx, cancel := context.WithCancelCause(context.Background())
	f := &fastCalls{g: g, out: out, sdk: sdk, ctx: ctx, cancel: cancel, live: map[string]*fastCall{}}
	f.warm.done, f.warm.work = ctx.Done(), make(chan func())
	return f
}

// inFlight reports whether the fast path serves a call with key k now.
func (f *fastCalls) inFlight(k string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[k] != nil
}

// refuseDuplicate answers a call whose id is in flight as the SDK's connection does: -32600
// with a null id (the error is not the call in flight's).
func refuseDuplicate(out io.Writer, id jsonrpc.ID) error {
	return answer(out, nil, codeInvalidRequest, fmt.Sprintf("JSON RPC invalid request: request ID %v already in use", id.Raw()))
}

// errAgentCancelled is the cause of a fast-path call the agent cancelled.
var errAgentCancelled = errors.New("the agent cancelled the call (notifications/cancelled)")

// stop ends the session's calls with cause and waits for them to finish.
// A line read after it is the SDK's, whose session has ended too: the filter's write to it fails.
func (f *fastCalls) stop(cause error) {
	f.mu.Lock()
	f.stopped = true
	f.mu.Unlock()
	f.cancel(cause)
	f.wg.Wait()
	f.warm.wait()
}

// take serves req when the fast path can; false leaves it to the SDK.
func (f *fastCalls) take(req *jsonrpc.Request) bool {
	ss := f.ss.Load()
	if ss == nil || req.Method != "tools/call" || !req.IsCall() {
		return false
	}
	creq, newProtocol, ok := f.g.fastRequest(ss, req.Params)
	if !ok {
		return false
	}
	k := idKey(req.ID.Raw())
	if f.sdk != nil && f.sdk.noted(k) {
		return false // the SDK may serve a call with this id: it refuses the second, or serves it
	}
	f.mu.Lock()
	if f.stopped || len(f.live) >= maxNotedCalls {
		f.mu.Unlock()
		return false // the SDK answers (and bounds) what the fast path does not track
	}
	if _, dup := f.live[k]; dup {
		f.mu.Unlock()
		_ = refuseDuplicate(f.out, req.ID) // a write error ends the filter at its next line
		return true
	}
	ctx, cancel := context.WithCancelCause(f.ctx)
	c := &fastCall{cancel: cancel}
	f.live[k] = c
	f.wg.Add(1) // under mu: stop's Wait sees every call taken before it
	f.mu.Unlock()
	f.warm.run(func() {
		defer f.wg.Done()
		line := f.g.fastReply(ctx, ss, req.ID, creq, newProtocol)
		f.mu.Lock()
		delete(f.live, k)
		drop := c.cancelled
		f.mu.Unlock()
		cancel(nil)
		if !drop {
			_, _ = f.out.Write(line)
		}
	})
	return true
}

// sawCancel cancels the fast-path call a notifications/cancelled names.
func (f *fastCalls) sawCancel(m jsonrpc.Message) {
	req, ok := m.(*jsonrpc.Request)
	if !ok {
		return
	}
	k, ok := cancelledID(req)
	if !ok {
		return
	}
	f.mu.Lock()
	c := f.live[k]
	if c != nil {
		c.cancelled = true
	}
	f.mu.Unlock()
	if c != nil {
		c.cancel(errAgentCancelled)
	}
}

// fastRequest decodes params as the SDK would into a request of session ss, when the fast path
// serves it. newProtocol: the request carries 2026-07-28's per-request `_meta`.
func (g *Gateway) fastRequest(ss *mcp.ServerSession, params json.RawMessage) (req *mcp.CallToolRequest, newProtocol, ok bool) {
	req, newProtocol, _, ok = g.fastRequestVersion(ss, params)
	return req, newProtocol, ok
}

// fastRequestVersion is fastRequest that also returns the protocol version the request's
// `_meta` names ("" when none): the SDK's stateful HTTP handler refuses a call naming any.
func (g *Gateway) fastRequestVersion(ss *mcp.ServerSession, params json.RawMessage) (req *mcp.CallToolRequest, newProtocol bool, metaVersion string, ok bool) {
	init := ss.InitializeParams()
	if init == nil {
		return nil, false, "", false
	}
	var p fastParams
	if _, err := fastjson.Parse(params, &p, fastjson.DontMatchCaseInsensitiveStructFields); err != nil || len(p.InputResponses) > 0 || len(p.RequestState) > 0 || g.route(p.Name) == nil {
		return nil, false, "", false
	}
	meta := mcp.Meta{}
	for k, raw := range p.Meta {
		if k == "progressToken" {
			return nil, false, "", false // progress is relayed by the SDK's path (agents.go)
		}
		if strings.HasPrefix(k, protocolMetaPrefix) {
			continue // the agent's hop (forwardMeta drops them too); checked below
		}
		var v any
		if fastjson.Unmarshal(raw, &v) != nil {
			return nil, false, "", false
		}
		meta[k] = v
	}
	if raw, has := p.Meta[mcp.MetaKeyProtocolVersion]; has {
		var version string
		if fastjson.Unmarshal(raw, &version) != nil || version >= "2026-07-28" {
			if !g.newProtocolMetaOK(p.Meta, version) {
				return nil, false, "", false // the SDK refuses it, with its own error
			}
			newProtocol = true
		}
		metaVersion = version // "" when it is not a string: the SDK's handler reads none then
	}
	return &mcp.CallToolRequest{Session: ss, Params: &mcp.CallToolParamsRaw{Name: p.Name, Arguments: p.Arguments, Meta: meta}}, newProtocol, metaVersion, true
}

// newProtocolMetaOK reports whether the SDK accepts a 2026-07-28 request's `_meta` (SEP-2575):
// a protocol version it serves, client capabilities, and client info when present, each of
// its type.
func (g *Gateway) newProtocolMetaOK(meta map[string]json.RawMessage, version string) bool {
	if version != "2026-07-28" { // the one per-request version the SDK serves
		return false
	}
	var caps mcp.ClientCapabilities
	raw, has := meta[mcp.MetaKeyClientCapabilities]
	if !has || fastjson.Unmarshal(raw, &caps) != nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return false
	}
	if raw, has := meta[mcp.MetaKeyClientInfo]; has {
		var info mcp.Implementation
		if fastjson.Unmarshal(raw, &info) != nil {
			return false
		}
	}
	return true
}

// fastReply runs the call as the SDK's path does (limits, then handle) and returns the
// response line: the upstream's result bytes spliced in, with what the SDK adds for the
// session's protocol (resultType from 2026-07-28 on, and the server's info in `_meta` for a
// per-request 2026-07-28 request).
func (g *Gateway) fastReply(ctx context.Context, ss *mcp.ServerSession, id jsonrpc.ID, req *mcp.CallToolRequest, newProtocol bool) []byte {
	h := &passHolder{}
	r, err := g.limitedCall(context.WithValue(ctx, passHolderKey{}, h), req, func(ctx context.Context) (mcp.Result, error) {
		return g.handle(ctx, req)
	})
	res, _ := r.(*mcp.CallToolResult)
	if err == nil && res == nil {
		err = errors.New("the call path returned no result")
	}
	var body []byte
	if err == nil {
		var set resultAdditions
		if init := ss.InitializeParams(); init != nil && init.ProtocolVersion >= "2026-07-28" {
			set.ResultType = json.RawMessage(`"complete"`)
		}
		if newProtocol {
			info, _ := json.Marshal(&mcp.Implementation{Name: Name, Version: Version})
			set.Meta = map[string]json.RawMessage{mcp.MetaKeyServerInfo: info}
		}
		raw, env := h.raw, h.env
		if raw == nil || res != h.res {
			if res.Content == nil {
				r := *res
				r.Content = []mcp.Content{} // as the SDK sends it: never null
				res = &r
			}
			env = envelopeMembers{} // splice reads the marshalled result's members
			raw, err = json.Marshal(res)
		}
		if err == nil {
			body, err = set.splice(raw, env)
		}
	}
	if err == nil && hasLineEnd(body) {
		// An upstream over HTTP may indent, one over stdio put a carriage return between tokens:
		// stdio is one message per line, and the SDK's path compacts what it writes.
		var b bytes.Buffer
		if err = json.Compact(&b, body); err == nil {
			body = b.Bytes()
		}
	}
	if err != nil {
		var je *jsonrpc.Error
		if !errors.As(err, &je) {
			je = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
		}
		line, merr := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: je})
		if merr != nil {
			return rpcErrorJSON(nil, jsonrpc.CodeInternalError, merr.Error())
		}
		return append(line, '\n')
	}
	line := make([]byte, 0, len(body)+48)
	line = append(line, `{"jsonrpc":"2.0","id":`...)
	switch v := id.Raw().(type) {
	case string:
		q, _ := json.Marshal(v)
		line = append(line, q...)
	case int64:
		line = strconv.AppendInt(line, v, 10)
	default:
		line = append(line, "null"...)
	}
	line = append(line, `,"result":`...)
	line = append(line, body...)
	return append(line, "}\n"...)
}

// The fast path over Streamable HTTP: a POST carrying one tools/call in a session the SDK
// initialized is answered with a JSON body (the transport lets a server answer a request so)
// by the same call path. Besides what the stdio fast path asks, the POST must pass every check
// the SDK's handler would make (content type, Accept, protocol version header, no Last-Event-ID,
// no protocol version in the call's `_meta`, the Host of a loopback listener without the
// gateway's guard), come from the principal that opened the
// session, and belong to an agent the relay cannot need a stream for during the call: none of
// sampling or elicitation declared (requests a tool relays then want the call's stream), no log
// level set. A roots/list of an upstream goes on the session's standalone stream. Anything
// else goes to the SDK.

// fastSessions notes when the SDK last served a POST of each HTTP session: the SDK closes a
// session it has not served for SessionTimeout, so the fast path leaves a session's POST to
// the SDK when it has not served one for half that time.
type fastSessions struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (f *fastSessions) sdkServed(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		f.last = map[string]time.Time{}
	}
	f.last[id] = time.Now()
	if len(f.last) > 2*maxNotedCalls { // forget sessions not served for the timeout (closed by now)
		for k, t := range f.last {
			if time.Since(t) > SessionTimeout {
				delete(f.last, k)
			}
		}
	}
}

func (f *fastSessions) fresh(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.last[id]
	return ok && time.Since(t) < SessionTimeout/2
}

// handshakeVersions are the protocol versions of the stateful HTTP handler (protocol.go).
var handshakeVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

// serveFastHTTP serves the POST r of the call req (its gate open) when the fast path can, and
// reports whether it did.
func (g *Gateway) serveFastHTTP(gate *cancelGate, r *http.Request, req *jsonrpc.Request) bool {
	if gate == nil || req == nil || req.Method != "tools/call" || r.Method != http.MethodPost {
		return false
	}
	id := r.Header.Get("Mcp-Session-Id")
	if !g.fastHTTP.fresh(id) {
		return false
	}
	if v := r.Header.Get("Mcp-Protocol-Version"); v != "" && !slices.Contains(handshakeVersions, v) {
		return false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return false
	}
	if !acceptsJSONAndStream(r.Header.Values("Accept")) || len(r.Header.Values("Last-Event-ID")) > 0 {
		return false
	}
	if g.sec.guard == nil { // the SDK's DNS rebinding check
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la != nil && isLoopbackAddr(la.String()) && !isLoopbackAddr(r.Host) {
			return false
		}
	}
	if owner, ok := g.sessions.ownerOf(id); !ok || owner != g.httpPrincipal(r) {
		return false // the SDK refuses another principal (403), or knows the session better
	}
	var ss *mcp.ServerSession
	for s := range g.server.Sessions() {
		if s.ID() == id {
			ss = s
			break
		}
	}
	if ss == nil {
		return false
	}
	init := ss.InitializeParams()
	if init == nil || init.Capabilities == nil || init.Capabilities.Sampling != nil || init.Capabilities.Elicitation != nil {
		return false
	}
	if a := g.agentOf(ss); a == nil || a.logLevel() != "" {
		return false
	}
	creq, newProtocol, metaVersion, ok := g.fastRequestVersion(ss, req.Params)
	if !ok || newProtocol || metaVersion != "" { // a stateful session has no per-request version: the SDK refuses one
		return false
	}
	creq.Extra = &mcp.RequestExtra{TokenInfo: sdkauth.TokenInfoFromContext(r.Context()), Header: r.Header}
	line := g.fastReply(gate.ctx, ss, req.ID, creq, false)
	h := gate.Header()
	h.Set("Mcp-Session-Id", id)
	h.Set("Cache-Control", "no-cache")
	if !gate.writeWhole(line) {
		// Cancelled: no response, as over the SDK's path (an event stream with nothing in it).
		h.Set("Content-Type", "text/event-stream")
		gate.WriteHeader(http.StatusOK)
	}
	return true
}

// acceptsJSONAndStream is the SDK's check of a POST's Accept: both application/json and
// text/event-stream (or a wildcard covering them).
func acceptsJSONAndStream(values []string) bool {
	jsonOK, streamOK := false, false
	for _, v := range values {
		for _, raw := range strings.Split(v, ",") {
			base, _, _ := strings.Cut(strings.TrimSpace(raw), ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json", "application/*":
				jsonOK = true
			case "text/event-stream", "text/*":
				streamOK = true
			case "*/*":
				jsonOK, streamOK = true, true
			}
		}
	}
	return jsonOK && streamOK
}

// isLoopbackAddr reports whether addr (host or host:port) is loopback (config.IsLoopbackHost).
// A name with a trailing dot is not taken: the SDK's check may refuse it, and the SDK decides.
func isLoopbackAddr(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	return !strings.HasSuffix(host, ".") && config.IsLoopbackHost(host)
}
