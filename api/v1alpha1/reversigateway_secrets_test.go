package v1alpha1

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// secretRefTypes are the types of this package that name a Secret (by their Name field).
var secretRefTypes = map[reflect.Type]bool{
	reflect.TypeFor[SecretKeyReference]():   true,
	reflect.TypeFor[LocalObjectReference](): true,
}

// notSecrets are the paths of LocalObjectReference fields of the spec that name another kind
// than a Secret (none today). A new field of that type is a Secret unless listed here.
var notSecrets = map[string]bool{}

// opaque are the types from other packages a spec may hold: they cannot name a Secret.
var opaque = map[reflect.Type]bool{
	reflect.TypeFor[metav1.LabelSelector](): true,
	reflect.TypeFor[resource.Quantity]():    true,
	reflect.TypeFor[metav1.Duration]():      true,
	reflect.TypeFor[corev1.ResourceList]():  true, // resource names and quantities
}

// secretWalk fills a value of a spec type by reflection: every pointer set, every slice two
// long, every map one entry, and every Secret reference (a field of a type of secretRefTypes)
// named uniquely. want maps each reference's JSON path (from root) to the name it got;
// problems lists what the walk cannot vouch for: a field of a type from another package that
// is not opaque (a corev1.SecretKeySelector, say), or a field called *secret* that is not of a
// Secret-reference type (a Secret named by a plain string).
type secretWalk struct {
	want     map[string]string
	problems []string
	n        int
}

func (w *secretWalk) fill(v reflect.Value, path, field string) {
	t := v.Type()
	if opaque[t] {
		return
	}
	if strings.Contains(strings.ToLower(field), "secret") && !secretRefTypes[t] && !(t.Kind() == reflect.Pointer && secretRefTypes[t.Elem()]) &&
		t.Kind() != reflect.Slice {
		w.problems = append(w.problems, fmt.Sprintf("%s (%s) names a Secret but is not a SecretKeyReference or LocalObjectReference", path, t))
	}
	switch t.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(t.Elem()))
		w.fill(v.Elem(), path, field)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(t, 2, 2))
		for i := range 2 {
			w.fill(v.Index(i), fmt.Sprintf("%s[%d]", path, i), field)
		}
	case reflect.Map:
		if t.Key().Kind() != reflect.String || t.Elem().Kind() != reflect.String {
			w.problems = append(w.problems, fmt.Sprintf("%s is a %s: teach this test (and SecretRefs, if it can name a Secret) about it", path, t))
			return
		}
		v.Set(reflect.MakeMap(t))
		v.SetMapIndex(reflect.ValueOf("k").Convert(t.Key()), reflect.ValueOf("v").Convert(t.Elem()))
	case reflect.Struct:
		switch {
		case secretRefTypes[t]:
			w.n++
			name := fmt.Sprintf("secret-%d", w.n)
			v.FieldByName("Name").SetString(name)
			if !notSecrets[path] {
				w.want[path] = name
			}
			return
		case t.PkgPath() != reflect.TypeFor[ReversiGatewaySpec]().PkgPath():
			w.problems = append(w.problems, fmt.Sprintf("%s is a %s.%s: if it can name a Secret, list it in SecretRefs and secretRefTypes, else add it to opaque", path, t.PkgPath(), t.Name()))
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-":
				continue
			case name == "" && f.Anonymous:
				w.fill(v.Field(i), path, f.Name)
				continue
			case name == "":
				name = f.Name
			}
			w.fill(v.Field(i), path+"."+name, name)
		}
	case reflect.String:
		v.SetString("x")
	case reflect.Bool, reflect.Int, reflect.Int32, reflect.Int64:
	default:
		w.problems = append(w.problems, fmt.Sprintf("%s is a %s: teach this test about it", path, t))
	}
}

func walkSecrets(root reflect.Type) (reflect.Value, map[string]string, []string) {
	w := &secretWalk{want: map[string]string{}}
	v := reflect.New(root).Elem()
	w.fill(v, "spec", "spec")
	return v, w.want, w.problems
}

// Issue 17: SecretRefs lists every field of the spec that can name a Secret, with its JSON
// path. The spec's Go types are walked by reflection, every reference given a unique name; a
// field of a Secret-reference type that SecretRefs leaves out, a path it spells wrong, or a
// field the walk cannot vouch for (a type from another package, a Secret named by a plain
// string) fails the test, so a future field cannot be missed by ReversiGateway admission.
func TestSecretRefsCoverEverySecretField(t *testing.T) {
	v, want, problems := walkSecrets(reflect.TypeFor[ReversiGatewaySpec]())
	for _, p := range problems {
		t.Errorf("ReversiGatewaySpec: %s", p)
	}
	spec := v.Addr().Interface().(*ReversiGatewaySpec)
	got := map[string]string{}
	for _, r := range spec.SecretRefs() {
		if _, dup := got[r.Field]; dup {
			t.Errorf("SecretRefs lists %s twice", r.Field)
		}
		got[r.Field] = r.Name
	}
	for _, path := range slices.Sorted(maps.Keys(want)) {
		if name := want[path]; got[path] != name {
			t.Errorf("SecretRefs misses %s (Secret %q): got %q", path, name, got[path])
		}
	}
	for _, path := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[path]; !ok {
			t.Errorf("SecretRefs lists %s (Secret %q), which is not a Secret-reference field of the spec", path, got[path])
		}
	}
	// The walk found the fields of today's spec (so it is not vacuous).
	for _, path := range []string{"spec.upstreams[1].headers[1].secretKeyRef", "spec.upstreams[0].env[1].secretKeyRef",
		"spec.trustedKeysSecretRef", "spec.store.postgres.urlSecretRef", "spec.auth.keysSecretRef",
		"spec.upstreams[1].container.env[0].valueFrom.secretKeyRef", "spec.upstreams[0].container.volumes[1].secret"} {
		if _, ok := want[path]; !ok {
			t.Errorf("the walk did not find %s", path)
		}
	}
	if n := len((&ReversiGatewaySpec{}).SecretRefs()); n != 0 {
		t.Errorf("an empty spec has %d Secret references", n)
	}
}

// Issue 17 (the red team): ManifestRegistrySpec.SecretRefs lists every Secret-reference field
// of its spec too (ManifestRegistry admission checks the author may read each).
func TestRegistrySecretRefsCoverEverySecretField(t *testing.T) {
	v, want, problems := walkSecrets(reflect.TypeFor[ManifestRegistrySpec]())
	for _, p := range problems {
		t.Errorf("ManifestRegistrySpec: %s", p)
	}
	got := map[string]string{}
	for _, r := range v.Addr().Interface().(*ManifestRegistrySpec).SecretRefs() {
		if _, dup := got[r.Field]; dup {
			t.Errorf("SecretRefs lists %s twice", r.Field)
		}
		got[r.Field] = r.Name
	}
	if !maps.Equal(got, want) {
		t.Errorf("ManifestRegistrySpec.SecretRefs: %v, want %v", got, want)
	}
	if len(want) != 3 {
		t.Errorf("the walk found %v, want spec.secretRef and the two verify Secrets", want)
	}
	if n := len((&ManifestRegistrySpec{}).SecretRefs()); n != 0 {
		t.Errorf("an empty spec has %d Secret references", n)
	}
}

// The walk itself reports what it cannot vouch for: a Secret reference of another package's
// type, and a Secret named by a plain string.
func TestSecretWalkReportsUnknownFields(t *testing.T) {
	type fake struct {
		Core        *corev1.SecretKeySelector `json:"core,omitempty"`
		TokenSecret string                    `json:"tokenSecret,omitempty"`
		Ref         LocalObjectReference      `json:"ref"`
	}
	_, want, problems := walkSecrets(reflect.TypeFor[fake]())
	if len(problems) != 2 || !strings.Contains(problems[0], "spec.core is a k8s.io/api/core/v1.SecretKeySelector") ||
		!strings.Contains(problems[1], "spec.tokenSecret (string) names a Secret") {
		t.Errorf("problems %q", problems)
	}
	if !reflect.DeepEqual(want, map[string]string{"spec.ref": "secret-1"}) {
		t.Errorf("want %v", want)
	}
}

// SecretRefs on a spec as users write it: paths in the order of the fields, a Secret named
// twice listed twice.
func TestSecretRefsExample(t *testing.T) {
	s := ReversiGatewaySpec{
		Upstreams: []GatewayUpstream{
			{Name: "a", URL: "http://a/mcp", Headers: []ValueFrom{{Name: "X", Value: "1"}, {Name: "Authorization", SecretKeyRef: &SecretKeyReference{Name: "db-creds", Key: "token"}}}},
			{Name: "b", Command: "b", Env: []ValueFrom{{Name: "T", SecretKeyRef: &SecretKeyReference{Name: "db-creds", Key: "t"}}}},
		},
		TrustedKeysSecretRef: &LocalObjectReference{Name: "keys"},
		Auth:                 &GatewayAuth{KeysSecretRef: &SecretKeyReference{Name: "api-keys", Key: "keys.json"}},
	}
	got := s.SecretRefs()
	want := []GatewaySecretRef{{"db-creds", "spec.upstreams[0].headers[1].secretKeyRef"}, {"db-creds", "spec.upstreams[1].env[0].secretKeyRef"},
		{"keys", "spec.trustedKeysSecretRef"}, {"api-keys", "spec.auth.keysSecretRef"}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}
