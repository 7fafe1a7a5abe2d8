package pgtest

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestStartStop: the server accepts connections on 127.0.0.1 as postgres, serves a new
// database, runs as a non-root user, and Stop removes its folder.
func TestStartStop(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	dir := s.Dir
	defer s.Stop()
	ctx := context.Background()
	u, err := s.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	var version, addr, db string
	var super bool
	if err := c.QueryRow(ctx, `SELECT version(), inet_server_addr()::text, current_database(),
		(SELECT rolsuper FROM pg_roles WHERE rolname = current_user)`).Scan(&version, &addr, &db, &super); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	t.Logf("%s at %s, database %s", version, addr, db)
	if !strings.HasPrefix(version, "PostgreSQL") || !strings.HasPrefix(addr, "127.0.0.1") || db == "postgres" || !super {
		t.Fatalf("server: %q at %q, database %q, superuser %v", version, addr, db, super)
	}
	s.Stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("folder %s left after Stop: %v", dir, err)
	}
	if _, err := pgx.Connect(ctx, u); err == nil {
		t.Fatal("the server still accepts connections after Stop")
	}
}
