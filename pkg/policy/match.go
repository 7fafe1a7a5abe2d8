package policy

import (
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// matcher is a rule's Match compiled for speed: the same decisions as apipolicy.Match.Matches
// (TestMatcherAgreesWithMatch), with literal globs compared as strings and `prefix*` globs as
// prefixes instead of running path.Match on every call.
type matcher struct {
	m     apipolicy.Match
	tools []glob
	perms []glob
}

// glob is one compiled tool-name glob.
type glob struct {
	pattern string
	kind    globKind
	lit     string // the literal, or the prefix before the trailing *
}

type globKind int

const (
	globGeneral globKind = iota // path.Match with the slash rule (apipolicy.GlobMatch)
	globLiteral                 // no metacharacter: equal, or equal to a part before a slash
	globPrefix                  // literal then one trailing *: a prefix of the name
)

func compileGlob(g string) glob {
	body, star := strings.CutSuffix(g, "*")
	if strings.ContainsAny(body, `*?[\`) {
		return glob{pattern: g, kind: globGeneral}
	}
	if star {
		// With the slash rule, lit* matches exactly the names that start with lit: * stops at
		// a slash, but the part before that slash is then matched instead.
		return glob{pattern: g, kind: globPrefix, lit: body}
	}
	return glob{pattern: g, kind: globLiteral, lit: body}
}

func (g *glob) match(name string) bool {
	switch g.kind {
	case globLiteral:
		return name == g.lit || (len(name) > len(g.lit) && name[len(g.lit)] == '/' && strings.HasPrefix(name, g.lit))
	case globPrefix:
		return strings.HasPrefix(name, g.lit)
	}
	return apipolicy.GlobMatch(g.pattern, name)
}

func newMatcher(m apipolicy.Match) matcher {
	mt := matcher{m: m}
	for _, g := range m.Tools {
		mt.tools = append(mt.tools, compileGlob(g))
	}
	for _, g := range m.Permissions {
		mt.perms = append(mt.perms, compileGlob(g))
	}
	return mt
}

func anyGlob(gs []glob, name string) bool {
	for i := range gs {
		if gs[i].match(name) {
			return true
		}
	}
	return false
}

// matches is apipolicy.Match.Matches with the globs compiled.
func (mt *matcher) matches(tool string, mf *manifest.Manifest) bool {
	if len(mt.tools) > 0 && !anyGlob(mt.tools, tool) {
		return false
	}
	return mt.m.MatchesManifest(mf, func(perm string) bool { return anyGlob(mt.perms, perm) })
}
