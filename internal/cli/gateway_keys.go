package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// newGatewayKeysCmd is `reversi gateway keys add`: a new API key in the gateway's auth.keys
// file (seed "MCP gateway", Config; format in gateway/auth/keys.go).
func newGatewayKeysCmd() *cobra.Command {
	keys := &cobra.Command{
		Use:   "keys",
		Short: "Manage the gateway's API key file (auth.keys)",
		Args:  cobra.NoArgs,
	}
	var (
		file, principal, role string
		uid, email            string
		perms, groups         []string
	)
	add := &cobra.Command{
		Use:   "add",
		Short: "Add an API key and print its secret (shown once; only its SHA-256 is stored)",
		Long: "Adds a key to the API key file (created with mode 0600 when missing) and prints the\n" +
			"secret on stdout, once. Clients send it as `Authorization: Bearer <secret>`.\n\n" +
			"  reversi gateway keys add --principal ci-bot --role agent --max-permission fs:read -f keys.json\n\n" +
			"Roles: agent < auditor < approver < operator < admin. --max-permission caps the\n" +
			"session scope (repeatable; without it the gateway's permissions apply); --group adds\n" +
			"a role name for manifest approval rules (approval.roles). --uid and --email name the\n" +
			"principal's identity for the approvals of its runs: an approver with that uid, or whose\n" +
			"username is that e-mail, is the actor under another name and is Rejected.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := auth.ParseRole(role)
			if err != nil {
				return fmt.Errorf("--role: %w", err)
			}
			var maxp *[]string
			if cmd.Flags().Changed("max-permission") {
				p := append([]string{}, perms...)
				maxp = &p
			}
			e, secret, err := auth.AddKey(file, principal, r, maxp, groups, auth.KeyIdentity{UID: uid, Email: email})
			if err != nil {
				if ie := (*auth.IdentityError)(nil); errors.As(err, &ie) {
					return fmt.Errorf("--%w", err) // names the flag: --uid "a b": …
				}
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "added key %s for %s (%s) to %s; the secret is shown once:\n", e.ID, e.Principal, e.Role, file)
			fmt.Fprintln(cmd.OutOrStdout(), secret)
			return nil
		},
	}
	f := add.Flags()
	f.StringVarP(&file, "file", "f", "", "the API key file (auth.keys)")
	f.StringVar(&principal, "principal", "", "the principal the key authenticates (the actor of its runs)")
	f.StringVar(&role, "role", "", "agent, auditor, approver, operator or admin")
	f.StringSliceVar(&perms, "max-permission", nil, "cap the session scope to these permissions (repeatable)")
	f.StringSliceVar(&groups, "group", nil, "an extra role name for manifest approval rules (repeatable)")
	f.StringVar(&uid, "uid", "", "the principal's uid (optional; compared with approvers' uids)")
	f.StringVar(&email, "email", "", "the principal's e-mail (optional; an approver named this address is the actor)")
	for _, n := range []string{"file", "principal", "role"} {
		_ = add.MarkFlagRequired(n)
	}
	keys.AddCommand(add)
	return keys
}

// gatewaySigner loads --signing-key; nil when not given.
func gatewaySigner(cmd *cobra.Command, path string) (*signing.Signer, error) {
	if path == "" {
		return nil, nil
	}
	s, warning, err := signing.LoadSigner(path)
	if err != nil {
		return nil, fmt.Errorf("--signing-key: %w", err)
	}
	if warning != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), warning)
	}
	return s, nil
}
