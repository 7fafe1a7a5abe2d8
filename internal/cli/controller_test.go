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
