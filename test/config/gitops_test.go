package config

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/test/flux"
)

// The README's "With Flux" and "With Argo CD" sections and docs/flux.md and docs/argocd.md
// (issue 22) are tested as runnable here: the files their commands name exist, the commands
// run against envtest with the project's and Flux's CRDs installed, and every object of
// config/flux and of the pages' yaml blocks is accepted by the API server as written.

// section is the part of the markdown text from the heading line (exact) to the next
// heading of the same or a higher level; it fails the test when the heading is absent.
func section(t *testing.T, text, heading string) string {
	t.Helper()
	level := len(heading) - len(strings.TrimLeft(heading, "#"))
	lines := strings.Split(text, "\n")
	start := slices.Index(lines, heading)
	if start < 0 {
		t.Fatalf("no heading %q", heading)
	}
	var out []string
	fenced := false
	for _, l := range lines[start+1:] {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(l, "#") {
			if n := len(l) - len(strings.TrimLeft(l, "#")); n <= level && strings.HasPrefix(l[n:], " ") {
				break
			}
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// fenced are the bodies of the text's fenced blocks of language lang.
func fenced(text, lang string) []string {
	var out []string
	for _, blk := range strings.Split(text, "```"+lang+"\n")[1:] {
		body, _, _ := strings.Cut(blk, "```")
		out = append(out, body)
	}
	return out
}

// commands are the shell commands of the text's bash blocks, continuation lines joined and
// comments removed, each split into words.
func commands(text string) [][]string {
	var out [][]string
	for _, body := range fenced(text, "bash") {
		joined := strings.ReplaceAll(body, "\\\n", " ")
		for _, l := range strings.Split(joined, "\n") {
			if i := strings.Index(l, "#"); i >= 0 && (i == 0 || l[i-1] == ' ') {
				l = l[:i]
			}
			if f := strings.Fields(l); len(f) > 0 {
				out = append(out, f)
			}
		}
	}
	return out
}

// fileArgs are the paths a kubectl command reads from the checkout: the values of -f,
// --filename, -k, --kustomize and --patch-file, each with its flag.
func fileArgs(cmd []string) [][2]string {
	var out [][2]string
	for i, w := range cmd {
		flag, val, hasVal := strings.Cut(w, "=")
		switch flag {
		case "-f", "--filename", "-k", "--kustomize", "--patch-file":
		default:
			continue
		}
		if !hasVal {
			if i+1 >= len(cmd) {
				continue
			}
			val = cmd[i+1]
		}
		out = append(out, [2]string{flag, val})
	}
	return out
}

func readDoc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// gitopsPages are the README sections and pages whose commands are checked, by name.
func gitopsPages(t *testing.T) map[string]string {
	readme := readDoc(t, "README.md")
	return map[string]string{
		"README.md With Flux":    section(t, readme, "### With Flux"),
		"README.md With Argo CD": section(t, readme, "### With Argo CD"),
		"docs/flux.md":           readDoc(t, "docs/flux.md"),
		"docs/argocd.md":         readDoc(t, "docs/argocd.md"),
	}
}

// Every file a kubectl command of the GitOps sections and pages reads is in the checkout
// (-f and --patch-file a file, -k a kustomization), the sections name the files they are
// about, and their relative links lead to files that exist.
func TestGitOpsDocsNameFilesThatExist(t *testing.T) {
	want := map[string][]string{
		"README.md With Flux":    {"config/default", "config/flux/gitrepository.yaml", "config/flux/manifestregistry.yaml"},
		"README.md With Argo CD": {"config/default", "config/argocd/argocd-cm-health.yaml", "config/argocd/application.yaml"},
		"docs/flux.md":           {"config/flux/gitrepository.yaml", "config/flux/manifestregistry.yaml"},
		"docs/argocd.md":         {"config/default", "config/argocd/argocd-cm-health.yaml", "config/argocd/application.yaml"},
	}
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	for name, text := range gitopsPages(t) {
		t.Run(name, func(t *testing.T) {
			var named []string
			for _, cmd := range commands(text) {
				if cmd[0] != "kubectl" {
					continue
				}
				for _, fa := range fileArgs(cmd) {
					flag, p := fa[0], fa[1]
					named = append(named, p)
					if filepath.IsAbs(p) || strings.HasPrefix(p, "..") || strings.ContainsAny(p, "$~") {
						t.Errorf("%s: %s %s is not a path in the checkout", strings.Join(cmd, " "), flag, p)
						continue
					}
					fi, err := os.Stat(filepath.Join(root, p))
					switch {
					case err != nil:
						t.Errorf("%s: %v", strings.Join(cmd, " "), err)
					case flag == "-k" || flag == "--kustomize":
						if _, err := os.Stat(filepath.Join(root, p, "kustomization.yaml")); !fi.IsDir() || err != nil {
							t.Errorf("%s: %s is not a kustomization folder", strings.Join(cmd, " "), p)
						}
					case !fi.Mode().IsRegular():
						t.Errorf("%s: %s is not a file", strings.Join(cmd, " "), p)
					}
				}
			}
			for _, p := range want[name] {
				if !slices.Contains(named, p) {
					t.Errorf("no kubectl command reads %s (commands read %v)", p, named)
				}
			}
			base := root
			if strings.HasPrefix(name, "docs/") {
				base = filepath.Join(root, "docs")
			}
			for _, m := range link.FindAllStringSubmatch(text, -1) {
				if strings.Contains(m[1], "://") {
					continue
				}
				if _, err := os.Stat(filepath.Join(base, m[1])); err != nil {
					t.Errorf("link %s: %v", m[1], err)
				}
			}
		})
	}
}

// yamlDocs are the objects of a file of one or more YAML documents.
func yamlDocs(t *testing.T, text string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		u := object(t, doc)
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
	return out
}

// installFlux installs the Flux CRDs (hack/setup-flux.sh's, $REVERSI_FLUX) into the shared
// control plane.
func installFlux(t *testing.T) {
	t.Helper()
	dir, err := flux.Dir()
	if err != nil {
		t.Fatal(err)
	}
	if err := flux.InstallCRDs(env(t).Environment, dir); err != nil {
		t.Fatal(err)
	}
}

// The README's "With Flux" commands run as written against an API server with our CRDs and
// Flux's (the applies of config/flux as server dry runs, `kubectl apply -k config/default`
// being TestInstallWithKubectl's; the namespace and Secrets for real, with stand-in key files), every object of config/flux/*.yaml and of docs/flux.md's yaml blocks is
// accepted as written (strict field validation), and the objects refer to each other: the
// registry and the Kustomization name the GitRepository, the registry verifies commits with
// the GitRepository's mode and Secret (what the controller requires), the Secrets the
// commands create are the ones the objects name, and `kubectl wait` waits for the registry
// config/flux defines.
func TestFluxExamplesAreAccepted(t *testing.T) {
	cp := env(t)
	installFlux(t)
	ctx := t.Context()

	// The commands of the README's section, in order.
	home := t.TempDir()
	keys := t.TempDir()
	writeFile(t, filepath.Join(keys, "writer.pub"), "-----BEGIN PUBLIC KEY-----\nstand-in\n-----END PUBLIC KEY-----\n")
	if err := os.MkdirAll(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(home, ".ssh", "id_ed25519.pub"), "ssh-ed25519 AAAAstand-in alice\n")
	readme := readDoc(t, "README.md")
	cmds := commands(section(t, readme, "### With Flux"))
	var secrets, waited []string
	applied := map[string]bool{}
	for _, cmd := range cmds {
		if cmd[0] != "kubectl" {
			t.Fatalf("the section runs %q, which this test does not know", strings.Join(cmd, " "))
		}
		args := slices.Clone(cmd[1:])
		verb := args[0]
		if verb == "-n" {
			verb = args[2]
		}
		switch verb {
		case "apply":
			args = append(args, "--dry-run=server")
			for _, fa := range fileArgs(cmd) {
				applied[fa[1]] = true
			}
			if slices.Equal(args, []string{"apply", "-k", "config/default", "--dry-run=server"}) {
				// TestInstallWithKubectl runs it (dry run and for real), with namespace
				// reversi-system made first, as a dry run needs.
				continue
			}
		case "create":
			for i, a := range args {
				if v, ok := strings.CutPrefix(a, "--from-file="); ok {
					k, p, _ := strings.Cut(v, "=")
					p = strings.ReplaceAll(p, "$HOME", home)
					if !filepath.IsAbs(p) {
						p = filepath.Join(keys, p) // a file of the reader's, beside their checkout
					}
					args[i] = "--from-file=" + k + "=" + p
				}
			}
			if slices.Contains(args, "secret") {
				secrets = append(secrets, args[slices.Index(args, "generic")+1])
			}
		case "wait":
			waited = append(waited, strings.Join(args, " "))
			continue // needs the controller running
		}
		out, err := kubectl(t, args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
	}
	for _, f := range []string{"config/default", "config/flux/gitrepository.yaml", "config/flux/manifestregistry.yaml"} {
		if !applied[f] {
			t.Errorf("the README's With Flux does not apply %s", f)
		}
	}

	// Every object of config/flux, as written.
	files, err := filepath.Glob(filepath.Join(root, "config", "flux", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("config/flux/*.yaml: %v %v", files, err)
	}
	byKind := map[string]*unstructured.Unstructured{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range yamlDocs(t, string(b)) {
			if err := cp.Client.Create(ctx, u, strict, client.DryRunAll); err != nil {
				t.Errorf("%s: %s %s is refused: %v", f, u.GetKind(), u.GetName(), err)
			}
			if byKind[u.GetKind()] != nil {
				t.Errorf("config/flux has two %ss", u.GetKind())
			}
			byKind[u.GetKind()] = u
		}
	}
	// docs/flux.md's objects, as written.
	n := 0
	for _, body := range fenced(readDoc(t, "docs/flux.md"), "yaml") {
		u := object(t, body)
		if err := cp.Client.Create(ctx, u, strict, client.DryRunAll); err != nil {
			t.Errorf("docs/flux.md's %s %s is refused: %v\n%s", u.GetKind(), u.GetName(), err, body)
		}
		n++
	}
	if n < 2 {
		t.Errorf("docs/flux.md has %d yaml objects, want its ManifestRegistry and Kustomization", n)
	}

	gr, reg, ks := byKind["GitRepository"], byKind["ManifestRegistry"], byKind["Kustomization"]
	if gr == nil || reg == nil || ks == nil {
		t.Fatalf("config/flux defines %v, want a GitRepository, a ManifestRegistry and a Kustomization", keysOf(byKind))
	}
	str := func(u *unstructured.Unstructured, path ...string) string {
		s, _, _ := unstructured.NestedString(u.Object, path...)
		return s
	}
	for _, u := range []*unstructured.Unstructured{reg, ks} {
		if str(u, "spec", "sourceRef", "kind") != "GitRepository" || str(u, "spec", "sourceRef", "name") != gr.GetName() ||
			u.GetNamespace() != gr.GetNamespace() {
			t.Errorf("%s %s/%s's sourceRef %v does not name GitRepository %s/%s", u.GetKind(), u.GetNamespace(), u.GetName(),
				u.Object["spec"].(map[string]any)["sourceRef"], gr.GetNamespace(), gr.GetName())
		}
	}
	if m, want := str(gr, "spec", "verify", "mode"), str(reg, "spec", "verify", "commit", "mode"); !strings.EqualFold(m, want) || m == "" {
		t.Errorf("the GitRepository verifies mode %q, the registry's verify.commit.mode is %q: the controller refuses different modes", m, want)
	}
	commitKeys := str(reg, "spec", "verify", "commit", "secretRef", "name")
	if s := str(gr, "spec", "verify", "secretRef", "name"); s != commitKeys || s == "" {
		t.Errorf("the GitRepository verifies with Secret %q, the registry with %q: name the same Secret", s, commitKeys)
	}
	for _, s := range []string{commitKeys, str(reg, "spec", "verify", "manifestKeysSecretRef", "name")} {
		if !slices.Contains(secrets, s) {
			t.Errorf("the registry names Secret %q, which the README's commands do not create (they create %v)", s, secrets)
		}
		var sec corev1.Secret
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: reg.GetNamespace(), Name: s}, &sec); err != nil {
			t.Errorf("Secret %s/%s after the README's commands: %v", reg.GetNamespace(), s, err)
		}
	}
	if want := "-n " + reg.GetNamespace() + " wait manifestregistry/" + reg.GetName() + " "; len(waited) != 1 || !strings.HasPrefix(waited[0], want) {
		t.Errorf("the README waits for %v, want the registry of config/flux (%q...)", waited, want)
	}
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The Argo CD walk-through runs as far as it can without Argo CD: the health-check patch of
// the README's "With Argo CD" (and docs/argocd.md step 2) applies to an argocd-cm with
// kubectl as written and leaves one key per kind, and the objects docs/argocd.md puts into git
// (the trusted keys Secret, the ReversiGateway) are accepted as written. The Application
// itself needs Argo CD's CRD, which is not here: pkg/argocd TestExampleApplication checks its
// shape; this test checks that it delivers the folder the walk-through writes into the
// namespace whose objects it shows.
func TestArgoCDExampleIsRunnable(t *testing.T) {
	cp := env(t)
	ctx := t.Context()
	// "With Argo CD installed in argocd": its namespace and ConfigMap.
	namespace(t, "argocd")
	if err := cp.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "argocd", Name: "argocd-cm"},
		Data: map[string]string{"url": "https://argocd.example.com"}}); err != nil {
		t.Fatal(err)
	}
	readme := readDoc(t, "README.md")
	var patched int
	for _, text := range []string{section(t, readme, "### With Argo CD"), readDoc(t, "docs/argocd.md")} {
		for _, cmd := range commands(text) {
			if cmd[0] != "kubectl" || !slices.Contains(cmd, "patch") {
				continue
			}
			out, err := kubectl(t, cmd[1:]...)
			if err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
			}
			patched++
		}
	}
	if patched < 2 {
		t.Fatalf("%d kubectl patch commands in the README's With Argo CD and docs/argocd.md, want one in each", patched)
	}
	var cm corev1.ConfigMap
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: "argocd", Name: "argocd-cm"}, &cm); err != nil {
		t.Fatal(err)
	}
	var health []string
	for k := range cm.Data {
		if strings.HasPrefix(k, "resource.customizations.health.reversi.dev_") {
			health = append(health, strings.TrimPrefix(k, "resource.customizations.health.reversi.dev_"))
		}
	}
	slices.Sort(health)
	if !slices.Equal(health, kinds) || cm.Data["url"] != "https://argocd.example.com" {
		t.Errorf("argocd-cm after the patch: health checks of %v (want %v), url %q kept", health, kinds, cm.Data["url"])
	}

	// What docs/argocd.md step 3 puts into deploy/agents, in the Application's namespace.
	app := yamlDocs(t, readDoc(t, "config/argocd/application.yaml"))
	if len(app) != 1 {
		t.Fatalf("config/argocd/application.yaml holds %d objects", len(app))
	}
	dest, _, _ := unstructured.NestedString(app[0].Object, "spec", "destination", "namespace")
	path, _, _ := unstructured.NestedString(app[0].Object, "spec", "source", "path")
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: dest}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	doc := readDoc(t, "docs/argocd.md")
	var created []string
	trusted := ""
	for _, body := range fenced(doc, "yaml") {
		u := object(t, body)
		if u.GroupVersionKind().Group == "argoproj.io" || u.GetKind() == "" {
			continue // the Application (above), the argocd-cm patch (no kind)
		}
		if u.GetNamespace() == "" {
			u.SetNamespace(dest)
		}
		if err := cp.Client.Create(ctx, u, strict, client.DryRunAll); err != nil {
			t.Errorf("docs/argocd.md's %s %s is refused: %v\n%s", u.GetKind(), u.GetName(), err, body)
			continue
		}
		created = append(created, u.GetKind()+"/"+u.GetName())
		if u.GetKind() == "ReversiGateway" {
			trusted, _, _ = unstructured.NestedString(u.Object, "spec", "trustedKeysSecretRef", "name")
		}
	}
	slices.Sort(created)
	if !slices.Equal(created, []string{"ReversiGateway/agents", "Secret/reversi-trusted-keys"}) {
		t.Errorf("docs/argocd.md's objects for git: %v, want its ReversiGateway agents and Secret reversi-trusted-keys", created)
	}
	// The gateway's trusted keys are the Secret shown beside it.
	if !slices.Contains(created, "Secret/"+trusted) {
		t.Errorf("the ReversiGateway trusts Secret %q, not the one docs/argocd.md shows (%v)", trusted, created)
	}
	// The Application delivers the folder the export writes into.
	for name, text := range map[string]string{"docs/argocd.md": doc, "README.md With Argo CD": section(t, readme, "### With Argo CD")} {
		found := false
		for _, cmd := range commands(text) {
			if i := slices.Index(cmd, ">"); cmd[0] == "reversi" && i >= 0 && i+1 < len(cmd) {
				found = true
				if dir := filepath.ToSlash(filepath.Dir(cmd[i+1])); dir != path && !strings.HasSuffix(dir, "/"+path) {
					t.Errorf("%s: %s writes into %s, but the Application delivers %s", name, strings.Join(cmd, " "), dir, path)
				}
			}
		}
		if !found {
			t.Errorf("%s has no `reversi manifests export ... > FILE` command", name)
		}
	}
}
