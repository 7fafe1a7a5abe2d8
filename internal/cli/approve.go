package cli

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

func init() {
	register(func() *cobra.Command { return newDecisionCmd("approve", v1alpha1.DecisionApprove) })
	register(func() *cobra.Command { return newDecisionCmd("deny", v1alpha1.DecisionDeny) })
}

// newDecisionCmd is `reversi approve` or `reversi deny`: the Approval object for the current
// kubeconfig user, printed as YAML (for kubectl apply -f) or created with --apply. The
// admission webhook stamps spec.approver; the YAML leaves it out. Source: issue 8.
func newDecisionCmd(verb, decision string) *cobra.Command {
	var kubeconfig, namespace, reason string
	var apply bool
	cmd := &cobra.Command{
		Use:   verb + " REQUEST [--reason TEXT] [-n NAMESPACE] [--apply]",
		Short: fmt.Sprintf("Print (or --apply) an Approval that %ss an ApprovalRequest, as the current kubeconfig user", strings.ToLower(decision)),
		Long: "Writes the Approval object for the ApprovalRequest REQUEST, named after REQUEST and the user\n" +
			"the API server authenticates you as. Without --apply it prints the YAML, for\n" +
			"`kubectl apply -f -`; with --apply it creates it. The admission webhook records who you are\n" +
			"(spec.approver); the controller counts it if you hold one of the request's roles.\n\n" +
			"  reversi " + verb + " apr-7f3a --reason 'ticket FIN-12' | kubectl apply -f -\n" +
			"  reversi " + verb + " apr-7f3a -n agents --apply",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, ns, err := kubeClientConfig(kubeconfig, namespace)
			if err != nil {
				return err
			}
			c, err := client.New(cfg, client.Options{Scheme: v1alpha1.NewScheme()})
			if err != nil {
				return err
			}
			review := &authnv1.SelfSubjectReview{}
			if err := c.Create(cmd.Context(), review); err != nil {
				return fmt.Errorf("asking the API server who you are (SelfSubjectReview): %w", err)
			}
			user := review.Status.UserInfo.Username
			apr := &v1alpha1.Approval{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Approval"},
				ObjectMeta: metav1.ObjectMeta{Name: approvalName(args[0], user), Namespace: ns},
				Spec:       v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: args[0]}, Decision: decision, Reason: reason},
			}
			if !apply {
				doc := map[string]any{"apiVersion": apr.APIVersion, "kind": apr.Kind,
					"metadata": map[string]any{"name": apr.Name, "namespace": apr.Namespace}, "spec": apr.Spec}
				b, err := yaml.Marshal(doc)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "# %s of %s by %s (spec.approver is stamped by the admission webhook)\n%s", decision, args[0], user, b)
				return err
			}
			if err := c.Create(cmd.Context(), apr); err != nil {
				if apierrors.IsAlreadyExists(err) {
					return fmt.Errorf("Approval %s/%s exists: %s already decided on %s (a decision cannot be changed; a Deny by anyone else still denies)", ns, apr.Name, user, args[0])
				}
				return fmt.Errorf("creating Approval %s/%s: %w", ns, apr.Name, err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "approval.reversi.dev/%s created in %s (%s of %s by %s)\n", apr.Name, ns, decision, args[0], user)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
	f.StringVarP(&namespace, "namespace", "n", "", "namespace of the request (default: the kubeconfig's)")
	f.StringVar(&reason, "reason", "", "why, such as a ticket reference (recorded in the Approval)")
	f.BoolVar(&apply, "apply", false, "create the Approval instead of printing it")
	return cmd
}

var nameUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// approvalName is "<request>-<user>", lowercased and cut to a valid object name: one
// Approval per user and request.
func approvalName(request, user string) string {
	u := strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(user), "-"), "-")
	name := request + "-" + u
	if len(name) > 253 {
		name = name[:253]
	}
	return strings.Trim(name, "-.")
}
