// Package config reads the project config, reversi.config.yaml, found in the current folder or
// above, or named by REVERSI_CONFIG. Source: seed "MCP gateway", Config ("Everything else …
// comes from reversi.config.yaml").
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	gwconfig "github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/egress"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// FileName is the project config's file name.
const FileName = "reversi.config.yaml"

// Config is the part of reversi.config.yaml this release reads. Unknown fields are refused.
type Config struct {
	// Manifests is the manifest folder or registry (relative to the config's folder).
	Manifests string `json:"manifests,omitempty"`
	// Policy is the policy file or folder (relative to the config's folder): what `reversi
	// test` and `reversi lint` read without --policy, and the gateway enforces.
	Policy string `json:"policy,omitempty"`
	// ManifestPublicKey is a PEM bundle of public keys (inline, or a path to a file); every
	// loaded registry version must be signed by one of them.
	ManifestPublicKey string `json:"manifest_public_key,omitempty"`
	// Reload is the hot-reload trigger for manifests, the policy and the manifest public key:
	// `reload: { watch: false, interval: 10s }`. Absent means watch every 2 s.
	Reload Reload `json:"reload,omitempty"`
	// Egress are the rules for the network destinations the gateway connects to (its url
	// upstreams): `egress: { block_private: true, allowed_hosts: ["*.example.com"] }`.
	Egress egress.Rules `json:"egress,omitzero"`
	// RawNotifications is `notifications:` as written (the receivers of the approval events,
	// issue 24); read it with Notifications, which expands ${NAME} and reports file:line.
	RawNotifications json.RawMessage `json:"notifications,omitempty"`

	// Dir is the folder holding the config file; empty when no config was found.
	Dir string `json:"-"`
	// File is the config file read; empty when no config was found.
	File string `json:"-"`
	// data is the file's text (for Notifications' line numbers).
	data []byte
}

// Notifications decodes `notifications:` with gateway.yaml's rules (gwconfig.Notification):
// ${NAME} in url and secret expands from lookup (nil: the environment), and every problem
// names the file, the line and the field. Only the gateway reads it, so that commands that do
// not send notifications (lint, validate) need none of their variables.
func (c *Config) Notifications(lookup gwconfig.LookupFunc) ([]gwconfig.Notification, error) {
	if len(c.RawNotifications) == 0 || string(c.RawNotifications) == "null" {
		return nil, nil
	}
	if lookup == nil {
		lookup = os.LookupEnv
	}
	ns, errs := gwconfig.ParseNotifications(c.File, c.data, lookup)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ns, nil
}

// Find locates and reads the project config: $REVERSI_CONFIG, else reversi.config.yaml in the
// current folder or the nearest one above. No config found is not an error (a zero Config).
// A config that cannot be read or has unknown fields is.
func Find() (*Config, error) {
	path := os.Getenv("REVERSI_CONFIG")
	if path == "" {
		dir, err := os.Getwd()
		if err != nil {
			return nil, err
		}
		for {
			p := filepath.Join(dir, FileName)
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				return &Config{}, nil
			}
			dir = parent
		}
	}
	return Load(path)
}

// Load reads one config file strictly (unknown and duplicate fields are errors).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.Dir, c.File, c.data = filepath.Dir(path), path, data
	return &c, nil
}

// WatchedFiles returns the files a gateway's hot reload depends on besides the manifests: the
// config file itself and the manifest public key when it is a file (seed: Hot reload,
// "Manifests, the policy and the manifest public key are re-read"). Empty when none applies.
func (c *Config) WatchedFiles() []string {
	var files []string
	if c.File != "" {
		files = append(files, c.File)
	}
	v := os.Getenv(TrustedKeysEnv)
	if v == "" {
		v = c.Resolve(c.ManifestPublicKey)
	}
	if v != "" && !strings.HasPrefix(strings.TrimSpace(v), "-----BEGIN") {
		files = append(files, v)
	}
	return files
}

// Resolve makes a path from the config relative to the config's folder.
func (c *Config) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) || c.Dir == "" {
		return p
	}
	return filepath.Join(c.Dir, p)
}

// ManifestPaths returns args when given; otherwise `manifests:` from the project config, or
// ./manifests when that folder exists. Source: seed "MCP gateway", Observe first.
func ManifestPaths(args []string) ([]string, error) {
	if len(args) > 0 {
		return args, nil
	}
	c, err := Find()
	if err != nil {
		return nil, err
	}
	if strings.Contains(c.Manifests, "://") {
		return nil, fmt.Errorf("manifests: %s: remote registries are not supported yet; clone the registry and name its folder", c.Manifests)
	}
	if c.Manifests != "" {
		return []string{c.Resolve(c.Manifests)}, nil
	}
	if fi, err := os.Stat("manifests"); err == nil && fi.IsDir() {
		return []string{"manifests"}, nil
	}
	return nil, errors.New("no manifests given: pass a file or folder, set manifests: in " + FileName + ", or create ./manifests")
}

// PolicyPaths returns args when given; otherwise `policy:` from the project config (resolved
// against its folder); nil when neither names a policy (a policy is optional, so there is no
// default folder). Source: issue 21 ("`policy:` in gateway.yaml and reversi.config.yaml").
func PolicyPaths(args []string) ([]string, error) {
	if len(args) > 0 {
		return args, nil
	}
	c, err := Find()
	if err != nil {
		return nil, err
	}
	if strings.Contains(c.Policy, "://") {
		return nil, fmt.Errorf("policy: %s: remote policies are not supported; name a file or folder", c.Policy)
	}
	if c.Policy == "" {
		return nil, nil
	}
	return []string{c.Resolve(c.Policy)}, nil
}

// TrustedKeysEnv names the environment variable that sets (and overrides) manifest_public_key.
const TrustedKeysEnv = "REVERSI_MANIFEST_PUBLIC_KEY"

// TrustedKeys returns the trusted manifest keys: $REVERSI_MANIFEST_PUBLIC_KEY, else
// manifest_public_key. Either is a PEM bundle inline or a path to one (relative to the
// config's folder). nil when neither is set. Source: seed "Tool manifests", Registry
// ("Trusted key").
func (c *Config) TrustedKeys() (*signing.TrustSet, error) {
	v, from := os.Getenv(TrustedKeysEnv), TrustedKeysEnv
	if v == "" {
		v, from = c.ManifestPublicKey, "manifest_public_key"
		if v != "" && !strings.HasPrefix(strings.TrimSpace(v), "-----BEGIN") {
			v = c.Resolve(v)
		}
	}
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	if strings.HasPrefix(strings.TrimSpace(v), "-----BEGIN") {
		t, err := signing.ParseTrustSet([]byte(v))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", from, err)
		}
		return t, nil
	}
	t, err := signing.LoadTrustSet(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	return t, nil
}

// TrustedKeysSetting names where trusted manifest keys are set, as a reader would look for
// it: "$REVERSI_MANIFEST_PUBLIC_KEY" (which wins), "manifest_public_key in <config file>", or
// "" when neither is set. Nothing is read or parsed.
func (c *Config) TrustedKeysSetting() string {
	switch env := os.Getenv(TrustedKeysEnv); {
	case env != "" && strings.TrimSpace(env) == "":
		return "" // as TrustedKeys: a blank variable still overrides the config
	case env != "":
		return "$" + TrustedKeysEnv
	case strings.TrimSpace(c.ManifestPublicKey) == "":
		return ""
	case c.File != "":
		return "manifest_public_key in " + c.File
	}
	return "manifest_public_key"
}

// Reload is `reload:` in reversi.config.yaml: the file watch that re-reads manifests, the policy
// and the manifest public key while the gateway runs. Source: seed "MCP gateway", Hot reload
// ("File watch | On by default, polling every 2 s. `reload: { watch: false, interval: 10s }`").
// Unknown fields are refused with the rest of the file. The zero value means the defaults, so
// read it through Watching and Every.
type Reload struct {
	// Watch turns the polling file watch on or off; nil (absent) means on.
	Watch *bool `json:"watch,omitempty"`
	// Interval is how often the watch polls, a Go duration string such as "10s"; zero (absent)
	// means DefaultReloadInterval. It must be at least MinReloadInterval.
	Interval Duration `json:"interval,omitempty"`
}

// DefaultReloadInterval is the polling interval when `reload.interval` is absent (seed: 2 s).
const DefaultReloadInterval = 2 * time.Second

// MinReloadInterval is the shortest interval accepted: a shorter one would busy-poll the disk.
// The seed names no minimum; this is the project's choice.
const MinReloadInterval = 100 * time.Millisecond

// Watching reports whether the file watch is on: `reload.watch`, default true.
func (r Reload) Watching() bool { return r.Watch == nil || *r.Watch }

// Every returns the polling interval: `reload.interval`, default DefaultReloadInterval.
func (r Reload) Every() time.Duration {
	if r.Interval == 0 {
		return DefaultReloadInterval
	}
	return time.Duration(r.Interval)
}

// Duration is a time.Duration written as a Go duration string ("2s", "1m30s"). Unmarshalling
// refuses anything else (numbers included, since their unit would be a guess) and intervals
// shorter than MinReloadInterval.
type Duration time.Duration

// UnmarshalJSON reads a duration string; the error names the value and the accepted form.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("invalid duration %s: write a duration such as 2s or 1m", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q: write a duration such as 2s or 1m", s)
	}
	if v < MinReloadInterval {
		return fmt.Errorf("invalid duration %q: must be at least %s", s, MinReloadInterval)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration string back.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }
