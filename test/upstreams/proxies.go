package upstreams

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/reversi-gitops/reversi/test/syncbuf"
)

// Packages of the npm MCP proxies that hack/bench measures beside the gateway (issue 20),
// pinned in package.json.
const (
	MCPProxyPackage     = "mcp-proxy"
	SupergatewayPackage = "supergateway"
)

// proxyStartTimeout bounds the wait for an npm proxy to listen.
const proxyStartTimeout = 30 * time.Second

// NPMProxy is one npm MCP proxy process (mcp-proxy or supergateway) fronting a stdio server
// and serving MCP over Streamable HTTP on 127.0.0.1, started by StartMCPProxy or
// StartSupergateway. Stop ends it with its whole process group (the servers it spawned).
type NPMProxy struct {
	// URL is the MCP endpoint, http://127.0.0.1:<port>/mcp.
	URL string
	// Pid is the proxy's node process (also its process group id).
	Pid int
	// Args is the proxy's command line (node first), for reports.
	Args []string

	stderr *syncbuf.Buffer
	done   chan struct{}
}

// MCPProxyArgs returns the command line of mcp-proxy (punkpeye/mcp-proxy) fronting the stdio
// server `server args...`: Streamable HTTP only (--server stream) at /mcp, stateful sessions
// (its default), on port (0: the kernel picks one). The proxy spawns the server once and
// forwards every HTTP session over that one stdio session. node runs loopback.mjs first, so
// the listen is on 127.0.0.1 whatever the proxy asks for.
func MCPProxyArgs(port int, server string, args []string) ([]string, error) {
	node, preload, err := proxyNode()
	if err != nil {
		return nil, err
	}
	bin, err := FindBin(MCPProxyPackage)
	if err != nil {
		return nil, err
	}
	out := []string{node, "--import=" + preload, bin, "--host", "127.0.0.1", "--port", fmt.Sprint(port),
		"--server", "stream", "--streamEndpoint", "/mcp", "--"}
	return append(append(out, server), args...), nil
}

// SupergatewayArgs returns the command line of supergateway (supercorp-ai/supergateway)
// fronting the stdio server `server args...`: stdio → Streamable HTTP at /mcp, --stateful
// (the stateless mode spawns a server per request), on port (0: the kernel picks one), with
// --logLevel none (its default, info, writes a line per message to stderr). Stateful
// supergateway spawns one server per HTTP session, through `sh -c` (it joins the command
// into one string; the arguments are single-quoted here). node runs loopback.mjs first, so
// the listen is on 127.0.0.1 (supergateway itself listens on every interface).
func SupergatewayArgs(port int, server string, args []string) ([]string, error) {
	node, preload, err := proxyNode()
	if err != nil {
		return nil, err
	}
	bin, err := FindBin(SupergatewayPackage)
	if err != nil {
		return nil, err
	}
	words := []string{shellQuote(server)}
	for _, a := range args {
		words = append(words, shellQuote(a))
	}
	return []string{node, "--import=" + preload, bin, "--stdio", strings.Join(words, " "),
		"--outputTransport", "streamableHttp", "--stateful", "--streamableHttpPath", "/mcp",
		"--port", fmt.Sprint(port), "--logLevel", "none"}, nil
}

// StartMCPProxy starts MCPProxyArgs on a free port with exactly env as its environment (the
// server inherits it: pass what the server needs, e.g. MEMORY_FILE_PATH) and returns once it
// listens on 127.0.0.1 only (within 30 s).
func StartMCPProxy(server string, args, env []string) (*NPMProxy, error) {
	argv, err := MCPProxyArgs(0, server, args)
	if err != nil {
		return nil, err
	}
	return startProxy(MCPProxyPackage, argv, env)
}

// StartSupergateway is StartMCPProxy for SupergatewayArgs.
func StartSupergateway(server string, args, env []string) (*NPMProxy, error) {
	argv, err := SupergatewayArgs(0, server, args)
	if err != nil {
		return nil, err
	}
	return startProxy(SupergatewayPackage, argv, env)
}

func startProxy(what string, argv, env []string) (*NPMProxy, error) {
	p := &NPMProxy{Args: argv, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append([]string{}, env...)
	cmd.Stderr = p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("upstreams: start %s: %w", what, err)
	}
	p.Pid = cmd.Process.Pid
	go func() { _ = cmd.Wait(); close(p.done) }()
	port, err := waitListening(p.stderr, p.done, proxyStartTimeout)
	if err == nil {
		err = onlyLoopback(port)
	}
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("upstreams: %s: %w\nstderr:\n%s", what, err, p.stderr)
	}
	p.URL = fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	return p, nil
}

// Stop sends SIGTERM to the proxy's process group, then SIGKILL after 5 s or once the proxy
// has exited (so none of the servers it spawned is left).
func (p *NPMProxy) Stop() { stopGroup(p.Pid, p.done) }

// Stderr returns what the proxy (and the servers it spawned) wrote to stderr so far.
func (p *NPMProxy) Stderr() string { return p.stderr.String() }

// proxyNode returns the node binary (the system's Node.js >= 20, which also runs the servers)
// and the absolute path of loopback.mjs.
func proxyNode() (node, preload string, err error) {
	if node, err = FindNode(); err != nil {
		return "", "", err
	}
	src, err := sourceDir()
	if err != nil {
		return "", "", err
	}
	return node, filepath.Join(src, "loopback.mjs"), nil
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
