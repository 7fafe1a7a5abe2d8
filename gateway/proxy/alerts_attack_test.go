package proxy

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// Red team (issue 24, alert floods): a hostile or broken upstream that stays up just past
// stableSession and then drops, again and again, is a new outage each time. Announced each
// time, it pages every receiver with a critical alert.upstream_down every few seconds, for as
// long as it likes, and fills the outbox (alert fatigue: the receiver gets muted, and the
// next real alert goes unseen). At most one alert per upstream per upstreamAlertQuiet: the
// later outages are journaled, and the next alert says how many there were. The first
// outage is still announced at once (TestUpstreamDownAlertsOnce stays green).
func TestAttackFlappingUpstreamAlertFlood(t *testing.T) {
	old := stableSession
	stableSession = 300 * time.Millisecond // the attack scaled down: up just past it, then gone
	t.Cleanup(func() { stableSession = old })
	mem := killableMemory(t)
	cfg := memoryConfig(t, config.ModeEnforce)
	cfg.Upstreams = []config.Upstream{mem.u}
	f, h := alertGateway(t, cfg, Options{Manifests: loadManifests(t)})
	cs := f.client(t)
	const outages = 4
	for i := range outages {
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if res := call(t, cs, "memory.read_graph", map[string]any{}); !res.IsError {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("outage %d: the upstream was not reconnected", i)
			}
		}
		time.Sleep(2 * stableSession) // a stable session: its end is a new outage
		mem.kill(t, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		stops := 0
		for _, n := range gatewayRecords(t, f.store, store.KindNote) {
			if strings.HasPrefix(n.Note, "upstream memory stopped (") {
				stops++
			}
		}
		if stops == outages {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d stops journaled, want %d", stops, outages)
		}
	}
	next(t, h.all, 5*time.Second, store.NoticeAlertUpstreamDown)
	alerts := 1
	for drained := false; !drained; {
		select {
		case d := <-h.all:
			if d.h.Get("X-Reversi-Event") == store.NoticeAlertUpstreamDown {
				alerts++
			}
		case <-time.After(time.Second):
			drained = true
		}
	}
	if alerts != 1 {
		t.Errorf("%d outages of one upstream within %s paged the receiver %d times, want once", outages, upstreamAlertQuiet, alerts)
	}
}
