package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
)

// Content checks: functions over any value that policy conditions call as has_card_number(v),
// has_secret(v), has_email(v), has_phone(v) and json_size(v), and that Go callers may use
// directly. Each walks v: a string is scanned; a map's keys and values and a list's elements
// are walked; an integral number (an argument such as `card: 4111111111111111`) is scanned as
// its decimal digits; booleans and null hold nothing. v is a plain JSON-like Go value
// (map[string]any, []any, string, float64, int64, bool, nil), or a CEL value. Walks stop at
// maxWalkDepth levels, the nesting the gateway's JSON decoder accepts (go-sdk's limit): a value
// nested deeper cannot be scanned whole, so the Go functions report it as holding what they
// look for and the CEL functions fail with an error (the rule then fails closed), never
// "nothing found" for content they did not read.

// maxWalkDepth bounds the nesting a content check walks. It is not below the nesting the
// gateway accepts in a message (1000, go-sdk's decoder): a smaller bound let an agent hide a
// card number 65 levels deep.
const maxWalkDepth = 1000

// errTooDeep is the error of a content function over a value nested past maxWalkDepth.
var errTooDeep = fmt.Errorf("the value is nested more than %d levels deep, too deep to scan", maxWalkDepth)

// walkStrings calls f with every string inside v (map keys included, integral numbers as
// decimal text) until f returns true; it reports whether f did. complete is false when the
// walk stopped at maxWalkDepth before reading all of v.
func walkStrings(v any, f func(key, s string) bool) (found, complete bool) {
	w := &walker{f: f}
	found = w.walk(v, "", 0)
	return found && !w.deep, !w.deep
}

// walker is one walk: f, and whether it stopped at maxWalkDepth (deep).
type walker struct {
	f    func(key, s string) bool
	deep bool
}

// scanned is a content check's Go answer: found, or v could not be scanned whole (fail closed).
func scanned(found, complete bool) bool { return found || !complete }

// celCheck is a content check's CEL answer: a bool, or an error when v could not be scanned
// whole (the rule's condition then fails closed).
func celCheck(found, complete bool) ref.Val {
	if !complete {
		return types.WrapErr(errTooDeep)
	}
	return types.Bool(found)
}

func (w *walker) walk(v any, key string, depth int) bool {
	f := w.f
	if depth > maxWalkDepth {
		w.deep = true
		return true // stop: the answer can no longer be "not found"
	}
	switch x := v.(type) {
	case nil, bool:
		return false
	case string:
		return f(key, x)
	case int64:
		return f(key, strconv.FormatInt(x, 10))
	case int:
		return f(key, strconv.Itoa(x))
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1e21 {
			return f(key, strconv.FormatFloat(x, 'f', -1, 64))
		}
		return false
	case map[string]any:
		for k, e := range x {
			if f("", k) || w.walk(e, k, depth+1) {
				return true
			}
		}
		return false
	case []any:
		for _, e := range x {
			if w.walk(e, key, depth+1) {
				return true
			}
		}
		return false
	case []string:
		for _, e := range x {
			if f(key, e) {
				return true
			}
		}
		return false
	case map[string]string:
		for k, e := range x {
			if f("", k) || f(k, e) {
				return true
			}
		}
		return false
	case json.Number:
		if _, err := x.Int64(); err == nil {
			return f(key, x.String())
		}
		return false
	case ref.Val:
		return w.walkCEL(x, key, depth)
	}
	return false
}

// walkCEL walks a CEL value: wrapped Go values are walked as Go values; CEL-built maps and
// lists through their traits.
func (w *walker) walkCEL(v ref.Val, key string, depth int) bool {
	switch native := v.Value().(type) {
	case string, int64, float64, bool, nil, map[string]any, []any, []string, map[string]string:
		return w.walk(native, key, depth)
	}
	switch x := v.(type) {
	case traits.Mapper:
		it := x.Iterator()
		for it.HasNext() == boolTrue {
			k := it.Next()
			ks, _ := k.Value().(string)
			if w.walk(k, "", depth+1) || w.walk(x.Get(k), ks, depth+1) {
				return true
			}
		}
	case traits.Lister:
		it := x.Iterator()
		for it.HasNext() == boolTrue {
			if w.walk(it.Next(), key, depth+1) {
				return true
			}
		}
	}
	return false
}

// HasCardNumber reports whether v holds a payment card number: 13 to 19 digits, written
// together or in groups separated by single spaces or dashes ("4111 1111 1111 1111",
// "4111-1111-1111-1111"), not adjacent to other digits or ASCII letters, whose Luhn checksum is
// valid. A digit string longer than 19 digits is not searched for a card inside it (an id
// would match by chance one time in ten). Sources: ISO/IEC 7812-1 (PAN length 8–19, Luhn check
// digit; 13–19 are the lengths issued by the card networks today) and PCI DSS's definition
// of the PAN.
func HasCardNumber(v any) bool { return scanned(cardNumber(v)) }

func cardNumber(v any) (found, complete bool) {
	return walkStrings(v, func(_, s string) bool { return containsCardNumber(s) })
}

func containsCardNumber(s string) bool {
	n := len(s)
	for i := 0; i < n; i++ {
		if !isDigit(s[i]) || (i > 0 && (isDigit(s[i-1]) || isLetter(s[i-1]))) {
			continue
		}
		// A run starting at i: digit groups joined by single separators. bounds are the
		// digit counts at the end of each group.
		var digits []byte
		var bounds []int
		j := i
		for j < n {
			for j < n && isDigit(s[j]) {
				digits = append(digits, s[j])
				j++
			}
			bounds = append(bounds, len(digits))
			if j+1 < n && (s[j] == ' ' || s[j] == '-') && isDigit(s[j+1]) && len(digits) < 64 {
				j++
				continue
			}
			break
		}
		if j < n && isLetter(s[j]) {
			// The last group touches a letter: only the groups before it can hold a card.
			bounds = bounds[:len(bounds)-1]
		}
		// Every span from a group start to a group end with 13–19 digits.
		starts := append([]int{0}, bounds...)
		for si, a := range starts {
			for _, b := range bounds[si:] {
				if b <= a {
					continue
				}
				if l := b - a; l >= 13 && l <= 19 && luhn(digits[a:b]) {
					return true
				}
			}
		}
		i = j
	}
	return false
}

// luhn reports whether the digits pass the Luhn (mod 10) check.
func luhn(d []byte) bool {
	sum := 0
	double := false
	for i := len(d) - 1; i >= 0; i-- {
		x := int(d[i] - '0')
		if double {
			x *= 2
			if x > 9 {
				x -= 9
			}
		}
		sum += x
		double = !double
	}
	return sum%10 == 0
}

func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// secretPattern is the union of the secret and key formats has_secret recognises, each a
// documented, fixed-prefix format (sources: the providers' own documentation of their key
// formats, as collected by GitHub secret scanning and gitleaks):
//   - AWS access key id: AKIA, ASIA, ABIA or ACCA and 16 upper-case letters or digits;
//   - Google API key: AIza and 35 characters of [0-9A-Za-z_-];
//   - GitHub tokens: ghp_, gho_, ghu_, ghs_, ghr_ and 36 or more letters or digits, and
//     fine-grained github_pat_ tokens;
//   - Slack tokens: xoxa-, xoxb-, xoxp-, xoxo-, xoxr-, xoxs- and 10 or more characters;
//   - Stripe secret and restricted live keys: sk_live_, rk_live_ and 24 or more characters;
//   - a PEM private key block header (RSA, EC, DSA, OPENSSH, ENCRYPTED, PGP or plain);
//   - an Azure storage connection string's AccountKey= (86 or more base64 characters).
var secretPattern = regexp.MustCompile(`\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b` +
	`|\bAIza[0-9A-Za-z_\-]{35}` +
	`|\bgh[pousr]_[A-Za-z0-9]{36,}` +
	`|\bgithub_pat_[A-Za-z0-9_]{22,}` +
	`|\bxox[abposr]-[A-Za-z0-9-]{10,}` +
	`|\b[rs]k_live_[0-9A-Za-z]{24,}` +
	`|-----BEGIN (?:(?:RSA|EC|DSA|OPENSSH|ENCRYPTED|PGP) )?PRIVATE KEY(?: BLOCK)?-----` +
	`|AccountKey=[A-Za-z0-9+/]{86,}={0,2}`)

// awsSecretKeyName and awsSecretValue recognise an AWS secret access key by its field: the
// key itself (40 base64 characters) has no prefix to find it by.
var (
	awsSecretKeyName = regexp.MustCompile(`(?i)^aws_?secret(?:_?access)?_?key$`)
	awsSecretValue   = regexp.MustCompile(`^[A-Za-z0-9/+]{40}$`)
	awsSecretInline  = regexp.MustCompile(`(?i)aws_?secret(?:_?access)?_?key["']?\s*[:=]\s*["']?[A-Za-z0-9/+]{40}\b`)
)

// HasSecret reports whether v holds a credential in a known format (see secretPattern: cloud
// access keys of AWS, Google and Azure, GitHub, Slack and Stripe tokens, PEM private keys), or
// an AWS secret access key (40 base64 characters) under a field named like
// aws_secret_access_key, or written inline as aws_secret_access_key=… . Generic
// high-entropy strings are not reported: they cannot be told from ids and hashes.
func HasSecret(v any) bool { return scanned(secret(v)) }

func secret(v any) (found, complete bool) {
	return walkStrings(v, func(key, s string) bool {
		if mayHoldSecret(s) && secretPattern.MatchString(s) {
			return true
		}
		if containsFoldASCII(s, "secret") && awsSecretInline.MatchString(s) {
			return true
		}
		return key != "" && len(s) == 40 && awsSecretKeyName.MatchString(key) && awsSecretValue.MatchString(s)
	})
}

// secretMarkers are literal parts every secretPattern alternative contains: a string without
// any of them cannot match, and is not run through the regular expression (the common case,
// and most of the cost otherwise).
var secretMarkers = []string{"AKIA", "ASIA", "ABIA", "ACCA", "AIza", "gh", "github_pat_", "xox", "k_live_", "-----BEGIN ", "AccountKey="}

func mayHoldSecret(s string) bool {
	for _, m := range secretMarkers {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// containsFoldASCII reports whether s contains sub (lower-case ASCII) in any ASCII case.
func containsFoldASCII(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i]|0x20 == sub[0] && strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// emailPattern is an address as the WHATWG HTML standard's "valid e-mail address" defines it
// (local part of atext characters and dots, a domain of dot-separated labels), with a
// top-level label of at least two letters so that "a@b" in free text is not taken for one.
var emailPattern = regexp.MustCompile(`[A-Za-z0-9.!#$%&'*+/=?^_` + "`" + `{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.[A-Za-z]{2,63}\b`)

// HasEmail reports whether v holds an e-mail address (see emailPattern).
func HasEmail(v any) bool { return scanned(email(v)) }

func email(v any) (found, complete bool) {
	return walkStrings(v, func(_, s string) bool { return strings.Contains(s, "@") && emailPattern.MatchString(s) })
}

// phonePattern is a phone number in international form (ITU-T E.164: "+", a country code and
// at most 15 digits in all, here 8 to 15, optionally grouped by single spaces, dashes, dots or
// a parenthesised group), or in the North American form "(415) 555-0132", "415-555-0132",
// "415.555.0132". Other national forms are not recognised: without a "+" they cannot be told
// from dates, amounts and ids.
var phonePattern = regexp.MustCompile(`(?:^|[^0-9A-Za-z+])(?:\+[0-9](?:[ .\-]?\(?[0-9]\)?){7,14}|(?:\([0-9]{3}\) ?|[0-9]{3}[.\-])[0-9]{3}[.\-][0-9]{4})(?:$|[^0-9A-Za-z])`)

// HasPhone reports whether v holds a phone number (see phonePattern).
func HasPhone(v any) bool { return scanned(phone(v)) }

func phone(v any) (found, complete bool) {
	return walkStrings(v, func(_, s string) bool { return digitCount(s) >= 8 && phonePattern.MatchString(s) })
}

// digitCount counts the ASCII digits of s (a phone number has at least 8).
func digitCount(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if isDigit(s[i]) {
			n++
		}
	}
	return n
}

// JSONSize returns the size in bytes of v encoded as compact JSON (encoding/json, as the
// gateway forwards arguments), or -1 when v cannot be encoded. For size limits such as
// `json_size(args) > 65536`.
func JSONSize(v any) int {
	b, err := json.Marshal(plain(v, 0))
	if err != nil {
		return -1
	}
	return len(b)
}

// plain turns a CEL value into plain Go values for encoding; Go values pass through.
func plain(v any, depth int) any {
	rv, ok := v.(ref.Val)
	if !ok || depth > maxWalkDepth {
		return v
	}
	switch native := rv.Value().(type) {
	case string, int64, float64, bool, map[string]any, []any, []string, map[string]string:
		return native
	}
	switch x := rv.(type) {
	case traits.Mapper:
		out := map[string]any{}
		it := x.Iterator()
		for it.HasNext() == boolTrue {
			k := it.Next()
			out[toKey(k)] = plain(x.Get(k), depth+1)
		}
		return out
	case traits.Lister:
		var out []any
		it := x.Iterator()
		for it.HasNext() == boolTrue {
			out = append(out, plain(it.Next(), depth+1))
		}
		return out
	}
	if n, err := rv.ConvertToNative(reflect.TypeFor[any]()); err == nil {
		return n
	}
	return rv.Value()
}

func toKey(k ref.Val) string {
	if s, ok := k.Value().(string); ok {
		return s
	}
	return strings.Trim(strconv.Quote(toString(k)), `"`)
}

func toString(v ref.Val) string {
	b, err := json.Marshal(v.Value())
	if err != nil {
		return ""
	}
	return string(b)
}
