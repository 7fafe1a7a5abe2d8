package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// A request the client cancelled gets no response over stdio either (MCP, cancellation: the
// receiver "SHOULD NOT send a response"; the SDK's server sends one). The line filter notes
// the calls it passes and the client's cancels of them; the writer drops the response line of
// a cancelled call. Both sets are bounded: a call noted long ago without an answer, or a
// cancel of one, is forgotten first.

// maxNotedCalls bounds the calls and cancels noted.
const maxNotedCalls = 1024

type stdioCancels struct {
	mu        sync.Mutex
	calls     map[string]bool // ids of calls passed to the SDK (an answered one may stay until evicted)
	order     []string        // calls, oldest first
	cancelled map[string]bool // calls the client cancelled, whose response is still to drop
}

func newStdioCancels() *stdioCancels {
	return &stdioCancels{calls: map[string]bool{}, cancelled: map[string]bool{}}
}

// idKey is the key of a request id as the SDK's connection tells ids apart: a string is not
// the number it spells ("5" is not 5), and a number is made an int64 as jsonrpc2.MakeID does
// (5.0 and 5.9 are 5), so that a cancel names the call the SDK would cancel.
func idKey(id any) string {
	switch v := id.(type) {
	case string:
		return strconv.Quote(v)
	case json.Number:
		if f, err := v.Float64(); err == nil {
			return strconv.FormatInt(int64(f), 10)
		}
		return string(v)
	case float64:
		return strconv.FormatInt(int64(v), 10)
	}
	return fmt.Sprint(id)
}

// noted reports whether the call with key k was passed to the SDK (and may be in flight there).
func (c *stdioCancels) noted(k string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[k]
}

// saw notes a message the filter passes to the SDK.
func (c *stdioCancels) saw(m jsonrpc.Message) {
	req, ok := m.(*jsonrpc.Request)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if req.IsCall() {
		k := idKey(req.ID.Raw())
		if !c.calls[k] {
			if len(c.order) >= maxNotedCalls {
				old := c.order[0]
				c.order = c.order[1:]
				delete(c.calls, old)
				delete(c.cancelled, old)
			}
			c.calls[k] = true
			c.order = append(c.order, k)
		}
		return
	}
	if k, ok := cancelledID(req); ok && c.calls[k] {
		c.cancelled[k] = true
	}
}

// cancelledID is the idKey of the request a notifications/cancelled names; false for any
// other message, or a cancel without a usable requestId.
func cancelledID(req *jsonrpc.Request) (string, bool) {
	if req.IsCall() || req.Method != "notifications/cancelled" {
		return "", false
	}
	var p struct {
		RequestID any `json:"requestId"`
	}
	d := json.NewDecoder(bytes.NewReader(req.Params))
	d.UseNumber()
	if d.Decode(&p) != nil || p.RequestID == nil {
		return "", false
	}
	return idKey(p.RequestID), true
}

// drop reports whether line, written by the SDK, is the response to a cancelled call (and
// forgets the call then). Only while a cancel waits is a line's id read.
func (c *stdioCancels) drop(line []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cancelled) == 0 {
		return false
	}
	id, ok := responseID(line)
	if !ok || !c.cancelled[id] {
		return false
	}
	delete(c.cancelled, id)
	delete(c.calls, id)
	return true
}

// responseID is the id of a JSON-RPC response line, read up to its id member (the SDK writes
// jsonrpc, then id, then result or error), so that a large result is not scanned.
func responseID(line []byte) (string, bool) {
	d := json.NewDecoder(bytes.NewReader(line))
	d.UseNumber()
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return "", false
		}
		if k == "method" {
			return "", false // a request or notification, not a response
		}
		if k != "id" {
			var skip json.RawMessage
			if d.Decode(&skip) != nil {
				return "", false
			}
			continue
		}
		var id any
		if d.Decode(&id) != nil || id == nil {
			return "", false
		}
		return idKey(id), true
	}
	return "", false
}

// cancelWriter is the SDK's writer on stdio: it drops the responses drop says to.
type cancelWriter struct {
	io.Writer
	c *stdioCancels
}

func (w cancelWriter) Write(p []byte) (int, error) {
	if w.c.drop(p) {
		return len(p), nil
	}
	return w.Writer.Write(p)
}
