package manifest

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func mustJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func mustManifest(t *testing.T, yamlText string) *Manifest {
	t.Helper()
	docs, err := ParseFile("m.yaml", []byte(yamlText))
	if err != nil {
		t.Fatal(err)
	}
	m, errs := decode(docs[0].Value, "m", nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return m
}

func TestLookup(t *testing.T) {
	v := mustJSON(t, `{"items":[{"id":"i0"},{"id":"i1"}],"a":{"b":null},"n":2500}`)
	cases := []struct {
		path string
		want any
		ok   bool
	}{
		{"items.1.id", "i1", true},
		{"items.2.id", nil, false},
		{"items.-1", nil, false},
		{"items.x", nil, false},
		{"a.b", nil, true},
		{"a.c", nil, false},
		{"n", 2500.0, true},
		{"n.x", nil, false},
	}
	for _, c := range cases {
		got, ok := Lookup(v, c.path)
		if ok != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("Lookup(%s) = %v, %v; want %v, %v", c.path, got, ok, c.want, c.ok)
		}
	}
}

func TestResolveTreatsNullAsMissing(t *testing.T) {
	args := mustJSON(t, `{"id":"x","gone":null}`)
	if v, ok := Resolve("$args.id", args, nil); !ok || v != "x" {
		t.Fatalf("got %v %v", v, ok)
	}
	if _, ok := Resolve("$args.gone", args, nil); ok {
		t.Fatal("null resolved")
	}
	if _, ok := Resolve("$result.id", args, nil); ok {
		t.Fatal("resolved from a nil result")
	}
	if _, ok := Resolve("args.id", args, nil); ok {
		t.Fatal("malformed reference resolved")
	}
}

const chargeYAML = `
tool: stripe.create_charge
effect: compensable
permission: payments:write
idempotency: { key: "charge-{{args.order_id}}-{{ args.meta.n }}", scope: run }
compensation:
  tool: stripe.refund
  residue: [statement]
  argument_map: { charge_id: $result.id, amount: $args.amount }
  verification:
    tool: stripe.get_charge
    arguments: { charge_id: $result.id }
    expect: { refunded: true, "items.0.amount": 2500 }
`

func TestPlanStep(t *testing.T) {
	m := mustManifest(t, chargeYAML)
	args := mustJSON(t, `{"order_id":"o1","amount":2500}`)

	s := PlanStep(m, Succeeded, args, mustJSON(t, `{"id":"ch_1"}`))
	if s.Action != PlanCompensate || s.Tool != "stripe.refund" || s.Kind != KindCompensation || len(s.Residue) != 1 {
		t.Fatalf("step = %+v", s)
	}
	if !JSONEqual(s.Handle, mustJSON(t, `{"charge_id":"ch_1","amount":2500}`)) {
		t.Fatalf("handle = %v", s.Handle)
	}
	s = PlanStep(m, Uncertain, args, nil)
	if s.Action != PlanUnrecoverable || !reflect.DeepEqual(s.Missing, []string{"$result.id"}) || !strings.Contains(s.Reason, "$result.id") {
		t.Fatalf("uncertain without result = %+v", s)
	}
	if s = PlanStep(m, Failed, args, nil); s.Action != PlanSkip {
		t.Fatalf("failed = %+v", s)
	}
	ro := mustManifest(t, "{tool: r, effect: read_only, permission: p}")
	if s = PlanStep(ro, Succeeded, args, nil); s.Action != PlanSkip {
		t.Fatalf("read_only = %+v", s)
	}
	irr := mustManifest(t, "{tool: mail.send, effect: irreversible, permission: p}")
	if s = PlanStep(irr, Succeeded, args, nil); s.Action != PlanNotUndone || !strings.Contains(s.Reason, "irreversible") {
		t.Fatalf("irreversible = %+v", s)
	}
	// Seed "Effects": idempotent is "safe to repeat, no undo needed" (issue 16).
	idem := mustManifest(t, "{tool: stripe.refund, effect: idempotent, permission: p}")
	if s = PlanStep(idem, Succeeded, args, nil); s.Action != PlanSkip || s.Reason != IdempotentReason {
		t.Fatalf("idempotent = %+v", s)
	}
}

func TestVerificationAndExpect(t *testing.T) {
	m := mustManifest(t, chargeYAML)
	vals, missing := VerificationArguments(m, nil, mustJSON(t, `{"id":"ch_1"}`))
	if len(missing) != 0 || vals["charge_id"] != "ch_1" {
		t.Fatalf("vals %v missing %v", vals, missing)
	}
	exp := m.Compensation.Verification.Expect
	if msg := CheckExpect(exp, mustJSON(t, `{"refunded":true,"items":[{"amount":2500.0}]}`)); msg != "" {
		t.Fatalf("match reported mismatch %q", msg)
	}
	if msg := CheckExpect(exp, mustJSON(t, `{"refunded":false,"items":[{"amount":2500}]}`)); msg != "refunded: expected true, got false" {
		t.Fatalf("mismatch = %q", msg)
	}
	if msg := CheckExpect(exp, mustJSON(t, `{"refunded":true}`)); msg != "items.0.amount: expected 2500, got nothing" {
		t.Fatalf("missing = %q", msg)
	}
	none := mustManifest(t, "{tool: r, effect: read_only, permission: p}")
	if vals, missing := VerificationArguments(none, nil, nil); vals != nil || missing != nil {
		t.Fatal("verification arguments without a verification")
	}
}

func TestDuplicateKey(t *testing.T) {
	m := mustManifest(t, chargeYAML)
	k1, err := DuplicateKey(m, mustJSON(t, `{"order_id":"o1","meta":{"n":7}}`), "run1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(k1, "charge-o1-7") || !strings.Contains(k1, "run:run1") {
		t.Fatalf("key = %q", k1)
	}
	k2, _ := DuplicateKey(m, mustJSON(t, `{"order_id":"o1","meta":{"n":7}}`), "run2", "alice")
	if k1 == k2 {
		t.Fatal("run-scoped keys of two runs are equal")
	}
	if _, err := DuplicateKey(m, mustJSON(t, `{"meta":{"n":7}}`), "r", "a"); err == nil || !strings.Contains(err.Error(), "argument order_id is missing") {
		t.Fatalf("missing arg err = %v", err)
	}
	if _, err := DuplicateKey(m, mustJSON(t, `{"order_id":{"x":1},"meta":{"n":7}}`), "r", "a"); err == nil || !strings.Contains(err.Error(), "not a plain value") {
		t.Fatalf("object arg err = %v", err)
	}
	g := mustManifest(t, `{tool: t, effect: idempotent, permission: p, idempotency: {key: "k-{{args.id}}", scope: global}}`)
	a, _ := DuplicateKey(g, mustJSON(t, `{"id":1}`), "r1", "alice")
	b, _ := DuplicateKey(g, mustJSON(t, `{"id":1}`), "r2", "bob")
	if a != b || a == "" {
		t.Fatalf("global keys differ: %q %q", a, b)
	}
	ac := mustManifest(t, `{tool: t, effect: idempotent, permission: p, idempotency: {key: "k-{{args.id}}", scope: actor}}`)
	a, _ = DuplicateKey(ac, mustJSON(t, `{"id":1}`), "r1", "alice")
	b, _ = DuplicateKey(ac, mustJSON(t, `{"id":1}`), "r2", "alice")
	c, _ := DuplicateKey(ac, mustJSON(t, `{"id":1}`), "r1", "bob")
	if a != b || a == c {
		t.Fatalf("actor scope: %q %q %q", a, b, c)
	}
	if k, err := DuplicateKey(mustManifest(t, "{tool: r, effect: read_only, permission: p}"), nil, "r", "a"); k != "" || err != nil {
		t.Fatalf("no idempotency gave %q %v", k, err)
	}
}

func TestStatusRequiresAndNote(t *testing.T) {
	d := mustManifest(t, "{tool: t, effect: read_only, permission: p, status: draft}")
	if err := CheckStatus(d); err == nil || !strings.Contains(err.Error(), "the manifest for t is a draft") {
		t.Fatalf("draft err = %v", err)
	}
	dep := mustManifest(t, "{tool: t, effect: read_only, permission: p, status: deprecated, replaced_by: t2}")
	if CheckStatus(dep) != nil || Note(dep) != "manifest deprecated; use t2" {
		t.Fatalf("deprecated: %v %q", CheckStatus(dep), Note(dep))
	}
	r := mustManifest(t, "{tool: t, effect: read_only, permission: p, requires: [a, {tool: b}]}")
	done := map[string]bool{"a": true}
	if err := CheckRequires(r, func(s string) bool { return done[s] }); err == nil || err.Error() != "t requires b to have succeeded earlier in the run" {
		t.Fatalf("requires err = %v", err)
	}
	done["b"] = true
	if err := CheckRequires(r, func(s string) bool { return done[s] }); err != nil {
		t.Fatal(err)
	}
}

func TestParseDuration(t *testing.T) {
	good := map[any]int64{"500ms": 500, "30s": 30000, "15m": 900000, "2h": 7200000, "1d": 86400000, "1.5s": 1500, int64(250): 250, 2000.0: 2000}
	for in, want := range good {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%v) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []any{"", "5", "5 s", "-1s", "1w", "0s", int64(0), int64(-5), 1.5, "0.5ms", "366d", true, nil} {
		if _, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%v) accepted", in)
		}
	}
}
