package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// A controller can be namespaced (issue 17): `reversi controller --watch-namespaces` limits
// the manager's cache, and so every reconciler, to those namespaces (the caller sets
// cache.Options.DefaultNamespaces from the same list), and Setup makes every admission webhook
// it registers refuse objects outside them (WatchedNamespaces). What the controller reads in
// its own namespace (its signing key, its stamp key, the ConfigMap of its public keys, the
// leader-election Lease) is read with clients of their own, not the cache, so its own
// namespace need not be watched.

// CheckWatchNamespaces returns the namespaces sorted and without repeats, or an error naming
// the first that is not a namespace name (an empty entry, upper case, an unexpanded
// $(POD_NAMESPACE)). Nil or empty: every namespace.
func CheckWatchNamespaces(namespaces []string) ([]string, error) {
	out := make([]string, 0, len(namespaces))
	for _, ns := range namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("watch namespace %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		out = append(out, ns)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// NamespaceNotWatchedError is the refusal of an admission request about an object in a
// namespace the controller does not watch: nothing the controller admitted there would ever be
// reconciled (an Approval would never be counted, a request never decided), so it admits
// nothing there rather than stamp what it will not look at again.
type NamespaceNotWatchedError struct {
	// Namespace is the object's ("" for a cluster-scoped object).
	Namespace string
	// Watched are the controller's --watch-namespaces.
	Watched []string
}

func (e *NamespaceNotWatchedError) Error() string {
	return fmt.Sprintf("namespace %q is not watched by this Reversi controller (--watch-namespaces=%s): it would never reconcile what it admitted here; "+
		"limit the webhook configurations' namespaceSelector to the watched namespaces (config/namespaced does), or add %q to --watch-namespaces",
		e.Namespace, strings.Join(e.Watched, ","), e.Namespace)
}

// namespaceGate is an admission handler that refuses requests outside watched and passes the
// others to next.
type namespaceGate struct {
	next    admission.Handler
	watched []string
}

// Handle refuses a request whose namespace is not watched (a cluster-scoped object too: the
// controller admits none) with a NamespaceNotWatchedError, and hands the others to next.
func (g namespaceGate) Handle(ctx context.Context, req admission.Request) admission.Response {
	if !slices.Contains(g.watched, req.Namespace) {
		return admission.Denied((&NamespaceNotWatchedError{Namespace: req.Namespace, Watched: g.watched}).Error())
	}
	return g.next.Handle(ctx, req)
}

// watchedServer registers every admission webhook behind a namespaceGate. Other handlers (a
// conversion webhook admits nothing) are registered as they are.
type watchedServer struct {
	webhook.Server
	watched []string
}

// Register gates hook when it is an admission webhook, then registers it.
func (s watchedServer) Register(path string, hook http.Handler) {
	if a, ok := hook.(*admission.Webhook); ok && a.Handler != nil {
		a.Handler = namespaceGate{next: a.Handler, watched: s.watched}
	}
	s.Server.Register(path, hook)
}

// watchedManager is mgr whose webhook server gates by namespace, so that every webhook
// registered through it (ctrl.NewWebhookManagedBy or GetWebhookServer().Register) is gated.
type watchedManager struct {
	ctrl.Manager
	server webhook.Server
}

// GetWebhookServer is the gated server.
func (m watchedManager) GetWebhookServer() webhook.Server { return m.server }

// WatchedNamespaces returns mgr unchanged when namespaces is empty (every namespace), and
// otherwise mgr with a webhook server that registers every admission webhook behind a gate
// refusing objects outside namespaces (NamespaceNotWatchedError). Setup applies it from
// Options.WatchNamespaces. Errors: a name CheckWatchNamespaces refuses.
func WatchedNamespaces(mgr ctrl.Manager, namespaces []string) (ctrl.Manager, error) {
	ns, err := CheckWatchNamespaces(namespaces)
	if err != nil {
		return nil, err
	}
	if len(ns) == 0 {
		return mgr, nil
	}
	if mgr.GetWebhookServer() == nil {
		return nil, errors.New("the manager has no webhook server to gate")
	}
	return watchedManager{Manager: mgr, server: watchedServer{Server: mgr.GetWebhookServer(), watched: ns}}, nil
}
