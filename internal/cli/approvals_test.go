package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// cliExecEnv, set to 1, makes this test binary behave as the `reversi` binary (TestMain runs
// Execute on its arguments and exits): the tests run `reversi approvals` in a process of its
// own, next to a gateway that has the same SQLite file open.
const cliExecEnv = "REVERSI_CLI_TEST_EXEC"

func TestMain(m *testing.M) {
	if os.Getenv(cliExecEnv) == "1" {
		os.Exit(Execute(os.Args[1:], os.Stdout, os.Stderr))
	}
	code := m.Run()
	pgServer.Stop() // started by the first test that needs PostgreSQL
	os.Exit(code)
}

// reversiProcess runs `reversi args...` as a separate process and returns its stdout, stderr
// and exit code.
func reversiProcess(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), cliExecEnv+"=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	}
	t.Fatalf("reversi %v: %v", args, err)
	return "", "", -1
}

// reversiInProcess runs `reversi args...` through Execute in this process.
func reversiInProcess(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := Execute(args, &out, &errb)
	return out.String(), errb.String(), code
}

// seedApprovals writes a store with four requests in run-1 (actor alice): p1 pending (finance,
// quorum 2), p2 pending (any role), d1 denied by bob, e1 expired. It returns the data folder.
func seedApprovals(t *testing.T) string {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	ctx := context.Background()
	// e1 is created by a store whose clock is two hours behind, so its hour has passed.
	past, err := store.OpenSQLite(data, func() time.Time { return time.Now().Add(-2 * time.Hour) })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := past.CreateRun(ctx, store.Run{ID: "run-1", Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := past.CreateApproval(ctx, store.ApprovalRequest{ID: "e1", Tool: "mem.delete_entities", ArgsDigest: "sha256:e",
		Run: "run-1", Actor: "alice", Expires: time.Now().Add(-time.Hour), Reason: "mem.delete_entities requires approval (manifest)"}); err != nil {
		t.Fatal(err)
	}
	if err := past.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	hour := time.Now().Add(time.Hour)
	for _, r := range []store.ApprovalRequest{
		{ID: "p1", Tool: "mem.delete_entities", ArgsDigest: "sha256:1", Roles: []string{"finance"}, Quorum: 2,
			Reason: "mem.delete_entities requires approval (manifest)"},
		{ID: "p2", Tool: "mem.delete_relations", ArgsDigest: "sha256:2", Reason: "mem.delete_relations\nrequires approval"},
		{ID: "d1", Tool: "mem.delete_observations", ArgsDigest: "sha256:3", Reason: "why not"},
	} {
		r.Run, r.Actor, r.Expires = "run-1", "alice", hour
		if _, err := st.CreateApproval(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Decide(ctx, "d1", store.Decision{By: "bob", Comment: "ticket FIN-12"}); err != nil {
		t.Fatal(err)
	}
	return data
}

// tableRows splits a kubectl-style table into its rows' fields, keyed by the first column.
func tableRows(t *testing.T, out string) (header []string, rows map[string][]string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header = strings.Fields(lines[0])
	rows = map[string][]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		rows[f[0]] = f
	}
	return header, rows
}

func TestApprovalsList(t *testing.T) {
	data := seedApprovals(t)

	out, errb, code := reversiInProcess("approvals", "list", "--data", data)
	if code != 0 {
		t.Fatalf("list: exit %d, %s", code, errb)
	}
	header, rows := tableRows(t, out)
	if got := strings.Join(header, " "); got != "ID TOOL RUN ACTOR STATE APPROVALS ROLES EXPIRES REASON" {
		t.Errorf("header %q", got)
	}
	if len(rows) != 2 || rows["p1"] == nil || rows["p2"] == nil {
		t.Fatalf("default list shows only the pending requests:\n%s", out)
	}
	// ID TOOL RUN ACTOR STATE APPROVALS ROLES EXPIRES(in 59m) REASON...
	if got := strings.Join(rows["p1"][:10], " "); !regexp.MustCompile(`^p1 mem.delete_entities run-1 alice pending 0/2 finance in (59|60)m mem.delete_entities$`).MatchString(got) {
		t.Errorf("p1 row %q\n%s", got, out)
	}
	if got := strings.Join(rows["p2"][5:7], " "); got != "0/1 <any>" {
		t.Errorf("p2 approvals and roles %q", got)
	}
	if strings.Count(out, "\n") != 3 || !strings.HasSuffix(out, "mem.delete_relations requires approval\n") {
		t.Errorf("a reason's newline must not break the table:\n%s", out)
	}
	// Columns are aligned: every row's STATE starts where the header's does.
	lines := strings.Split(out, "\n")
	col := strings.Index(lines[0], "STATE")
	for _, l := range lines[1:3] {
		if !strings.HasPrefix(l[col:], "pending ") {
			t.Errorf("STATE column not aligned:\n%s", out)
		}
	}

	out, _, _ = reversiInProcess("approvals", "list", "--data", data, "--state", "all")
	if _, rows := tableRows(t, out); len(rows) != 4 || rows["d1"][4] != "denied" || rows["e1"][4] != "expired" ||
		strings.Join(rows["e1"][7:9], " ") != "1h ago" && strings.Join(rows["e1"][7:9], " ") != "60m ago" {
		t.Errorf("--state all:\n%s", out)
	}
	out, _, _ = reversiInProcess("approvals", "list", "--data", data, "--state", "expired")
	if _, rows := tableRows(t, out); len(rows) != 1 || rows["e1"] == nil {
		t.Errorf("--state expired:\n%s", out)
	}

	out, errb, code = reversiInProcess("approvals", "list", "--data", data, "--state", "all", "--json")
	if code != 0 {
		t.Fatalf("--json: exit %d %s", code, errb)
	}
	var js []map[string]any
	if err := json.Unmarshal([]byte(out), &js); err != nil || len(js) != 4 {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	byID := map[string]map[string]any{}
	for _, j := range js {
		byID[j["id"].(string)] = j
	}
	d1 := byID["d1"]
	if d1["state"] != "denied" || d1["argumentsDigest"] != "sha256:3" || d1["onTimeout"] != "deny" || d1["decidedAt"] == nil {
		t.Errorf("d1 %v", d1)
	}
	decs, _ := d1["decisions"].([]any)
	if len(decs) != 1 || decs[0].(map[string]any)["by"] != "bob" || decs[0].(map[string]any)["decision"] != "Deny" ||
		decs[0].(map[string]any)["reason"] != "ticket FIN-12" {
		t.Errorf("d1 decisions %v", d1["decisions"])
	}
	if p1 := byID["p1"]; p1["quorum"] != 2.0 || p1["approvals"] != 0.0 || p1["roles"].([]any)[0] != "finance" || p1["decidedAt"] != nil {
		t.Errorf("p1 %v", p1)
	}
	if r, ok := byID["p2"]["roles"].([]any); !ok || len(r) != 0 {
		t.Errorf("p2 roles should be [] (not null): %v", byID["p2"]["roles"])
	}

	// Nothing to show: an empty table says so on stderr, --json prints [].
	out, errb, code = reversiInProcess("approvals", "list", "--data", data, "--state", "approved")
	if code != 0 || out != "" || !strings.Contains(errb, "No approved approval requests in ") {
		t.Errorf("empty list: exit %d, %q, %q", code, out, errb)
	}
	if out, _, _ = reversiInProcess("approvals", "list", "--data", data, "--state", "approved", "--json"); out != "[]\n" {
		t.Errorf("empty --json %q", out)
	}
}

func TestApprovalsDecide(t *testing.T) {
	data := seedApprovals(t)
	run := func(args ...string) (string, string, int) {
		return reversiInProcess(append(args, "--data", data)...)
	}
	for _, tc := range []struct {
		args []string
		out  string // exit 0 and this stdout, or
		err  string // exit 1 and this in stderr
	}{
		{args: []string{"approvals", "approve", "p1", "--by", "bob", "--role", "finance"}, out: "p1 pending (1/2 approvals)\n"},
		{args: []string{"approvals", "approve", "p1", "--by", "bob", "--role", "finance"}, err: "bob has already decided it; the quorum (2) counts distinct principals"},
		{args: []string{"approvals", "approve", "p1", "--by", "carol"}, err: "needs an approver holding one of the roles finance, and no --role was given for carol"},
		{args: []string{"approvals", "approve", "p1", "--by", "carol", "--role", "ops,dev"}, err: "and --role ops,dev was given for carol"},
		{args: []string{"approvals", "approve", "p1", "--by", "alice", "--role", "finance"}, err: "alice opened run run-1 and may not approve its own call"},
		{args: []string{"approvals", "approve", "p1", "--by", "carol", "--role", "ops", "--role", "finance", "--reason", "FIN-7"}, out: "p1 approved (2/2)\n"},
		{args: []string{"approvals", "deny", "p1", "--by", "dave", "--role", "finance"}, err: "cannot deny p1: it is already approved (since "},
		{args: []string{"approvals", "approve", "e1", "--by", "bob"}, err: "cannot approve e1: it is already expired"},
		{args: []string{"approvals", "deny", "p2", "--by", "bob", "--reason", "wrong customer"}, out: "p2 denied by bob\n"},
		{args: []string{"approvals", "approve", "apr-nope", "--by", "bob"}, err: "no approval request apr-nope in this store: check the id and --data"},
		{args: []string{"approvals", "approve", "d1"}, err: "--by is required"},
		{args: []string{"approvals", "approve", "d1", "--by", "  "}, err: "--by is required"},
		{args: []string{"approvals", "approve", "--by", "bob"}, err: "approve takes one approval request id"},
		{args: []string{"approvals", "approve", "p1", "--by", "bob", "--store", "memory"}, err: "--store memory: a memory store lives only inside its gateway process"},
		{args: []string{"approvals", "list", "--state", "stuck"}, err: `--state "stuck": use one of pending, approved, denied, expired, all`},
	} {
		out, errb, code := run(tc.args...)
		if tc.err == "" && (code != 0 || out != tc.out) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %q", tc.args, code, out, errb, tc.out)
		}
		if tc.err != "" && (code != 1 || !strings.Contains(errb, tc.err)) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tc.args, code, errb, tc.err)
		}
	}

	// The decisions are in the store, with the principal's roles and reason.
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p1, err := st.GetApproval(context.Background(), "p1")
	if err != nil || p1.State != store.ApprovalApproved || len(p1.Decisions) != 2 {
		t.Fatalf("p1 %+v %v", p1, err)
	}
	if d := p1.Decisions[1]; d.By != "carol" || strings.Join(d.Roles, ",") != "ops,finance" || d.Comment != "FIN-7" || !d.Approve {
		t.Errorf("carol's decision %+v", d)
	}
	if p2, _ := st.GetApproval(context.Background(), "p2"); p2.State != store.ApprovalDenied || p2.Decisions[0].Comment != "wrong customer" {
		t.Errorf("p2 %+v", p2)
	}
}

// TestApprovalsNoStore: a --data folder without a gateway store is an error that names it,
// and the command creates nothing there.
func TestApprovalsNoStore(t *testing.T) {
	data := filepath.Join(t.TempDir(), "nothing")
	for _, args := range [][]string{
		{"approvals", "list", "--data", data},
		{"approvals", "approve", "apr-1", "--by", "bob", "--data", data},
	} {
		_, errb, code := reversiInProcess(args...)
		if code != 1 || !strings.Contains(errb, "no gateway store at "+filepath.Join(data, store.SQLiteFile)) ||
			!strings.Contains(errb, "pass --data with the folder the gateway was started with") {
			t.Errorf("%v: exit %d, %q", args, code, errb)
		}
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("the command created %s: %v", data, err)
	}
}
