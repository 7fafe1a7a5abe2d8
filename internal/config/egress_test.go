package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/gateway/egress"
)

func TestEgressRules(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, FileName)
	if err := os.WriteFile(p, []byte("egress:\n  block_private: true\n  allowed_hosts: [\"*.example.com\", mcp.github.com]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	want := egress.Rules{BlockPrivate: true, AllowedHosts: []string{"*.example.com", "mcp.github.com"}}
	if !reflect.DeepEqual(c.Egress, want) {
		t.Errorf("egress = %+v, want %+v", c.Egress, want)
	}
	if err := os.WriteFile(p, []byte("egress:\n  block_privat: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "block_privat") {
		t.Errorf("a misspelt egress field: %v", err)
	}
}
