package redteam

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// readFreeze is a policy that denies what the manifests allow: graph reads.
const (
	readFreeze = `policy: read-freeze
description: Graph reads are frozen while the audit runs.
rules:
  - name: no-graph-reads
    match: {tools: [memory.read_graph]}
    condition: "true"
    effect: deny
    reason: "graph reads are frozen by policy during the audit"
`
	frozen = "graph reads are frozen by policy"
	// prToEnforcement is the p99 budget of BENCHMARKS.md row 2 (PR → enforcement).
	prToEnforcement = 5 * time.Second
)

// TestPolicyChainOfTrust is issue 21's acceptance point for GitOps: a signed policy in a
// ManifestRegistry reaches the ReversiGateway's pod and is enforced within the PR-to-enforcement
// budget; a tampered or unsigned policy commit is refused and the old policy keeps serving;
// and the pod itself refuses a policy edited in, dropped from, or re-signed with a manifest
// signature in its ConfigMap (the controller stopped, so nothing restores it first).
func TestPolicyChainOfTrust(t *testing.T) {
	w := newWorld(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log (end):\n%s", w.controller.Tail(6000))
			t.Logf("gateway log (end):\n%s", w.pay.proc.Tail(6000))
		}
	})
	w.pay.requireAllowed(t, "memory.read_graph", map[string]any{})

	// 1. The PR: the policy published, signed and approved, in a signed commit.
	f := filepath.Join(t.TempDir(), "read-freeze.yaml")
	must(t, os.WriteFile(f, []byte(readFreeze), 0o600))
	out := w.reversi(t, w.memory.repo.Dir, "policy", "publish", f, "--registry", w.memory.path, "--by", "platform-team",
		"--key", w.writerKey, "--status", "approved", "--note", "audit freeze")
	if !strings.HasPrefix(out, "read-freeze v1 approved ") {
		t.Fatalf("policy publish: %q", out)
	}
	w.memory.repo.CommitSigned("freeze graph reads", w.committer)
	start := time.Now()
	w.reconcile(t, memoryReg)
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
		if text, isErr := w.pay.call(t, "memory.read_graph", map[string]any{}); !isErr || !strings.Contains(text, frozen) {
			return "memory.read_graph is not denied by the policy yet: " + oneLine(text)
		}
		return ""
	}); err != nil {
		t.Fatalf("the signed policy was not enforced: %v", err)
	}
	took := time.Since(start)
	t.Logf("PR to enforcement of the policy: %s", took)
	if took > prToEnforcement {
		t.Errorf("the policy took %s to be enforced, more than the %s budget", took, prToEnforcement)
	}
	w.pay.requireHeld(t, "memory.create_entities", createArgs) // the manifests still serve
	if r := w.registry(t, memoryReg); r.Status.Artifact == nil || r.Status.Artifact.Policies != 1 {
		t.Errorf("registry status %+v", r.Status.Artifact)
	}

	// 2. A tampered policy commit (the version file loosened to advice): refused, the policy
	// keeps denying.
	file := filepath.Join(w.memory.repo.Dir, w.memory.path, "policies", "read-freeze", "v1.json")
	orig, err := os.ReadFile(file)
	must(t, err)
	must(t, os.WriteFile(file, []byte(strings.Replace(string(orig), `"effect": "deny"`, `"effect": "advise"`, 1)), 0o644))
	w.memory.repo.CommitSigned("loosen the freeze", w.committer)
	r := w.reconciled(t, memoryReg, w.reconcile(t, memoryReg), 30*time.Second)
	wantNotReady(t, r, "ValidationFailed", "policies/read-freeze/v1.json: policy read-freeze v1: edited after publishing")
	w.pay.requireBlocked(t, "memory.read_graph", map[string]any{}, frozen)

	// 3. An unsigned policy version (approved without --key; the index re-signed by the
	// writer, as after a rotation): refused as a signature, the signed v1 keeps denying.
	must(t, os.WriteFile(file, orig, 0o644))
	must(t, os.WriteFile(f, []byte(strings.Replace(readFreeze, "during the audit", "UNSIGNED", 1)), 0o600))
	w.reversi(t, w.memory.repo.Dir, "policy", "publish", f, "--registry", w.memory.path, "--by", "mallory", "--status", "approved")
	w.reversi(t, w.memory.repo.Dir, "manifests", "sign", "--registry", w.memory.path, "--key", w.writerKey)
	w.memory.repo.CommitSigned("an unsigned policy", w.committer)
	r = w.reconciled(t, memoryReg, w.reconcile(t, memoryReg), 30*time.Second)
	wantNotReady(t, r, "SignatureVerificationFailed", "policy read-freeze v2: not signed")
	if !w.pay.requireBlocked(t, "memory.read_graph", map[string]any{}, "during the audit") {
		t.Error("the unsigned policy version replaced the signed one")
	}

	// 4. The ConfigMap attacks, with the controller stopped: only the pod stands between the
	// attacker's rendering and the agent.
	w.stopController()
	good := maps.Clone(w.configMap(t, payGW+"-manifests").Data)
	signer, _, err := signing.LoadSigner(w.writerKey)
	must(t, err)
	attacks := map[string]func(ps []bundle.PolicyEntry) []bundle.PolicyEntry{
		"policy loosened, checksum fixed": func(ps []bundle.PolicyEntry) []bundle.PolicyEntry {
			ps[0].Document = json.RawMessage(strings.Replace(string(ps[0].Document), `"effect":"deny"`, `"effect":"advise"`, 1))
			ps[0].Checksum = sha(ps[0].Document)
			return ps
		},
		"policy dropped": func([]bundle.PolicyEntry) []bundle.PolicyEntry { return nil },
		"manifest signature replayed as the policy's": func(ps []bundle.PolicyEntry) []bundle.PolicyEntry {
			ps[0].Document = json.RawMessage(strings.Replace(string(ps[0].Document), `"effect":"deny"`, `"effect":"advise"`, 1))
			ps[0].Checksum = sha(ps[0].Document)
			sig, err := signer.Sign(signing.Message(ps[0].Policy, ps[0].Version, ps[0].Checksum))
			must(t, err)
			ps[0].Signature = base64.StdEncoding.EncodeToString(sig)
			return ps
		},
	}
	for name, edit := range attacks {
		var ps []bundle.PolicyEntry
		must(t, json.Unmarshal([]byte(good[bundle.KeyPolicies]), &ps))
		data := maps.Clone(good)
		if ps = edit(ps); ps == nil {
			delete(data, bundle.KeyPolicies)
		} else {
			b, err := json.Marshal(ps)
			must(t, err)
			data[bundle.KeyPolicies] = string(b)
		}
		w.writeAsMallory(t, payGW+"-manifests", data)
		if err := podrun.Poll(w.ctx, 15*time.Second, func() string {
			if e := w.pay.leaseAnnotation(t, v1alpha1.AnnotationManifestError); !strings.Contains(e, "was refused") {
				return "the pod has not refused the edited rendering: " + oneLine(e)
			}
			return ""
		}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		t.Logf("%s: %s", name, oneLine(w.pay.leaseAnnotation(t, v1alpha1.AnnotationManifestError)))
		if !w.pay.requireBlocked(t, "memory.read_graph", map[string]any{}, frozen) {
			t.Errorf("%s: the policy stopped denying", name)
		}
		w.writeAsMallory(t, payGW+"-manifests", good)
		if err := podrun.Poll(w.ctx, 15*time.Second, func() string {
			if e := w.pay.leaseAnnotation(t, v1alpha1.AnnotationManifestError); e != "" {
				return "the pod still reports a refusal: " + oneLine(e)
			}
			return ""
		}); err != nil {
			t.Errorf("%s, restored: %v", name, err)
		}
	}
	w.startController(t)
	w.pay.requireBlocked(t, "memory.read_graph", map[string]any{}, frozen)
}

// sha is the checksum a policy entry records: the hex SHA-256 of its document's bytes.
func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
