// Package egress checks the network destinations the gateway connects to (its `url`
// upstreams) against the project's `egress:` rules in reversi.config.yaml: a host allowlist,
// `block_private`, and the cloud metadata addresses, which are always refused.
//
// Source: seed "MCP gateway", Config ("Egress check. Before connecting, every url upstream is
// checked against the project's egress: rules (host allowlist, block_private, and cloud
// metadata addresses, which are always refused). A refused upstream stops the gateway at
// start with `upstream <name>: <reason>`."); issue 7.
package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path"
	"strings"
)

// Rules are `egress:` in reversi.config.yaml.
type Rules struct {
	// BlockPrivate refuses destinations that resolve to a private, loopback, link-local,
	// shared (100.64.0.0/10) or unspecified address.
	BlockPrivate bool `json:"block_private,omitempty"`
	// AllowedHosts, when not empty, are the only host names (or IP literals) allowed; an
	// entry may start with "*." to allow every subdomain. Case-insensitive.
	AllowedHosts []string `json:"allowed_hosts,omitempty"`
}

// MetadataHosts and MetadataAddrs are the cloud metadata endpoints, refused whatever the
// rules say (they hand out the node's cloud credentials).
var (
	MetadataHosts = []string{"metadata.google.internal", "metadata.goog"}
	MetadataAddrs = []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00:ec2::254")}
)

var sharedSpace = netip.MustParsePrefix("100.64.0.0/10")

// Resolver looks up a host's addresses (net.DefaultResolver's LookupNetIP).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Check returns nil when rawURL may be connected to, or the reason it may not (without the
// "upstream <name>: " prefix). Names are resolved with r (nil: net.DefaultResolver) and every
// address must pass, so a name pointing at a metadata or private address is refused too. A
// name that does not resolve is refused only when block_private needs its addresses.
func Check(ctx context.Context, rawURL string, rules Rules, r Resolver) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return fmt.Errorf("%q is not a URL with a host", rawURL)
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	for _, m := range MetadataHosts {
		if host == m {
			return fmt.Errorf("%s is a cloud metadata endpoint, which is always refused", host)
		}
	}
	if len(rules.AllowedHosts) > 0 && !allowed(host, rules.AllowedHosts) {
		return fmt.Errorf("host %s is not in egress.allowed_hosts (%s) of reversi.config.yaml", host, strings.Join(rules.AllowedHosts, ", "))
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		if r == nil {
			r = net.DefaultResolver
		}
		addrs, err = r.LookupNetIP(ctx, "ip", host)
		if err != nil {
			if rules.BlockPrivate {
				return fmt.Errorf("host %s does not resolve (%v), so egress.block_private cannot be checked", host, err)
			}
			return nil // the connection fails on its own, with its own error
		}
	}
	for _, a := range addrs {
		a = a.Unmap()
		for _, v := range []netip.Addr{a, nat64(a)} {
			for _, m := range MetadataAddrs {
				if v == m {
					return fmt.Errorf("%s is a cloud metadata address, which is always refused", describe(host, a))
				}
			}
			if rules.BlockPrivate && private(v) {
				return fmt.Errorf("%s is a private address and egress.block_private is set in reversi.config.yaml", describe(host, a))
			}
		}
	}
	return nil
}

// The NAT64 prefixes (RFC 6052's well-known one, RFC 8215's local-use one): a NAT64 gateway
// connects an address in them to the IPv4 address in its last 32 bits (a /96 prefix).
var nat64Prefixes = []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("64:ff9b:1::/48")}

// nat64 returns the IPv4 address a NAT64 address reaches, or a itself.
func nat64(a netip.Addr) netip.Addr {
	for _, p := range nat64Prefixes {
		if a.Is6() && p.Contains(a) {
			b := a.As16()
			return netip.AddrFrom4([4]byte(b[12:]))
		}
	}
	return a
}

func describe(host string, a netip.Addr) string {
	if host == a.String() {
		return host
	}
	return fmt.Sprintf("host %s resolves to %s, which", host, a)
}

func private(a netip.Addr) bool {
	return a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsUnspecified() || sharedSpace.Contains(a)
}

func allowed(host string, list []string) bool {
	for _, e := range list {
		e = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(e)), ".")
		if e == host {
			return true
		}
		if strings.HasPrefix(e, "*.") {
			if ok, _ := path.Match(e, host); ok && strings.HasSuffix(host, e[1:]) {
				return true
			}
		}
	}
	return false
}

// Dialed is the check of an address a connection is about to be made to, for
// pkg/dialguard: Check of the address itself under BlockPrivate alone (the host allowlist
// was checked on the name, before). A metadata address is refused whatever the rules say.
func (r Rules) Dialed(a netip.Addr) error {
	only := Rules{BlockPrivate: r.BlockPrivate}
	if err := Check(context.Background(), "http://"+netip.AddrPortFrom(a.WithZone(""), 80).String()+"/", only, nil); err != nil {
		return fmt.Errorf("refused by the egress rules: %v", err)
	}
	return nil
}
