package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The rule table: at least one failing fixture for every rule of decode.go and validate.go.
// Fixtures are built from lines so that the expected line of an error can be counted off the
// source. schema_test.go runs the single-manifest ones through schemas/manifest.schema.json too.

const rulesFile = "rules.yaml"

// ruleHelpers are the tools fixtures point at. They follow the fixture as a second YAML
// document, so the fixture's lines stay as written and no "has no manifest" error hides or
// adds to the one under test.
const ruleHelpers = `---
- {tool: h.read, effect: read_only, permission: h:read}
- {tool: h.undo, effect: idempotent, permission: h:write}
- {tool: h.dep, effect: read_only, permission: h:read}
- {tool: h.new, effect: read_only, permission: h:read}
- {tool: h.draft, effect: idempotent, permission: h:write, status: draft}
- {tool: h.rdraft, effect: read_only, permission: h:read, status: draft}
`

// ry joins lines into a fixture: line n of the fixture is lines[n-1].
func ry(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

// rdoc is a manifest "acme.op" of the given effect; more starts at line 4.
func rdoc(effect string, more ...string) string {
	return ry(append([]string{"tool: acme.op", "effect: " + effect, "permission: acme:write"}, more...)...)
}

// rcomp is a compensable manifest undone by h.undo; more (compensation fields) starts at line 6.
func rcomp(more ...string) string {
	return rdoc("compensable", append([]string{"compensation:", "  tool: h.undo"}, more...)...)
}

// rverif adds a verification by h.read; more (verification fields) starts at line 8.
func rverif(more ...string) string {
	return rcomp(append([]string{"  verification:", "    tool: h.read"}, more...)...)
}

type ruleKind int

const (
	single ruleKind = iota // one manifest's rule: schema_test.go also runs it through the schema
	cross                  // needs the whole set (ValidateDocuments)
	parse                  // refused by ParseFile before validation
)

type wantErr struct {
	path string
	msg  string // a distinctive substring of Message
	line int    // 0: not checked
	tool string // "": acme.op
}

type ruleCase struct {
	name   string
	kind   ruleKind
	file   string // "": rules.yaml
	yaml   string
	want   []wantErr // every error, no more
	goOnly string    // why JSON Schema cannot express the rule: the schema must accept the fixture
}

// Why a rule is checked by Go only. schema_test.go asserts the schema accepts these fixtures,
// so a mark cannot outlive the schema learning the rule.
const (
	goSelf        = "JSON Schema cannot compare a field with the manifest's own tool name"
	goDupForms    = "uniqueItems compares JSON values, and a name and {tool} objects naming the same tool differ"
	goPlaceholder = "a pattern can demand one {{args.x}}; refusing every other {{…}} beside it is not practical without lookahead"
	goFraction    = "a pattern cannot tell whether a decimal times its unit is a whole number of milliseconds"
	goTooLong     = "a pattern cannot compare a number with a unit against 365 days"
)

func e(path string, line int, msg string) wantErr { return wantErr{path: path, line: line, msg: msg} }

// withTool sets the tool every error of w is reported for.
func withTool(tool string, w ...wantErr) []wantErr {
	for i := range w {
		w[i].tool = tool
	}
	return w
}

func ruleCases() []ruleCase {
	long := strings.Repeat("a", 129)
	cases := []ruleCase{
		// Required fields. A missing field points at its enclosing object.
		{name: "tool required", yaml: ry("effect: read_only", "permission: acme:read"),
			want: withTool("manifest #1", e("tool", 1, "required: name the tool as the upstream exposes it"))},
		{name: "effect required", yaml: ry("tool: acme.op", "permission: acme:write"),
			want: []wantErr{e("effect", 1, "required: one of read_only, idempotent, reversible, compensable, irreversible")}},
		{name: "permission required", yaml: ry("tool: acme.op", "effect: read_only"),
			want: []wantErr{e("permission", 1, "required: the permission a run's scope must contain")}},
		{name: "compensation.tool required", yaml: rdoc("compensable", "compensation:", "  argument_map: {id: $result.id}"),
			want: []wantErr{e("compensation.tool", 4, "required: name the tool that undoes this one")}},
		{name: "verification.tool required", yaml: rcomp("  verification:", "    expect: {ok: true}"),
			want: []wantErr{e("compensation.verification.tool", 6, "required: name the read_only tool")}},
		{name: "verification.expect required", yaml: rverif("    retries: 2"),
			want: []wantErr{e("compensation.verification.expect", 6, "required: at least one dotted path and the value expected")}},
		{name: "requires object needs tool", yaml: rdoc("read_only", "requires: [{status: succeeded}]"),
			want: []wantErr{e("requires[0].tool", 4, "required: name the tool that must have succeeded first")}},
		{name: "idempotency.key required", yaml: rdoc("idempotent", "idempotency: {scope: run}"),
			want: []wantErr{e("idempotency.key", 4, "required: a template with at least one {{args.field}}")}},

		// Enumerations.
		{name: "effect enum", yaml: rdoc("destroy"),
			want: []wantErr{e("effect", 2, `must be one of read_only, idempotent, reversible, compensable, irreversible, found string "destroy"`)}},
		{name: "effect must be a string", yaml: rdoc("3"), want: []wantErr{e("effect", 2, "found number 3")}},
		{name: "status enum", yaml: rdoc("read_only", "status: retired"),
			want: []wantErr{e("status", 4, `must be one of draft, approved, deprecated, found string "retired"`)}},
		{name: "risk.blast_radius enum", yaml: rdoc("read_only", "risk: {data_class: pii, blast_radius: huge}"),
			want: []wantErr{e("risk.blast_radius", 4, `must be one of low, medium, high, critical, found string "huge"`)}},
		{name: "approval.on_timeout enum", yaml: rdoc("idempotent", "approval:", "  on_timeout: ignore"),
			want: []wantErr{e("approval.on_timeout", 5, `must be one of deny, escalate, found string "ignore"`)}},
		{name: "compensation.kind enum", yaml: rcomp("  kind: undo"),
			want: []wantErr{e("compensation.kind", 6, `must be one of compensation, inverse, found string "undo"`)}},
		{name: "idempotency.scope enum", yaml: rdoc("idempotent", `idempotency: {key: "k-{{args.id}}", scope: tenant}`),
			want: []wantErr{e("idempotency.scope", 4, `must be one of run, actor, global, found string "tenant"`)}},
		{name: "audit.evidence_export enum", yaml: rdoc("read_only", "audit: {evidence_export: maybe}"),
			want: []wantErr{e("audit.evidence_export", 4, `must be one of required, optional, found string "maybe"`)}},
		{name: "requires status is succeeded only", yaml: rdoc("read_only", "requires: [{tool: h.dep, status: failed}]"),
			want: []wantErr{e("requires[0].status", 4, `must be one of succeeded, found string "failed"`)}},
		{name: "approval unknown word", yaml: rdoc("idempotent", "approval: sometimes"),
			want: []wantErr{e("approval", 4, `must be never, always or an object, found string "sometimes"`)}},
		{name: "approval number", yaml: rdoc("idempotent", "approval: 2"),
			want: []wantErr{e("approval", 4, "must be never, always or an object, found number 2")}},
		{name: "approval list", yaml: rdoc("idempotent", "approval: [finance]"),
			want: []wantErr{e("approval", 4, "must be never, always or an object, found a list")}},

		// Types of plain fields.
		{name: "description string", yaml: rdoc("read_only", "description: 5"), want: []wantErr{e("description", 4, "must be a string, found number 5")}},
		{name: "owner string", yaml: rdoc("read_only", "owner: [a]"), want: []wantErr{e("owner", 4, "must be a string, found a list")}},
		{name: "oncall string", yaml: rdoc("read_only", "oncall: true"), want: []wantErr{e("oncall", 4, "must be a string, found boolean true")}},
		{name: "risk.data_class string", yaml: rdoc("read_only", "risk: {data_class: 3}"), want: []wantErr{e("risk.data_class", 4, "must be a string, found number 3")}},
		{name: "risk.environment string", yaml: rdoc("read_only", "risk: {environment: {name: prod}}"), want: []wantErr{e("risk.environment", 4, "must be a string, found an object")}},
		{name: "schema_hash not empty", yaml: rdoc("read_only", `schema_hash: ""`), want: []wantErr{e("schema_hash", 4, "must not be empty: remove it or let suggest-manifest fill it in")}},
		// One fault, one error: a number is not also "empty".
		{name: "schema_hash string", yaml: rdoc("read_only", "schema_hash: 12"), want: []wantErr{e("schema_hash", 4, "must be a string, found number 12")}},
		{name: "risk object", yaml: rdoc("read_only", "risk: high"), want: []wantErr{e("risk", 4, `must be an object, found string "high"`)}},
		{name: "retry object", yaml: rdoc("idempotent", "retry: 3"), want: []wantErr{e("retry", 4, "must be an object, found number 3")}},
		{name: "compensation object", yaml: rdoc("compensable", "compensation: h.undo"), want: []wantErr{e("compensation", 4, `must be an object, found string "h.undo"`)}},
		{name: "verification object", yaml: rcomp("  verification: h.read"), want: []wantErr{e("compensation.verification", 6, `must be an object, found string "h.read"`)}},
		{name: "idempotency object", yaml: rdoc("idempotent", `idempotency: "k-{{args.id}}"`), want: []wantErr{e("idempotency", 4, "must be an object, found string")}},
		{name: "audit object", yaml: rdoc("read_only", "audit: [x]"), want: []wantErr{e("audit", 4, "must be an object, found a list")}},
		{name: "requires list", yaml: rdoc("read_only", "requires: h.dep"),
			want: []wantErr{e("requires", 4, `must be a list of tool names or {tool, status: succeeded} objects, found string "h.dep"`)}},
		{name: "requires entry type", yaml: rdoc("read_only", "requires: [5]"),
			want: []wantErr{e("requires[0]", 4, "must be a tool name or {tool, status: succeeded}, found number 5")}},
		{name: "requires_approval boolean", yaml: rcomp(`  requires_approval: "false"`),
			want: []wantErr{e("compensation.requires_approval", 6, `must be true or false, found string "false"`)}},
		{name: "approval.required boolean", yaml: rdoc("idempotent", "approval: {required: 0}"),
			want: []wantErr{e("approval.required", 4, "must be true or false, found number 0")}},
		{name: "approval.roles list", yaml: rdoc("idempotent", "approval: {roles: finance}"),
			want: []wantErr{e("approval.roles", 4, `must be a list of strings, found string "finance"`)}},
		{name: "approval.roles entries not empty", yaml: rdoc("idempotent", "approval:", "  roles:", "    - finance", `    - ""`),
			want: []wantErr{e("approval.roles[1]", 7, `must be a non-empty string, found string ""`)}},
		{name: "approval.escalate_to entries strings", yaml: rdoc("idempotent", "approval: {escalate_to: [3]}"),
			want: []wantErr{e("approval.escalate_to[0]", 4, "must be a non-empty string, found number 3")}},
		{name: "compensation.residue list", yaml: rcomp("  residue: some fees"),
			want: []wantErr{e("compensation.residue", 6, `must be a list of strings, found string "some fees"`)}},
		{name: "idempotency.key string", yaml: rdoc("idempotent", "idempotency: {key: 5}"),
			want: []wantErr{e("idempotency.key", 4, "must be a string, found number 5")}},
		{name: "audit.retention_days positive", yaml: rdoc("read_only", "audit: {retention_days: 0}"),
			want: []wantErr{e("audit.retention_days", 4, "must be a positive number of days")}},
		{name: "audit.retention_days integer", yaml: rdoc("read_only", "audit: {retention_days: 7.5}"),
			want: []wantErr{e("audit.retention_days", 4, "must be an integer, found number 7.5")}},

		// Tool names: charset, 128 characters, not empty, a string; in every field that names a tool.
		{name: "tool charset", yaml: ry("tool: acme op", "effect: read_only", "permission: acme:read"),
			want: withTool("acme op", e("tool", 1, `"acme op" is not a tool name: use letters, digits and _ . : / - only`))},
		{name: "tool charset at sign", yaml: ry("tool: acme@op", "effect: read_only", "permission: acme:read"),
			want: withTool("acme@op", e("tool", 1, `"acme@op" is not a tool name`))},
		{name: "tool 129 characters", yaml: ry("tool: "+long, "effect: read_only", "permission: acme:read"),
			want: withTool(long, e("tool", 1, "tool name is 129 characters long: at most 128"))},
		// 65 characters but 130 bytes: refused for its charset (by both), never for a length
		// counted in bytes. So bytes vs code points cannot make the schema and Go disagree.
		{name: "tool non-ASCII counted as characters", yaml: ry("tool: "+strings.Repeat("é", 65), "effect: read_only", "permission: acme:read"),
			want: withTool(strings.Repeat("é", 65), e("tool", 1, "is not a tool name: use letters, digits"))},
		{name: "tool empty", yaml: ry(`tool: ""`, "effect: read_only", "permission: acme:read"),
			want: withTool("manifest #1", e("tool", 1, "must not be empty: name the tool"))},
		{name: "tool string", yaml: ry("tool: 42", "effect: read_only", "permission: acme:read"),
			want: withTool("manifest #1", e("tool", 1, "must be a tool name (string), found number 42"))},
		// An invalid name in a reference is also missing from the set: both are reported.
		{name: "compensation.tool charset", yaml: rdoc("compensable", "compensation:", "  tool: h undo"),
			want: []wantErr{e("compensation.tool", 5, `"h undo" is not a tool name`), e("compensation.tool", 5, `tool "h undo" has no manifest`)}},
		{name: "verification.tool charset", yaml: rcomp("  verification:", "    tool: h#read", "    expect: {ok: true}"),
			want: []wantErr{e("compensation.verification.tool", 7, `"h#read" is not a tool name`), e("compensation.verification.tool", 7, `tool "h#read" has no manifest`)}},
		{name: "replaced_by charset", yaml: rdoc("read_only", "status: deprecated", "replaced_by: h new"),
			want: []wantErr{e("replaced_by", 5, `"h new" is not a tool name`), e("replaced_by", 5, `tool "h new" has no manifest`)}},
		{name: "requires name charset", yaml: rdoc("read_only", `requires: ["h dep"]`),
			want: []wantErr{e("requires[0]", 4, `"h dep" is not a tool name`), e("requires[0]", 4, `tool "h dep" has no manifest`)}},
		{name: "requires object tool charset", yaml: rdoc("read_only", `requires: [{tool: "h dep"}]`),
			want: []wantErr{e("requires[0].tool", 4, `"h dep" is not a tool name`), e("requires[0]", 4, `tool "h dep" has no manifest`)}},
		{name: "requires name empty", yaml: rdoc("read_only", `requires: [""]`),
			want: []wantErr{e("requires[0]", 4, "must not be empty: name the tool")}},
		{name: "requires name too long", yaml: rdoc("read_only", "requires: ["+long+"]"),
			want: []wantErr{e("requires[0]", 4, "tool name is 129 characters long"), e("requires[0]", 4, "has no manifest")}},

		// Permission: a non-empty string (whitespace cases below).
		{name: "permission empty", yaml: ry("tool: acme.op", "effect: read_only", `permission: ""`),
			want: []wantErr{e("permission", 3, `"" is not a permission: use one word without whitespace`)}},
		{name: "permission string", yaml: ry("tool: acme.op", "effect: read_only", "permission: 7"),
			want: []wantErr{e("permission", 3, "must be a string, found number 7")}},

		// version.
		{name: "version zero", yaml: rdoc("read_only", "version: 0"), want: []wantErr{e("version", 4, "must be a positive integer")}},
		{name: "version negative", yaml: rdoc("read_only", "version: -1"), want: []wantErr{e("version", 4, "must be a positive integer")}},
		{name: "version fraction", yaml: rdoc("read_only", "version: 1.5"), want: []wantErr{e("version", 4, "must be an integer, found number 1.5")}},
		{name: "version string", yaml: rdoc("read_only", `version: "2"`), want: []wantErr{e("version", 4, `must be an integer, found string "2"`)}},

		// Compensation required for reversible and compensable, forbidden otherwise.
		{name: "reversible needs compensation", yaml: rdoc("reversible"),
			want: []wantErr{e("compensation", 1, "required for a reversible tool: name the tool that undoes it")}},
		{name: "compensable needs compensation", yaml: rdoc("compensable", "description: Charge."),
			want: []wantErr{e("compensation", 1, "required for a compensable tool")}},
		{name: "read_only forbids compensation", yaml: rdoc("read_only", "compensation: {tool: h.undo}"),
			want: []wantErr{e("compensation", 4, "not allowed for a read_only tool: only reversible and compensable tools declare a compensation")}},
		{name: "idempotent forbids compensation", yaml: rdoc("idempotent", "compensation: {tool: h.undo}"),
			want: []wantErr{e("compensation", 4, "not allowed for an idempotent tool")}},
		{name: "irreversible forbids compensation", yaml: rdoc("irreversible", "compensation: {tool: h.undo}"),
			want: []wantErr{e("compensation", 4, "not allowed for an irreversible tool")}},

		// Irreversible tools cannot set approval never, in either form.
		{name: "irreversible approval never", yaml: rdoc("irreversible", "approval: never"),
			want: []wantErr{e("approval", 4, "an irreversible tool cannot set approval: never: it always needs approval; use always or the object form")}},
		{name: "irreversible approval required false", yaml: rdoc("irreversible", "approval: {required: false}"),
			want: []wantErr{e("approval.required", 4, "an irreversible tool cannot set approval: never: it always needs approval; remove required: false")}},
		{name: "irreversible approval required false with rules", yaml: rdoc("irreversible", "approval:", "  roles: [legal]", "  required: false"),
			want: []wantErr{e("approval.required", 6, "remove required: false")}},

		// A tool cannot require, compensate or replace itself.
		{name: "requires itself", yaml: rdoc("read_only", "requires: [acme.op]"), goOnly: goSelf,
			want: []wantErr{e("requires[0]", 4, "a tool cannot require itself: remove this entry")}},
		{name: "requires itself object form", yaml: rdoc("read_only", "requires: [h.dep, {tool: acme.op}]"), goOnly: goSelf,
			want: []wantErr{e("requires[1]", 4, "a tool cannot require itself")}},
		{name: "compensates itself", yaml: rdoc("compensable", "compensation:", "  tool: acme.op"), goOnly: goSelf,
			want: []wantErr{e("compensation.tool", 5, "a tool cannot compensate itself: name the tool that undoes it")}},
		{name: "replaces itself", yaml: rdoc("read_only", "status: deprecated", "replaced_by: acme.op"), goOnly: goSelf,
			want: []wantErr{e("replaced_by", 5, "a tool cannot replace itself: name the tool to use instead")}},

		// requires has no duplicates, whatever the form.
		{name: "requires duplicate names", yaml: rdoc("read_only", "requires: [h.dep, h.dep]"),
			want: []wantErr{e("requires[1]", 4, `"h.dep" is already listed at requires[0]: list each tool once`)}},
		{name: "requires duplicate objects", yaml: rdoc("read_only", "requires: [{tool: h.dep}, {tool: h.dep}]"),
			want: []wantErr{e("requires[1]", 4, `"h.dep" is already listed at requires[0]`)}},
		{name: "requires duplicate after others", yaml: rdoc("read_only", "requires:", "  - h.read", "  - h.dep", "  - h.dep"),
			want: []wantErr{e("requires[2]", 7, `"h.dep" is already listed at requires[1]`)}},
		{name: "requires duplicate string and object", yaml: rdoc("read_only", "requires: [h.dep, {tool: h.dep}]"), goOnly: goDupForms,
			want: []wantErr{e("requires[1]", 4, `"h.dep" is already listed at requires[0]`)}},
		{name: "requires duplicate object with and without status", yaml: rdoc("read_only", "requires: [{tool: h.dep}, {tool: h.dep, status: succeeded}]"), goOnly: goDupForms,
			want: []wantErr{e("requires[1]", 4, `"h.dep" is already listed at requires[0]`)}},

		// References in argument_map, verification.arguments and audit.redaction.
		{name: "argument_map empty argument name", yaml: rcomp("  argument_map:", `    "": $result.id`),
			want: []wantErr{e("compensation.argument_map.", 7, "an argument name must not be empty")}},
		{name: "argument_map without $", yaml: rcomp("  argument_map:", "    id: result.id"),
			want: []wantErr{e("compensation.argument_map.id", 7, `"result.id" is not a reference: use $args.<path> or $result.<path>`)}},
		{name: "argument_map unknown root", yaml: rcomp("  argument_map: {id: $params.id}"),
			want: []wantErr{e("compensation.argument_map.id", 6, `"$params.id" is not a reference`)}},
		{name: "argument_map root only", yaml: rcomp("  argument_map: {id: $args}"),
			want: []wantErr{e("compensation.argument_map.id", 6, `"$args" is not a reference`)}},
		{name: "argument_map empty segment", yaml: rcomp("  argument_map: {id: $args..id}"),
			want: []wantErr{e("compensation.argument_map.id", 6, `"$args..id" is not a reference`)}},
		{name: "argument_map trailing dot", yaml: rcomp("  argument_map: {id: $result.id.}"),
			want: []wantErr{e("compensation.argument_map.id", 6, `"$result.id." is not a reference`)}},
		{name: "argument_map space", yaml: rcomp(`  argument_map: {id: "$args.order id"}`),
			want: []wantErr{e("compensation.argument_map.id", 6, `"$args.order id" is not a reference`)}},
		{name: "argument_map no-break space", yaml: rcomp(`  argument_map: {id: "$args.order\u00a0id"}`),
			want: []wantErr{e("compensation.argument_map.id", 6, "is not a reference")}},
		{name: "argument_map value type", yaml: rcomp("  argument_map: {id: 5}"),
			want: []wantErr{e("compensation.argument_map.id", 6, "must be a reference such as $args.id or $result.charge_id, found number 5")}},
		{name: "argument_map object", yaml: rcomp("  argument_map: [$args.id]"),
			want: []wantErr{e("compensation.argument_map", 6, "must be an object of argument names to references, found a list")}},
		{name: "verification.arguments reference", yaml: rverif("    arguments: {id: id}", "    expect: {ok: true}"),
			want: []wantErr{e("compensation.verification.arguments.id", 8, `"id" is not a reference`)}},
		{name: "audit.redaction reference", yaml: rdoc("read_only", "audit:", "  redaction: [$args.card, card_token]"),
			want: []wantErr{e("audit.redaction[1]", 5, `"card_token" is not a reference`)}},
		{name: "audit.redaction entry empty", yaml: rdoc("read_only", `audit: {redaction: [""]}`),
			want: []wantErr{e("audit.redaction[0]", 4, `must be a non-empty string, found string ""`)}},
		{name: "audit.redaction list", yaml: rdoc("read_only", "audit: {redaction: $args.card}"),
			want: []wantErr{e("audit.redaction", 4, "must be a list of strings")}},

		// kind: inverse cannot list residue.
		{name: "inverse with residue", yaml: rcomp("  kind: inverse", "  residue: [fees are kept]"),
			want: []wantErr{e("compensation.residue", 7, "kind: inverse restores the exact prior state and cannot list residue")}},

		// retry: only read_only and idempotent; attempts 1 to 10. Verification retries 1 to 10.
		{name: "retry on reversible", yaml: rdoc("reversible", "compensation: {tool: h.undo}", "retry: {attempts: 2}"),
			want: []wantErr{e("retry", 5, "only read_only and idempotent tools may retry: retrying a reversible tool could repeat its effect")}},
		{name: "retry on compensable", yaml: rdoc("compensable", "retry: {}", "compensation: {tool: h.undo}"),
			want: []wantErr{e("retry", 4, "retrying a compensable tool")}},
		{name: "retry on irreversible", yaml: rdoc("irreversible", "retry:", "  attempts: 3"),
			want: []wantErr{e("retry", 4, "retrying an irreversible tool")}},
		{name: "retry attempts zero", yaml: rdoc("idempotent", "retry:", "  attempts: 0"),
			want: []wantErr{e("retry.attempts", 5, "must be between 1 and 10, found 0")}},
		{name: "retry attempts eleven", yaml: rdoc("read_only", "retry: {attempts: 11}"),
			want: []wantErr{e("retry.attempts", 4, "must be between 1 and 10, found 11")}},
		{name: "retry attempts integer", yaml: rdoc("idempotent", "retry: {attempts: 2.5}"),
			want: []wantErr{e("retry.attempts", 4, "must be an integer, found number 2.5")}},
		{name: "verification retries zero", yaml: rverif("    expect: {ok: true}", "    retries: 0"),
			want: []wantErr{e("compensation.verification.retries", 9, "must be between 1 and 10, found 0")}},
		{name: "verification retries eleven", yaml: rverif("    expect: {ok: true}", "    retries: 11"),
			want: []wantErr{e("compensation.verification.retries", 9, "must be between 1 and 10, found 11")}},

		// verification.expect: an object, not empty, keys are dotted paths.
		{name: "expect empty", yaml: rverif("    expect: {}"),
			want: []wantErr{e("compensation.verification.expect", 8, "must have at least one entry")}},
		{name: "expect null", yaml: rverif("    expect: null"),
			want: []wantErr{e("compensation.verification.expect", 8, "must be an object of dotted paths to expected values, found null")}},
		{name: "expect list", yaml: rverif("    expect: [refunded]"),
			want: []wantErr{e("compensation.verification.expect", 8, "must be an object of dotted paths to expected values, found a list")}},
		{name: "expect empty segment", yaml: rverif("    expect:", "      items..id: 1"),
			want: []wantErr{e("compensation.verification.expect.items..id", 9, `"items..id" is not a dotted path`)}},
		{name: "expect leading dot", yaml: rverif(`    expect: {".ok": true}`),
			want: []wantErr{e("compensation.verification.expect..ok", 8, `".ok" is not a dotted path`)}},
		{name: "expect trailing dot", yaml: rverif(`    expect: {"ok.": true}`),
			want: []wantErr{e("compensation.verification.expect.ok.", 8, `"ok." is not a dotted path`)}},
		{name: "expect whitespace", yaml: rverif(`    expect: {"is ok": true}`),
			want: []wantErr{e("compensation.verification.expect.is ok", 8, `"is ok" is not a dotted path`)}},
		{name: "expect empty key", yaml: rverif(`    expect: {"": true}`),
			want: []wantErr{e("compensation.verification.expect.", 8, `"" is not a dotted path`)}},

		// approval: quorum 1 to 10, above 1 only with roles; escalate needs escalate_to.
		{name: "quorum zero", yaml: rdoc("idempotent", "approval: {roles: [a], quorum: 0}"),
			want: []wantErr{e("approval.quorum", 4, "must be between 1 and 10, found 0")}},
		{name: "quorum eleven", yaml: rdoc("idempotent", "approval:", "  roles: [a]", "  quorum: 11"),
			want: []wantErr{e("approval.quorum", 6, "must be between 1 and 10, found 11")}},
		{name: "quorum integer", yaml: rdoc("idempotent", "approval: {roles: [a], quorum: 1.5}"),
			want: []wantErr{e("approval.quorum", 4, "must be an integer, found number 1.5")}},
		{name: "quorum above 1 needs roles", yaml: rdoc("idempotent", "approval:", "  quorum: 2"),
			want: []wantErr{e("approval.quorum", 5, "a quorum above 1 needs roles: name the roles or groups that may approve")}},
		{name: "quorum above 1 empty roles", yaml: rdoc("idempotent", "approval: {quorum: 3, roles: []}"),
			want: []wantErr{e("approval.quorum", 4, "a quorum above 1 needs roles")}},
		{name: "escalate needs escalate_to", yaml: rdoc("idempotent", "approval:", "  on_timeout: escalate"),
			want: []wantErr{e("approval.escalate_to", 4, "required when on_timeout is escalate: name the roles asked next")}},
		{name: "escalate with empty escalate_to", yaml: rdoc("idempotent", "approval:", "  on_timeout: escalate", "  escalate_to: []"),
			want: []wantErr{e("approval.escalate_to", 6, "required when on_timeout is escalate")}},

		// idempotency.key: at least one {{args.field}}, no other placeholder.
		{name: "key constant", yaml: rdoc("idempotent", "idempotency: {key: charge}"),
			want: []wantErr{e("idempotency.key", 4, "needs at least one {{args.field}} placeholder, such as charge-{{args.order_id}}: a constant key would make every call a duplicate")}},
		{name: "key single braces", yaml: rdoc("idempotent", `idempotency: {key: "charge-{args.id}"}`),
			want: []wantErr{e("idempotency.key", 4, "needs at least one {{args.field}} placeholder")}},
		{name: "key result placeholder only", yaml: rdoc("idempotent", `idempotency: {key: "charge-{{result.id}}"}`),
			want: []wantErr{e("idempotency.key", 4, "placeholder {{result.id}} is not an argument: only {{args.field}} placeholders are allowed")}},
		{name: "key args without field", yaml: rdoc("idempotent", `idempotency: {key: "charge-{{args.}}"}`),
			want: []wantErr{e("idempotency.key", 4, "placeholder {{args.}} is not an argument")}},
		{name: "key args root", yaml: rdoc("idempotent", `idempotency: {key: "charge-{{args}}"}`),
			want: []wantErr{e("idempotency.key", 4, "placeholder {{args}} is not an argument")}},
		{name: "key space in field", yaml: rdoc("idempotent", `idempotency: {key: "charge-{{args.order id}}"}`),
			want: []wantErr{e("idempotency.key", 4, "placeholder {{args.order id}} is not an argument")}},
		{name: "key unknown placeholder beside a valid one", yaml: rdoc("idempotent", `idempotency: {key: "{{args.id}}-{{run.id}}"}`), goOnly: goPlaceholder,
			want: []wantErr{e("idempotency.key", 4, "placeholder {{run.id}} is not an argument")}},

		// replaced_by only when deprecated.
		{name: "replaced_by without status", yaml: rdoc("read_only", "replaced_by: h.new"),
			want: []wantErr{e("replaced_by", 4, "only a deprecated tool names a replacement: set status: deprecated or remove replaced_by")}},
		{name: "replaced_by when approved", yaml: rdoc("read_only", "status: approved", "replaced_by: h.new"),
			want: []wantErr{e("replaced_by", 5, "only a deprecated tool names a replacement")}},
		{name: "replaced_by when draft", yaml: rdoc("read_only", "replaced_by: h.new", "status: draft"),
			want: []wantErr{e("replaced_by", 4, "only a deprecated tool names a replacement")}},

		// Unknown fields at every level, reported at the field's own line.
		{name: "unknown top-level field", yaml: rdoc("read_only", "colour: red"),
			want: []wantErr{e("colour", 4, "unknown field: remove it or fix its name (known fields: tool, description, effect, permission, approval")}},
		{name: "unknown approval field", yaml: rdoc("idempotent", "approval:", "  roles: [a]", "  quorom: 2"),
			want: []wantErr{e("approval.quorom", 6, "unknown field: remove it or fix its name (known fields: required, roles, quorum, timeout, on_timeout, escalate_to)")}},
		{name: "unknown compensation field", yaml: rcomp("  argmap: {}"),
			want: []wantErr{e("compensation.argmap", 6, "(known fields: tool, argument_map, kind, residue, requires_approval, timeout_ms, verification)")}},
		{name: "unknown verification field", yaml: rverif("    expect: {ok: true}", "    retry: 3"),
			want: []wantErr{e("compensation.verification.retry", 9, "(known fields: tool, arguments, expect, retries, backoff_ms)")}},
		{name: "unknown requires field", yaml: rdoc("read_only", "requires: [{tool: h.dep, state: succeeded}]"),
			want: []wantErr{e("requires[0].state", 4, "(known fields: tool, status)")}},
		{name: "unknown risk field", yaml: rdoc("read_only", "risk: {blast: high}"),
			want: []wantErr{e("risk.blast", 4, "(known fields: data_class, blast_radius, environment)")}},
		{name: "unknown retry field", yaml: rdoc("read_only", "retry: {attempt: 3}"),
			want: []wantErr{e("retry.attempt", 4, "(known fields: attempts, base_ms, max_ms)")}},
		{name: "unknown idempotency field", yaml: rdoc("idempotent", "idempotency:", `  key: "k-{{args.id}}"`, "  ttl: 5m"),
			want: []wantErr{e("idempotency.ttl", 6, "(known fields: key, scope)")}},
		{name: "unknown audit field", yaml: rdoc("read_only", "audit: {retention: 5}"),
			want: []wantErr{e("audit.retention", 4, "(known fields: retention_days, evidence_export, redaction)")}},

		// Duplicate keys: refused by the reader, at the second key, naming the first's line; the
		// rest of the object is still read (and checked by the validator).
		{name: "duplicate top-level key", kind: parse, yaml: rdoc("read_only", "effect: idempotent"),
			want: []wantErr{e("effect", 4, `duplicate key "effect" (first at line 2): keep one`)}},
		{name: "duplicate approval key", kind: parse, yaml: rdoc("idempotent", "approval:", "  quorum: 1", "  roles: [a]", "  quorum: 2"),
			want: []wantErr{e("approval.quorum", 7, `duplicate key "quorum" (first at line 5)`)}},
		{name: "duplicate expect key", kind: parse, yaml: rverif("    expect:", "      ok: true", "      ok: false"),
			want: []wantErr{e("compensation.verification.expect.ok", 10, `duplicate key "ok" (first at line 9)`)}},
		{name: "duplicate key in a requires entry", kind: parse, yaml: rdoc("read_only", "requires:", "  - tool: h.dep", "    tool: h.read"),
			want: []wantErr{e("requires[0].tool", 6, `duplicate key "tool" (first at line 5)`)}},
		{name: "duplicate key in JSON", kind: parse, file: "rules.json",
			yaml: "{\"tool\": \"acme.op\",\n \"effect\": \"read_only\",\n \"permission\": \"acme:read\",\n \"tool\": \"acme.two\"}\n",
			want: []wantErr{e("tool", 4, `duplicate key "tool" (first at line 1)`)}},
		{name: "entry not an object", kind: parse, yaml: ry("- tool: acme.op", "  effect: read_only", "  permission: acme:read", "- acme.two"),
			want: []wantErr{e("", 4, `entry 2: expected an object, found string "acme.two"`)}},

		// Across manifests: referenced tools exist, verification is read_only, names are unique.
		{name: "compensation tool missing", kind: cross, yaml: rdoc("compensable", "compensation:", "  tool: h.nope"),
			want: []wantErr{e("compensation.tool", 5, `tool "h.nope" has no manifest: add its manifest or fix the name`)}},
		{name: "required tool missing", kind: cross, yaml: rdoc("read_only", "requires: [h.dep, {tool: h.nope}]"),
			want: []wantErr{e("requires[1]", 4, `tool "h.nope" has no manifest`)}},
		{name: "verification tool missing", kind: cross, yaml: rcomp("  verification:", "    tool: h.nope", "    expect: {ok: true}"),
			want: []wantErr{e("compensation.verification.tool", 7, `tool "h.nope" has no manifest`)}},
		{name: "replaced_by missing", kind: cross, yaml: rdoc("read_only", "status: deprecated", "replaced_by: h.gone"),
			want: []wantErr{e("replaced_by", 5, `tool "h.gone" has no manifest`)}},
		// A draft is not enforced: an enforced manifest cannot lean on a tool that is only a draft
		// (its rollback would run a tool nobody approved); a draft may.
		{name: "compensation tool only a draft", kind: cross, yaml: rdoc("compensable", "compensation:", "  tool: h.draft"),
			want: []wantErr{e("compensation.tool", 5, `tool "h.draft" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve h.draft first (reversi manifests approve h.draft, or status: approved in plain files)`)}},
		{name: "required tool only a draft", kind: cross, yaml: rdoc("read_only", "requires: [h.dep, {tool: h.rdraft}]"),
			want: []wantErr{e("requires[1]", 4, `tool "h.rdraft" is only a draft: drafts are not enforced, so requires cannot use it; approve h.rdraft first (reversi manifests approve h.rdraft, or status: approved in plain files)`)}},
		{name: "verification tool only a draft", kind: cross, yaml: rcomp("  verification:", "    tool: h.rdraft", "    expect: {ok: true}"),
			want: []wantErr{e("compensation.verification.tool", 7, `tool "h.rdraft" is only a draft: drafts are not enforced, so compensation.verification.tool cannot use it; approve h.rdraft first (reversi manifests approve h.rdraft, or status: approved in plain files)`)}},
		{name: "replaced_by only a draft", kind: cross, yaml: rdoc("read_only", "status: deprecated", "replaced_by: h.rdraft"),
			want: []wantErr{e("replaced_by", 5, `tool "h.rdraft" is only a draft: drafts are not enforced, so replaced_by cannot use it; approve h.rdraft first (reversi manifests approve h.rdraft, or status: approved in plain files)`)}},
		{name: "a draft may use drafts", kind: cross, yaml: rdoc("compensable", "status: draft", "requires: [h.rdraft]", "compensation:", "  tool: h.draft", "  verification:", "    tool: h.rdraft", "    expect: {ok: true}")},
		{name: "a draft's missing tool is still missing", kind: cross, yaml: rdoc("compensable", "status: draft", "compensation:", "  tool: h.nope"),
			want: []wantErr{e("compensation.tool", 6, `tool "h.nope" has no manifest`)}},
		{name: "verification tool not read_only", kind: cross, yaml: rcomp("  verification:", "    tool: h.undo", "    expect: {ok: true}"),
			want: []wantErr{e("compensation.verification.tool", 7, `"h.undo" is idempotent: a verification read-back must use a read_only tool`)}},
		{name: "duplicate tool name", kind: cross,
			yaml: ry("- tool: acme.op", "  effect: read_only", "  permission: acme:read", "- tool: acme.op", "  effect: idempotent", "  permission: acme:write"),
			want: []wantErr{e("tool", 4, "duplicate tool name: also defined at rules.yaml:1; keep one manifest per tool")}},
		// The helpers follow the fixture (line 4 is "---"), so the helper is the second h.read.
		{name: "duplicate of another document's name", kind: cross, yaml: ry("tool: h.read", "effect: read_only", "permission: h:read"),
			want: withTool("h.read", e("tool", 5, "duplicate tool name: also defined at rules.yaml:1"))},
		// A manifest with errors of its own still counts as defined: one typo, one error.
		{name: "invalid manifest still defines its name", kind: cross,
			yaml: ry("- tool: acme.op", "  effect: read_only", "  permission: acme:read", "  colour: red",
				"- tool: acme.two", "  effect: read_only", "  permission: acme:read", "  requires: [acme.op]"),
			want: []wantErr{e("colour", 4, "unknown field")}},
	}

	// Permission: no whitespace of any kind (Unicode), at any position.
	for _, p := range []struct{ name, yaml string }{
		{"space", `"acme write"`}, {"leading space", `" acme:write"`}, {"tab", `"acme\twrite"`},
		{"vertical tab", `"acme\vwrite"`}, {"no-break space", `"acme\u00a0write"`},
		{"em space", `"acme\u2003write"`}, {"line separator", `"acme\u2028write"`}, {"ideographic space", `"acme\u3000write"`},
	} {
		cases = append(cases, ruleCase{name: "permission " + p.name,
			yaml: ry("tool: acme.op", "effect: read_only", "permission: "+p.yaml),
			want: []wantErr{e("permission", 3, "is not a permission: use one word without whitespace, such as payments:write")}})
	}

	// Durations: every duration field, every way to get one wrong.
	sites := []struct {
		path  string
		line  int
		build func(v string) string
	}{
		{"timeout_ms", 4, func(v string) string { return rdoc("idempotent", "timeout_ms: "+v) }},
		{"retry.base_ms", 5, func(v string) string { return rdoc("idempotent", "retry:", "  base_ms: "+v) }},
		{"retry.max_ms", 5, func(v string) string { return rdoc("read_only", "retry:", "  max_ms: "+v) }},
		{"approval.timeout", 5, func(v string) string { return rdoc("idempotent", "approval:", "  timeout: "+v) }},
		{"compensation.timeout_ms", 6, func(v string) string { return rcomp("  timeout_ms: " + v) }},
		{"compensation.verification.backoff_ms", 9, func(v string) string {
			return rverif("    expect: {ok: true}", "    backoff_ms: "+v)
		}},
	}
	bad := []struct{ yaml, msg, goOnly string }{
		{"30sec", `invalid duration "30sec": use a number of milliseconds or a number with a unit (500ms, 30s, 15m, 2h, 1d)`, ""},
		{"1w", `invalid duration "1w"`, ""},
		{`"5"`, `invalid duration "5"`, ""},
		{`"1.5 s"`, `invalid duration "1.5 s"`, ""},
		{`""`, `invalid duration ""`, ""},
		{"-5s", `invalid duration "-5s"`, ""},
		{"0", "invalid duration 0: must be positive", ""},
		{"0s", "invalid duration 0s: must be positive", ""},
		{"0.000m", "invalid duration 0.000m: must be positive", ""},
		{"-5", "invalid duration -5: must be positive", ""},
		{"1.5", "invalid duration 1.5: must be a whole number of milliseconds", ""},
		{"1.5ms", "invalid duration 1.5ms: must be a whole number of milliseconds", goFraction},
		{"0.0001s", "invalid duration 0.0001s: must be a whole number of milliseconds", goFraction},
		{"31536000001", "invalid duration 31536000001: longer than 365 days", ""},
		{"366d", "invalid duration 366d: longer than 365 days", goTooLong},
		{"8761h", "invalid duration 8761h: longer than 365 days", goTooLong},
		{"true", "invalid duration boolean true: use a number of milliseconds or a string such as 30s", ""},
		{"[1]", "invalid duration a list", ""},
		{"null", "invalid duration null", ""},
	}
	for _, s := range sites {
		for _, b := range bad {
			cases = append(cases, ruleCase{name: s.path + " " + b.yaml, yaml: s.build(b.yaml), goOnly: b.goOnly,
				want: []wantErr{e(s.path, s.line, b.msg)}})
		}
	}
	return cases
}

// validCases are edges that both the validator and the schema must accept.
func validCases() map[string]string {
	ok := map[string]string{
		"tool 128 characters":                     ry("tool: "+strings.Repeat("a", 128), "effect: read_only", "permission: p"),
		"tool every allowed character":            ry("tool: aZ09_.:/-", "effect: read_only", "permission: p"),
		"permission non-ASCII letters":            ry("tool: t", "effect: read_only", "permission: paiements:écrire"),
		"permission zero-width space is no space": ry("tool: t", "effect: read_only", `permission: "a\u200bb"`),
		"quorum 10 with roles":                    rdoc("idempotent", "approval: {roles: [a], quorum: 10}"),
		"quorum 1 without roles":                  rdoc("idempotent", "approval: {quorum: 1}"),
		"approval empty object":                   rdoc("idempotent", "approval: {}"),
		"approval required false with rules":      rdoc("idempotent", "approval: {required: false, quorum: 2, roles: [a]}"),
		"approval escalate":                       rdoc("idempotent", "approval: {on_timeout: escalate, escalate_to: [cfo]}"),
		"irreversible approval always":            rdoc("irreversible", "approval: always"),
		"irreversible approval object":            rdoc("irreversible", "approval: {roles: [legal], required: true}"),
		"irreversible without approval":           rdoc("irreversible"),
		"retry bounds":                            rdoc("idempotent", "retry: {attempts: 1}"),
		"retry ten on read_only":                  rdoc("read_only", "retry: {attempts: 10, base_ms: 1, max_ms: 365d}"),
		"retry empty":                             rdoc("idempotent", "retry: {}"),
		"verification bounds":                     rverif("    expect: {ok: true}", "    retries: 10", "    backoff_ms: 1ms"),
		"verification one retry":                  rverif("    expect: {ok: true}", "    retries: 1"),
		"expect paths": rverif(`    expect: {items.0.id: x, größe: 1, "a-b.c_d": [1, {x: null}]}`,
			"    arguments: {id: $result.items.0.id, n: $args.a-b}"),
		"requires both forms":            rdoc("read_only", "requires: [h.dep, {tool: h.read}, {tool: h.new, status: succeeded}]"),
		"inverse with empty residue":     rcomp("  kind: inverse", "  residue: []"),
		"key with spaces around":         rdoc("idempotent", `idempotency: {key: "{{ args.id }}", scope: actor}`),
		"key with several args":          rdoc("idempotent", `idempotency: {key: "a-{{args.x.y}}-{{args.z}}", scope: global}`),
		"key after stray braces":         rdoc("idempotent", `idempotency: {key: "{{{{args.x}}"}`),
		"deprecated with replacement":    rdoc("read_only", "status: deprecated", "replaced_by: h.new"),
		"deprecated without replacement": rdoc("read_only", "status: deprecated"),
		"draft version 7":                rdoc("read_only", "status: draft", "version: 7"),
		"audit full":                     rdoc("read_only", "audit: {retention_days: 1, evidence_export: optional, redaction: [$args.a, $result.b.0]}"),
		"risk full":                      rdoc("read_only", "risk: {data_class: pii, blast_radius: critical, environment: prod}"),
		"empty maps and lists":           rcomp("  argument_map: {}", "  residue: []", "  requires_approval: true"),
		"all strings may be empty":       rdoc("read_only", `description: ""`, `owner: ""`, `oncall: ""`, `risk: {data_class: "", environment: ""}`),
		"whole float is an integer":      rdoc("read_only", "version: 2.0", "timeout_ms: 1000.0", "retry: {attempts: 3.0}"),
		"schema hash":                    rdoc("read_only", "schema_hash: 9f2c"),
	}
	for _, d := range []string{"1", "31536000000", "1ms", "1.000ms", "0.5s", "1.5s", "0.001s", "1.1h", "4.35m", "1.25m", "8760h", "365d", "365.0d", "007s"} {
		ok["timeout_ms "+d] = rdoc("idempotent", "timeout_ms: "+d)
	}
	ok["every duration field"] = rdoc("compensable", "timeout_ms: 2h", "approval: {timeout: 1d}",
		"compensation:", "  tool: h.undo", "  timeout_ms: 20s", "  verification: {tool: h.read, expect: {ok: true}, backoff_ms: 2s}")
	return ok
}

func TestRules(t *testing.T) {
	for _, c := range ruleCases() {
		t.Run(c.name, func(t *testing.T) {
			file := rulesFile
			if c.file != "" {
				file = c.file
			}
			if c.kind == parse {
				_, errs := ParseFile(file, []byte(c.yaml))
				if len(errs) != 1 {
					t.Fatalf("ParseFile errors = %v, want one", errs)
				}
				fe, ok := errs[0].(*FieldError)
				if !ok {
					t.Fatalf("ParseFile error = %v (%T), want a *FieldError", errs[0], errs[0])
				}
				w := c.want[0]
				if fe.File != file || fe.Line != w.line || fe.Path != w.path || !strings.Contains(fe.Message, w.msg) {
					t.Fatalf("got %s (line %d, path %q)\nwant line %d, path %q, message containing %q", fe, fe.Line, fe.Path, w.line, w.path, w.msg)
				}
				return
			}
			docs, err := ParseFile(file, []byte(c.yaml+ruleHelpers))
			if err != nil {
				t.Fatal(err)
			}
			_, errs := ValidateDocuments(docs)
			checkErrors(t, errs, c.want, file)
		})
	}
}

// checkErrors asserts that errs are exactly want: same count, and each want matched by its own
// error (path, message substring, tool, line).
func checkErrors(t *testing.T, errs []error, want []wantErr, file string) {
	t.Helper()
	used := make([]bool, len(errs))
	for _, w := range want {
		tool := w.tool
		if tool == "" {
			tool = "acme.op"
		}
		found := false
		for i, err := range errs {
			fe, ok := err.(*FieldError)
			if !ok {
				t.Fatalf("error %v is %T, want *FieldError", err, err)
			}
			if used[i] || fe.Path != w.path || fe.Tool != tool || !strings.Contains(fe.Message, w.msg) || (w.line != 0 && fe.Line != w.line) {
				continue
			}
			used[i], found = true, true
			break
		}
		if !found {
			t.Errorf("no error %s: %s: %q at line %d", tool, w.path, w.msg, w.line)
		}
	}
	for i, err := range errs {
		fe := err.(*FieldError)
		if !used[i] {
			t.Errorf("unexpected error: %s (line %d)", err, fe.Line)
		}
		if fe.File != file || fe.Line == 0 {
			t.Errorf("error %q should carry file %s and a line", err, file)
		}
	}
}

func TestValidEdges(t *testing.T) {
	for name, y := range validCases() {
		t.Run(name, func(t *testing.T) {
			docs, err := ParseFile(rulesFile, []byte(y+ruleHelpers))
			if err != nil {
				t.Fatal(err)
			}
			ms, errs := ValidateDocuments(docs)
			if len(errs) > 0 || len(ms) != len(docs) {
				t.Fatalf("errors: %v", errs)
			}
		})
	}
}

// manyFaults is one manifest with fifteen faults (two on line 8), all to be reported at once.
const manyFaults = `tool: acme op
effect: compensable
permission: acme write
version: 0
status: retired
colour: red
timeout_ms: 0s
retry: {attempts: 11}
approval: {quorum: 2}
idempotency: {key: constant}
audit: {redaction: [card]}
compensation:
  tool: h.undo
  kind: inverse
  residue: [x]
  argument_map: {id: result.id}
  verification:
    tool: h.read
    expect: {}
    retries: 0
`

func TestAllErrorsAtOnce(t *testing.T) {
	want := map[string]int{
		"tool": 1, "permission": 3, "version": 4, "status": 5, "colour": 6, "timeout_ms": 7,
		"retry.attempts": 8, "retry": 8, "approval.quorum": 9, "idempotency.key": 10,
		"audit.redaction[0]": 11, "compensation.residue": 15, "compensation.argument_map.id": 16,
		"compensation.verification.expect": 19, "compensation.verification.retries": 20,
	}
	docs, err := ParseFile(rulesFile, []byte(manyFaults+ruleHelpers))
	if err != nil {
		t.Fatal(err)
	}
	ms, errs := ValidateDocuments(docs)
	if len(errs) != len(want) {
		t.Errorf("got %d errors, want %d:\n%v", len(errs), len(want), errs)
	}
	if len(ms) != len(docs)-1 || slices.ContainsFunc(ms, func(m *Manifest) bool { return m.Tool == "acme op" }) {
		t.Errorf("the faulty manifest must be left out and the helpers kept: got %d manifests", len(ms))
	}
	got := map[string]int{}
	for _, err := range errs {
		fe := err.(*FieldError)
		got[fe.Path] = fe.Line
		if fe.Tool != "acme op" || fe.File != rulesFile {
			t.Errorf("error %q: tool %q, file %q", err, fe.Tool, fe.File)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("paths and lines:\n got %v\nwant %v", got, want)
	}

	// Validate on the decoded object reports the same faults, without a file.
	m, errs := Validate(docs[0].Value)
	if m != nil {
		t.Error("Validate returned a manifest along with errors")
	}
	var paths []string
	for _, err := range errs {
		fe := err.(*FieldError)
		if fe.File != "" || fe.Line != 0 || fe.Tool != "acme op" {
			t.Errorf("Validate error %q: file %q, line %d, tool %q", err, fe.File, fe.Line, fe.Tool)
		}
		paths = append(paths, fe.Path)
	}
	slices.Sort(paths)
	if wantPaths := slices.Sorted(maps.Keys(want)); !slices.Equal(paths, wantPaths) {
		t.Errorf("Validate paths %v, want %v", paths, wantPaths)
	}
}

// normalised parses one YAML manifest and validates it on its own.
func normalised(t *testing.T, y string) *Manifest {
	t.Helper()
	docs, err := ParseFile("n.yaml", []byte(y))
	if err != nil || len(docs) != 1 {
		t.Fatalf("parse: %v (%d documents)", err, len(docs))
	}
	m, errs := Validate(docs[0].Value)
	if len(errs) > 0 {
		t.Fatalf("invalid: %v", errs)
	}
	return m
}

func int64p(n int64) *int64 { return &n }

func TestNormaliseDurations(t *testing.T) {
	m := normalised(t, rdoc("idempotent", "timeout_ms: 1.1h", "retry: {base_ms: 0.25s, max_ms: 2m}",
		"approval: {timeout: 1d}"))
	if *m.TimeoutMs != 3960000 || m.Retry.BaseMs != 250 || m.Retry.MaxMs != 120000 || *m.Approval.Rules.TimeoutMs != 86400000 {
		t.Errorf("durations: timeout %d, retry %+v, approval %d", *m.TimeoutMs, *m.Retry, *m.Approval.Rules.TimeoutMs)
	}
	c := normalised(t, rverif("    expect: {ok: true}", "    backoff_ms: 4.35m")+"timeout_ms: 500\n").Compensation
	c2 := normalised(t, rcomp("  timeout_ms: 365d")).Compensation
	if c.Verification.BackoffMs != 261000 || *c2.TimeoutMs != 31536000000 {
		t.Errorf("backoff %d, compensation timeout %d", c.Verification.BackoffMs, *c2.TimeoutMs)
	}
}

func TestNormaliseApproval(t *testing.T) {
	never, always := Approval{}, Approval{Required: true}
	rules := &ApprovalRules{Roles: []string{"finance"}, Quorum: 2, TimeoutMs: int64p(900000), OnTimeout: "escalate", EscalateTo: []string{"cfo"}}
	for _, c := range []struct {
		effect, approval string
		want             Approval
		json             string
	}{
		{"idempotent", "", never, `"never"`},
		{"idempotent", "approval: never", never, `"never"`},
		{"idempotent", "approval: always", always, `"always"`},
		{"idempotent", "approval: {}", always, `"always"`},
		{"idempotent", "approval: {required: true}", always, `"always"`},
		{"idempotent", "approval: {quorum: 1, on_timeout: deny, roles: []}", always, `"always"`},
		{"idempotent", "approval: {required: false}", never, `"never"`},
		{"idempotent", "approval: {required: false, roles: [a], quorum: 2}", never, `"never"`},
		{"idempotent", "approval: {roles: [finance], quorum: 2, timeout: 15m, on_timeout: escalate, escalate_to: [cfo]}",
			Approval{Required: true, Rules: rules}, `{"roles":["finance"],"quorum":2,"timeout":900000,"on_timeout":"escalate","escalate_to":["cfo"]}`},
		{"idempotent", "approval: {timeout: 1h}", Approval{Required: true, Rules: &ApprovalRules{Quorum: 1, TimeoutMs: int64p(3600000), OnTimeout: "deny"}},
			`{"quorum":1,"timeout":3600000,"on_timeout":"deny"}`},
		{"irreversible", "", always, `"always"`},
		{"irreversible", "approval: always", always, `"always"`},
		{"irreversible", "approval: {roles: [legal]}", Approval{Required: true, Rules: &ApprovalRules{Roles: []string{"legal"}, Quorum: 1, OnTimeout: "deny"}},
			`{"roles":["legal"],"quorum":1,"on_timeout":"deny"}`},
	} {
		lines := []string{}
		if c.approval != "" {
			lines = append(lines, c.approval)
		}
		m := normalised(t, rdoc(c.effect, lines...))
		if !reflect.DeepEqual(m.Approval, c.want) {
			t.Errorf("%s %q: approval %+v (rules %+v), want %+v", c.effect, c.approval, m.Approval, m.Approval.Rules, c.want)
		}
		if b, _ := json.Marshal(m.Approval); string(b) != c.json {
			t.Errorf("%s %q: JSON %s, want %s", c.effect, c.approval, b, c.json)
		}
	}
}

func TestNormaliseRequiresAndDefaults(t *testing.T) {
	m := normalised(t, rdoc("read_only", "requires: [a, {tool: b}, {tool: c, status: succeeded}]"))
	want := []Requirement{{"a", "succeeded"}, {"b", "succeeded"}, {"c", "succeeded"}}
	if !reflect.DeepEqual(m.Requires, want) {
		t.Errorf("requires %+v", m.Requires)
	}
	if m.Version != 1 || m.Status != Approved || m.Approval.Required || m.Compensation != nil || m.Retry != nil || m.Idempotency != nil || m.TimeoutMs != nil {
		t.Errorf("defaults of a minimal manifest: %+v", m)
	}
	if m := normalised(t, rdoc("read_only", "version: 7", "status: draft")); m.Version != 7 || m.Status != Draft {
		t.Errorf("explicit version and status: %d %s", m.Version, m.Status)
	}
	m = normalised(t, rdoc("idempotent", "retry: {}", `idempotency: {key: "k-{{args.id}}"}`))
	if *m.Retry != (Retry{Attempts: 3, BaseMs: 200, MaxMs: 5000}) || *m.Idempotency != (Idempotency{Key: "k-{{args.id}}", Scope: "run"}) {
		t.Errorf("retry %+v, idempotency %+v", *m.Retry, *m.Idempotency)
	}
	m = normalised(t, rverif("    expect: {ok: true}"))
	wantComp := &Compensation{Tool: "h.undo", Kind: KindCompensation,
		Verification: &Verification{Tool: "h.read", Expect: map[string]any{"ok": true}, Retries: 3, BackoffMs: 1000}}
	if !reflect.DeepEqual(m.Compensation, wantComp) {
		t.Errorf("compensation %+v, verification %+v", m.Compensation, m.Compensation.Verification)
	}
}

// The same manifest written twice: YAML with defaults left out, JSON with keys in another
// order, every default written out and durations spelt differently.
var samePairs = []struct{ yaml, json string }{
	{
		yaml: `
tool: acme.refund
effect: compensable
permission: acme:write
requires: [h.dep]
approval: {}
timeout_ms: 30s
idempotency: {key: "r-{{args.id}}"}
compensation:
  tool: h.undo
  argument_map: {id: $result.id, amount: $args.amount}
  verification:
    tool: h.read
    arguments: {id: $result.id}
    expect: {refunded: true, items.0.state: done, total: 2500}
`,
		json: `{"version": 1, "status": "approved", "timeout_ms": 30000,
 "idempotency": {"scope": "run", "key": "r-{{args.id}}"},
 "compensation": {"verification": {"backoff_ms": "1s", "retries": 3,
   "expect": {"total": 2500.0, "items.0.state": "done", "refunded": true},
   "arguments": {"id": "$result.id"}, "tool": "h.read"},
  "requires_approval": false, "kind": "compensation",
  "argument_map": {"amount": "$args.amount", "id": "$result.id"}, "tool": "h.undo"},
 "approval": {"required": true, "quorum": 1, "on_timeout": "deny"},
 "requires": [{"status": "succeeded", "tool": "h.dep"}],
 "permission": "acme:write", "effect": "compensable", "tool": "acme.refund"}`,
	},
	{
		yaml: `
tool: acme.get
effect: idempotent
permission: acme:read
retry: {}
approval: {required: false, roles: [x]}
`,
		json: `{"retry": {"max_ms": "5s", "base_ms": "0.2s", "attempts": 3}, "approval": "never",
 "status": "approved", "version": 1, "permission": "acme:read", "tool": "acme.get", "effect": "idempotent"}`,
	},
}

func TestCanonicalSameAcrossFormats(t *testing.T) {
	for i, p := range samePairs {
		a := normalisedFile(t, "a.yaml", p.yaml)
		b := normalisedFile(t, "b.json", p.json)
		ca, _ := CanonicalJSON(a)
		cb, _ := CanonicalJSON(b)
		if !bytes.Equal(ca, cb) {
			t.Errorf("pair %d: canonical JSON differs:\n%s\n%s", i, ca, cb)
		}
		sa, _ := Checksum(a)
		sb, _ := Checksum(b)
		if sa != sb {
			t.Errorf("pair %d: checksums %s and %s", i, sa, sb)
		}
		// Any real change changes the checksum.
		b.Description = "changed"
		if sc, _ := Checksum(b); sc == sa {
			t.Errorf("pair %d: checksum ignores the description", i)
		}
	}
}

func TestCanonicalForm(t *testing.T) {
	m := normalised(t, ry("permission: h:read", "effect: read_only", "tool: h.read"))
	c, err := CanonicalJSON(m)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"approval":"never","effect":"read_only","permission":"h:read","status":"approved","tool":"h.read","version":1}`
	if string(c) != want {
		t.Errorf("canonical JSON\n got %s\nwant %s", c, want)
	}
	sum := sha256.Sum256([]byte(want))
	if s, _ := Checksum(m); s != hex.EncodeToString(sum[:]) {
		t.Errorf("checksum %s is not the SHA-256 of the canonical JSON", s)
	}
	// Nested keys are sorted too, and nothing is HTML-escaped.
	m = normalised(t, rverif("    expect: {z: 1, a: <b>&}"))
	c, _ = CanonicalJSON(m)
	if !strings.Contains(string(c), `"expect":{"a":"<b>&","z":1}`) {
		t.Errorf("canonical JSON %s", c)
	}
}

// Validate(json.Unmarshal(CanonicalJSON(m))) is m again: the canonical form is a fixed point.
func TestCanonicalFixedPoint(t *testing.T) {
	var sources []string
	seed, err := os.ReadFile("../../test/fixtures/manifests/payments.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sources = append(sources, string(seed))
	for _, p := range samePairs {
		sources = append(sources, p.yaml)
	}
	for _, y := range validCases() {
		sources = append(sources, y)
	}
	n := 0
	for _, src := range sources {
		docs, err := ParseFile("f.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range docs {
			m, errs := Validate(d.Value)
			if len(errs) > 0 {
				t.Fatalf("%v", errs)
			}
			first, _ := CanonicalJSON(m)
			var raw any
			if err := json.Unmarshal(first, &raw); err != nil {
				t.Fatal(err)
			}
			again, errs := Validate(raw)
			if len(errs) > 0 {
				t.Fatalf("canonical form %s is invalid: %v", first, errs)
			}
			s1, _ := Checksum(m)
			s2, _ := Checksum(again)
			if s1 != s2 {
				second, _ := CanonicalJSON(again)
				t.Errorf("not a fixed point:\n%s\n%s", first, second)
			}
			n++
		}
	}
	if n < 40 {
		t.Errorf("only %d manifests checked", n)
	}
}

func normalisedFile(t *testing.T, file, src string) *Manifest {
	t.Helper()
	docs, err := ParseFile(file, []byte(src))
	if err != nil || len(docs) != 1 {
		t.Fatalf("%s: %v", file, err)
	}
	m, errs := Validate(docs[0].Value)
	if len(errs) > 0 {
		t.Fatalf("%s: %v", file, errs)
	}
	return m
}

// The Go patterns and isSpace agree on whitespace: every Unicode White_Space rune, nothing else.
func TestWhitespaceIsUnicode(t *testing.T) {
	for r := rune(0); r < 0x10000; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		s := string(r)
		space := isSpace(r)
		if got := referencePattern.MatchString("$args.a" + s); got != (!space && r != '.') {
			t.Errorf("reference with %U accepted = %v", r, got)
		}
		// Inside the field name: whitespace around a placeholder is allowed.
		if got := argsPlaceholder.MatchString("args.a" + s + "b"); got != (!space && r != '{' && r != '}') {
			t.Errorf("placeholder with %U accepted = %v", r, got)
		}
		if got := validDottedPath("a" + s); got != (!space && r != '.') {
			t.Errorf("dotted path with %U accepted = %v", r, got)
		}
	}
	for _, r := range []rune{'\v', 0x85, 0xA0, 0x2003, 0x2028, 0x3000} {
		if !isSpace(r) {
			t.Errorf("%U is whitespace", r)
		}
	}
	if isSpace(0x200B) || isSpace(0xFEFF) {
		t.Error("zero-width space and BOM are not White_Space")
	}
}

// ValidateSet (registry loads, writers, rendered bundles) applies the draft rule too: a
// manifest with status draft stands for a tool that has only a draft.
func TestValidateSetRefusesAnEnforcedToolLeaningOnADraft(t *testing.T) {
	mk := func(raw map[string]any) *Manifest {
		m, errs := Validate(raw)
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		return m
	}
	charge := mk(map[string]any{"tool": "pay.charge", "effect": "compensable", "permission": "pay:write",
		"compensation": map[string]any{"tool": "pay.refund"}})
	refund := mk(map[string]any{"tool": "pay.refund", "effect": "idempotent", "permission": "pay:write", "status": "draft"})
	errs := ValidateSet([]*Manifest{charge, refund})
	want := `pay.charge: compensation.tool: tool "pay.refund" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve pay.refund first (reversi manifests approve pay.refund, or status: approved in plain files)`
	if len(errs) != 1 || errs[0].Error() != want {
		t.Fatalf("errors %v\nwant %s", errs, want)
	}
	// The same two tools, the charge a draft too: nothing is enforced that leans on a draft.
	draftCharge := *charge
	draftCharge.Status = Draft
	if errs := ValidateSet([]*Manifest{&draftCharge, refund}); len(errs) != 0 {
		t.Fatalf("a draft leaning on a draft: %v", errs)
	}
}

// ValidateDocumentsAs judges the files as the versions publish --status will write: a file's
// own status: draft does not make an approved publish refuse, and a draft publish of an
// approved-by-default file leaning on a draft is not refused either.
func TestValidateDocumentsAsTheStatusPublished(t *testing.T) {
	y := ry("- tool: pay.charge", "  effect: compensable", "  permission: pay:write", "  compensation: {tool: pay.refund}",
		"- tool: pay.refund", "  effect: idempotent", "  permission: pay:write", "  status: draft")
	docs, perrs := ParseFile(rulesFile, []byte(y))
	if len(perrs) > 0 {
		t.Fatal(perrs)
	}
	_, errs := ValidateDocuments(docs)
	want := `rules.yaml:4: pay.charge: compensation.tool: tool "pay.refund" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve pay.refund first (reversi manifests approve pay.refund, or status: approved in plain files)`
	if len(errs) != 1 || errs[0].Error() != want {
		t.Fatalf("as written: %v\nwant %s", errs, want)
	}
	for _, s := range []Status{Approved, Draft} {
		ms, errs := ValidateDocumentsAs(docs, s)
		if len(errs) > 0 || len(ms) != 2 || ms[0].Status != s || ms[1].Status != s {
			t.Fatalf("as %s: %v", s, errs)
		}
	}
}
