package proxy

import (
	"bytes"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	fastjson "github.com/segmentio/encoding/json"
)

// sdkMaxDepth is the nesting the SDK's JSON decoder accepts (go-sdk internal/json
// defaultMaxDepth): deeper messages are refused.
const sdkMaxDepth = 1000

// wireMessage is the SDK's wire form of a JSON-RPC message as its decoder reads it
// (go-sdk internal/jsonrpc2 wireDecode).
type wireMessage struct {
	VersionTag string          `json:"jsonrpc"`
	ID         any             `json:"id,omitempty"`
	Method     json.RawMessage `json:"method"`
	Params     json.RawMessage `json:"params,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
	Error      *jsonrpc.Error  `json:"error,omitempty"`
}

// decodeMessage is jsonrpc.DecodeMessage without the 32 KB read buffer its decoder allocates
// (and the runtime clears) for every message: that buffer was a tenth of a call's CPU, twice
// per call. It decodes data with the SDK's library and options (segmentio, case-sensitive
// member names) into the SDK's wire form and builds the same Request or Response. Anything it
// is not sure to read alike (a syntax error, nesting that may pass the SDK's limit, a version
// tag or id the SDK refuses, a message that is neither a request nor a response) goes to
// jsonrpc.DecodeMessage itself, so the result and the error text are the SDK's.
// FuzzDecodeMessageAsTheSDK holds the two to the same answers.
func decodeMessage(data []byte) (jsonrpc.Message, error) {
	if bytes.Count(data, []byte{'{'})+bytes.Count(data, []byte{'['}) >= sdkMaxDepth {
		return jsonrpc.DecodeMessage(data) // may nest past the limit: the SDK's check decides
	}
	var w wireMessage
	if _, err := fastjson.Parse(data, &w, fastjson.DontMatchCaseInsensitiveStructFields); err != nil || w.VersionTag != "2.0" {
		return jsonrpc.DecodeMessage(data)
	}
	id, err := jsonrpc.MakeID(w.ID)
	if err != nil {
		return jsonrpc.DecodeMessage(data)
	}
	if len(w.Method) > 0 {
		var method string
		if _, err := fastjson.Parse(w.Method, &method, fastjson.DontMatchCaseInsensitiveStructFields); err != nil {
			return jsonrpc.DecodeMessage(data)
		}
		return &jsonrpc.Request{Method: method, ID: id, Params: w.Params}, nil
	}
	if !id.IsValid() {
		return jsonrpc.DecodeMessage(data)
	}
	resp := &jsonrpc.Response{ID: id, Result: w.Result}
	if w.Error != nil {
		resp.Error = w.Error
	}
	return resp, nil
}
