package policy

import (
	"path"
	"slices"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// GlobMatch reports whether name is matched by glob, with the gateway's allow/deny semantics
// for tool names (gateway/engine, Denied): path.Match syntax (`*` is any run of characters
// but `/`, `?` one character but `/`, `[a-z]` a class, `\` quotes), and a name is also matched
// when a part of it before a slash is (`fs.*` matches `fs.team/secret`), since upstreams
// choose their tool names and a rule must not be escaped by a slash. A malformed glob matches
// nothing (the decoder refuses them).
func GlobMatch(glob, name string) bool {
	if ok, _ := path.Match(glob, name); ok {
		return true
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' {
			if ok, _ := path.Match(glob, name[:i]); ok {
				return true
			}
		}
	}
	return false
}

// MatchesTool reports whether the match's tool globs admit tool (true when it lists none).
func (m Match) MatchesTool(tool string) bool {
	if len(m.Tools) == 0 {
		return true
	}
	for _, g := range m.Tools {
		if GlobMatch(g, tool) {
			return true
		}
	}
	return false
}

// Matches reports whether the match selects a call of tool whose manifest is m (nil when the
// tool has none): the tool globs, then the manifest's effect, permission (globs) and risk.
// Parts that read the manifest never match a tool without one.
func (m Match) Matches(tool string, mf *manifest.Manifest) bool {
	return m.MatchesTool(tool) && m.MatchesManifest(mf, func(perm string) bool {
		return slices.ContainsFunc(m.Permissions, func(g string) bool { return GlobMatch(g, perm) })
	})
}

// MatchesManifest is the manifest part of Matches: the effects, the permission (permMatch
// reports whether one of the match's permission globs admits it) and the risk fields. true
// when the match reads no manifest; false for a tool without one (mf nil) otherwise.
func (m Match) MatchesManifest(mf *manifest.Manifest, permMatch func(perm string) bool) bool {
	if !m.NeedsManifest() {
		return true
	}
	if mf == nil {
		return false
	}
	if len(m.Effects) > 0 && !slices.Contains(m.Effects, mf.Effect) {
		return false
	}
	if len(m.Permissions) > 0 && !permMatch(mf.Permission) {
		return false
	}
	if r := m.Risk; r != nil {
		var dc, br string
		if mf.Risk != nil {
			dc, br = mf.Risk.DataClass, mf.Risk.BlastRadius
		}
		if len(r.DataClass) > 0 && !slices.Contains(r.DataClass, dc) {
			return false
		}
		if len(r.BlastRadius) > 0 && !slices.Contains(r.BlastRadius, br) {
			return false
		}
	}
	return true
}
