package proxy

import (
	"bufio"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRelayAttackForeignCancel (issue 19): the cancel gate drops the response of a call only for
// a cancel from the call's own session with the call's own credential. Another principal
// cancelling the same request id, in its own session or naming the victim's, leaves the call
// alone: its result still reaches its agent. The victim's own cancel (the honest path) is in
// test/e2e/gateway TestRelayTSClient.
func TestRelayAttackForeignCancel(t *testing.T) {
	h := startHostile(t, true, nil)
	victim, attacker := h.key("ci-bot"), h.key("other-bot")
	sidA := h.initSession(t, victim, "2025-06-18")
	sidB := h.initSession(t, attacker, "2025-06-18")
	c := h.rawConn(t)
	body := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"everything.trigger-long-running-operation","arguments":{"duration":2,"steps":1}}}`
	if _, err := io.WriteString(c, h.postHead("Authorization: Bearer "+victim, "Mcp-Session-Id: "+sidA, "Mcp-Protocol-Version: 2025-06-18",
		"Content-Length: "+strconv.Itoa(len(body)))+body); err != nil {
		t.Fatal(err)
	}
	waitInflight(t, h.gw, "ci-bot", 1)
	cancel := `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"not yours"}}`
	for _, sid := range []string{sidB, sidA} {
		res := post(t, h.base+PathAgent, cancel, "Authorization", "Bearer "+attacker, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18")
		_ = readBody(t, res)
	}
	// The victim's call completes and its result arrives on its stream.
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	br := bufio.NewReader(c)
	var got strings.Builder
	for !strings.Contains(got.String(), `"id":5`) {
		line, err := br.ReadString('\n')
		got.WriteString(line)
		if err != nil {
			t.Fatalf("the victim's call got no response after another principal's cancels (%v):\n%s", err, got.String())
		}
	}
	_ = c.Close()
	if !strings.Contains(got.String(), "Long running operation completed") {
		t.Errorf("the victim's call was cancelled by another principal's notifications/cancelled:\n%s", got.String())
	}
	// server-everything asked the victim (which declared no capability) for its roots during the
	// call: refused at once and journaled, instead of held until call_timeout, which kept the
	// session from closing (the DELETEs below would time out).
	if !strings.Contains(gatewayOrRunNotes(t, h.store), "the agent did not declare the roots capability, so it is not asked roots/list") {
		t.Errorf("the roots/list to an agent without roots is not journaled as refused: %q", gatewayOrRunNotes(t, h.store))
	}
	for sid, key := range map[string]string{sidA: victim, sidB: attacker} {
		h.deleteSession(t, sid, key)
	}
}
