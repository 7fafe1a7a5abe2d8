package engine

// Category is the kind of rule a call broke: the first violation of a Decision, or
// CategoryApproval for a call waiting for approval. It is the `reason` label of the gateway's
// reversi_gateway_blocks_total metric, so its values are few and fixed (the violation texts
// name tools and ids and would make unbounded labels).
type Category string

// The categories, one per check of Decide (seed "MCP gateway", What happens to a call).
const (
	CategoryNoManifest Category = "no_manifest" // no manifest for the tool (enforce)
	CategoryDraft      Category = "draft"       // the manifest is a draft
	CategoryScope      Category = "scope"       // the permission is outside the session's scope
	CategoryRequires   Category = "requires"    // a required tool has not succeeded in the run
	CategorySchema     Category = "schema"      // the arguments break the input schema
	CategoryDrift      Category = "drift"       // the schema_hash does not match the upstream's schema
	CategoryAllowDeny  Category = "allow_deny"  // refused by the gateway's allow/deny globs
	CategoryPolicy     Category = "policy"      // denied by a policy rule (deny, or a limit reached)
	CategoryApproval   Category = "approval"    // needs, or was refused, a person's approval
	CategoryDuplicate  Category = "duplicate"   // the duplicate-call key is held, or cannot be rendered
	CategoryOther      Category = "other"       // anything else (e.g. arguments that are not JSON)
)

// Categories lists every Category.
var Categories = []Category{CategoryNoManifest, CategoryDraft, CategoryScope, CategoryRequires,
	CategorySchema, CategoryDrift, CategoryAllowDeny, CategoryPolicy, CategoryApproval, CategoryDuplicate, CategoryOther}
