package argocd

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite config/argocd/argocd-cm-health.yaml and the generated blocks of docs/argocd.md")

const root = "../.."

// cmHeader heads config/argocd/argocd-cm-health.yaml, the rendered ConfigMapData.
const cmHeader = `# The Argo CD health checks of the reversi.dev kinds, as a merge patch for argocd-cm:
#   kubectl -n argocd patch configmap argocd-cm --type merge --patch-file config/argocd/argocd-cm-health.yaml
# Generated from pkg/argocd/health/*.lua (go test ./pkg/argocd -run TestGenerated -update); do
# not edit by hand. docs/argocd.md explains what each status means.
`

// generatedBlock matches a block of docs/argocd.md that holds a file verbatim:
// "<!-- BEGIN <path> -->\n```yaml\n<content>```\n<!-- END <path> -->".
func generatedBlock(path string) *regexp.Regexp {
	q := regexp.QuoteMeta(path)
	return regexp.MustCompile("(?s)(<!-- BEGIN " + q + " -->\n```yaml\n)(.*?)(```\n<!-- END " + q + " -->)")
}

// The argocd-cm patch in config/argocd and the snippets in docs/argocd.md are what the scripts
// render, so neither can drift from the Lua the health tests run; and the patch parses back
// to one key per kind holding exactly that kind's script.
func TestGeneratedConfigAndDocsMatchTheScripts(t *testing.T) {
	data, err := ConfigMapData()
	if err != nil {
		t.Fatal(err)
	}
	cmPath := filepath.Join(root, "config/argocd/argocd-cm-health.yaml")
	want := map[string]string{
		"config/argocd/argocd-cm-health.yaml": cmHeader + data,
	}
	app, err := os.ReadFile(filepath.Join(root, "config/argocd/application.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want["config/argocd/application.yaml"] = string(app)

	if *update {
		if err := os.WriteFile(cmPath, []byte(want["config/argocd/argocd-cm-health.yaml"]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(cmPath)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want["config/argocd/argocd-cm-health.yaml"] {
		t.Errorf("config/argocd/argocd-cm-health.yaml is stale: run go test ./pkg/argocd -run TestGenerated -update")
	}

	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.UnmarshalStrict(got, &cm); err != nil {
		t.Fatalf("argocd-cm-health.yaml: %v", err)
	}
	if len(cm.Data) != len(Kinds) {
		t.Errorf("argocd-cm-health.yaml has %d keys, want %d", len(cm.Data), len(Kinds))
	}
	for _, kind := range Kinds {
		s, _ := HealthScript(kind)
		if cm.Data[HealthKey(kind)] != s {
			t.Errorf("argocd-cm key %s does not hold health/%s.lua as it is", HealthKey(kind), strings.ToLower(kind))
		}
	}

	docPath := filepath.Join(root, "docs/argocd.md")
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	for path, content := range want {
		re := generatedBlock(path)
		if *update {
			text = re.ReplaceAllStringFunc(text, func(m string) string {
				sub := re.FindStringSubmatch(m)
				return sub[1] + content + sub[3]
			})
		}
		sub := re.FindStringSubmatch(text)
		if sub == nil {
			t.Errorf("docs/argocd.md has no block <!-- BEGIN %s --> ```yaml ... ``` <!-- END %s -->", path, path)
			continue
		}
		if sub[2] != content {
			t.Errorf("docs/argocd.md's block of %s is stale: run go test ./pkg/argocd -run TestGenerated -update", path)
		}
	}
	if *update {
		if err := os.WriteFile(docPath, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The example Application is one an Argo CD API server accepts: kind Application of
// argoproj.io/v1alpha1 in the argocd namespace, a git source with repoURL, targetRevision and
// path, a destination, and the sync options docs/argocd.md recommends.
func TestExampleApplication(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "config/argocd/application.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var u unstructured.Unstructured
	if err := yaml.Unmarshal(b, &u.Object); err != nil {
		t.Fatal(err)
	}
	if u.GetAPIVersion() != "argoproj.io/v1alpha1" || u.GetKind() != "Application" {
		t.Fatalf("apiVersion %q kind %q, want argoproj.io/v1alpha1 Application", u.GetAPIVersion(), u.GetKind())
	}
	if u.GetName() == "" || u.GetNamespace() != "argocd" {
		t.Errorf("metadata name %q namespace %q: want a name, in argocd", u.GetName(), u.GetNamespace())
	}
	for _, f := range [][]string{
		{"spec", "project"},
		{"spec", "source", "repoURL"}, {"spec", "source", "targetRevision"}, {"spec", "source", "path"},
		{"spec", "destination", "server"}, {"spec", "destination", "namespace"},
	} {
		if v, ok, err := unstructured.NestedString(u.Object, f...); err != nil || !ok || v == "" {
			t.Errorf("%s: missing or not a string (%v)", strings.Join(f, "."), err)
		}
	}
	if !strings.HasPrefix(u.Object["spec"].(map[string]any)["source"].(map[string]any)["repoURL"].(string), "https://") {
		t.Errorf("spec.source.repoURL is not an https git URL")
	}
	opts, _, err := unstructured.NestedStringSlice(u.Object, "spec", "syncPolicy", "syncOptions")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"ServerSideApply=true", "CreateNamespace=true"} {
		if !slices.Contains(opts, o) {
			t.Errorf("spec.syncPolicy.syncOptions %v lack %s", opts, o)
		}
	}
	known := map[string]bool{"project": true, "source": true, "destination": true, "syncPolicy": true}
	for k := range u.Object["spec"].(map[string]any) {
		if !known[k] {
			t.Errorf("spec.%s: not a field this example is meant to set", k)
		}
	}
}
