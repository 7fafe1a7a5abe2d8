package proxy

import (
	"bytes"
	"encoding/json"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Which agent what a shared upstream session sends belongs to is decided when the message is
// read from the upstream, not when its handler runs: the SDK hands notifications (and requests)
// to their handlers on other goroutines than responses, so a log message an upstream sent
// during alice's call was often handled after that call had ended, when no request (or only
// bob's) was in flight, and went to every agent (or to bob). The transports of a shared
// session (passthroughConn, sseBody) stamp each message of ownedMethods with the owner the
// upstream's flights give at that moment (upstream.owner), in _meta under ownerMeta, replacing
// whatever the upstream put there; the handlers take it out (takeOwner) before anything is
// relayed.

// ownerMeta is the _meta key of the stamp (reversi/: never forwarded upstream, forwardMeta).
const ownerMeta = metaPrefix + "owner"

// Stamps that are not an agent's id.
const (
	ownerNone    = "none"    // no request was in flight: the upstream's own (logs go to every agent)
	ownerSeveral = "several" // several were, or one without an agent session: nobody's for sure
)

// ownedMethods are the messages of an upstream stamped with their owner.
var ownedMethods = map[string]bool{
	"notifications/message": true, "notifications/elicitation/complete": true,
	"sampling/createMessage": true, "elicitation/create": true, "roots/list": true,
}

// owner is the stamp of what up's shared session sends now: the id of the agent of the one
// request in flight on it, ownerNone or ownerSeveral.
func (up *upstream) owner() string {
	f, n := up.onlyFlight()
	switch {
	case n == 0:
		return ownerNone
	case f != nil && f.agent != nil:
		return f.agent.id
	}
	return ownerSeveral
}

// stampOwner sets the owner stamp of req when its method is one of ownedMethods.
func stampOwner(req *jsonrpc.Request, owner string) {
	if !ownedMethods[req.Method] {
		return
	}
	m := map[string]json.RawMessage{}
	if p := bytes.TrimSpace(req.Params); len(p) > 0 && string(p) != "null" {
		if json.Unmarshal(p, &m) != nil || m == nil {
			return // not an object: the SDK refuses it
		}
	}
	meta := map[string]any{}
	if raw, ok := m["_meta"]; ok && json.Unmarshal(raw, &meta) != nil || meta == nil {
		meta = map[string]any{}
	}
	meta[ownerMeta] = owner
	if b, err := json.Marshal(meta); err == nil {
		m["_meta"] = b
		if out, err := json.Marshal(m); err == nil {
			req.Params = out
		}
	}
}

// stampEvent is stampOwner for one SSE event, msg its data decoded (badEvent), with the owner
// owner says (asked only for a message to stamp); the event is returned as it is when it
// carries no such message.
func stampEvent(ev []byte, msg jsonrpc.Message, owner func() string) []byte {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !ownedMethods[req.Method] {
		return ev
	}
	stampOwner(req, owner())
	enc, err := jsonrpc.EncodeMessage(req)
	if err != nil {
		return ev
	}
	var out []byte
	put := false
	for line := range bytes.Lines(ev) {
		if !bytes.HasPrefix(line, []byte("data:")) {
			out = append(out, line...)
		} else if !put {
			out = append(append(append(out, "data: "...), enc...), '\n')
			put = true
		}
	}
	return out
}

// takeOwner removes the owner stamp from p and returns it ("" when there is none).
func takeOwner(p mcp.Params) string {
	if p == nil {
		return ""
	}
	if v := reflect.ValueOf(p); v.Kind() == reflect.Pointer && v.IsNil() {
		return ""
	}
	m := p.GetMeta()
	owner, _ := m[ownerMeta].(string)
	if _, ok := m[ownerMeta]; ok {
		delete(m, ownerMeta)
		if len(m) == 0 {
			p.SetMeta(nil)
		}
	}
	return owner
}

// agentByID is the agent session of an owner stamp, nil when it has ended (or is none).
func (g *Gateway) agentByID(id string) *agentSession {
	if v, ok := g.agentIDs.Load(id); ok {
		return v.(*agentSession)
	}
	return nil
}
