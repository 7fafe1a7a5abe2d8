package proxy

import (
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/reversi-gitops/reversi/gateway/engine"
)

// uriAllowed applies allow/deny to a resource URI as an upstream may read it, not only as the
// agent wrote it: servers resolve URIs (file:///data/public/../secret/key is
// file:///data/secret/key to a filesystem server), and path.Match's * stops at a slash, so
// deny: ["file:///data/secret/*"] alone would not cover file:///data/secret/sub/key. The URI
// passes when
//   - the URI as written and its canonical form (canonicalURI) pass allow and deny;
//   - no folder above the canonical form is denied (a denied folder denies what is in it);
//   - the canonical form in lower case, and its folders, are not denied (servers on
//     case-insensitive file systems).
//
// Every check only tightens: what passes here passes AllowDeny.
func uriAllowed(e *engine.Engine, uri string) (string, bool) {
	if why, ok := e.AllowDeny(uri); !ok {
		return why, false
	}
	c := canonicalURI(uri)
	if c != uri {
		if why, ok := e.AllowDeny(c); !ok {
			return fmt.Sprintf("%s reads as %s, and %s", uri, c, why), false
		}
	}
	for _, form := range []string{c, strings.ToLower(c)} {
		for p := form; p != ""; p = parentURI(p) {
			if why, denied := e.Denied(p); denied {
				return fmt.Sprintf("%s is within %s, and %s", uri, p, why), false
			}
		}
	}
	return "", true
}

// nameAllowed applies allow/deny to a prompt name as to a tool name (Engine.AllowDeny: no part
// of it before a slash may be denied either).
func nameAllowed(e *engine.Engine, name string) (string, bool) { return e.AllowDeny(name) }

// canonicalURI is uri as a server resolving it would read it: percent-encoded unreserved
// characters decoded everywhere (RFC 3986 6.2.2.2: res://%73ecret/b is res://secret/b), scheme
// and host in lower case,
// no user info, query or fragment, the path unescaped (%2F as well), backslashes as slashes,
// and cleaned of dot segments and doubled slashes; file:/p and file://localhost/p are
// file:///p (RFC 8089). A URI that does not parse is kept as it is.
func canonicalURI(uri string) string {
	uri = decodeUnreserved(uri)
	u, err := url.Parse(uri)
	if err != nil || u.Scheme == "" {
		return uri
	}
	if u.Opaque != "" {
		o, err := url.PathUnescape(u.Opaque)
		if err != nil {
			o = u.Opaque
		}
		return u.Scheme + ":" + o
	}
	out := u.Scheme + ":"
	host := strings.ToLower(u.Host)
	if u.Scheme == "file" && host == "localhost" {
		host = ""
	}
	if host != "" || u.Scheme == "file" || strings.HasPrefix(uri[len(u.Scheme)+1:], "//") {
		out += "//" + host
	}
	if p := strings.ReplaceAll(u.Path, `\`, "/"); p != "" {
		if p = path.Clean(p); p != "." {
			out += p
		}
	}
	return out
}

// parentURI is the folder above a canonical URI ("" at its authority): file:///a/b for
// file:///a/b/c.
func parentURI(c string) string {
	i := strings.LastIndexByte(c, '/')
	if i <= 0 || strings.HasSuffix(c[:i], "/") || !strings.Contains(c[:i], "/") {
		return "" // the // of the authority, or no path
	}
	return c[:i]
}

// decodeUnreserved decodes the percent-encoded unreserved characters of s (ALPHA, DIGIT, "-",
// ".", "_", "~"), which are the same URI either way (RFC 3986 2.3); other escapes stay.
func decodeUnreserved(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if c, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil && unreserved(byte(c)) {
				b.WriteByte(byte(c))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}
