package upstreams_test

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestTSRelayDirect: every feature of ts-relay.mjs works against server-everything directly,
// so that any feature lost through the gateway (test/e2e/gateway TestRelayTSClient) is the
// gateway's loss; the upstream saw the cancellation of the cancelled call.
func TestTSRelayDirect(t *testing.T) {
	t.Parallel()
	ev := upstreams.StartEverythingHTTP(t)
	rep := upstreams.RunTSRelay(t, ev.URL, "")
	for _, l := range rep.Lost() {
		t.Errorf("direct: %s", l)
	}
	if !slices.Equal(rep.Order, upstreams.TSRelayFeatures) {
		t.Errorf("features ran in order %v, want TSRelayFeatures %v", rep.Order, upstreams.TSRelayFeatures)
	}
	if err := upstreams.CancelReached(ev.Received(t)); err != nil {
		t.Errorf("direct: %v", err)
	}
	if t.Failed() {
		t.Logf("report: %+v\nserver stderr:\n%s", rep, ev.Stderr())
	}

	// Bad usage is refused with exit status 2.
	node, script := upstreams.TSRelay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bad := exec.CommandContext(ctx, node, append(script, "--prefix", "x.")...)
	bad.Env = []string{}
	var ee *exec.ExitError
	if err := bad.Run(); !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("ts-relay without --url: %v, want exit status 2", err)
	}
}
