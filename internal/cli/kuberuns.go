package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// kubeRuns wraps st so that every run is mirrored as a ReversiRun in the namespace and
// spec.rollback on one is executed (gateway --kubeconfig/--namespace; the caller attaches the
// gateway). The replica is named by the host name (the pod's name in a cluster). On error it
// closes st.
func kubeRuns(ctx context.Context, st store.Store, kubeconfig, namespace, gateway string, stderr io.Writer) (*kube.Runs, error) {
	cfg, ns, err := kubeClientConfig(kubeconfig, namespace)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	runs, err := kube.NewRuns(ctx, st, kube.RunsOptions{Config: cfg, Namespace: ns, Gateway: gateway, Replica: replicaName(), Stderr: stderr})
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	return runs, nil
}

// kubeRollback is `reversi rollback RUN --kubeconfig/--namespace`: it sets spec.rollback of the
// ReversiRun (a merge patch); a gateway replica that serves the run executes it and reports in
// status.rollback (issue 8: "`reversi rollback RUN --confirm` in Kubernetes mode just sets the
// field"). Without --confirm the gateway only plans the rollback.
func kubeRollback(ctx context.Context, out io.Writer, run, kubeconfig, namespace string, confirm, approveComp bool) error {
	cfg, ns, err := kubeClientConfig(kubeconfig, namespace)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: v1alpha1.NewScheme()})
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"rollback": map[string]any{"confirm": confirm, "approveCompensations": approveComp}}})
	if err != nil {
		return err
	}
	obj := &v1alpha1.ReversiRun{}
	obj.Namespace, obj.Name = ns, run
	if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("no ReversiRun %s in namespace %s: list them with kubectl get reversiruns -n %s", run, ns, ns)
		}
		return fmt.Errorf("setting spec.rollback of ReversiRun %s/%s: %w", ns, run, err)
	}
	what := "planned (dry run; pass --confirm to execute)"
	if confirm {
		what = "requested; a gateway replica runs it"
	}
	_, err = fmt.Fprintf(out, "reversirun.reversi.dev/%s: rollback %s. Follow it with: kubectl get reversirun %s -n %s -o jsonpath='{.status.rollback}'\n", run, what, run, ns)
	return err
}

// replicaName names this gateway process in consumedBy and status.rollback.replica: the pod
// ($POD_NAME, set by the rendered Deployment), else the host name, else the process id.
// Replicas sharing a namespace must have distinct names.
func replicaName() string {
	if p := os.Getenv(PodNameEnv); p != "" {
		return p
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return fmt.Sprintf("pid-%d", os.Getpid())
}
