package config

import (
	"errors"
	"fmt"
	"slices"
)

// Flags are the gateway's command-line settings that describe what gateway.yaml otherwise
// holds. An empty string or nil slice means the flag was not given. Source: seed "MCP gateway",
// Config ("for one upstream without a config file --upstream-cmd (+ repeatable --upstream-arg)
// or --upstream-url, --mode, --actor") and Console on the gateway's port (--console,
// --console-role).
type Flags struct {
	UpstreamCmd  string   // --upstream-cmd
	UpstreamArgs []string // --upstream-arg, repeatable, in order
	UpstreamURL  string   // --upstream-url
	Mode         string   // --mode: enforce, advise or observe
	Actor        string   // --actor
	Console      string   // --console: off, open or login
	ConsoleRole  string   // --console-role: auditor, approver or operator
}

// FlagUpstreamName is the name of the upstream given by --upstream-cmd or --upstream-url.
const FlagUpstreamName = "upstream"

// upstreamGiven reports whether any upstream flag was given.
func (f Flags) upstreamGiven() bool {
	return f.UpstreamCmd != "" || f.UpstreamURL != "" || len(f.UpstreamArgs) > 0
}

// FromFlags builds the config of the one-upstream form without a config file: exactly one of
// --upstream-cmd (with its --upstream-arg values, taken literally: the shell has already
// expanded them) or --upstream-url, plus the other flags over the seed's defaults. The upstream
// is named FlagUpstreamName and is not namespaced, so its tools keep their own names (manifests
// written for the server directly apply). As in the file, a stdio upstream gets no inherited
// environment. With no listen flag the gateway speaks MCP on stdio.
//
// Errors: no upstream flag, both --upstream-cmd and --upstream-url, --upstream-arg without
// --upstream-cmd, a url that is not http(s), and any value Merge refuses.
func FromFlags(f Flags) (*Gateway, error) {
	u := Upstream{Name: FlagUpstreamName, Command: f.UpstreamCmd, URL: f.UpstreamURL}
	switch {
	case f.UpstreamCmd == "" && f.UpstreamURL == "":
		if len(f.UpstreamArgs) > 0 {
			return nil, errors.New("--upstream-arg needs --upstream-cmd")
		}
		return nil, errors.New("no upstream: give --upstream-cmd (with --upstream-arg) or --upstream-url, or --config gateway.yaml")
	case f.UpstreamCmd != "" && f.UpstreamURL != "":
		return nil, errors.New("give one of --upstream-cmd or --upstream-url, not both")
	case f.UpstreamURL != "" && len(f.UpstreamArgs) > 0:
		return nil, errors.New("--upstream-arg applies to --upstream-cmd, not --upstream-url")
	case f.UpstreamURL != "":
		if err := checkHTTPURL(f.UpstreamURL); err != nil {
			return nil, fmt.Errorf("--upstream-url: %w", err)
		}
	}
	u.Args = slices.Clone(f.UpstreamArgs)
	g := defaults()
	g.Upstreams = []Upstream{u}
	rest := f
	rest.UpstreamCmd, rest.UpstreamURL, rest.UpstreamArgs = "", "", nil
	return Merge(g, rest)
}

// Merge applies the flags given explicitly over a config read from a file and returns a new
// Gateway (file is not modified): --mode, --actor, --console and --console-role override the
// file's values; flags not given leave them alone. The upstream flags are refused with a file,
// since the seed has them only "for one upstream without a config file"; put the upstream in
// the file's upstreams: instead.
//
// The result is checked again with the file's cross-field rules (a console open needs a
// loopback listen and a role other than admin, login needs auth, both need listen).
func Merge(file *Gateway, f Flags) (*Gateway, error) {
	if f.upstreamGiven() && file.File != "" {
		return nil, fmt.Errorf("--upstream-cmd, --upstream-arg and --upstream-url are for running without a config file: add the upstream to upstreams: in %s", file.File)
	}
	g := *file
	g.Upstreams = slices.Clone(file.Upstreams)
	switch Mode(f.Mode) {
	case ModeAuto:
	case ModeEnforce, ModeAdvise, ModeObserve:
		g.Mode = Mode(f.Mode)
	default:
		return nil, fmt.Errorf("--mode %q: use enforce, advise or observe", f.Mode)
	}
	if f.Actor != "" {
		g.Actor = f.Actor
	}
	if f.Console != "" {
		switch f.Console {
		case ConsoleOff, ConsoleOpen, ConsoleLogin:
		default:
			return nil, fmt.Errorf("--console %q: use off, open or login", f.Console)
		}
		if f.Console != g.Console.Mode {
			g.Console = Console{Mode: f.Console}
			if f.Console == ConsoleOpen {
				g.Console.Role = DefaultConsoleRole
			}
		}
	}
	if f.ConsoleRole != "" {
		switch {
		case g.Console.Mode != ConsoleOpen:
			return nil, errors.New("--console-role applies to --console open only")
		case f.ConsoleRole == "admin":
			return nil, errors.New("--console-role admin: the gateway refuses to start an open console with the admin role; use auditor, approver or operator")
		case !slices.Contains([]string{"auditor", "approver", "operator"}, f.ConsoleRole):
			return nil, fmt.Errorf("--console-role %q: use auditor, approver or operator", f.ConsoleRole)
		}
		g.Console.Role = f.ConsoleRole
	}
	if err := consoleRules(&g); err != nil {
		return nil, err
	}
	return &g, nil
}

// consoleRules checks the console against listen and auth (seed "MCP gateway", Console on the
// gateway's port).
func consoleRules(g *Gateway) error {
	switch g.Console.Mode {
	case ConsoleOpen, ConsoleLogin:
		if g.Listen == nil {
			return fmt.Errorf("console %s needs HTTP mode: set listen in gateway.yaml", g.Console.Mode)
		}
	}
	switch {
	case g.Console.Mode == ConsoleOpen && !g.Listen.Loopback():
		return fmt.Errorf("console open needs a loopback listen.host, not %q: use login with auth instead", g.Listen.Host)
	case g.Console.Mode == ConsoleLogin && !g.Auth.Enabled():
		return errors.New("console login needs auth.keys or auth.oidc")
	}
	return nil
}
