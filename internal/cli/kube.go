package cli

import (
	"context"
	"fmt"
	"io"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// kubeClientConfig loads a kubeconfig (the file given, else $KUBECONFIG or ~/.kube/config,
// else in-cluster) and its namespace (the one given, else the context's, else the pod's).
func kubeClientConfig(kubeconfig, namespace string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading the kubeconfig: %w", err)
	}
	if namespace == "" {
		if namespace, _, err = cc.Namespace(); err != nil {
			return nil, "", fmt.Errorf("the kubeconfig's namespace: %w", err)
		}
	}
	return cfg, namespace, nil
}

// kubeApprovals wraps st so its approval queue is ApprovalRequests in the namespace (gateway
// --kubeconfig/--namespace). The gateway's own username comes from a SelfSubjectReview (the
// gateway does not start without it: issue 16), and an Approved phase is honoured only with
// the controller's signature of it: controllerKeys is --kube-controller-keys (a PEM file;
// default the PEM in $REVERSI_CONTROLLER_KEYS), without which the gateway does not start. On
// error it closes st.
func kubeApprovals(ctx context.Context, st store.Store, kubeconfig, namespace, gateway, controllerKeys string, stderr io.Writer) (store.Store, error) {
	ctl, err := controllerTrust(controllerKeys)
	if err == nil && ctl == nil {
		err = fmt.Errorf("the Kubernetes approval queue (--kubeconfig/--namespace) needs the controller's public keys (--kube-controller-keys FILE, or the PEM in $%s, as a ReversiGateway's pods get it; the controller publishes them in the ConfigMap reversi-controller-keys of its namespace): without them an Approved ApprovalRequest cannot be told from one whose status anyone allowed to write approvalrequests/status set", ControllerKeysEnv)
	}
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	cfg, ns, err := kubeClientConfig(kubeconfig, namespace)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	// The gateway's notices carry its namespace, for the receivers' namespaces filters (issue 24).
	if ob, ok := st.(store.Outbox); ok {
		ob.SetNoticeNamespace(ns)
	}
	ks, err := kube.New(ctx, st, kube.Options{Config: cfg, Namespace: ns, Gateway: gateway, Replica: replicaName(), ControllerKeys: ctl, Events: true, Stderr: stderr})
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	return ks, nil
}
