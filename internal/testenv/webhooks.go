package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// WithoutWebhooks deletes every mutating and validating webhook configuration of the control
// plane (as an attacker or a broken install would), waits until probe reports that the API
// server no longer calls them (probe returns nil once a write the webhooks refuse is admitted),
// and returns restore, which creates the configurations again as they were and waits until
// probe fails again (the webhooks are back). Each wait is bounded by 30 s. Errors: the list,
// delete or create calls, or a wait that ran out. Tests that use it must not run in parallel
// with tests that rely on the webhooks.
func WithoutWebhooks(ctx context.Context, c client.Client, probe func() error) (restore func() error, err error) {
	var muts admissionregistrationv1.MutatingWebhookConfigurationList
	var vals admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := c.List(ctx, &muts); err != nil {
		return nil, err
	}
	if err := c.List(ctx, &vals); err != nil {
		return nil, err
	}
	var saved []client.Object
	for i := range muts.Items {
		saved = append(saved, &muts.Items[i])
	}
	for i := range vals.Items {
		saved = append(saved, &vals.Items[i])
	}
	if len(saved) == 0 {
		return nil, fmt.Errorf("no webhook configurations to delete")
	}
	for _, o := range saved {
		if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("deleting webhook configuration %s: %w", o.GetName(), err)
		}
	}
	restore = func() error {
		for _, o := range saved {
			o.SetResourceVersion("")
			o.SetUID("")
			o.SetCreationTimestamp(metav1.Time{})
			o.SetManagedFields(nil)
			if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("restoring webhook configuration %s: %w", o.GetName(), err)
			}
		}
		return waitProbe(ctx, probe, false)
	}
	if err := waitProbe(ctx, probe, true); err != nil {
		_ = restore()
		return nil, err
	}
	return restore, nil
}

// waitProbe waits until probe succeeds (admitted) or fails (refused), at most 30 s.
func waitProbe(ctx context.Context, probe func() error, admitted bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := probe()
		if (err == nil) == admitted {
			return nil
		}
		if time.Now().After(deadline) {
			if admitted {
				return fmt.Errorf("the API server still calls the webhooks 30 s after their configurations were deleted: %v", err)
			}
			return fmt.Errorf("the restored webhook configurations do not refuse the probe after 30 s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WithoutAdmission runs fn with the webhook configurations deleted (WithoutWebhooks) and puts
// them back before it returns; the probe is a dry-run ReversiRun in ns for a gateway that does
// not exist, which the gateway objects' admission refuses (issue 16). It fails t on error.
func WithoutAdmission(t testing.TB, c client.Client, ns string, fn func()) {
	t.Helper()
	probe := func() error {
		return c.Create(t.Context(), &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "admission-probe"},
			Spec: v1alpha1.ReversiRunSpec{Actor: "probe", Gateway: "no-such-gateway"}}, client.DryRunAll)
	}
	restore, err := WithoutWebhooks(t.Context(), c, probe)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := restore(); err != nil {
			t.Fatal(err)
		}
	}()
	fn()
}
