package proxy

// Outside review of issue 16 (i16-atk): the standalone gateway's own approval tools. FAILS
// while the attack works.

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/gateway/config"
)

// TestAttackActorAliasThroughApproveAction: issue 16 says the approver check compares uids
// and e-mail claims, and the store's rule does (approvalrules.ActorAlias, `reversi approvals
// approve --uid`). But reversi.approve_action, the MCP tool of a standalone gateway, builds
// the decision from the principal and roles only: the approver's uid and e-mail never reach
// the rule. ci-bot (uid u-bot, e-mail bot@corp.example) holds two approver keys under other
// names — one with its uid, one with its e-mail — and approves its own held call with them:
// the quorum of two "distinct" ops approvers is met by the actor alone and the call runs.
func TestAttackActorAliasThroughApproveAction(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "keys.json")
	keys := map[string]string{}
	for _, k := range []struct {
		principal string
		role      auth.Role
		groups    []string
		id        auth.KeyIdentity
	}{
		{"ci-bot", auth.Agent, nil, auth.KeyIdentity{UID: "u-bot", Email: "bot@corp.example"}},
		{"ci-bot-admin", auth.Approver, []string{"ops"}, auth.KeyIdentity{UID: "u-bot"}},                     // same uid
		{"robo", auth.Approver, []string{"ops"}, auth.KeyIdentity{UID: "u-robo", Email: "bot@corp.example"}}, // same e-mail
	} {
		_, secret, err := auth.AddKey(keyFile, k.principal, k.role, nil, k.groups, k.id)
		if err != nil {
			t.Fatal(err)
		}
		keys[k.principal] = secret
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := memoryConfig(t, config.ModeEnforce)
	cfg.Deny = nil
	cfg.Listen = &config.Listen{Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port}
	cfg.Auth = config.Auth{Keys: keyFile}
	ms := loadAgentManifests(t)
	f := startWith(t, cfg, Options{Manifests: ms, Load: func(context.Context) (Loaded, error) { return Loaded{Manifests: ms}, nil }})
	base := serveOn(t, f.gw, ln)

	bot := mustConnect(t, base+PathAgent, keys["ci-bot"])
	ent := map[string]any{"entities": []any{map[string]any{"name": "n1", "entityType": "t", "observations": []any{}}}}
	if r := call(t, bot, "memory.create_entities", ent); r.IsError {
		t.Fatalf("ci-bot create_entities: %v", texts(r))
	}
	del := map[string]any{"entityNames": []any{"n1"}}
	r := call(t, bot, "memory.delete_entities", del) // ops, quorum 2
	id := approvalIDRe.FindString(strings.Join(texts(r), " "))
	if !r.IsError || id == "" {
		t.Fatalf("delete_entities is not held: %v", texts(r))
	}
	var counted []string
	for _, alias := range []string{"ci-bot-admin", "robo"} {
		cs := mustConnect(t, base+PathOperator, keys[alias])
		res := call(t, cs, ToolApproveAction, map[string]any{"id": id, "comment": "self"})
		if !res.IsError {
			counted = append(counted, alias)
		} else {
			t.Logf("%s refused: %v", alias, texts(res))
		}
	}
	if len(counted) > 0 {
		t.Errorf("ATTACK: the actor ci-bot's aliases %v (same uid / same e-mail) approved its own request %s through %s", counted, id, ToolApproveAction)
	}
	if r := call(t, bot, "memory.delete_entities", del); !r.IsError {
		t.Errorf("ATTACK: ci-bot's delete_entities ran on approvals made by ci-bot itself under two other names")
	}
}
