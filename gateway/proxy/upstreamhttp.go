package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Bounded answers of HTTP upstreams (issue 18). go-sdk's Streamable HTTP client reads a JSON
// answer with io.ReadAll (no bound) and an SSE event up to MaxEventSize, and it fails the whole
// connection (every session's calls on that upstream) when a body cannot be read or an event
// is too large. bodyLimitTransport, under the SDK's http.Client, turns each of these into the
// failure of the one call concerned: an answer over limits.message_bytes is replaced by a
// JSON-RPC error answer to that call (MessageTooLargeError's text), read no further than the
// limit, so the SDK never holds more than the limit for it.

// sseSlack is how much the SDK's own SSE event cap exceeds limits.message_bytes: the field
// names and line ends of an event the transport let through.
const sseSlack = 4 << 10

// bodyLimitTransport bounds the bodies of an HTTP upstream's answers (see above).
type bodyLimitTransport struct {
	base  http.RoundTripper
	name  string // the upstream's name
	limit int64  // limits.message_bytes
	warn  func(format string, args ...any)
	hit   func(limit string)
	// answers bounds the POSTs of the gateway's answers to the upstream's own requests
	// (answers.go); nil: unbounded.
	answers *answerGate
	// progress is told of each progress notification as it is read, in stream order (see
	// progressToken); nil: not told.
	progress func(token string)
	// owner stamps the messages read with their owner (owner.go); nil: nothing is stamped.
	owner func() string
}

func (t *bodyLimitTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.answers != nil && isAnswer(r) {
		return t.answers.answerRoundTrip(roundTripFunc(t.roundTrip), r)
	}
	return t.roundTrip(r)
}

// roundTripFunc is a function as an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (t *bodyLimitTransport) roundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil && isRedirect(resp) {
		// Refused here, not in the client's CheckRedirect: net/http puts the whole Location
		// (up to the 10 MiB of response headers, any bytes) in the error it returns then.
		_ = resp.Body.Close()
		return nil, redirectError(t.name, resp)
	}
	if err != nil || resp.Body == nil || r.Method != http.MethodPost && r.Method != http.MethodGet {
		return resp, err
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	slot, _ := r.Context().Value(rawSlotKey{}).(*rawSlot)
	if slot != nil && !slot.keep {
		slot = nil // results of calls are decoded by the SDK (passthrough.go: stdio only)
	}
	switch {
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		// The SDK reads an error body only to find a JSON-RPC error in it: a cut one is none.
		resp.Body = readCloser2{io.LimitReader(resp.Body, t.limit), resp.Body}
		if r.Method == http.MethodPost {
			t.errorStatus(r, resp)
		}
	case mt == "application/json":
		resp.Body = &jsonBody{t: t, body: resp.Body, req: r, slot: slot}
		resp.ContentLength = -1
	case mt == "text/event-stream":
		resp.Body = &sseBody{t: t, body: resp.Body, req: r, slot: slot, br: bufio.NewReaderSize(resp.Body, 64<<10), lineStart: true}
	}
	return resp, nil
}

// errorStatus makes an HTTP error answer to one POST fail only what that POST carried. The SDK
// fails the whole connection (every session's calls) on an error status that is neither a
// session gone (404) nor transient (429, 500, 502 to 504) unless the body is a JSON-RPC error:
// an upstream answering one call 400 or 403 with an error page broke them all. A call's error
// page is replaced by a JSON-RPC error answer to it saying the status; any other message's
// status is made transient (502), which the SDK takes as that message refused.
func (t *bodyLimitTransport) errorStatus(r *http.Request, resp *http.Response) {
	switch resp.StatusCode {
	case http.StatusNotFound, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return // the SDK's own handling: the session is gone, or the message is refused
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if m, err := decodeMessage(body); err == nil {
		if a, ok := m.(*jsonrpc.Response); ok && a.Error != nil {
			return // a JSON-RPC error: the SDK fails that call only
		}
	}
	id, call := postedMessage(r)
	if !call {
		resp.StatusCode, resp.Status = http.StatusBadGateway, fmt.Sprintf("%d %s (upstream: %s)", http.StatusBadGateway, http.StatusText(http.StatusBadGateway), resp.Status)
		return
	}
	fail := fmt.Errorf("upstream %s answered HTTP %s: %s", t.name, resp.Status, snippet(bytes.TrimSpace(body)))
	t.warn("%v; the call with id %v fails, the others go on", fail, id.Raw())
	resp.Body = io.NopCloser(bytes.NewReader(errorAnswer(id, fail)))
	resp.Header.Set("Content-Type", "application/json")
}

type readCloser2 struct {
	io.Reader
	io.Closer
}

// errorAnswer is the JSON-RPC error answer to id saying err.
func errorAnswer(id jsonrpc.ID, err error) []byte {
	b, _ := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}})
	return b
}

// scanPost runs the id scan over the JSON-RPC message r posts (the SDK's POST bodies are small
// and can be read again with GetBody); ok is false when the body cannot be read again.
func scanPost(r *http.Request) (s *idScanner, ok bool) {
	if r.GetBody == nil {
		return nil, false
	}
	body, err := r.GetBody()
	if err != nil {
		return nil, false
	}
	defer body.Close()
	s = &idScanner{}
	if _, err := io.Copy(s, io.LimitReader(body, 1<<20)); err != nil {
		return nil, false
	}
	return s, true
}

// requestID is the id of the JSON-RPC message r posts.
func requestID(r *http.Request) (jsonrpc.ID, bool) {
	s, ok := scanPost(r)
	if !ok {
		return jsonrpc.ID{}, false
	}
	return s.ID()
}

// postedMessage is the id of the JSON-RPC message r posts and whether it is a call (a request
// with an id, whose answer the SDK waits for).
func postedMessage(r *http.Request) (jsonrpc.ID, bool) {
	s, ok := scanPost(r)
	if !ok {
		return jsonrpc.ID{}, false
	}
	id, ok := s.ID()
	return id, ok && s.hasMethod
}

// jsonBody is an application/json answer: read whole on the first Read up to the limit; over
// it, or when it cannot be read, the reader gets an error answer to the request instead.
type jsonBody struct {
	t    *bodyLimitTransport
	body io.ReadCloser
	req  *http.Request
	slot *rawSlot      // receives the answer's raw result (a tools/list page); nil: none
	buf  *bytes.Reader // nil until the first Read
}

func (b *jsonBody) Read(p []byte) (int, error) {
	if b.buf == nil {
		var held chunks
		_, err := io.Copy(&held, io.LimitReader(b.body, b.t.limit+1))
		var data []byte
		var fail error
		switch {
		case err != nil:
			fail = fmt.Errorf("upstream %s: the answer could not be read: %w", b.t.name, err)
		case int64(held.Len()) > b.t.limit:
			b.t.hit("message_bytes")
			fail = &MessageTooLargeError{Upstream: b.t.name, Limit: b.t.limit}
		default:
			data = held.Bytes()
			// The SDK fails the whole connection (every session's calls) on an answer it
			// cannot decode: fail only this call.
			m, err := decodeMessage(data)
			if err != nil {
				fail = fmt.Errorf("upstream %s answered with a body that is not a JSON-RPC message: %v", b.t.name, clipErr(err))
				data = nil
			}
			b.slot.fill(m)
		}
		held.Reset()
		if fail != nil {
			_ = b.body.Close() // read no further
			id, ok := requestID(b.req)
			if !ok {
				return 0, fail // not a call (the SDK reads JSON answers of calls only)
			}
			b.t.warn("%v; the call with id %v fails, the others go on", fail, id.Raw())
			data = errorAnswer(id, fail)
		}
		b.buf = bytes.NewReader(data)
	}
	return b.buf.Read(p)
}

func (b *jsonBody) Close() error { return b.body.Close() }

// sseBody passes a text/event-stream through event by event, holding at most the limit of
// one event; an event over it is discarded as it is read, and replaced by an error answer to
// the call its data answers (found by the id scan of the data), or dropped and logged.
type sseBody struct {
	t    *bodyLimitTransport
	body io.ReadCloser
	req  *http.Request // the POST or GET whose answer the stream is
	slot *rawSlot      // receives the raw result of the POST's answer (a tools/list page); nil: none
	br   *bufio.Reader

	out []byte // bytes ready for the reader
	err error  // returned once out is empty

	event     chunks    // the event read so far (when not over)
	over      *overLine // the event went over the limit: its size and the scan of its data
	lineStart bool      // the next fragment starts a line
	inData    bool      // the current line is a data line (when over)
	dataLines int       // data lines of the event fed to the scan
}

func (b *sseBody) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		b.step()
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

func (b *sseBody) Close() error { return b.body.Close() }

// step reads one fragment of a line.
func (b *sseBody) step() {
	frag, err := b.br.ReadSlice('\n')
	start := b.lineStart
	b.lineStart = err == nil
	if start && (string(frag) == "\n" || string(frag) == "\r\n") {
		b.endEvent(frag)
	} else if len(frag) > 0 {
		b.take(frag, start)
	}
	if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
		if b.over != nil || b.event.Len() > 0 {
			b.endEvent(nil) // the SDK reads an event cut by the end of the stream too
		}
		b.err = err
	}
}

func (b *sseBody) take(frag []byte, start bool) {
	if b.over == nil && int64(b.event.Len()+len(frag)) > b.t.limit {
		b.over = &overLine{size: int64(b.event.Len())}
		lineStart := true
		b.event.each(func(p []byte) {
			for len(p) > 0 {
				seg := p
				if i := bytes.IndexByte(p, '\n'); i >= 0 {
					seg = p[:i+1]
				}
				b.feed(seg, lineStart)
				lineStart = seg[len(seg)-1] == '\n'
				p = p[len(seg):]
			}
		})
		b.event.Reset()
	}
	if b.over == nil {
		b.event.Write(frag)
		return
	}
	b.over.size += int64(len(frag))
	b.feed(frag, start)
}

// feed gives the data of a fragment of an oversized event to the id scan.
func (b *sseBody) feed(frag []byte, start bool) {
	if start {
		rest, ok := bytes.CutPrefix(frag, []byte("data:"))
		b.inData = ok
		if !ok {
			return
		}
		if b.dataLines > 0 {
			b.over.scan.Write([]byte("\n")) // data lines join with newlines
		}
		b.dataLines++
		frag = rest
	}
	if b.inData {
		b.over.scan.Write(frag)
	}
}

// endEvent passes the event on (with its blank line end), or what replaces an oversized one.
func (b *sseBody) endEvent(end []byte) {
	if b.over == nil {
		ev := b.event.Bytes()
		b.event.Reset()
		m, why := badEvent(ev)
		if why != nil {
			// The SDK fails the whole connection on an event it cannot read: fail only the call
			// whose stream this is, or drop the event from the standalone stream.
			fail := fmt.Errorf("upstream %s sent an event that is not a JSON-RPC message (%v)", b.t.name, why)
			id, ok := jsonrpc.ID{}, false
			if b.req.Method == http.MethodPost {
				id, ok = requestID(b.req)
			}
			if !ok {
				b.t.warn("%v; dropped it", fail)
				return
			}
			b.t.warn("%v; the call with id %v fails, the others go on", fail, id.Raw())
			b.out = append(b.out, "event: message\ndata: "...)
			b.out = append(b.out, errorAnswer(id, fail)...)
			b.out = append(b.out, "\n\n"...)
			return
		}
		b.slot.fill(m)
		if b.t.progress != nil {
			if tok, ok := progressToken(m); ok {
				b.t.progress(tok)
			}
		}
		if b.t.owner != nil {
			ev = stampEvent(ev, m, b.t.owner)
		}
		b.out = append(ev, end...)
		return
	}
	o := b.over
	b.over, b.inData, b.dataLines = nil, false, 0
	b.t.hit("message_bytes")
	tooLarge := &MessageTooLargeError{Upstream: b.t.name, Size: o.size, Limit: b.t.limit}
	id, ok := o.scan.ID()
	if !ok || o.scan.hasMethod {
		b.t.warn("upstream %s: dropped an event of %d bytes that answers no call, over limits.message_bytes (%d bytes)", b.t.name, o.size, b.t.limit)
		return
	}
	b.t.warn("%v; the call with id %v fails, the others go on", tooLarge, id.Raw())
	b.out = append(b.out, "event: message\ndata: "...)
	b.out = append(b.out, errorAnswer(id, tooLarge)...)
	b.out = append(b.out, "\n\n"...)
}

// badEvent reports why the SDK's SSE reader would fail the connection on event (its lines,
// without the blank line that ends it), or nil: a line without a colon, or data (the data
// lines joined, of an event named message or unnamed) that is not a JSON-RPC message. It also
// returns the event's message when it has one.
func badEvent(event []byte) (jsonrpc.Message, error) {
	name, data, hasData := "", []byte(nil), false
	for line := range bytes.SplitSeq(event, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		field, value, found := bytes.Cut(line, []byte(":"))
		switch {
		case !found:
			return nil, fmt.Errorf("a line without a colon: %s", snippet(line))
		case string(field) == "event":
			name = string(bytes.TrimSpace(value))
		case string(field) == "data":
			if hasData {
				data = append(data, '\n')
			}
			data, hasData = append(data, bytes.TrimSpace(value)...), true
		}
	}
	if len(data) == 0 || name != "" && name != "message" {
		return nil, nil
	}
	m, err := decodeMessage(data)
	if err != nil {
		return nil, fmt.Errorf("its data: %v", clipErr(err))
	}
	return m, nil
}

// clipErr is err's text cut to 200 bytes (a decoding error quotes the input).
func clipErr(err error) string { return clip(err.Error(), 200) }
