package manifest

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

// FuzzParseValidate feeds arbitrary bytes to the reader and validator. Nothing may panic, and
// every manifest that validates must be a fixed point: its canonical JSON validates again to
// the same bytes. The seed corpus runs in `make test`; `go test -fuzz FuzzParseValidate
// ./api/manifest` explores further.
func FuzzParseValidate(f *testing.F) {
	seed, err := os.ReadFile("../../test/fixtures/manifests/payments.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed, false)
	f.Add([]byte(`[{"tool":"a","effect":"reversible","permission":"p","compensation":{"tool":"b","kind":"inverse","argument_map":{"id":"$result.id"}}}]`), true)
	f.Add([]byte("tool: x\neffect: irreversible\npermission: p\napproval: {required: false}\n"), false)
	f.Add([]byte("a: &a [*a]\n"), false)
	f.Add([]byte("- tool: t\n  requires: [t, {tool: t}]\n  retry: {attempts: 11}\n  timeout_ms: 1.5\n"), false)
	f.Add([]byte(`{"tool":"t","effect":"idempotent","permission":"p","idempotency":{"key":"{{args.}}"}}`), true)
	f.Add([]byte("---\n---\n- {}\n"), false)
	f.Add([]byte(`{"tool":"a","effect":"reversible","permission":"p","compensation":{"tool":"b","kind":"inverse","argument_map":{"names":"$args.entities.*.name"}}}`), true)
	f.Add([]byte("{tool: t, effect: reversible, permission: p, compensation: {tool: u, verification: {tool: v, expect: {n: 1152921504606846977}}}}"), false)
	f.Fuzz(func(t *testing.T, data []byte, asJSON bool) {
		name := "f.yaml"
		if asJSON {
			name = "f.json"
		}
		docs, perrs := ParseFile(name, data)
		for _, err := range perrs {
			if _, ok := err.(*FieldError); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
		}
		ms, _ := ValidateDocuments(docs)
		for _, m := range ms {
			first, err := CanonicalJSON(m)
			if err != nil {
				t.Fatalf("canonical JSON of a valid manifest: %v", err)
			}
			var raw any
			dec := json.NewDecoder(bytes.NewReader(first))
			dec.UseNumber()
			if err := dec.Decode(&raw); err != nil {
				t.Fatal(err)
			}
			again, errs := Validate(raw)
			if len(errs) > 0 {
				t.Fatalf("canonical form %s does not validate: %v", first, errs)
			}
			second, _ := CanonicalJSON(again)
			if !bytes.Equal(first, second) {
				t.Fatalf("not a fixed point:\n%s\n%s", first, second)
			}
		}
	})
}
