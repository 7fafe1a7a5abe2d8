package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// DatabaseURLEnv names the environment variable that gives the Postgres store's URL when
// --database-url is not set (a URL with a password is better kept out of the command line).
const DatabaseURLEnv = "REVERSI_DATABASE_URL"

// databaseURL returns the --database-url flag, else $REVERSI_DATABASE_URL.
func databaseURL(flag string) (string, error) {
	u := strings.TrimSpace(flag)
	if u == "" {
		u = strings.TrimSpace(os.Getenv(DatabaseURLEnv))
	}
	if u == "" {
		return "", fmt.Errorf("--store postgres needs --database-url or $%s (postgres://user:password@host:5432/database?sslmode=verify-full; "+
			"the tables go in the schema named by search_path=..., default %s)", DatabaseURLEnv, store.PostgresSchema)
	}
	return u, nil
}

// openPostgres opens the gateway's Postgres store (creating its tables if missing).
func openPostgres(ctx context.Context, flag string) (*store.Postgres, error) {
	u, err := databaseURL(flag)
	if err != nil {
		return nil, err
	}
	return store.OpenPostgres(ctx, u, nil)
}

// openExistingPostgres opens a Postgres store that a gateway has created; a URL or schema
// without one is an error (never an empty queue).
func openExistingPostgres(ctx context.Context, flag string) (*store.Postgres, error) {
	u, err := databaseURL(flag)
	if err != nil {
		return nil, err
	}
	schema, ok, err := store.PostgresExists(ctx, u)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errors.New("no gateway store in schema " + schema + " of that database: pass the gateway's --database-url " +
			"(or $" + DatabaseURLEnv + "), with its search_path if it sets one")
	}
	return store.OpenPostgres(ctx, u, nil)
}

// storeWhere names where a store keeps its data, for messages.
func storeWhere(st store.Store) string {
	switch s := st.(type) {
	case *store.SQLite:
		return s.Path()
	case *store.Postgres:
		return "the postgres schema " + s.Schema()
	}
	return "the store"
}
