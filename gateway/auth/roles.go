// Package auth authenticates the MCP gateway's HTTP clients and says what each may reach:
// API keys from the `auth.keys` file, OIDC bearer tokens (`auth.oidc`, checked with
// coreos/go-oidc), the five Reversi roles, and the Host/Origin guards of HTTP mode.
//
// Source: seed "MCP gateway" (../shared/seeds/003_0ebd38203277749f.txt): Config (`auth.keys`,
// `auth.oidc`, `allowed_hosts`, `allowed_origins`, `resource_url`, `permissions` "capped by a
// key's max_permissions"), Endpoints (HTTP mode) and `reversi.*` tools (the operator table);
// issue 7.
//
// The authenticator plugs into the go-sdk's bearer-token middleware (auth.RequireBearerToken
// of github.com/modelcontextprotocol/go-sdk/auth): Verify is its TokenVerifier, and the
// identity rides in TokenInfo.Extra, so the SDK's own session check (a session answers only
// the TokenInfo.UserID that opened it) gives the seed's "using another's session id is a 403".
package auth

import (
	"fmt"
	"slices"
	"strings"
)

// Role is a Reversi role. Roles are ordered: each one reaches everything the roles below it
// reach (agent < auditor < approver < operator < admin). Source: seed "MCP gateway",
// Endpoints and `reversi.*` tools.
type Role string

// The roles, lowest first.
const (
	Agent    Role = "agent"
	Auditor  Role = "auditor"
	Approver Role = "approver"
	Operator Role = "operator"
	Admin    Role = "admin"
)

// Roles lists every role, lowest first.
var Roles = []Role{Agent, Auditor, Approver, Operator, Admin}

// ParseRole reads a role name; anything else is an error naming the roles.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if !slices.Contains(Roles, r) {
		return "", fmt.Errorf("%q is not a Reversi role: use one of %s", s, roleNames())
	}
	return r, nil
}

func roleNames() string {
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// rank is the role's place in the order; -1 for an unknown role (which reaches nothing).
func (r Role) rank() int { return slices.Index(Roles, r) }

// AtLeast reports whether r reaches what min reaches. An unknown role reaches nothing.
func (r Role) AtLeast(min Role) bool { return r.rank() >= 0 && r.rank() >= min.rank() }
