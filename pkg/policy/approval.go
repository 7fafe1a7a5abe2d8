package policy

import (
	"slices"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// MergeApproval merges the approval rules that apply to one call: the manifest's (base) and
// the policy's (more), by the seed's rule ("Tool manifests", Approval: "Rules from the manifest
// and from policy are merged for one call: any listed role may approve, the largest quorum
// wins, the shortest timeout wins"). A nil entry is an approval with no rules (any one
// approver, no timeout) and adds nothing but its presence. The result is never nil:
//
//   - Roles: the union of every listed role, in order of first appearance (base first). Empty
//     only when no entry lists roles (anyone may approve). Note the seed's rule widens as well
//     as tightens: with roles [finance] and [cfo], a finance approver or the CFO may approve.
//   - Quorum: the largest (at least 1).
//   - TimeoutMs: the shortest of those set; nil when none is.
//   - OnTimeout: deny when any entry with rules says deny (deny is the stricter outcome);
//     escalate only when every entry with rules escalates.
//   - EscalateTo: the union of every entry's escalate_to when the result escalates, in order
//     of first appearance; nil when it denies.
//
// The inputs are not modified.
func MergeApproval(base *manifest.ApprovalRules, more ...*manifest.ApprovalRules) *manifest.ApprovalRules {
	out := &manifest.ApprovalRules{Quorum: manifest.DefaultQuorum, OnTimeout: "deny"}
	all := append([]*manifest.ApprovalRules{base}, more...)
	escalate, seen := true, false
	var escalateTo []string
	for _, a := range all {
		if a == nil {
			continue
		}
		seen = true
		for _, r := range a.Roles {
			if !slices.Contains(out.Roles, r) {
				out.Roles = append(out.Roles, r)
			}
		}
		out.Quorum = max(out.Quorum, a.Quorum)
		if a.TimeoutMs != nil && (out.TimeoutMs == nil || *a.TimeoutMs < *out.TimeoutMs) {
			t := *a.TimeoutMs
			out.TimeoutMs = &t
		}
		if a.OnTimeout != "escalate" {
			escalate = false
		}
		for _, r := range a.EscalateTo {
			if !slices.Contains(escalateTo, r) {
				escalateTo = append(escalateTo, r)
			}
		}
	}
	if seen && escalate {
		out.OnTimeout = "escalate"
		out.EscalateTo = escalateTo
	}
	return out
}
