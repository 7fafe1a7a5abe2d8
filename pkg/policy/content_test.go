package policy

import (
	"context"
	"strings"
	"testing"

	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

func TestHasCardNumber(t *testing.T) {
	for _, c := range []struct {
		v    any
		want bool
	}{
		{"4111111111111111", true},
		{"pay with 4111 1111 1111 1111 please", true},
		{"4111-1111-1111-1111", true},
		{"378282246310005", true},            // 15 digits (Amex test number)
		{"6011 0009 9013 9424", true},        // Discover test number
		{"id 4111 1111 1111 1111, ok", true}, // punctuation after
		{"4111111111111112", false},          // fails Luhn
		{"41111111111111110000", false},      // 20 digits: an id, not searched inside
		{"x4111111111111111", false},         // glued to a letter
		{"4111111111111111abc", false},       // glued to a letter
		{"12 4111 1111 1111 1111", true},     // a group span inside a longer run
		{"4111  1111 1111 1111", false},      // a double space breaks the number
		{"123456789012", false},              // 12 digits
		{int64(4012888888881881), true},      // a number argument
		{4012888888881881.0, true},           // as JSON decodes it
		{map[string]any{"a": []any{map[string]any{"b": "5500-0000-0000-0004"}}}, true},
		{map[string]any{"4111111111111111": 1}, true}, // keys are scanned too
		{map[string]any{"amount": 1500, "note": "2026-12-04"}, false},
		{[]string{"nothing", "4111 1111 1111 1111"}, true},
		{nil, false},
		{true, false},
	} {
		if got := HasCardNumber(c.v); got != c.want {
			t.Errorf("HasCardNumber(%#v) = %v", c.v, got)
		}
	}
}

func TestHasSecret(t *testing.T) {
	aws := "AKIA" + "IOSFODNN7EXAMPLE"
	for _, c := range []struct {
		v    any
		want bool
	}{
		{"key " + aws + " here", true},
		{"ASIA" + strings.Repeat("B", 16), true},
		{"AKIA" + "IOSFODNN7EXAMPL", false}, // 15 characters
		{"AIza" + strings.Repeat("x", 35), true},
		{"token ghp_" + strings.Repeat("a1", 18), true},
		{"github_pat_" + strings.Repeat("A", 22), true},
		{"xoxb-" + "1234567890-abc", true},
		{"sk_live_" + strings.Repeat("a", 24), true},
		{"sk_test_" + strings.Repeat("a", 24), false}, // a test key is not a credential
		{"-----BEGIN RSA PRIVATE KEY-----\nMIIE", true},
		{"-----BEGIN PRIVATE KEY-----", true},
		{"-----BEGIN PUBLIC KEY-----", false},
		{"DefaultEndpointsProtocol=https;AccountName=a;AccountKey=" + strings.Repeat("A", 86) + "==", true},
		{map[string]any{"aws_secret_access_key": strings.Repeat("wJalrXUtnFEMI/K7MDENG", 2)[:40]}, true},
		{map[string]any{"note": strings.Repeat("wJalrXUtnFEMI/K7MDENG", 2)[:40]}, false}, // 40 characters, no field name
		{"export AWS_SECRET_ACCESS_KEY=" + strings.Repeat("wJalrXUtnFEMI/K7MDENG", 2)[:40], true},
		{"ghost_town and akia", false},
		{map[string]any{"deep": []any{[]any{"x " + aws}}}, true},
	} {
		if got := HasSecret(c.v); got != c.want {
			t.Errorf("HasSecret(%#v) = %v", c.v, got)
		}
	}
}

func TestHasEmailPhoneAndSize(t *testing.T) {
	for _, c := range []struct {
		v            any
		email, phone bool
	}{
		{"write to jane.doe+x@example.co.uk today", true, false},
		{"a@b", false, false},
		{"user@localhost", false, false},
		{"call +33 1 42 68 53 00", false, true},
		{"call +14155550132", false, true},
		{"(415) 555-0132", false, true},
		{"415-555-0132", false, true},
		{"on 2026-12-04 at 10:00, order 20261204, amount 1500.00", false, false},
		{"+1 2", false, false},
		{map[string]any{"to": []any{"ops@example.com"}}, true, false},
	} {
		if got := HasEmail(c.v); got != c.email {
			t.Errorf("HasEmail(%#v) = %v", c.v, got)
		}
		if got := HasPhone(c.v); got != c.phone {
			t.Errorf("HasPhone(%#v) = %v", c.v, got)
		}
	}
	if n := JSONSize(map[string]any{"a": "é"}); n != len(`{"a":"é"}`) {
		t.Errorf("JSONSize = %d", n)
	}
	if JSONSize(func() {}) != -1 {
		t.Error("JSONSize of a function")
	}
}

// The functions work in conditions, on the arguments and on values CEL builds itself.
func TestContentFunctionsInCEL(t *testing.T) {
	s := compile(t, `policy: c
rules:
  - { name: card-literal, condition: 'has_card_number(["x", {"k": "4111 1111 1111 1111"}])', effect: advise, reason: "1" }
  - { name: secret-field, condition: 'has_secret(args.env)', effect: advise, reason: "2" }
  - { name: email, condition: 'has_email(args)', effect: advise, reason: "3" }
  - { name: phone, condition: 'has_phone(args.note)', effect: advise, reason: "4" }
  - { name: size, condition: 'json_size(args) > 40 && json_size({"a": [1, 2]}) == 11', effect: advise, reason: "5" }
  - { name: no-card, condition: 'has_card_number(args)', effect: advise, reason: "6" }
`)
	res := s.Evaluate(context.Background(), Input{Tool: "t", Args: map[string]any{
		"env":  map[string]any{"AWS_SECRET_ACCESS_KEY": strings.Repeat("abcd/EFGH", 5)[:40]},
		"note": "ring jane@example.com on +44 20 7946 0958",
	}})
	if got := strings.Join(res.Advice, ","); got != "1,2,3,4,5" || res.Decision != apipolicy.DecisionAdvise {
		t.Errorf("advice %q: %+v", got, res)
	}
}

// A value nested past what a check walks is never "nothing found": the Go check reports it,
// the CEL function fails (and the rule fails closed).
func TestContentChecksTooDeep(t *testing.T) {
	var v any = "nothing here"
	for range maxWalkDepth + 5 {
		v = []any{v}
	}
	if !HasCardNumber(v) || !HasSecret(v) || !HasEmail(v) || !HasPhone(v) {
		t.Error("a value too deep to scan is reported clean")
	}
	if got := celCheck(cardNumber(v)); !strings.Contains(got.(interface{ String() string }).String(), "too deep") {
		t.Errorf("CEL answer %v", got)
	}
	if HasCardNumber([]any{[]any{"4111 1111 1111 1112"}}) {
		t.Error("a shallow clean value")
	}
}
