package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/pkg/signing"
)

func TestFindWalksUpAndResolvesRelativeToTheConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("manifests: reg\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	c, err := Find()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Resolve(c.Manifests); got != filepath.Join(dir, "reg") {
		t.Fatalf("manifests resolve to %s", got)
	}
	other := filepath.Join(t.TempDir(), "other.yaml")
	if err := os.WriteFile(other, []byte("manifests: elsewhere\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REVERSI_CONFIG", other)
	if c, err = Find(); err != nil || c.Manifests != "elsewhere" {
		t.Fatalf("REVERSI_CONFIG ignored: %+v %v", c, err)
	}
}

func TestLoadRefusesUnknownAndDuplicateFields(t *testing.T) {
	for body, want := range map[string]string{
		"manifest: x\n":                `unknown field "manifest"`,
		"manifests: a\nmanifests: b\n": `"manifests" already set`,
	} {
		p := filepath.Join(t.TempDir(), FileName)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%q: err %v, want %q naming the file", body, err, want)
		}
	}
}

func TestTrustedKeysFromPathInlineAndEnv(t *testing.T) {
	dir := t.TempDir()
	idA, err := signing.GenerateKeyFiles(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	idB, err := signing.GenerateKeyFiles(filepath.Join(dir, "b"))
	if err != nil {
		t.Fatal(err)
	}
	pubB, _ := os.ReadFile(filepath.Join(dir, "b.pub"))

	c := &Config{Dir: dir, File: filepath.Join(dir, FileName)}
	if ts, err := c.TrustedKeys(); ts != nil || err != nil || c.TrustedKeysSetting() != "" {
		t.Fatalf("no key set: %v %v %q", ts, err, c.TrustedKeysSetting())
	}
	c.ManifestPublicKey = "a.pub" // relative to the config's folder
	if ts, err := c.TrustedKeys(); err != nil || ts.KeyIDs()[0] != idA || c.TrustedKeysSetting() != "manifest_public_key in "+c.File {
		t.Fatalf("path: %v %v %q", ts, err, c.TrustedKeysSetting())
	}
	t.Setenv(TrustedKeysEnv, string(pubB)) // the environment wins
	if ts, err := c.TrustedKeys(); err != nil || len(ts.KeyIDs()) != 1 || ts.KeyIDs()[0] != idB || c.TrustedKeysSetting() != "$"+TrustedKeysEnv {
		t.Fatalf("env: %v %v %q", ts, err, c.TrustedKeysSetting())
	}
	t.Setenv(TrustedKeysEnv, filepath.Join(dir, "missing.pub"))
	if _, err := c.TrustedKeys(); err == nil || !strings.Contains(err.Error(), TrustedKeysEnv) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestReloadDefaultsAndOverrides(t *testing.T) {
	var zero Config
	if !zero.Reload.Watching() || zero.Reload.Every() != DefaultReloadInterval || DefaultReloadInterval != 2*time.Second {
		t.Fatalf("defaults: watch %v every %v", zero.Reload.Watching(), zero.Reload.Every())
	}
	for body, want := range map[string]struct {
		watch bool
		every time.Duration
	}{
		"manifests: m\n": {true, 2 * time.Second},
		"reload: { watch: false, interval: 10s }\n":  {false, 10 * time.Second},
		"reload:\n  interval: 1m30s\n":               {true, 90 * time.Second},
		"reload: { watch: true }\n":                  {true, 2 * time.Second},
		"manifests: m\nreload:\n  interval: 100ms\n": {true, 100 * time.Millisecond},
	} {
		p := filepath.Join(t.TempDir(), FileName)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p)
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if c.Reload.Watching() != want.watch || c.Reload.Every() != want.every {
			t.Errorf("%q: watch %v every %v, want %v %v", body, c.Reload.Watching(), c.Reload.Every(), want.watch, want.every)
		}
	}
}

func TestReloadIsStrict(t *testing.T) {
	for body, want := range map[string]string{
		"reload: { watch: false, every: 3s }\n":   `unknown field "every"`,
		"reload: { interval: 10 }\n":              `invalid duration 10`,
		"reload: { interval: soon }\n":            `invalid duration "soon"`,
		"reload: { interval: 10ms }\n":            `must be at least 100ms`,
		"reload: { interval: -1s }\n":             `must be at least 100ms`,
		"reload: { watch: yes please }\n":         `reload.watch`,
		"reload: { watch: true, watch: false }\n": `"watch" already set`,
	} {
		p := filepath.Join(t.TempDir(), FileName)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(p); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%q: err %v, want %q naming the file", body, err, want)
		}
	}
}

// policy: resolves against the config's folder; flags win; without either there is no policy.
func TestPolicyPaths(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	t.Setenv("REVERSI_CONFIG", "")
	if got, err := PolicyPaths(nil); err != nil || got != nil {
		t.Fatalf("no config: %v %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("policy: policy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	if got, err := PolicyPaths(nil); err != nil || len(got) != 1 || got[0] != filepath.Join(dir, "policy") {
		t.Fatalf("policy: %v %v", got, err)
	}
	if got, _ := PolicyPaths([]string{"x.yaml"}); len(got) != 1 || got[0] != "x.yaml" {
		t.Fatalf("flag: %v", got)
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("policy: https://example.com/p\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := PolicyPaths(nil); err == nil || !strings.Contains(err.Error(), "remote policies are not supported") {
		t.Fatalf("remote: %v", err)
	}
}

// TestNotificationsInProjectConfig: `notifications:` in reversi.config.yaml is read with
// gateway.yaml's rules (file:line errors, ${NAME} expansion), only when asked for.
func TestNotificationsInProjectConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, FileName)
	if err := os.WriteFile(p, []byte("manifests: m\nnotifications:\n  - type: webhook\n    url: ${HOOK}\n    risk: [severe]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatalf("Load reads notifications lazily: %v", err)
	}
	_, err = c.Notifications(func(n string) (string, bool) {
		return map[string]string{"HOOK": "https://h.example.com"}[n], n == "HOOK"
	})
	if err == nil || err.Error() != p+`:5: notifications[0].risk[0]: "severe" is not one of low, medium, high, critical (the manifest's risk.blast_radius)` {
		t.Fatalf("error %v", err)
	}
	if err := os.WriteFile(p, []byte("notifications:\n  - type: slack\n    url: ${HOOK}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load(p)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := c.Notifications(func(n string) (string, bool) { return "https://h.example.com/s", n == "HOOK" })
	if err != nil || len(ns) != 1 || ns[0].Type != "slack" || ns[0].URL != "https://h.example.com/s" || ns[0].Where != p+":2" {
		t.Fatalf("%+v %v", ns, err)
	}
	if ns, err := (&Config{}).Notifications(nil); ns != nil || err != nil {
		t.Fatalf("no config: %v %v", ns, err)
	}
}
