package proxy

import "sync"

// chunkSize is the size of the pooled pieces a message longer than one read is held in.
const chunkSize = 64 << 10

var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// chunks holds a message being read in pooled fixed-size pieces, so that reading one (up to
// limits.message_bytes, then perhaps discarding it) makes no garbage beyond the message
// itself: appending to one slice would leave about twice its size behind in the slices it
// outgrew, which the gateway's GOGC (400) lets pile up to several times the limit.
type chunks struct {
	bufs []*[]byte
	n    int // bytes held
}

// Write copies p in; it never fails.
func (c *chunks) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		off := c.n % chunkSize
		if off == 0 && c.n/chunkSize == len(c.bufs) {
			c.bufs = append(c.bufs, chunkPool.Get().(*[]byte))
		}
		k := copy((*c.bufs[len(c.bufs)-1])[off:], p)
		c.n += k
		p = p[k:]
	}
	return n, nil
}

// Len is the number of bytes held.
func (c *chunks) Len() int { return c.n }

// each calls f with the bytes held, in order.
func (c *chunks) each(f func([]byte)) {
	left := c.n
	for _, b := range c.bufs {
		k := min(left, chunkSize)
		f((*b)[:k])
		left -= k
	}
}

// Bytes returns a copy of the bytes held, of exactly their size.
func (c *chunks) Bytes() []byte {
	out := make([]byte, 0, c.n)
	c.each(func(b []byte) { out = append(out, b...) })
	return out
}

// Reset returns the pieces to the pool.
func (c *chunks) Reset() {
	for _, b := range c.bufs {
		chunkPool.Put(b)
	}
	c.bufs, c.n = nil, 0
}
