package upstreams

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// MetaCall is one tools/call as a server with RecordMetaEnv received it.
type MetaCall struct {
	Name string         `json:"name"`
	Meta map[string]any `json:"meta"`
}

// RecordMetaEnv returns the environment that makes a Node MCP server record every tools/call's
// name and `_meta` as received (one JSON line each in file; read them with ReadMetaCalls), and,
// with fault "exit:<tool>" or "hang:<tool>", exit or never answer on the first call of that
// tool (record-meta.mjs). Add it to a stdio upstream's env; the server itself is unchanged.
func RecordMetaEnv(t testing.TB, file, fault string) map[string]string {
	t.Helper()
	abs, err := filepath.Abs(file)
	if err != nil {
		t.Fatalf("upstreams: %s: %v", file, err)
	}
	env := map[string]string{"NODE_OPTIONS": "--import=" + filepath.Join(srcDir(t), "record-meta.mjs"), "REVERSI_RECORD_META": abs}
	if fault != "" {
		env["REVERSI_FAULT"] = fault
	}
	return env
}

// ReadMetaCalls reads the calls RecordMetaEnv recorded in file (none when it does not exist).
func ReadMetaCalls(t testing.TB, file string) []MetaCall {
	t.Helper()
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []MetaCall
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var c MetaCall
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("upstreams: %s: %q: %v", file, line, err)
		}
		out = append(out, c)
	}
	return out
}
