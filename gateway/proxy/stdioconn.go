package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/time/rate"
)

// Framing faults of stdio upstreams (issue 18). go-sdk's CommandTransport decodes the
// upstream's stdout with one json.Decoder: the first line that is not JSON, or a message over
// its 16 MiB cap, ends the connection, and with it every session's call in flight on that
// upstream (and the upstream is restarted, its state lost). stdioTransport reads newline-
// delimited JSON-RPC itself (the MCP stdio framing: one message per line):
//   - a line that is not a JSON-RPC message (a banner before initialize, log output, garbage)
//     is skipped and logged, escaped and truncated;
//   - a line over limits.message_bytes is discarded as it is read (never held whole) while a
//     streaming scan finds its top-level "id": the call it answers fails with
//     MessageTooLargeError and the others go on; without an id it is dropped and logged;
//   - the connection ends only when the stream does (the process exited or closed stdout) or
//     a write broke the framing; the error says which, for the journal.

// ErrUpstreamExited is returned (wrapped, with the exit status) by a stdio upstream's
// connection when its process has exited.
var ErrUpstreamExited = errors.New("the upstream process exited")

// ErrSocketClosed is returned (wrapped) by a socket upstream's connection when the other end
// closed it: `reversi stdio-bridge` does so when its server process exited (issue 23).
var ErrSocketClosed = errors.New("the upstream closed the socket connection")

// MessageTooLargeError is the error of a call whose answer was longer than
// limits.message_bytes: the answer was discarded. Limit is the limit and Size the message's
// size (0 when it was not read to its end), both in bytes.
type MessageTooLargeError struct {
	Upstream    string
	Size, Limit int64
}

func (e *MessageTooLargeError) Error() string {
	size := ""
	if e.Size > 0 {
		size = fmt.Sprintf(" of %d bytes", e.Size)
	}
	return fmt.Sprintf("upstream %s answered with a message%s, over limits.message_bytes (%d bytes); the answer was discarded", e.Upstream, size, e.Limit)
}

// stdioTransport runs a stdio upstream's command (like mcp.CommandTransport: stdin closed
// first on Close, then SIGTERM, then SIGKILL) and frames its stdout as described above. With
// socket set instead of cmd it dials that Unix socket (a `socket:` upstream, issue 23) and
// frames what it reads from it the same way: the socket is the process's stdin and stdout.
type stdioTransport struct {
	cmd       *exec.Cmd
	socket    string        // the Unix socket's path; "" for a command
	name      string        // the upstream's name, for logs and errors
	limit     int64         // limits.message_bytes
	terminate time.Duration // how long Close waits after closing stdin, and after SIGTERM
	warn      func(format string, args ...any)
	hit       func(limit string) // counts a limit hit (metrics)
	stderr    *stderrLines       // the process's stderr; nil: not ours
}

func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	if t.socket != "" {
		return t.dialSocket(ctx)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		_, _ = inR.Close(), inW.Close()
		return nil, err
	}
	// Own pipes (not StdoutPipe): Wait must not close stdout before every line is read.
	t.cmd.Stdin, t.cmd.Stdout = inR, outW
	if t.cmd.WaitDelay == 0 {
		t.cmd.WaitDelay = t.terminate // a child holding stderr open must not hold Wait
	}
	if err := t.cmd.Start(); err != nil {
		_, _, _, _ = inR.Close(), inW.Close(), outR.Close(), outW.Close()
		return nil, err
	}
	_, _ = inR.Close(), outW.Close()
	c := t.newConn(inW, outR)
	go func() {
		_ = t.cmd.Wait() // its result is in cmd.ProcessState
		if t.stderr != nil {
			t.stderr.flush()
		}
		close(c.exited)
		// A child of the upstream may hold stdout open after it exited: stop reading anyway.
		select {
		case <-c.readDone:
		case <-c.closed:
		case <-time.After(t.terminate):
			_ = c.stdout.Close()
		}
	}()
	go c.readLoop()
	return c, nil
}

func (t *stdioTransport) newConn(stdin writeEnd, stdout io.ReadCloser) *stdioConn {
	return &stdioConn{t: t, stdin: stdin, stdout: stdout, incoming: make(chan jsonrpc.Message),
		readDone: make(chan struct{}), exited: make(chan struct{}), closed: make(chan struct{}),
		writeSem: make(chan struct{}, 1), logs: rate.Sometimes{First: 10, Interval: 10 * time.Second},
		answers: newAnswerGate(t.name, t.warn), rawWait: map[string]chan rawAnswer{}}
}

// socketRetry is how often dialSocket tries again while the socket is not there yet or
// refuses connections.
const socketRetry = 100 * time.Millisecond

// dialSocket connects to a socket upstream. A socket that does not exist yet, or that nobody
// listens on (a bridge starting or restarting its server), is tried again every socketRetry
// until ctx ends (ConnectTimeout at start and on each reconnect): in a pod the gateway may start
// before its stdio-bridge sidecar listens. Only the socket at the path itself is connected to
// (dialSocketPath): anything else there, a symlink above all, is a *NotSocketError at once.
func (t *stdioTransport) dialSocket(ctx context.Context) (mcp.Connection, error) {
	var d net.Dialer
	for {
		nc, err := dialSocketPath(ctx, &d, t.socket)
		if err == nil {
			uc := nc.(*net.UnixConn)
			c := t.newConn(uc, uc)
			go c.readLoop()
			return c, nil
		}
		retry := errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
		if !retry {
			return nil, fmt.Errorf("upstream %s: socket %s: %w", t.name, t.socket, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("upstream %s: socket %s: %w (still %v)", t.name, t.socket, ctx.Err(), err)
		case <-time.After(socketRetry):
		}
	}
}

// NotSocketError is a socket upstream's path that is not a socket itself: a symlink (never
// followed: in a pod it could lead to another upstream's socket), a folder, a regular file.
type NotSocketError struct {
	Path, What string
}

func (e *NotSocketError) Error() string {
	return fmt.Sprintf("%s is %s, not a Unix socket: the gateway connects only to the socket at the path itself", e.Path, e.What)
}

// writeEnd is where a stdio connection writes: the process's stdin pipe, or the socket.
type writeEnd interface {
	io.WriteCloser
	SetWriteDeadline(time.Time) error
}

// stdioConn is one stdio upstream's JSON-RPC connection: a process's stdin and stdout, or a
// Unix socket (both ends are the same *net.UnixConn then; exited is never closed).
type stdioConn struct {
	t      *stdioTransport
	stdin  writeEnd
	stdout io.ReadCloser

	incoming chan jsonrpc.Message // from readLoop, one message at a time
	readErr  error                // why reading ended; set before readDone closes
	readDone chan struct{}
	exited   chan struct{} // closed when the process was waited for (never for a socket)

	writeSem chan struct{} // one writer at a time, given up when its context ends

	closeOnce sync.Once
	closing   atomic.Bool // Close has begun: a read error now is the gateway's doing
	closed    chan struct{}
	closeErr  error

	logs    rate.Sometimes // at most 10 skipped-line logs, then one per 10 s
	skipped atomic.Int64   // lines skipped so far

	answers *answerGate // the answers to the upstream's own requests (answers.go)

	rawMu   sync.Mutex
	rawWait map[string]chan rawAnswer // raw calls waiting, by id (rawcall.go)
	rawSeq  atomic.Uint64
}

func (c *stdioConn) SessionID() string { return "" }

// Read returns the next message, or why the stream ended.
func (c *stdioConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case m := <-c.incoming:
		return m, nil
	case <-c.readDone:
		return nil, c.readErr
	case <-c.closed:
		return nil, io.EOF
	}
}

// Write writes one message and its newline. It gives up when ctx ends before the upstream
// takes the bytes (an upstream that stops reading stdin fills the pipe); a message written
// in part breaks the framing, so the connection is then closed. An answer to the upstream's
// own request is bounded by the connection's answerGate (answers.go): dropped, not failed,
// when it cannot be written in time.
func (c *stdioConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	data, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return fmt.Errorf("encoding a message for upstream %s: %w", c.t.name, err)
	}
	data = append(data, '\n')
	if _, ok := msg.(*jsonrpc.Response); ok {
		if !c.answers.enter() {
			return nil
		}
		defer c.answers.leave()
		actx, cancel := context.WithTimeout(ctx, answerTimeout)
		defer cancel()
		err := c.write(actx, data)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			c.answers.drop(fmt.Sprintf("it did not read the answer within %s", answerTimeout))
			return nil // nothing was written: the framing holds
		}
		return err
	}
	return c.write(ctx, data)
}

// write writes data, one message and its newline, as Write describes.
func (c *stdioConn) write(ctx context.Context, data []byte) error {
	select {
	case c.writeSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closed:
		return mcp.ErrConnectionClosed
	}
	defer func() { <-c.writeSem }()
	dl, _ := ctx.Deadline() // zero: no deadline
	_ = c.stdin.SetWriteDeadline(dl)
	n, err := c.stdin.Write(data)
	if err == nil {
		return nil
	}
	if n > 0 {
		_ = c.Close()
		return fmt.Errorf("upstream %s: a message was written in part (%d of %d bytes: %v), so the stream is unusable", c.t.name, n, len(data), err)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		<-ctx.Done() // the deadline is ctx's: report it as ctx's, which leaves the connection up
		return ctx.Err()
	}
	return err
}

// Close closes stdin and waits for the process to exit, then sends SIGTERM, then SIGKILL,
// waiting terminate after each. A socket is closed (the bridge then stops its server).
func (c *stdioConn) Close() error {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		_ = c.stdin.Close()
		if c.t.socket != "" {
			close(c.closed)
			return
		}
		wait := func() bool {
			select {
			case <-c.exited:
				return true
			case <-time.After(c.t.terminate):
				return false
			}
		}
		if !wait() {
			if c.t.cmd.Process.Signal(syscall.SIGTERM) != nil || !wait() {
				_ = c.t.cmd.Process.Kill()
				if !wait() {
					c.closeErr = fmt.Errorf("upstream %s: the process did not exit after SIGKILL", c.t.name)
				}
			}
		}
		_ = c.stdout.Close() // unblocks readLoop
		close(c.closed)
	})
	return c.closeErr
}

// readLoop reads lines until the stream ends, delivering every JSON-RPC message in them.
func (c *stdioConn) readLoop() {
	br := bufio.NewReaderSize(c.stdout, 64<<10)
	first := true // nothing was delivered yet: a line now is a banner
	for {
		line, over, err := readLine(br, c.t.limit)
		switch {
		case over != nil:
			c.oversized(over)
		case len(bytes.TrimSpace(line)) > 0 && c.rawWaiting() && c.deliverRaw(line):
			first = false
		case len(bytes.TrimSpace(line)) > 0:
			msgs, derr := decodeLine(line)
			if derr != nil {
				c.skip(line, first, derr)
				break
			}
			for _, m := range msgs {
				select {
				case c.incoming <- m:
				case <-c.closed:
					return
				}
			}
			first = false
		}
		if err != nil {
			c.readErr = c.cause(err)
			close(c.readDone)
			return
		}
	}
}

// cause says why the stream ended: the process's exit status when it has exited.
func (c *stdioConn) cause(err error) error {
	if c.closing.Load() {
		return io.EOF // closed by the gateway
	}
	if c.t.socket != "" {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return fmt.Errorf("%w (%s; a stdio-bridge does so when its server exits)", ErrSocketClosed, c.t.socket)
		}
		return fmt.Errorf("upstream %s: reading socket %s: %w", c.t.name, c.t.socket, err)
	}
	exited := func() error { return fmt.Errorf("%w (%s)", ErrUpstreamExited, c.t.cmd.ProcessState) }
	select {
	case <-c.exited:
		return exited()
	default:
	}
	if !errors.Is(err, io.EOF) {
		return fmt.Errorf("upstream %s: reading stdout: %w", c.t.name, err)
	}
	select {
	case <-c.exited:
		return exited()
	case <-time.After(c.t.terminate):
		return errors.New("the upstream closed its stdout")
	}
}

// skip logs a line that is not a JSON-RPC message (rate-limited).
func (c *stdioConn) skip(line []byte, banner bool, why error) {
	n := c.skipped.Add(1)
	c.logs.Do(func() {
		what := "a line that is not a JSON-RPC message"
		if banner {
			what = "a line before initialize that is not a JSON-RPC message (a banner?)"
		}
		c.t.warn("upstream %s: skipped %s (%d bytes, %d skipped so far: %v): %s", c.t.name, what, len(line), n, why, snippet(line))
	})
}

// oversized fails the call an oversized message answers, or logs that it was dropped.
func (c *stdioConn) oversized(o *overLine) {
	if c.t.hit != nil {
		c.t.hit("message_bytes")
	}
	tooLarge := &MessageTooLargeError{Upstream: c.t.name, Size: o.size, Limit: c.t.limit}
	id, ok := o.scan.ID()
	if !ok || o.scan.hasMethod {
		kind := "without an id"
		if o.scan.hasMethod {
			kind = "that is a request or notification"
		}
		c.t.warn("upstream %s: dropped a message of %d bytes %s, over limits.message_bytes (%d); a call it answers ends at its timeout", c.t.name, o.size, kind, c.t.limit)
		return
	}
	c.t.warn("%v; the call with id %v fails, the others go on", tooLarge, id.Raw())
	if rid, ok := id.Raw().(string); ok && c.answerRaw(rid, rawAnswer{err: tooLarge}) {
		return
	}
	select {
	case c.incoming <- &jsonrpc.Response{ID: id, Error: tooLarge}:
	case <-c.closed:
	}
}

// decodeLine decodes one line: a JSON-RPC message, or a batch (an array) of them.
func decodeLine(line []byte) ([]jsonrpc.Message, error) {
	line = bytes.TrimSpace(line)
	if line[0] != '[' {
		m, err := decodeMessage(line)
		if err != nil {
			return nil, err
		}
		return []jsonrpc.Message{m}, nil
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(line, &raws); err != nil {
		return nil, err
	}
	if len(raws) == 0 {
		return nil, errors.New("an empty batch")
	}
	msgs := make([]jsonrpc.Message, 0, len(raws))
	for _, r := range raws {
		m, err := decodeMessage(r)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// snippet is the start of b for a log line: quoted (control characters escaped) and cut at
// 120 bytes.
func snippet(b []byte) string {
	const max = 120
	if len(b) <= max {
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%q… (%d more bytes)", b[:max], len(b)-max)
}

// overLine is a line that was longer than the limit: its size and what the scan found.
type overLine struct {
	size int64
	scan idScanner
}

// readLine reads one line (without its line end) of at most limit bytes. A longer line is
// read to its end but not kept: over holds its size and the id scan of all its bytes.
// err is the read error that ended the line, if any (io.EOF at the end of the stream).
func readLine(br *bufio.Reader, limit int64) (line []byte, over *overLine, err error) {
	var held chunks // a line longer than one read, until it ends or passes the limit
	defer held.Reset()
	for {
		frag, rerr := br.ReadSlice('\n')
		more := errors.Is(rerr, bufio.ErrBufferFull)
		switch {
		case over != nil:
			over.size += int64(len(frag))
			over.scan.Write(frag)
		case !more && held.Len() == 0: // the whole line in one read: most lines
			line = bytes.Clone(frag)
		case int64(held.Len()+len(frag)) > limit+2: // +2: the line end, \r\n at most
			over = &overLine{size: int64(held.Len() + len(frag))}
			held.each(func(b []byte) { over.scan.Write(b) })
			over.scan.Write(frag)
			held.Reset()
		default:
			held.Write(frag)
		}
		if more {
			continue
		}
		if over == nil {
			if line == nil {
				line = held.Bytes()
			}
			line = bytes.TrimRight(line, "\r\n")
			if int64(len(line)) > limit {
				over = &overLine{size: int64(len(line))}
				over.scan.Write(line)
				line = nil
			}
		}
		return line, over, rerr
	}
}

// idScanner finds the top-level "id" of a JSON object fed to it in pieces, keeping only the
// id's bytes (at most maxIDBytes): the streaming scan of an oversized message. It notes
// whether the object has a top-level "method" (then it is not an answer).
type idScanner struct {
	state     scanState
	depth     int  // nesting below the top-level object's members (stNested)
	inStr     bool // in a string inside a nested value
	esc       bool // the previous byte was a backslash (in any string)
	key       []byte
	keyLong   bool
	isID      bool // the current member's key is "id"
	val       []byte
	id        []byte // the raw id, once complete
	hasMethod bool
}

type scanState uint8

const (
	stStart  scanState = iota // before the top-level '{'
	stKey                     // expecting a member's key, or '}'
	stInKey                   // in a key
	stColon                   // expecting ':'
	stValue                   // expecting a member's value
	stScalar                  // in a number, true, false or null
	stStrVal                  // in a string value
	stNested                  // in an object or array value
	stComma                   // after a value: expecting ',' or '}'
	stDone                    // after the top-level '}', or not an object
)

const maxIDBytes = 256

// ID returns the id found, if any.
func (s *idScanner) ID() (jsonrpc.ID, bool) {
	if s.id == nil {
		return jsonrpc.ID{}, false
	}
	var v any
	if err := json.Unmarshal(s.id, &v); err != nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(v)
	if err != nil || !id.IsValid() {
		return jsonrpc.ID{}, false
	}
	return id, true
}

func (s *idScanner) keep(b []byte) {
	if s.isID && len(s.val)+len(b) <= maxIDBytes {
		s.val = append(s.val, b...)
	} else if s.isID {
		s.isID = false // too long to be an id
	}
}

func (s *idScanner) endValue() {
	if s.isID { // the last one, as json.Unmarshal reads duplicate keys
		s.id = bytes.Clone(s.val)
	}
	s.isID, s.val = false, nil
	s.state = stComma
}

// Write feeds the next bytes; it never fails.
func (s *idScanner) Write(p []byte) (int, error) {
	n := len(p)
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch s.state {
		case stDone:
			return n, nil
		case stStart:
			switch c {
			case ' ', '\t', '\r', '\n':
			case '{':
				s.state = stKey
			default:
				s.state = stDone
			}
		case stKey:
			switch c {
			case '"':
				s.state, s.key, s.keyLong = stInKey, s.key[:0], false
			case '}':
				s.state = stDone
			}
		case stInKey:
			if s.esc {
				s.esc = false
				s.keyLong = true // an escaped key is not a plain "id" or "method"
				continue
			}
			switch c {
			case '\\':
				s.esc = true
			case '"':
				s.state = stColon
			default:
				if len(s.key) < 8 {
					s.key = append(s.key, c)
				} else {
					s.keyLong = true
				}
			}
		case stColon:
			if c == ':' {
				s.state = stValue
				k := string(s.key)
				s.isID = !s.keyLong && k == "id"
				if !s.keyLong && k == "method" {
					s.hasMethod = true
				}
			}
		case stValue:
			switch c {
			case ' ', '\t', '\r', '\n':
			case '"':
				s.state = stStrVal
				s.keep(p[i : i+1])
			case '{', '[':
				s.state, s.depth, s.inStr, s.isID = stNested, 1, false, false
			default:
				s.state = stScalar
				s.keep(p[i : i+1])
			}
		case stScalar:
			switch c {
			case ',', '}', ' ', '\t', '\r', '\n':
				s.endValue()
				i-- // the same byte again, in stComma
			default:
				s.keep(p[i : i+1])
			}
		case stStrVal:
			// Skip to the next quote or backslash: the long strings are here.
			j := i
			if !s.esc {
				k := bytes.IndexAny(p[i:], `"\`)
				if k < 0 {
					s.keep(p[i:])
					return n, nil
				}
				j = i + k
			}
			s.keep(p[i : j+1])
			switch {
			case s.esc:
				s.esc = false
			case p[j] == '\\':
				s.esc = true
			default: // the closing quote
				s.endValue()
			}
			i = j
		case stNested:
			if s.inStr {
				if s.esc {
					s.esc = false
					continue
				}
				k := bytes.IndexAny(p[i:], `"\`)
				if k < 0 {
					return n, nil
				}
				i += k
				if p[i] == '\\' {
					s.esc = true
				} else {
					s.inStr = false
				}
				continue
			}
			switch c {
			case '"':
				s.inStr = true
			case '{', '[':
				s.depth++
			case '}', ']':
				s.depth--
				if s.depth == 0 {
					s.endValue()
				}
			}
		case stComma:
			switch c {
			case ',':
				s.state = stKey
			case '}':
				s.state = stDone
			}
		}
	}
	return n, nil
}
