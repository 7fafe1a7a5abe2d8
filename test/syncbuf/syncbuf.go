// Package syncbuf is a bytes.Buffer safe for concurrent writers (a gateway, its upstreams'
// stderr copiers) and a reader (the test or bench that checks what was written).
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer collects writes under a lock. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p; it never fails.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
