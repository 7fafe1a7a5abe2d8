package kube

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// startCache starts ca on runCtx and waits up to timeout for its informers to list. On failure
// it calls stop and says what was not listed (kind, in namespace) and which RBAC to check.
func startCache(ctx, runCtx context.Context, stop context.CancelFunc, ca cache.Cache, timeout time.Duration, kind, namespace, rbac string) error {
	errc := make(chan error, 1)
	go func() { errc <- ca.Start(runCtx) }()
	syncCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if ca.WaitForCacheSync(syncCtx) {
		return nil
	}
	stop()
	select {
	case err := <-errc:
		return fmt.Errorf("kube: watching %s in %s: %w", kind, namespace, err)
	default:
	}
	return fmt.Errorf("kube: the %s of namespace %s were not listed within %s: check the gateway's RBAC (%s)", kind, namespace, timeout, rbac)
}
