package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/pkg/signing"
)

func init() { register(newKeygenCmd) }

func newKeygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen PREFIX",
		Short: "Write an Ed25519 key pair for signing manifests: PREFIX.key and PREFIX.pub",
		Long: "Writes PREFIX.key (PKCS#8 PEM, mode 0600: keep it secret) and PREFIX.pub (PKIX PEM: put it\n" +
			"in manifest_public_key) and prints the key id. Never overwrites existing files.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := signing.GenerateKeyFiles(args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s.key (private) and %s.pub, key id %s\n", args[0], args[0], id)
			return nil
		},
	}
}
