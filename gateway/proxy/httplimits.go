package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/auth"
)

// HTTP limits of the MCP endpoints (issue 18), between authentication and the SDK's handler:
//
//   - the request body is read here, whole, within limits.request_body_bytes (413 before any
//     decoding) and limits.read_timeout (http.Server.ReadTimeout; 408), and a JSON-RPC batch is
//     refused, or held to limits.batch_size messages, before the SDK decodes it (a 4 MiB batch
//     of small messages cost the SDK about 410 MB);
//   - the write deadline is one per write (limits.write_timeout for each write and flush), not
//     http.Server.WriteTimeout's one per response, so that SSE streams and long calls live while
//     a client that stops reading is cut (the read deadline needs nothing: net/http clears it
//     once the body is read, when it starts watching the connection);
//   - a DELETE of a session cancels the session's calls in flight, and a POST that ends before
//     its calls' results were sent (the client went away) cancels those calls (limits.go).
//
// Refusals that leave a body unread close the connection (auth.CloseAfterReply), so that
// net/http neither waits for the rest of a slow body nor reads it after the answer.

// postHeader carries, from mcpEndpoint to callMiddleware, the number of the POST that brought a
// call: the SDK hands a call the POST's header (RequestExtra.Header), not its context. The
// gateway sets the header on every POST, replacing any value the client sent.
const postHeader = "Reversi-Gateway-Post"

// posts are the POSTs being served, by their postHeader value.
type posts struct {
	seq atomic.Uint64
	m   sync.Map // string -> context.Context of the request
}

// postContext returns the context of the HTTP request that carried req, or nil (stdio,
// in-memory transports, or a request already answered).
func (g *Gateway) postContext(req *mcp.CallToolRequest) context.Context {
	if req.Extra == nil || req.Extra.Header == nil {
		return nil
	}
	if v, ok := g.posts.m.Load(req.Extra.Header.Get(postHeader)); ok {
		return v.(context.Context)
	}
	return nil
}

// mcpEndpoint applies the limits above to an MCP endpoint served by s.
func (g *Gateway) mcpEndpoint(s *mcp.Server, next http.Handler) http.Handler {
	lim := g.limits
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		var body []byte
		admitted := func() {}
		if r.Method == http.MethodPost {
			var ok bool
			body, ok = g.readMessage(w, r)
			if !ok {
				return
			}
			r.Body = http.NoBody
			if len(body) > 0 {
				r.Body = &drainReader{b: body}
			}
			r.ContentLength = int64(len(body))
			done, ok := g.admitSession(w, r)
			if !ok {
				return
			}
			admitted = done
			defer done()
			id := strconv.FormatUint(g.posts.seq.Add(1), 10)
			r.Header.Set(postHeader, id)
			g.posts.m.Store(id, r.Context())
			defer g.posts.m.Delete(id)
		}
		if r.Method == http.MethodDelete {
			g.closingSession(s, r)
		}
		_ = rc.SetWriteDeadline(time.Time{})
		defer func() { _ = rc.SetWriteDeadline(time.Now().Add(lim.WriteTimeout)) }() // the final flush
		dw := &deadlineWriter{ResponseWriter: w, rc: rc, timeout: lim.WriteTimeout, m: g.metrics}
		out, gate, call, closeGate := g.gates.open(dw, r, body) // httpcancel.go
		defer closeGate()
		if s == g.server && g.serveFastHTTP(gate, r, call) { // fastcall.go
			return
		}
		if r.Method == http.MethodPost {
			// Noted as the status goes out, before the client can send its next POST.
			dw.onStatus = func(code int) {
				admitted() // a new session's owner is known before its id reaches the client
				if code != http.StatusOK && code != http.StatusAccepted {
					return
				}
				id := r.Header.Get("Mcp-Session-Id")
				if id == "" {
					id = w.Header().Get("Mcp-Session-Id") // initialize: the id the SDK gave the session
				}
				if id != "" {
					g.fastHTTP.sdkServed(id) // the SDK took the POST: its idle timer started again
				}
			}
		}
		next.ServeHTTP(out, r)
		if r.Method == http.MethodDelete && dw.status == http.StatusNoContent {
			g.sessions.closed(r.Header.Get("Mcp-Session-Id")) // its place is free at once
		}
	})
}

// drainReader reads b once and drops it at its end: the SDK copies the body it reads, and the
// request (a call's may last minutes) must not keep a second copy alive.
type drainReader struct{ b []byte }

func (r *drainReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		r.b = nil
		return 0, io.EOF
	}
	n := copy(p, r.b)
	if r.b = r.b[n:]; len(r.b) == 0 {
		r.b = nil
	}
	return n, nil
}

func (r *drainReader) Close() error { r.b = nil; return nil }

// JSON-RPC error codes of the refusals here.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
)

// readMessage reads r's body within limits.request_body_bytes and refuses a batch beyond
// limits.batch_size; on a refusal it has answered and returns false.
func (g *Gateway) readMessage(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	max := g.limits.RequestBodyBytes
	tooLarge := func() ([]byte, bool) {
		g.metrics.limitHit("request_body_bytes")
		writeRPCError(w, http.StatusRequestEntityTooLarge, codeInvalidRequest,
			fmt.Sprintf("the request body is larger than limits.request_body_bytes (%d bytes)", max), true)
		return nil, false
	}
	if r.ContentLength > max {
		return tooLarge()
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// Not the whole announced length: a request head announcing request_body_bytes would
		// otherwise cost that much at once, however little of it comes.
		buf.Grow(int(min(r.ContentLength, 64<<10)))
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, max))
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		return tooLarge()
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		g.metrics.limitHit("read_timeout")
		writeRPCError(w, http.StatusRequestTimeout, codeInvalidRequest,
			fmt.Sprintf("the request was not read within limits.read_timeout (%s)", g.limits.ReadTimeout), true)
		return nil, false
	case err != nil:
		writeRPCError(w, http.StatusBadRequest, codeInvalidRequest, "the request body could not be read: "+err.Error(), true)
		return nil, false
	}
	body := buf.Bytes()
	if n, batch := batchLen(body, g.limits.BatchSize); batch && n > g.limits.BatchSize {
		g.metrics.limitHit("batch_size")
		msg := "JSON-RPC batches are not accepted (limits.batch_size is 0): send one message per request"
		if g.limits.BatchSize > 0 {
			msg = fmt.Sprintf("the batch holds more than %d messages (limits.batch_size)", g.limits.BatchSize)
		}
		writeRPCError(w, http.StatusBadRequest, codeInvalidRequest, msg, false)
		return nil, false
	}
	return body, true
}

// batchLen reports whether body is a JSON array (a JSON-RPC batch) and how many of its
// elements it counted, stopping at max+1: the SDK would decode every element at once.
func batchLen(body []byte, max int) (n int, batch bool) {
	t := bytes.TrimLeft(body, " \t\r\n")
	if len(t) == 0 || t[0] != '[' {
		return 0, false
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	if _, err := dec.Token(); err != nil {
		return 1, true // '[' then nothing readable: counted as one, so batch_size 0 refuses it
	}
	for dec.More() && n <= max {
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			break // malformed: the SDK answers it, within the count so far
		}
		n++
	}
	if n == 0 {
		n = 1 // an empty batch is still a batch
	}
	return n, true
}

// rpcErrorJSON is a JSON-RPC error response with id (nil: null), ending in a newline.
func rpcErrorJSON(id any, code int, msg string) []byte {
	type rpcError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	b, err := json.Marshal(struct {
		JSONRPC string   `json:"jsonrpc"`
		ID      any      `json:"id"`
		Error   rpcError `json:"error"`
	}{"2.0", id, rpcError{code, msg}})
	if err != nil { // only an id of another type than those idOf returns
		b, _ = json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil, "error": rpcError{code, msg}})
	}
	return append(b, '\n')
}

// writeRPCError answers status with a JSON-RPC error response of id null; closeConn closes the
// connection after it (the body was not read to its end).
func writeRPCError(w http.ResponseWriter, status, code int, msg string, closeConn bool) {
	w.Header().Set("Content-Type", "application/json")
	if closeConn {
		auth.CloseAfterReply(w)
	}
	w.WriteHeader(status)
	_, _ = w.Write(rpcErrorJSON(nil, code, msg))
}

// closingSession cancels the calls in flight of the session a DELETE names, when the caller is
// the session's principal (the SDK answers 403 or 404 otherwise): the SDK's Close waits for
// them, so that without this a DELETE hung as long as the slowest call.
func (g *Gateway) closingSession(s *mcp.Server, r *http.Request) {
	id := r.Header.Get("Mcp-Session-Id")
	if id == "" || s == nil {
		return
	}
	principal := g.httpPrincipal(r)
	for ss := range s.Sessions() {
		if ss.ID() == id {
			g.calls.cancelSession(ss, principal, ErrSessionClosed)
		}
	}
}

// httpPrincipal is the principal of an HTTP request: the authenticated one, else the actor.
func (g *Gateway) httpPrincipal(r *http.Request) string {
	if who := auth.FromContext(r.Context()); who != nil {
		return who.Principal
	}
	return g.cfg.Actor
}

// deadlineWriter gives each write and flush of a response limits.write_timeout.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	m       *metrics
	hit     atomic.Bool
	status  int // the status written, 0 before
	// onStatus (nil: none) sees the status before it is written.
	onStatus func(code int)
}

func (w *deadlineWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if w.onStatus != nil {
			w.onStatus(code)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK) // written without WriteHeader
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	n, err := w.ResponseWriter.Write(p)
	w.check(err)
	return n, err
}

// FlushError is what http.ResponseController.Flush (the SDK's flush of each event) calls.
func (w *deadlineWriter) FlushError() error {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	err := w.rc.Flush()
	w.check(err)
	return err
}

// Flush implements http.Flusher.
func (w *deadlineWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the connection's other controls.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *deadlineWriter) check(err error) {
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && w.hit.CompareAndSwap(false, true) {
		w.m.limitHit("write_timeout")
	}
}

// refusalWriter closes the connection after any error status written through it: the
// authentication middleware's 401 and 403 go out at once, and net/http does not first read
// what is left of the request's body (which a slow client may never finish).
type refusalWriter struct{ http.ResponseWriter }

func (w refusalWriter) WriteHeader(code int) {
	if code >= 400 {
		auth.CloseAfterReply(w.ResponseWriter)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w refusalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
