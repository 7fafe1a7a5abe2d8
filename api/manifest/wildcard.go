package manifest

import (
	"strconv"
	"strings"
)

// Wildcard is the reference path segment that maps the rest of the path over every element
// of an array: `$args.entities.*.name` is the list of the `name` of each element of
// `entities`, in order. It lets an argument_map (or verification.arguments) turn a list of
// objects into a list of values, as MCP tools that create objects in bulk and delete them by
// name need (server-memory: create_entities takes `entities: [{name, ...}]`, delete_entities
// takes `entityNames: [string]`).
//
// Extension of the seed ("Tool manifests", Compensation: "`$args.path`, `$result.path`"),
// which names fields and array indexes only. The reference grammar is unchanged (`*` was
// already a valid segment, it simply never matched a field); only Resolve gives it meaning.
// Rules: `*` applies to arrays only (an object or a scalar there is a missing value); an empty
// array resolves to an empty list; when the rest of the path is missing or null for any
// element, the whole reference is missing, so the step is unrecoverable rather than guessed.
// Segments after several `*` give nested lists.
const Wildcard = "*"

// LookupRef follows a reference path like Lookup, with `*` segments mapping over arrays (see
// Wildcard). A null anywhere in a mapped element counts as missing.
func LookupRef(v any, path string) (any, bool) {
	return lookupSegs(v, strings.Split(path, "."), false)
}

func lookupSegs(v any, segs []string, mapped bool) (any, bool) {
	for i, seg := range segs {
		switch x := v.(type) {
		case map[string]any:
			next, ok := x[seg]
			if !ok {
				return nil, false
			}
			v = next
		case []any:
			if seg == Wildcard {
				out := make([]any, 0, len(x))
				for _, el := range x {
					got, ok := lookupSegs(el, segs[i+1:], true)
					if !ok {
						return nil, false
					}
					out = append(out, got)
				}
				return out, true
			}
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 || n >= len(x) {
				return nil, false
			}
			v = x[n]
		default:
			return nil, false
		}
	}
	if mapped && v == nil {
		return nil, false
	}
	return v, true
}
