package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Protocol versions (issue 19). go-sdk v1.8.0 speaks 2026-07-28 (SEP-2575: no initialize,
// per-request `_meta`, server/discover) and the handshake versions 2025-11-25, 2025-06-18,
// 2025-03-26 and 2024-11-05. What a session can serve depends on its transport:
//
//   - stdio (and in-memory): every version; 2026-07-28 per request, the others by initialize.
//   - Streamable HTTP: the gateway's handler is stateful (one session is one run), and the SDK
//     serves 2026-07-28 only on stateless handlers (StreamableServerTransport
//     .SupportsProtocolVersion), so only the four handshake versions.
//
// The SDK's server/discover answers with the versions of the session's transport, but it
// answers a discover sent at 2026-07-28 on the stateful HTTP handler with a success listing
// only the handshake versions, instead of the UnsupportedProtocolVersion error (-32022) SEP-2575
// requires for a request at a version the server does not serve ("When a server receives a
// request whose declared protocol version it does not implement, it MUST return this error").
// A client that takes a successful discover to mean its version was accepted (mark3labs/mcp-go
// v1.2.1) then sent every request at 2026-07-28 and got -32022 for each; go-sdk's own client
// happens to check the list and fall back to initialize.
//
// discoverMiddleware makes the answer agree with what the session serves: a discover at a
// version missing from the SDK's own list for this session becomes -32022 with that list in
// `data.supported`, so every client falls back to initialize, which accepts exactly those
// versions. It is a middleware rather than ServerOptions.SupportedProtocolVersions because one
// mcp.Server serves both stdio, where 2026-07-28 works and must stay, and HTTP.

// discoverMethod is SEP-2575's discovery request.
const discoverMethod = "server/discover"

// discoverMiddleware serves server/discover as described above: the SDK's answer when the
// request's `_meta` protocol version is among the answer's supportedVersions, otherwise a
// *jsonrpc.Error with code mcp.CodeUnsupportedProtocolVersion (-32022) and data
// mcp.UnsupportedProtocolVersionData{Supported: the session's versions, Requested}.
func discoverMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if method != discoverMethod || err != nil {
			return res, err
		}
		dr, ok := res.(*mcp.DiscoverResult)
		sr, isServer := req.(*mcp.ServerRequest[*mcp.DiscoverParams])
		if !ok || !isServer {
			return res, err
		}
		requested := sr.ProtocolVersion()
		if slices.Contains(dr.SupportedVersions, requested) {
			return res, nil
		}
		return nil, unsupportedVersion(requested, dr.SupportedVersions)
	}
}

// unsupportedVersion is SEP-2575's UnsupportedProtocolVersion error for requested, a version
// the SDK knows but this session's transport does not serve (the SDK refuses unknown versions
// itself, before any middleware).
func unsupportedVersion(requested string, supported []string) *jsonrpc.Error {
	data, _ := json.Marshal(mcp.UnsupportedProtocolVersionData{Supported: supported, Requested: requested})
	return &jsonrpc.Error{
		Code: mcp.CodeUnsupportedProtocolVersion,
		Message: fmt.Sprintf("protocol version %q is not served on this transport (the gateway's Streamable HTTP endpoint keeps a session per run, and 2026-07-28 has no sessions; it is served over stdio); initialize with one of: %s",
			requested, strings.Join(supported, ", ")),
		Data: data,
	}
}
