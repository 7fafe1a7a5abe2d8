package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The stdio client side (issue 18). The SDK's IOTransport reads the client with one
// json.Decoder and ends the session at the first value it cannot decode: one bad line from the
// client stopped the gateway. MCP's stdio transport is newline-delimited (messages "MUST NOT
// contain embedded newlines"), so the gateway reads the client's lines itself and hands the SDK
// only lines it can decode, one at a time. Every other line is answered and skipped, as the
// JSON-RPC 2.0 specification has it:
//
//   - not JSON: -32700 "Parse error", id null;
//   - JSON but not a JSON-RPC message the SDK can decode: -32600 "Invalid Request", with the
//     line's id when it has a usable one, else null;
//   - longer than limits.request_body_bytes: -32600, read to its end without being kept;
//   - a batch (a JSON array): -32600 unless limits.batch_size allows it and the session's
//     protocol still has batches (before 2025-06-18: the SDK ends the session on a batch after).

// serveStdio serves the one stdio session on in and out through the line filter, which hands
// the calls the fast path serves to it (fastcall.go) and the rest to the SDK's session.
func (g *Gateway) serveStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	w := &lockedWriter{w: out} // the SDK, the filter and the fast path write whole lines, each with one Write
	pr, pw := io.Pipe()
	cancels := newStdioCancels() // stdiocancel.go
	fast := newFastCalls(g, w, cancels)
	ss, err := g.server.Connect(ctx, &mcp.IOTransport{Reader: pr, Writer: writeCloser(cancelWriter{Writer: w, c: cancels}), MaxLineLength: int(g.limits.RequestBodyBytes) + 16}, nil)
	if err != nil {
		return err
	}
	fast.ss.Store(ss)
	go func() { pw.CloseWithError(g.filterLines(in, pw, w, cancels, fast)) }()
	ended := make(chan error, 1)
	go func() { ended <- ss.Wait() }()
	select {
	case <-ctx.Done():
		_ = ss.Close()
		<-ended
		err = ctx.Err()
	case err = <-ended:
	}
	_ = pr.Close()
	fast.stop(ErrSessionClosed) // the SDK's session has ended its own calls the same way
	return err
}

// filterLines copies the lines of in that the SDK can decode to sdk and answers the others on
// out. It returns nil at the end of in, or sdk's or out's error.
func (g *Gateway) filterLines(in io.Reader, sdk io.Writer, out io.Writer, cancels *stdioCancels, fast *fastCalls) error {
	max := g.limits.RequestBodyBytes
	br := bufio.NewReaderSize(in, 64<<10)
	var line []byte
	protocol := "" // the protocolVersion the client's initialize asked for
	for {
		line = line[:0]
		tooLong := false
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			if !tooLong {
				if int64(len(line)+len(chunk)) > max+2 { // the message, then \r\n
					tooLong, line = true, line[:0]
				} else {
					line = append(line, chunk...)
				}
			}
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if tooLong {
			g.metrics.limitHit("request_body_bytes")
			g.warn("stdio: the client sent a line longer than limits.request_body_bytes (%d bytes); answered -32600 and skipped it", max)
			if werr := answer(out, nil, codeInvalidRequest, fmt.Sprintf("Invalid Request: the message is larger than limits.request_body_bytes (%d bytes)", max)); werr != nil {
				return werr
			}
		} else if msg := bytes.TrimSpace(line); len(msg) > 0 {
			pass, ok, werr := g.checkLine(out, msg, &protocol, cancels, fast)
			if werr != nil {
				return werr
			}
			if ok {
				if _, werr := sdk.Write(append(pass, '\n')); werr != nil {
					return werr
				}
			}
		}
		if err != nil { // io.EOF
			return nil
		}
	}
}

// checkLine decides one non-empty line: ok when the SDK may have it (pass), otherwise it has
// been answered on out.
func (g *Gateway) checkLine(out io.Writer, msg []byte, protocol *string, cancels *stdioCancels, fast *fastCalls) (pass []byte, ok bool, err error) {
	if !json.Valid(msg) {
		g.warn("stdio: the client sent a line that is not JSON; answered -32700 and skipped it")
		return nil, false, answer(out, nil, codeParseError, "Parse error: the line is not JSON")
	}
	if msg[0] == '[' {
		var elems []json.RawMessage
		_ = json.Unmarshal(msg, &elems)
		max := g.limits.BatchSize
		switch {
		case max == 0:
			g.metrics.limitHit("batch_size")
			return nil, false, answer(out, nil, codeInvalidRequest, "Invalid Request: JSON-RPC batches are not accepted (limits.batch_size is 0): send one message per line")
		case len(elems) > max:
			g.metrics.limitHit("batch_size")
			return nil, false, answer(out, nil, codeInvalidRequest, fmt.Sprintf("Invalid Request: the batch holds %d messages, more than limits.batch_size (%d)", len(elems), max))
		case len(elems) == 0:
			return nil, false, answer(out, nil, codeInvalidRequest, "Invalid Request: an empty batch")
		case *protocol != "" && *protocol != "2024-11-05" && *protocol != "2025-03-26":
			// The SDK ends the session on a batch of a later protocol: answer it here.
			return nil, false, answer(out, nil, codeInvalidRequest, "Invalid Request: JSON-RPC batches are not part of MCP from protocol version 2025-06-18 on")
		}
		for _, e := range elems {
			if _, err := decodeMessage(e); err != nil {
				return nil, false, answer(out, idOf(e), codeInvalidRequest, "Invalid Request: "+err.Error())
			}
		}
		return msg, true, nil
	}
	m, err := decodeMessage(msg)
	if err != nil {
		return nil, false, answer(out, idOf(msg), codeInvalidRequest, "Invalid Request: "+err.Error())
	}
	if req, isReq := m.(*jsonrpc.Request); isReq && fast != nil {
		if fast.take(req) {
			return nil, false, nil // served by the fast path
		}
		if req.IsCall() && fast.inFlight(idKey(req.ID.Raw())) { // the SDK does not know the fast path's ids
			return nil, false, refuseDuplicate(out, req.ID)
		}
	}
	cancels.saw(m)
	if fast != nil {
		fast.sawCancel(m)
	}
	if req, isReq := m.(*jsonrpc.Request); isReq && req.Method == "initialize" {
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(req.Params, &p)
		*protocol = p.ProtocolVersion
	}
	return msg, true, nil
}

// idOf is msg's id when it is a string or a number (JSON-RPC's id types), else nil.
func idOf(msg []byte) any {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(msg, &m) != nil || len(m.ID) == 0 {
		return nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(m.ID))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return nil
	}
	switch v.(type) {
	case string, json.Number:
		return v
	}
	return nil
}

// answer writes one JSON-RPC error response line with id (nil: null).
func answer(out io.Writer, id any, code int, message string) error {
	_, err := out.Write(rpcErrorJSON(id, code, message))
	return err
}
