package cli

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// gatewayGCPercent is the gateway's GOGC when the environment sets none. Each forwarded call
// allocates a few times its result size for a few milliseconds; with Go's default of 100 the
// collector took about a seventh of the gateway's CPU (issue 5's benchmark, BENCHMARKS.md).
// Its heap is small (about 10 MB per 1,000 tools), so a larger target costs little.
const gatewayGCPercent = 400

// gatewayMemoryRatio is the share of a container's memory limit given to the Go runtime as
// its soft limit (GOMEMLIMIT), so that the larger GC target never pushes the pod to its limit.
const gatewayMemoryRatio = 0.9

// tuneGC applies gatewayGCPercent unless GOGC is set, and, when the process runs under a
// cgroup memory limit and GOMEMLIMIT is not set, a soft memory limit of gatewayMemoryRatio
// of it (github.com/KimMachineGun/automemlimit). It reports whether it set the GC percent.
func tuneGC() bool {
	// No limit found (not in a container) is not an error worth reporting.
	_, _ = memlimit.Set(memlimit.WithRatio(gatewayMemoryRatio), memlimit.WithProvider(memlimit.FromCgroup),
		memlimit.WithLogger(slog.New(slog.DiscardHandler)))
	if _, set := os.LookupEnv("GOGC"); set {
		return false
	}
	debug.SetGCPercent(gatewayGCPercent)
	return true
}
