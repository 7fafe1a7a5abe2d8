package cli

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestApprovalsShow: `reversi approvals show ID` prints the request and its decision records:
// the CLI's own decisions (approve and deny are records of the run), refusals with why, and
// the retry's consumption. Source: issue 16 ("Decisions are ledger records").
func TestApprovalsShow(t *testing.T) {
	data := seedApprovals(t)
	// mallory has no finance role: refused, and journaled as rejected
	if _, errb, code := reversiInProcess("approvals", "approve", "p1", "--data", data, "--by", "mallory", "--reason", "trust me"); code != 1 ||
		!strings.Contains(errb, "finance") {
		t.Fatalf("mallory: %d %s", code, errb)
	}
	for _, by := range []string{"carol", "dave"} {
		if _, errb, code := reversiInProcess("approvals", "approve", "p1", "--data", data, "--by", by, "--role", "finance", "--reason", "FIN-12"); code != 0 {
			t.Fatalf("%s: %d %s", by, code, errb)
		}
	}
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecordIntent(context.Background(), store.Intent{Run: "run-1", Tool: "mem.delete_entities", ArgsDigest: "sha256:1", Approval: "p1"}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	out, errb, code := reversiInProcess("approvals", "show", "p1", "--data", data)
	if code != 0 {
		t.Fatalf("show: %d %s", code, errb)
	}
	for _, want := range []string{"Request:   p1", "State:     approved (2/2 approvals)", "Roles:     finance", "Consumed:  "} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	var events []string
	for _, l := range strings.Split(out[strings.Index(out, "SEQ"):], "\n")[1:] {
		if f := strings.Fields(l); len(f) > 2 {
			events = append(events, f[2]+":"+f[3])
		}
	}
	if got := strings.Join(events, ","); got != "rejected:mallory,counted:carol,counted:dave,approved:-,consumed:-" {
		t.Fatalf("records %s:\n%s", got, out)
	}

	out, _, code = reversiInProcess("approvals", "show", "p1", "--data", data, "--json")
	var j showJSON
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || j.Request.ID != "p1" || len(j.Records) != 5 ||
		j.Records[0].Event != "rejected" || !strings.Contains(j.Records[0].Note, "mallory holds none of the roles") ||
		j.Records[0].Reason != "trust me" || j.Records[1].Approver != "carol" || j.Records[1].Groups[0] != "finance" ||
		j.Records[1].Decision != "Approve" || j.Records[4].Step == 0 {
		t.Fatalf("--json: %d %s", code, out)
	}
	// the deny of the seed is a record too
	out, _, _ = reversiInProcess("approvals", "show", "d1", "--data", data, "--json")
	if err := json.Unmarshal([]byte(out), &j); err != nil || len(j.Records) != 2 || j.Records[0].Decision != "Deny" || j.Records[1].Event != "denied" {
		t.Fatalf("d1: %s", out)
	}
	if _, errb, code := reversiInProcess("approvals", "show", "nope", "--data", data); code != 1 || !strings.Contains(errb, "no approval request nope") {
		t.Fatalf("unknown id: %d %s", code, errb)
	}
	if _, errb, code := reversiInProcess("approvals", "show", "--data", data); code != 1 || !strings.Contains(errb, "show takes one approval request id") {
		t.Fatalf("no id: %d %s", code, errb)
	}
}

// TestApproveAsTheActorsAlias: the actor under another name (its e-mail, or its uid with
// --uid) cannot approve its own request; the refusal says why.
func TestApproveAsTheActorsAlias(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := st.CreateRun(ctx, store.Run{ID: "run-1", Actor: "agent-7"}); err != nil {
		t.Fatal(err)
	}
	req := store.ApprovalRequest{ID: "a1", Tool: "t", ArgsDigest: "sha256:1", Run: "run-1", Actor: "agent-7", ActorUID: "u-7",
		ActorEmail: "agent-7@corp.example", Expires: timeNowPlusHour()}
	if _, err := st.CreateApproval(ctx, req); err != nil {
		t.Fatal(err)
	}
	st.Close()
	for _, args := range [][]string{{"--by", "agent-7@corp.example"}, {"--by", "seven", "--uid", "u-7"}} {
		_, errb, code := reversiInProcess(append([]string{"approvals", "approve", "a1", "--data", data}, args...)...)
		if code != 1 || !strings.Contains(errb, "cannot approve a1") || !strings.Contains(errb, "(same ") {
			t.Errorf("%v: %d %s", args, code, errb)
		}
	}
}

// TestKeysAddIdentity: `reversi gateway keys add --uid --email` writes them to the key file;
// a bad e-mail names the flag.
func TestKeysAddIdentity(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys.json")
	if _, errb, code := reversiInProcess("gateway", "keys", "add", "-f", p, "--principal", "agent-7", "--role", "agent",
		"--uid", "u-7", "--email", "agent-7@corp.example"); code != 0 {
		t.Fatalf("%d %s", code, errb)
	}
	f, err := auth.LoadKeyFile(p)
	if err != nil || len(f.Keys) != 1 || f.Keys[0].UID != "u-7" || f.Keys[0].Email != "agent-7@corp.example" {
		t.Fatalf("%+v %v", f, err)
	}
	if _, errb, code := reversiInProcess("gateway", "keys", "add", "-f", p, "--principal", "x", "--role", "agent", "--email", "nope"); code != 1 ||
		!strings.Contains(errb, "--email") {
		t.Fatalf("bad email: %d %s", code, errb)
	}
	if _, errb, code := reversiInProcess("gateway", "keys", "add", "-f", p, "--principal", "x", "--role", "agent", "--uid", "a b"); code != 1 ||
		!strings.Contains(errb, `--uid "a b": at most 253 characters, no spaces`) {
		t.Fatalf("bad uid: %d %s", code, errb)
	}
}

func timeNowPlusHour() time.Time { return time.Now().Add(time.Hour) }
