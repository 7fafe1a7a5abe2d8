package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

func init() { register(newCopyBinaryCmd) }

// newCopyBinaryCmd is `reversi copy-binary DEST`: the init container of a ReversiGateway pod
// with container upstreams (issue 23) copies the running binary into an emptyDir, from which
// each upstream's sidecar runs `reversi stdio-bridge`. The image is FROM scratch: there is no
// cp to do it with.
func newCopyBinaryCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "copy-binary DEST",
		Short: "Copy this reversi binary to DEST (executable, read-only), for a sidecar's stdio bridge",
		Long: "Copy the running reversi binary to DEST, mode 0555, atomically (a temporary file in DEST's folder,\n" +
			"renamed over DEST). A ReversiGateway's init container runs it to put the bridge into a volume its\n" +
			"container upstreams' sidecars share.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("finding the running binary: %w", err)
			}
			n, err := copyBinary(self, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "copied %s to %s (%d bytes)\n", self, args[0], n)
			return nil
		},
	}
}

// copyBinary copies the file src to dest with mode 0555: written to a temporary file beside
// dest, synced, then renamed over it, so dest is never seen half written (a sidecar restarted
// meanwhile runs the old copy or the new one). It returns the bytes copied.
func copyBinary(src, dest string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, fmt.Errorf("reading the binary: %w", err)
	}
	defer in.Close()
	if st, err := in.Stat(); err != nil || !st.Mode().IsRegular() {
		return 0, fmt.Errorf("%s is not a regular file (%v)", src, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".*")
	if err != nil {
		return 0, fmt.Errorf("copying to %s: %w", dest, err)
	}
	n, err := io.Copy(tmp, in)
	err = errors.Join(err, tmp.Chmod(0o555), tmp.Sync(), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), dest)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return 0, fmt.Errorf("copying to %s: %w", dest, err)
	}
	return n, nil
}
