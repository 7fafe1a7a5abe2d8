package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --gateway-identity NAMESPACE/GATEWAY=USERNAME, repeatable (issue 16); one user per gateway.
func TestParseGatewayIdentities(t *testing.T) {
	ids, err := parseGatewayIdentities([]string{"agents/pay=alice", "*/ops=system:serviceaccount:tools:ops", "agents/pay=alice"})
	if err != nil || len(ids) != 2 || ids["agents/pay"] != "alice" || ids["*/ops"] != "system:serviceaccount:tools:ops" {
		t.Fatalf("%v %v", ids, err)
	}
	if _, err := parseGatewayIdentities([]string{"agents/pay=alice", "agents/pay=bob"}); err == nil || !strings.Contains(err.Error(), "agents/pay is given twice") {
		t.Errorf("a gateway named twice: %v", err)
	}
	if _, err := parseGatewayIdentities([]string{"pay=alice"}); err == nil || !strings.Contains(err.Error(), "--gateway-identity: gateway identity \"pay=alice\": write NAMESPACE/GATEWAY=USERNAME") {
		t.Errorf("no namespace: %v", err)
	}
}

// --watch-namespaces limits the manager's cache to those namespaces (and only then); a value
// that is no namespace name (an unexpanded $(POD_NAMESPACE)) is refused before anything
// connects to a cluster.
func TestWatchNamespaces(t *testing.T) {
	if o := watchCache(nil); o.DefaultNamespaces != nil {
		t.Errorf("no --watch-namespaces: the cache is limited to %v, want every namespace", o.DefaultNamespaces)
	}
	o := watchCache([]string{"agents", "team-a"})
	if _, ok := o.DefaultNamespaces["agents"]; !ok || len(o.DefaultNamespaces) != 2 {
		t.Errorf("--watch-namespaces agents,team-a: the cache watches %v", o.DefaultNamespaces)
	}
	cmd := newControllerCmd()
	cmd.SetArgs([]string{"--watch-namespaces", "agents,$(POD_NAMESPACE)", "--kubeconfig", "/nonexistent"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `--watch-namespaces: watch namespace "$(POD_NAMESPACE)" is not a namespace name`) {
		t.Errorf("an unexpanded $(POD_NAMESPACE): %v", err)
	}
}

// --upstream-images (issue 23): not given, nil (the --gateway-images policy applies); given,
// comma-separated or repeated patterns, of which there must be one, each valid.
func TestUpstreamImagePatterns(t *testing.T) {
	if got, err := upstreamImagePatterns(nil, false); err != nil || got != nil {
		t.Errorf("the default: %q %v", got, err)
	}
	if got, err := upstreamImagePatterns([]string{"mcp/*,registry.example/mcp/*", "reversi:*"}, true); err != nil || len(got) != 3 {
		t.Errorf("three patterns: %q %v", got, err)
	}
	if _, err := upstreamImagePatterns(nil, true); err == nil || !strings.Contains(err.Error(), "--upstream-images is empty") {
		t.Errorf("given empty: %v", err)
	}
	for vals, want := range map[string]string{"mcp/[x": `--upstream-images: gateway image pattern "mcp/[x"`, "a,,b": "--upstream-images: gateway image patterns"} {
		if _, err := upstreamImagePatterns([]string{vals}, true); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", vals, err, want)
		}
	}
}

// --gateway-images (issue 17): comma-separated or repeated patterns, checked before the
// controller connects: empty, malformed, or refusing --gateway-image is an error.
func TestGatewayImagePatterns(t *testing.T) {
	got, err := gatewayImagePatterns("ghcr.io/acme/reversi:1", []string{"ghcr.io/acme/reversi:*", "ghcr.io/acme/reversi@sha256:*"}, true)
	if err != nil || len(got) != 2 {
		t.Fatalf("%q %v", got, err)
	}
	if got, err := gatewayImagePatterns("", nil, false); err != nil || got != nil {
		t.Errorf("the default: %q %v", got, err)
	}
	if _, err := gatewayImagePatterns("Bad:Image", nil, false); err == nil || !strings.Contains(err.Error(), `--gateway-image: image "Bad:Image"`) {
		t.Errorf("an invalid --gateway-image: %v", err)
	}
	for _, c := range []struct {
		image string
		vals  []string
		want  string
	}{
		{"", nil, "--gateway-images is empty"},
		{"", []string{"reversi:[1"}, `gateway image pattern "reversi:[1"`},
		{"", []string{"ghcr.io/acme/*"}, `--gateway-image "reversi:latest" is not allowed`},
		{"Bad:Image", []string{"reversi:*"}, "--gateway-image \"Bad:Image\" is not a valid image reference"},
	} {
		if _, err := gatewayImagePatterns(c.image, c.vals, true); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q %q: %v, want %q", c.image, c.vals, err, c.want)
		}
	}
}

// --notifications-config (issue 24): a file the controller cannot use stops it at start with
// the file, line and field, before it connects anywhere; a good one gives the receivers, with
// ${NAME} read from the environment.
func TestNotificationsConfigFlag(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "alerts.yaml")
	if err := os.WriteFile(bad, []byte("notifications:\n  - type: webhook\n    url: ${REVERSI_TEST_UNSET_URL}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := newControllerCmd()
	cmd.SetArgs([]string{"--notifications-config", bad, "--kubeconfig", "/nonexistent"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	want := bad + ":3: notifications[0].url: environment variable REVERSI_TEST_UNSET_URL is not set"
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a bad notifications file: %v, want %q", err, want)
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("notifications:\n  - type: slack\n    name: ops\n    url: ${REVERSI_TEST_SLACK_URL}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REVERSI_TEST_SLACK_URL", "https://chat.example/T/B/x")
	o, err := controllerAlerts(good)
	if err != nil || o == nil || len(o.Receivers) != 1 || o.Receivers[0].Name != "ops" || o.Receivers[0].URL != "https://chat.example/T/B/x" {
		t.Errorf("a good file: %+v %v", o, err)
	}
	if o, err := controllerAlerts(""); o != nil || err != nil {
		t.Errorf("no flag: %+v %v", o, err)
	}
}
