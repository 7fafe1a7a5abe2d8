package v1alpha1_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// fixture is the seed's example registry: three manifests that use every kind of field
// (unions, durations in both forms, expect values, nested objects).
const fixture = "../../test/fixtures/manifests/payments.yaml"

func readFixture(t *testing.T) []manifest.Document {
	t.Helper()
	data, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	docs, errs := manifest.ParseFile(filepath.Base(fixture), data)
	if len(errs) > 0 {
		t.Fatalf("parsing %s: %v", fixture, errs)
	}
	if len(docs) != 3 {
		t.Fatalf("%s holds %d manifests, want 3", fixture, len(docs))
	}
	return docs
}

func checksum(t *testing.T, raw any) string {
	t.Helper()
	m, errs := manifest.Validate(raw)
	if len(errs) > 0 {
		t.Fatalf("validate: %v", errs)
	}
	sum, err := manifest.Checksum(m)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// plain turns any JSON-like value into the generic form encoding/json gives (numbers as
// json.Number), so values from YAML and from a spec compare by value.
func plain(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// The seed's manifests go YAML → ToolManifest spec → (JSON, as through the API server) →
// ManifestObject → manifest.Validate and give the checksum that validating the YAML gives,
// and ManifestObject is the very object the YAML held.
func TestToolManifestRoundTripsTheSeedManifests(t *testing.T) {
	for _, doc := range readFixture(t) {
		want := checksum(t, doc.Value)
		spec, err := v1alpha1.ToolManifestSpecFromObject(doc.Value)
		if err != nil {
			t.Fatalf("manifest #%d: %v", doc.Index+1, err)
		}
		tm := &v1alpha1.ToolManifest{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ToolManifest"},
			ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns"},
			Spec:       *spec,
		}
		// Through the wire format, as a client reads the object back from the API server.
		wire, err := json.Marshal(tm)
		if err != nil {
			t.Fatal(err)
		}
		var back v1alpha1.ToolManifest
		if err := json.Unmarshal(wire, &back); err != nil {
			t.Fatalf("decoding %s: %v", wire, err)
		}
		for name, obj := range map[string]*v1alpha1.ToolManifest{"spec": tm, "wire": &back, "deepcopy": back.DeepCopy()} {
			raw, err := obj.ManifestObject()
			if err != nil {
				t.Fatal(err)
			}
			if got := checksum(t, raw); got != want {
				t.Errorf("%s: %s: checksum %s, want %s (the YAML's)", spec.Tool, name, got, want)
			}
			if got, want := plain(t, raw), plain(t, doc.Value); !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %s: ManifestObject\n%v\nwant the YAML's object\n%v", spec.Tool, name, got, want)
			}
		}
	}
}

// validateText validates raw and returns its errors as text ("" when valid) and the checksum.
func validateText(raw any) (string, string) {
	m, errs := manifest.Validate(raw)
	if len(errs) > 0 {
		s := make([]string, len(errs))
		for i, e := range errs {
			s[i] = e.Error()
		}
		return strings.Join(s, "\n"), ""
	}
	sum, _ := manifest.Checksum(m)
	return "", sum
}

// The unions accept whatever the API server stores (it cannot type a string-or-object field)
// and hand it to the validator unchanged: for every shape, valid or not, validating
// ManifestObject gives exactly the verdict of validating the raw manifest. A wrong value is
// never lost on the way (which would let an invalid manifest pass).
func TestToolManifestUnionsKeepWhatWasWritten(t *testing.T) {
	base := func(field string, v any) map[string]any {
		m := map[string]any{"tool": "t.write", "effect": "idempotent", "permission": "t:write"}
		m[field] = v
		return m
	}
	cases := map[string]map[string]any{
		"approval never":                  base("approval", "never"),
		"approval always":                 base("approval", "always"),
		"approval rules":                  base("approval", map[string]any{"roles": []any{"ops"}, "quorum": 2, "timeout": "15m", "on_timeout": "escalate", "escalate_to": []any{"cto"}}),
		"approval required false":         base("approval", map[string]any{"required": false}),
		"approval ms timeout":             base("approval", map[string]any{"timeout": 90000}),
		"approval empty object":           base("approval", map[string]any{}),
		"approval unknown word":           base("approval", "sometimes"),
		"approval empty string":           base("approval", ""),
		"approval number":                 base("approval", 42),
		"approval list":                   base("approval", []any{"always"}),
		"approval unknown field":          base("approval", map[string]any{"rolez": []any{"ops"}}),
		"approval wrong type in object":   base("approval", map[string]any{"quorum": "two"}),
		"approval null in object":         base("approval", map[string]any{"roles": nil}),
		"approval fractional quorum":      base("approval", map[string]any{"quorum": 1.5}),
		"requires names":                  base("requires", []any{"a.read", "b.read"}),
		"requires objects":                base("requires", []any{map[string]any{"tool": "a.read"}, map[string]any{"tool": "b.read", "status": "succeeded"}}),
		"requires empty name":             base("requires", []any{""}),
		"requires number":                 base("requires", []any{7}),
		"requires null":                   base("requires", []any{nil}),
		"requires unknown field":          base("requires", []any{map[string]any{"tool": "a.read", "when": "always"}}),
		"requires wrong status":           base("requires", []any{map[string]any{"tool": "a.read", "status": "failed"}}),
		"requires self":                   base("requires", []any{"t.write"}),
		"requires empty object":           base("requires", []any{map[string]any{}}),
		"requires one tool in both forms": base("requires", []any{"a.read", map[string]any{"tool": "a.read"}}),
		"irreversible never": func() map[string]any {
			m := base("approval", "never")
			m["effect"] = "irreversible"
			return m
		}(),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			wantErr, wantSum := validateText(raw)
			spec, err := v1alpha1.ToolManifestSpecFromObject(raw)
			if err != nil {
				t.Fatalf("ToolManifestSpecFromObject: %v", err)
			}
			// Through JSON, as a client reads it from the API server.
			b, err := json.Marshal(spec)
			if err != nil {
				t.Fatal(err)
			}
			var back v1alpha1.ToolManifestSpec
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatalf("decoding %s: %v", b, err)
			}
			obj, err := back.DeepCopy().ManifestObject()
			if err != nil {
				t.Fatal(err)
			}
			gotErr, gotSum := validateText(obj)
			if gotErr != wantErr || gotSum != wantSum {
				t.Errorf("ManifestObject %s\nvalidates to %q (checksum %s),\nthe raw manifest to %q (checksum %s)", b, gotErr, gotSum, wantErr, wantSum)
			}
		})
	}
}

// A null optional field is dropped, as the API server drops it before it stores an object.
func TestToolManifestNullFieldIsDropped(t *testing.T) {
	spec, err := v1alpha1.ToolManifestSpecFromObject(map[string]any{"tool": "a", "effect": "read_only", "permission": "p", "approval": nil, "risk": nil})
	if err != nil {
		t.Fatal(err)
	}
	obj, err := spec.ManifestObject()
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"tool": "a", "effect": "read_only", "permission": "p"}; !reflect.DeepEqual(obj, want) {
		t.Errorf("ManifestObject %v, want %v", obj, want)
	}
}

func TestManifestDurationForms(t *testing.T) {
	var spec v1alpha1.ToolManifestSpec
	if err := json.Unmarshal([]byte(`{"tool":"a","effect":"read_only","permission":"p","timeout_ms":30000,"retry":{"base_ms":"1.5s","max_ms":31536000000}}`), &spec); err != nil {
		t.Fatal(err)
	}
	if got := *spec.TimeoutMs; got != (v1alpha1.ManifestDuration{Milliseconds: 30000}) || got.String() != "30000ms" {
		t.Errorf("timeout_ms 30000 decoded as %+v (%s)", got, got)
	}
	if got := *spec.Retry.BaseMs; got != (v1alpha1.ManifestDuration{Text: "1.5s"}) || got.String() != "1.5s" {
		t.Errorf(`base_ms "1.5s" decoded as %+v`, got)
	}
	if got := spec.Retry.MaxMs.Milliseconds; got != 31536000000 {
		t.Errorf("max_ms beyond int32 decoded as %d", got)
	}
	b, err := json.Marshal(spec.Retry)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"base_ms":"1.5s","max_ms":31536000000}`; string(b) != want {
		t.Errorf("retry encodes as %s, want %s", b, want)
	}
	for _, bad := range []string{`1.5`, `true`, `{}`, `[1]`, `1e400`} {
		var d v1alpha1.ManifestDuration
		if err := json.Unmarshal([]byte(bad), &d); err == nil {
			t.Errorf("duration %s decoded as %+v, want an error", bad, d)
		}
	}
}

func TestToolManifestSpecFromObjectIsStrict(t *testing.T) {
	for name, raw := range map[string]any{
		"unknown field":          map[string]any{"tool": "a", "effect": "read_only", "permission": "p", "colour": "red"},
		"unknown nested field":   map[string]any{"tool": "a", "effect": "read_only", "permission": "p", "risk": map[string]any{"size": "xl"}},
		"version not a number":   map[string]any{"tool": "a", "effect": "read_only", "permission": "p", "version": "2"},
		"duration of wrong type": map[string]any{"tool": "a", "effect": "read_only", "permission": "p", "timeout_ms": true},
		"not an object":          []any{"a"},
	} {
		if spec, err := v1alpha1.ToolManifestSpecFromObject(raw); err == nil {
			t.Errorf("%s: accepted as %+v, want an error", name, spec)
		}
	}
}
