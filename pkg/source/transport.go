package source

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sync"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
)

// advertisementBytesPerRef is how many bytes of advertisement each ref of MaxRefs allows:
// a ref line is 46 bytes and the ref's name.
const advertisementBytesPerRef = 256

// errorBodyBytes is how much of an HTTP error answer (not 2xx) is read, for its message.
const errorBodyBytes = 4 << 10

// advertisementLimit bounds the bytes of a ref advertisement.
func (p *prepared) advertisementLimit() int64 {
	return int64(p.maxRefs)*advertisementBytesPerRef + 64<<10
}

// packLimit bounds the compressed pack of one fetch.
func (p *prepared) packLimit() int64 {
	return p.maxTotal + p.maxTotal/16 + 8<<20
}

// answerLimit bounds everything the server sends in answer to one fetch request: the pack
// and, besides it, its pkt-line framing and the acknowledgement and shallow lines, which
// go-git decodes into memory before the pack.
func (p *prepared) answerLimit() int64 {
	return p.packLimit() + p.advertisementLimit()
}

// answerBound bounds what one upload-pack session reads from the server, whatever the
// transport: first the ref advertisement, whose pkt-lines are counted against MaxRefs and
// bytes against advertisementLimit as they are read (go-git decodes the advertisement as
// it reads it, so it never holds more than the limits allow), then the answer to the
// request, whose bytes are counted against answerLimit.
type answerBound struct {
	p *prepared

	mu    sync.Mutex // go-git may read through a goroutine of its own (ctxio)
	pack  bool       // the advertisement is read; what follows is the answer to the request
	n     int64      // bytes read in this phase
	lines int        // pkt-lines of the advertisement
	err   *Error     // the limit hit, returned by every later read
}

func newAnswerBound(p *prepared) *answerBound { return &answerBound{p: p} }

// advertised switches to the answer phase, once go-git has decoded the advertisement.
func (b *answerBound) advertised() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pack, b.n = true, 0
}

// failure returns the limit hit, or nil: go-git does not always keep a reader's error intact.
func (b *answerBound) failure() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		return nil
	}
	return b.err
}

func (b *answerBound) fail(op, format string, args ...any) *Error {
	hint := "delete stale branches and tags on the remote, or raise the limit"
	if b.pack {
		hint = "the server is broken or hostile, or raise the limit"
	}
	b.err = &Error{Op: op, Subject: b.p.display, Kind: ErrTooLarge, Err: fmt.Errorf(format, args...), Hint: hint}
	return b.err
}

// account counts n more bytes read; lines are the data pkt-lines among them.
func (b *answerBound) account(n int64, lines int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	b.n += n
	if b.pack {
		if limit := b.p.answerLimit(); b.n > limit {
			return b.fail("fetch", "the server sent more than %s in answer to a fetch request, the limit for a pack of %s of objects (--source-max-total-bytes) and %d refs (--source-max-refs)",
				size(limit), size(b.p.maxTotal), b.p.maxRefs)
		}
		return nil
	}
	allowed := b.p.maxRefs
	if b.p.http != nil {
		allowed++ // the smart-HTTP advertisement starts with a "# service=git-upload-pack" line
	}
	if b.lines += lines; b.lines > allowed {
		return b.fail("list", "the server advertised more than %d refs, the limit (--source-max-refs)", b.p.maxRefs)
	}
	if limit := b.p.advertisementLimit(); b.n > limit {
		return b.fail("list", "the server's ref advertisement is larger than %s, the limit for %d refs (--source-max-refs)", size(limit), b.p.maxRefs)
	}
	return nil
}

// remaining is how many bytes the phase still allows.
func (b *answerBound) remaining() (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	limit := b.p.advertisementLimit()
	if b.pack {
		limit = b.p.answerLimit()
	}
	return max(limit-b.n, 0), b.pack
}

// boundedReader reads one stream of the server through an answerBound. It splits the
// advertisement into pkt-lines exactly as go-git's pktline.Scanner does (four hex digits of
// either case, "0000" a flush, other lengths under 5 or over 65524 invalid), so every line
// go-git decodes is counted; after an invalid length, which go-git refuses too, only bytes
// are counted.
type boundedReader struct {
	r     io.Reader
	b     *answerBound
	hdr   [4]byte
	nhdr  int
	skip  int // payload bytes of the current pkt-line still to come
	wrong bool
}

func (r *boundedReader) Read(p []byte) (int, error) {
	left, pack := r.b.remaining()
	if err := r.b.failure(); err != nil {
		return 0, err
	}
	if int64(len(p)) > left+1 {
		p = p[:left+1] // never more than one byte past the limit
	}
	n, err := r.r.Read(p)
	lines := 0
	if !pack {
		lines = r.lines(p[:n])
	}
	if lerr := r.b.account(int64(n), lines); lerr != nil {
		return 0, lerr
	}
	return n, err
}

// lines returns the number of data pkt-lines that start in p.
func (r *boundedReader) lines(p []byte) int {
	lines := 0
	for len(p) > 0 && !r.wrong {
		if r.skip > 0 {
			k := min(r.skip, len(p))
			r.skip -= k
			p = p[k:]
			continue
		}
		k := copy(r.hdr[r.nhdr:], p)
		r.nhdr += k
		p = p[k:]
		if r.nhdr < len(r.hdr) {
			break
		}
		r.nhdr = 0
		n := 0
		for _, c := range r.hdr {
			switch {
			case c >= '0' && c <= '9':
				n = n*16 + int(c-'0')
			case c >= 'a' && c <= 'f':
				n = n*16 + int(c-'a'+10)
			case c >= 'A' && c <= 'F':
				n = n*16 + int(c-'A'+10)
			default:
				r.wrong = true
			}
		}
		switch {
		case r.wrong:
		case n == 0: // flush-pkt
		case n <= 4 || n > 65520+4:
			r.wrong = true
		default:
			lines++
			r.skip = n - 4
		}
	}
	return lines
}

// Close closes the stream when it can be closed (go-git closes a command's stdout).
func (r *boundedReader) Close() error {
	if c, ok := r.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// boundKey carries a session's answerBound in the context of go-git's HTTP requests.
type boundKey struct{}

// boundedTransport is the http.RoundTripper of go-git's HTTP client: it passes every
// successful answer's body (after net/http has inflated a gzip encoding) through the
// answerBound of the request's context, and reads at most errorBodyBytes of an error
// answer, which go-git reads whole for its message.
type boundedTransport struct{ base http.RoundTripper }

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	b, _ := req.Context().Value(boundKey{}).(*answerBound)
	if b == nil {
		return nil, errors.New("internal error: an HTTP request to the git server without a bound on its answer")
	}
	res, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body := res.Body
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		res.Body = readCloser{&boundedReader{r: body, b: b}, body}
	} else {
		res.Body = readCloser{io.LimitReader(body, errorBodyBytes), body}
	}
	return res, nil
}

type readCloser struct {
	io.Reader
	c io.Closer
}

func (r readCloser) Close() error { return r.c.Close() }

// httpTransport makes the go-git HTTP transport of one Fetch or RemoteRevision: its own
// client, whose RoundTripper bounds every answer (no protocol is installed globally), over
// http.DefaultTransport or, with a CA bundle, over a clone of it that also trusts the
// bundle (go-git's own CA handling needs an *http.Transport). release closes the idle
// connections of such a clone.
func httpTransport(ca []byte) (t transport.Transport, release func(), err error) {
	base, release := http.DefaultTransport, func() {}
	if len(ca) > 0 {
		def, ok := http.DefaultTransport.(*http.Transport)
		if !ok {
			return nil, nil, errors.New("http.DefaultTransport is not an *http.Transport")
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		pool.AppendCertsFromPEM(ca)
		tr := def.Clone()
		if tr.TLSClientConfig == nil {
			tr.TLSClientConfig = &tls.Config{}
		}
		tr.TLSClientConfig.RootCAs = pool
		base, release = tr, tr.CloseIdleConnections
	}
	return githttp.NewClient(&http.Client{Transport: &boundedTransport{base: base}}), release, nil
}

// readerType is io.Reader's reflect.Type.
var readerType = reflect.TypeFor[io.Reader]()

// boundStdout puts b in front of the server's output in a go-git file or ssh session. Those
// transports take no reader of ours: their session (go-git's internal common.session) keeps
// the command's standard output (git-upload-pack's, local or over ssh) in its exported
// field Stdout, which the advertisement decoder and then UploadPack read, so the field is
// replaced before anything is read. If go-git no longer has that field, it fails (closed)
// rather than read an unbounded advertisement.
func boundStdout(s transport.UploadPackSession, b *answerBound) error {
	v := reflect.ValueOf(s)
	if v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct {
		f := v.Elem().FieldByName("Stdout")
		if f.IsValid() && f.CanSet() && f.Type() == readerType && !f.IsNil() {
			f.Set(reflect.ValueOf(io.Reader(&boundedReader{r: f.Interface().(io.Reader), b: b})))
			return nil
		}
	}
	return fmt.Errorf("cannot bound what go-git's %T reads from the server (no field Stdout io.Reader): refusing to read an unbounded ref advertisement", s)
}

// newUploadPackSession opens an upload-pack session whose every read from the server is
// bounded by b: over p.http for http(s), else over go-git's file or ssh transport.
func newUploadPackSession(p *prepared, b *answerBound) (transport.UploadPackSession, error) {
	ep, err := transport.NewEndpoint(p.url)
	if err != nil {
		return nil, err
	}
	if p.http != nil {
		return p.http.NewUploadPackSession(ep, p.auth)
	}
	c, err := client.NewClient(ep)
	if err != nil {
		return nil, err
	}
	s, err := c.NewUploadPackSession(ep, p.auth)
	if err != nil {
		return nil, err
	}
	if err := boundStdout(s, b); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// withBound is ctx carrying b for the HTTP transport.
func withBound(ctx context.Context, b *answerBound) context.Context {
	return context.WithValue(ctx, boundKey{}, b)
}
