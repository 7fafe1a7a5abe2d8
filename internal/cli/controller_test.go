package cli

import (
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
