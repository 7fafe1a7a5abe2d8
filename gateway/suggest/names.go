package suggest

import (
	"strings"
	"unicode"
)

// Verbs read from tool names. A name's verb is its first word: `create_entities`,
// `createEntities` and `create-entities` all have the verb "create". These lists are
// suggest-manifest's own guesses (the seeds only say drafts are made "from names").
var (
	// readVerbs name tools that only look. A tool named so without readOnlyHint is suspect.
	readVerbs = words("get list read search find describe show query fetch view lookup count check inspect stat")
	// writeVerbs name tools that change something. A tool named so with readOnlyHint is suspect.
	writeVerbs = words("create add insert put set update edit write delete remove destroy drop purge move rename " +
		"send post upload patch replace append attach detach grant revoke enable disable start stop kill cancel " +
		"archive unarchive execute run deploy publish merge push commit close lock unlock subscribe unsubscribe " +
		"follow unfollow reset clear truncate modify copy save store register unregister overwrite")
	// destroyVerbs name tools that take something away. One with destructiveHint: false is suspect.
	destroyVerbs = words("delete remove destroy drop purge truncate clear reset overwrite kill")
	// inverseVerbs maps a verb to the verbs of the tools that undo it, in order of preference.
	// Only tools that add or switch something on have one; the reverse direction (delete_X undone
	// by create_X) cannot rebuild what was deleted from the delete's arguments.
	inverseVerbs = map[string][]string{
		"create":    {"delete", "remove", "destroy"},
		"add":       {"remove", "delete"},
		"insert":    {"delete", "remove"},
		"attach":    {"detach"},
		"grant":     {"revoke"},
		"enable":    {"disable"},
		"start":     {"stop"},
		"lock":      {"unlock"},
		"subscribe": {"unsubscribe"},
		"follow":    {"unfollow"},
		"archive":   {"unarchive"},
		"register":  {"unregister"},
	}
)

func words(s string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(s) {
		m[w] = true
	}
	return m
}

// localName is the part of an exposed name after its namespace: `memory.create_entities` →
// `create_entities`. Names are split at the last '.', '/' or ':'.
func localName(name string) string {
	if i := strings.LastIndexAny(name, "./:"); i >= 0 {
		return name[i+1:]
	}
	return name
}

// splitVerb returns a local name's first word, lowercased, and the rest exactly as written:
// "create_entities" → "create", "_entities"; "createEntity" → "create", "Entity".
func splitVerb(local string) (verb, rest string) {
	rs := []rune(local)
	i := 0
	for i < len(rs) && (unicode.IsLetter(rs[i]) || unicode.IsDigit(rs[i])) {
		if i > 0 && unicode.IsUpper(rs[i]) && unicode.IsLower(rs[i-1]) {
			break // camelCase boundary
		}
		i++
	}
	return strings.ToLower(string(rs[:i])), string(rs[i:])
}

// withVerb replaces the verb of local by verb, keeping the first letter's case.
func withVerb(local, verb string) string {
	old, rest := splitVerb(local)
	if old == "" || verb == "" {
		return ""
	}
	if r := []rune(local); unicode.IsUpper(r[0]) {
		verb = strings.ToUpper(verb[:1]) + verb[1:]
	}
	return verb + rest
}

// idLike reports whether an argument name looks like an identifier (`id`, `charge_id`,
// `entityId`), which a tool that creates something usually returns as `id`.
func idLike(name string) bool {
	n := strings.ToLower(name)
	return n == "id" || strings.HasSuffix(n, "_id") || strings.HasSuffix(name, "Id") || strings.HasSuffix(name, "ID")
}
