package proxy

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/reversi-gitops/reversi/gateway/engine"
)

// A stdio upstream's stderr (issue 18, found by attack). It was copied to the gateway's stderr
// as it came: an upstream could print lines that read as the gateway's own (a banner line
// `OK x.delete - irreversible, approved`, `reversi-gateway: upstream x reconnected`) or
// terminal escapes, which escaping tool names in the banner does not stop, and it could flood
// the gateway's log without bound. stderrLines writes each of its lines prefixed with
// `upstream <name> stderr: `, escaped (engine.EscapeControl), cut at stderrLineBytes, and at
// most stderrBurst lines at once then stderrRate a second; the lines dropped are counted in
// the next line written.

const (
	// stderrLineBytes is the longest upstream stderr line written whole.
	stderrLineBytes = 1024
	// stderrRate and stderrBurst bound the upstream stderr lines written (per process).
	stderrRate  = 50
	stderrBurst = 500
)

// stderrLines is the stderr of one stdio upstream process.
type stderrLines struct {
	out    io.Writer
	prefix string
	lim    *rate.Limiter

	mu      sync.Mutex
	line    []byte // the current line, up to stderrLineBytes
	cut     int    // bytes of the current line past stderrLineBytes
	dropped int    // lines dropped since the last one written
}

func newStderrLines(out io.Writer, upstream string) *stderrLines {
	return &stderrLines{out: out, prefix: "upstream " + upstream + " stderr: ",
		lim: rate.NewLimiter(rate.Limit(stderrRate), stderrBurst)}
}

// Write takes the next bytes of the stream; it never fails (the upstream must not block on a
// gateway log that fails).
func (s *stderrLines) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		seg := p
		if i >= 0 {
			seg = p[:i]
		}
		if room := stderrLineBytes - len(s.line); room > 0 {
			k := min(room, len(seg))
			s.line = append(s.line, seg[:k]...)
			s.cut += len(seg) - k
		} else {
			s.cut += len(seg)
		}
		if i < 0 {
			break
		}
		s.emit()
		p = p[i+1:]
	}
	return n, nil
}

// flush writes a last line that had no line end.
func (s *stderrLines) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.line) > 0 || s.cut > 0 {
		s.emit()
	}
	if s.dropped > 0 {
		fmt.Fprintf(s.out, "%s(%d more lines dropped: over %d lines a second)\n", s.prefix, s.dropped, stderrRate)
		s.dropped = 0
	}
}

// emit writes the current line, or counts it dropped.
func (s *stderrLines) emit() {
	line, cut := bytes.TrimSuffix(s.line, []byte("\r")), s.cut
	s.line, s.cut = s.line[:0], 0
	if !s.lim.AllowN(time.Now(), 1) {
		s.dropped++
		return
	}
	var b bytes.Buffer
	if s.dropped > 0 {
		fmt.Fprintf(&b, "%s(%d lines dropped: over %d lines a second)\n", s.prefix, s.dropped, stderrRate)
		s.dropped = 0
	}
	b.WriteString(s.prefix)
	b.WriteString(engine.EscapeControl(string(line)))
	if cut > 0 {
		fmt.Fprintf(&b, "… (%d more bytes)", cut)
	}
	b.WriteByte('\n')
	_, _ = s.out.Write(b.Bytes())
}
