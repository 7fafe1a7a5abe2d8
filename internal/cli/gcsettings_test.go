package cli

import (
	"os"
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(old) })

	t.Setenv("GOGC", "150") // restored after the test
	if tuneGC() {
		t.Fatal("GOGC is set: the gateway must leave the GC percent to it")
	}
	if p := debug.SetGCPercent(100); p != 100 {
		t.Fatalf("GC percent %d, want the one in effect (100) kept", p)
	}
	os.Unsetenv("GOGC")
	if !tuneGC() {
		t.Fatal("GOGC unset: want the gateway's GC percent")
	}
	if p := debug.SetGCPercent(100); p != gatewayGCPercent {
		t.Fatalf("GC percent %d, want %d", p, gatewayGCPercent)
	}
}
