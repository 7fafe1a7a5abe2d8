package engine

import (
	"context"
	"fmt"
)

// Preview decides a call the way Decide would, without any side effect: no duplicate-call key
// is claimed, no approval is consumed or queued, and nothing is journaled (the engine never
// journals). It reads the Store (approval queue, key holders) and the Succeeded callback.
// It backs `reversi.preview_impact` (seed "MCP gateway", `reversi.*` tools: "would this call
// be allowed, need approval or be blocked ... Executes nothing").
//
// Differences from Decide, all in what the Decision names rather than what it says:
//   - a call that would queue a new approval request is NeedsApproval with ApprovalID "" and
//     Reason PreviewApprovalText;
//   - a call an approved, unused request would let through is Allow with that ApprovalID;
//   - KeyClaimed is always false; a key that another call holds is the duplicate violation.
func (e *Engine) Preview(ctx context.Context, c Call) Decision {
	x := &decider{e: e, d: Decision{Mode: e.mode, Run: c.Run}, preview: true}
	x.decide(ctx, c)
	return x.finish()
}

// PreviewApprovalText is the reason of a previewed call that would queue an approval request.
func PreviewApprovalText(tool string) string {
	return fmt.Sprintf("%s requires approval: calling it would queue a request for an approver; retry the same call once it is approved", tool)
}

// previewKey is the duplicate-call check of Preview: it looks at the key's holder instead of
// claiming the key.
func (x *decider) previewKey(ctx context.Context, c Call, key string) {
	holder, held, err := x.e.store.HeldKey(ctx, key)
	switch {
	case err != nil:
		x.violate(CategoryDuplicate, "the duplicate-call key could not be checked: "+err.Error())
	case held:
		x.violate(CategoryDuplicate, DuplicateText(c.Tool, holder))
	}
}

// Exposed reports whether an upstream offers tool (by its exposed name) in this engine's tool
// set.
func (e *Engine) Exposed(tool string) bool { _, ok := e.tools[tool]; return ok }

// CheckArguments checks args against tool's input schema (full JSON Schema) and returns "" or
// the problems (first MaxProblems), without the InputSchemaPrefix. A tool without an input
// schema, or whose schema did not compile, gives "" and unchecked true; an unknown tool gives
// a problem. It ignores validate_schemas: a dry run always checks. Used by
// `reversi.dry_run_rollback` for compensation calls.
func (e *Engine) CheckArguments(tool string, args map[string]any) (problem string, unchecked bool) {
	t := e.tools[tool]
	if t == nil {
		return "no upstream exposes " + tool, false
	}
	if t.InputSchema == nil || t.inputErr != nil {
		return "", true
	}
	if args == nil {
		args = map[string]any{}
	}
	return checkValue(t.input, args), false
}
