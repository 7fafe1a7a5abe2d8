package auth

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// Guard checks the Host and Origin headers (an Origin must be in allowed_origins or be the
// request's own origin, scheme aside) of HTTP requests, which stops a web page from
// driving a gateway through DNS rebinding or a cross-site request. Source: seed "MCP
// gateway", Endpoints ("Host is validated against allowed_hosts (default: loopback only when
// bound to loopback) and any Origin header is rejected unless allowed").
type Guard struct {
	hosts   []hostRule
	origins map[string]bool
}

type hostRule struct{ host, port string } // port "" matches any port

// LoopbackHosts are the Host names accepted by default on a loopback listen address.
var LoopbackHosts = []string{"localhost", "127.0.0.1", "::1"}

// NewGuard derives the accepted hosts: allowed_hosts when set; otherwise, on a loopback
// listen address, LoopbackHosts (any port) plus resource_url's host; beyond loopback,
// resource_url's host. Beyond loopback with neither set it is an error, since any name would
// then be accepted. Origins are allowed_origins only (none by default).
func NewGuard(g *config.Gateway) (*Guard, error) {
	gd := &Guard{origins: map[string]bool{}}
	add := func(entry string) {
		h, p := splitHost(entry)
		gd.hosts = append(gd.hosts, hostRule{host: h, port: p})
	}
	for _, h := range g.AllowedHosts {
		add(h)
	}
	if len(g.AllowedHosts) == 0 {
		if g.Listen != nil && g.Listen.Loopback() {
			for _, h := range LoopbackHosts {
				gd.hosts = append(gd.hosts, hostRule{host: h})
			}
		}
		if g.ResourceURL != "" {
			u, err := url.Parse(g.ResourceURL)
			if err != nil {
				return nil, fmt.Errorf("resource_url: %w", err)
			}
			add(u.Host)
		}
		if len(gd.hosts) == 0 {
			host := ""
			if g.Listen != nil {
				host = g.Listen.Host
			}
			return nil, fmt.Errorf("listen.host %q is not loopback: set allowed_hosts (or resource_url) to the names clients reach the gateway by, so that requests for any other Host are refused", host)
		}
	}
	for _, o := range g.AllowedOrigins {
		gd.origins[normOrigin(o)] = true
	}
	return gd, nil
}

// splitHost splits "name[:port]" or "[v6]:port" into a lowercase host without a trailing dot
// and brackets, and the port ("" when absent).
func splitHost(s string) (host, port string) {
	s = strings.ToLower(strings.TrimSpace(s))
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, port = h, p
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	}
	return strings.TrimSuffix(host, "."), port
}

func normOrigin(o string) string {
	o = strings.ToLower(strings.TrimSpace(o))
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return o
	}
	h, p := splitHost(u.Host)
	switch {
	case p == "80" && u.Scheme == "http", p == "443" && u.Scheme == "https":
		p = ""
	}
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if p != "" {
		h += ":" + p
	}
	return u.Scheme + "://" + h
}

// sameOrigin reports whether origin names the host and port r is addressed to: a page the
// gateway itself served (the console), not a cross-site one. The Host check runs first, so a
// rebound name (Host: evil.example, Origin: http://evil.example) is still refused.
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(strings.ToLower(strings.TrimSpace(origin)))
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	oh, op := splitHost(u.Host)
	if op == "" {
		op = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	rh, rp := splitHost(r.Host)
	if rp == "" {
		rp = "80"
		if r.TLS != nil {
			rp = "443"
		}
	}
	return oh == rh && op == rp
}

// Check returns "" when r may pass, or why it may not (answered with 403).
func (gd *Guard) Check(r *http.Request) string {
	h, p := splitHost(r.Host)
	ok := false
	for _, rule := range gd.hosts {
		if rule.host == h && (rule.port == "" || rule.port == p) {
			ok = true
			break
		}
	}
	if !ok {
		return fmt.Sprintf("Forbidden: Host %q is not one of this gateway's allowed_hosts", r.Host)
	}
	if vals, present := r.Header["Origin"]; present {
		for _, o := range vals {
			if !gd.origins[normOrigin(o)] && !sameOrigin(o, r) {
				return fmt.Sprintf("Forbidden: Origin %q is not in allowed_origins", o)
			}
		}
	}
	return ""
}

// Wrap refuses, with 403 and the reason, the requests Check refuses, and closes their
// connection (the body is not read).
func (gd *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if why := gd.Check(r); why != "" {
			CloseAfterReply(w)
			http.Error(w, why, http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// CloseAfterReply makes the response being written on w the connection's last, and stops
// reading the request's body: call it before WriteHeader when refusing a request whose body
// was not read. Otherwise net/http reads up to 256 KiB of what is left of the body, before the
// answer (a handler that returns without writing) or after it (when closing the body), which a
// client that trickles its body turns into a connection held for the whole read timeout.
func CloseAfterReply(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	// An expired read deadline fails the body's reads at once; the write deadline is apart.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}
