package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/internal/stdiobridge"
)

func init() { register(newStdioBridgeCmd) }

// stdioBridgeUsage is the command line the controller renders as a server sidecar's entrypoint.
const stdioBridgeUsage = "reversi stdio-bridge --listen unix:///run/reversi/NAME.sock [--session shared|per_client] -- COMMAND [ARGS...]"

func newStdioBridgeCmd() *cobra.Command {
	var o stdiobridge.Options
	cmd := &cobra.Command{
		Use:   "stdio-bridge --listen unix:///PATH.sock [--session shared|per_client] [--max-connections N] -- COMMAND [ARGS...]",
		Short: "Serve a stdio MCP server on a Unix socket (a ReversiGateway's server sidecar)",
		Long: "Runs COMMAND as a child and bridges each connection on the socket to the child's stdin\n" +
			"and stdout (MCP's stdio framing: newline-delimited JSON-RPC); the child's stderr is this\n" +
			"program's. A gateway reaches it as an upstream with `socket: PATH` in gateway.yaml.\n\n" +
			"  --session shared (default): one child, started at once and again when it exits (with\n" +
			"    backoff) or when its connection closes; one connection at a time, a second is refused.\n" +
			"  --session per_client: one child per connection, at most --max-connections at once.\n\n" +
			"A connection is closed when its child exits; a child is stopped (stdin closed, then SIGTERM,\n" +
			"then SIGKILL after --grace-period) when its connection closes. SIGTERM and SIGINT are\n" +
			"forwarded to the children; the bridge exits once they have, with the shared child's exit\n" +
			"status. The socket is made with mode 0660, its directory if missing; a stale one is\n" +
			"removed. \"listening on unix://PATH\" on stderr says it is ready.\n\n" +
			"  " + stdioBridgeUsage,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash != 0 || len(args) == 0 {
				if dash > 0 {
					return fmt.Errorf("arguments before --: %q; give the server's command after --: %s", args[:dash], stdioBridgeUsage)
				}
				return errors.New("give the server's command after --: " + stdioBridgeUsage)
			}
			o.Command = args
			o.Log = cmd.ErrOrStderr()
			sigs := make(chan os.Signal, 4)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
			defer signal.Stop(sigs)
			o.Signals = sigs
			o.Reap = true // this process is the bridge (a sidecar's PID 1): its servers' orphans are its to reap
			code, err := stdiobridge.Run(context.Background(), o)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitError{code: code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Listen, "listen", "", "the socket to serve: unix:// and an absolute path (required)")
	f.StringVar(&o.Session, "session", stdiobridge.SessionShared, "shared (one child, one connection at a time) or per_client (one child per connection)")
	f.IntVar(&o.MaxConnections, "max-connections", 0, fmt.Sprintf("per_client: the most connections (children) at once (0: %d); shared serves one", stdiobridge.DefaultMaxConnections))
	f.DurationVar(&o.GracePeriod, "grace-period", stdiobridge.DefaultGracePeriod, "how long a child has after SIGTERM (or a forwarded signal) before SIGKILL")
	return cmd
}
