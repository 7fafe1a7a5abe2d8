package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	kstatus "github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/testenv"
)

// strict makes the API server refuse unknown and duplicate fields instead of dropping them
// with a warning; kubectl asks for the same by default (--validate=strict).
var strict = client.FieldValidation("Strict")

// kinds are the six kinds of reversi.dev, sorted.
var kinds = []string{"Approval", "ApprovalRequest", "ManifestRegistry", "ReversiGateway", "ReversiRun", "ToolManifest"}

// object reads a YAML object.
func object(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatalf("bad test object: %v\n%s", err, doc)
	}
	return u
}

// samples reads the files config/samples/kustomization.yaml lists.
func samples(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	dir := filepath.Join(root, "config", "samples")
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, r := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, object(t, string(b)))
	}
	return out
}

// Every sample is accepted as written (strict field validation: nothing dropped), reads back
// into the Go types, and there is one sample of each kind. The ToolManifest sample is also a
// valid manifest, and kubectl shows the objects with their printer columns, short names and
// category, and explains the snake_case manifest fields.
func TestSamplesAreAccepted(t *testing.T) {
	cp := env(t)
	ctx := t.Context()
	ns := namespace(t, "samples")
	var seen []string
	for _, u := range samples(t) {
		u.SetNamespace(ns)
		if err := cp.Client.Create(ctx, u, strict); err != nil {
			t.Errorf("sample %s %s refused: %v", u.GetKind(), u.GetName(), err)
			continue
		}
		if u.GroupVersionKind().Group == v1alpha1.GroupVersion.Group {
			seen = append(seen, u.GetKind())
		}
	}
	slices.Sort(seen)
	if !slices.Equal(seen, kinds) {
		t.Errorf("samples of kinds %v, want one of each of %v", seen, kinds)
	}

	var tms v1alpha1.ToolManifestList
	if err := cp.Client.List(ctx, &tms, client.InNamespace(ns)); err != nil {
		t.Fatalf("listing ToolManifests into the Go type: %v", err)
	}
	for _, tm := range tms.Items {
		raw, err := tm.ManifestObject()
		if err != nil {
			t.Fatal(err)
		}
		if _, errs := manifest.Validate(raw); len(errs) > 0 {
			t.Errorf("ToolManifest sample %s is not a valid manifest: %v", tm.Name, errs)
		}
	}
	for _, list := range []client.ObjectList{&v1alpha1.ManifestRegistryList{}, &v1alpha1.ReversiGatewayList{}, &v1alpha1.ApprovalRequestList{}, &v1alpha1.ApprovalList{}, &v1alpha1.ReversiRunList{}} {
		if err := cp.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Errorf("listing %T: %v", list, err)
		}
	}

	out, err := kubectl(t, "get", "mreg,tm,rgw,apreq,apr,rrun", "-n", ns)
	if err != nil {
		t.Fatalf("kubectl get by short names: %v\n%s", err, out)
	}
	for _, want := range []string{"manifestregistry.reversi.dev/tool-manifests", "toolmanifest.reversi.dev/tickets-close", "reversigateway.reversi.dev/agents", "approvalrequest.reversi.dev/apr-7f3a", "approval.reversi.dev/apr-7f3a-alice", "reversirun.reversi.dev/run-5c1e", "REVISION", "READY", "STATUS", "EFFECT", "PHASE", "DECISION", "AGE"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get output lacks %q:\n%s", want, out)
		}
	}
	out, err = kubectl(t, "get", "reversi", "-n", ns, "-o", "name")
	if err != nil || len(strings.Fields(out)) != len(kinds) {
		t.Errorf("kubectl get reversi (the category) lists %d objects, want %d: %v\n%s", len(strings.Fields(out)), len(kinds), err, out)
	}
	out, err = kubectl(t, "explain", "toolmanifests.spec.compensation.verification.backoff_ms")
	if err != nil || !strings.Contains(out, "doubled between attempts") {
		t.Errorf("kubectl explain of a manifest field: %v\n%s", err, out)
	}
}

// The API server fills in the documented defaults.
func TestDefaults(t *testing.T) {
	cp := env(t)
	ctx := t.Context()
	ns := namespace(t, "defaults")
	for _, doc := range []string{
		`{apiVersion: reversi.dev/v1alpha1, kind: ManifestRegistry, metadata: {name: r}, spec: {url: "file:///srv/manifests", format: Plain}}`,
		`{apiVersion: reversi.dev/v1alpha1, kind: ReversiGateway, metadata: {name: g}, spec: {upstreams: [{name: fs, command: fs-mcp}]}}`,
		`{apiVersion: reversi.dev/v1alpha1, kind: ApprovalRequest, metadata: {name: a}, spec: {tool: t, argumentsDigest: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", run: r, actor: x, gateway: g}}`,
	} {
		u := object(t, doc)
		u.SetNamespace(ns)
		if err := cp.Client.Create(ctx, u, strict); err != nil {
			t.Fatalf("creating %s: %v", doc, err)
		}
	}
	var r v1alpha1.ManifestRegistry
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "r"}, &r); err != nil {
		t.Fatal(err)
	}
	// No ref: the controller follows the branch main (controllers.DefaultBranch) when none is
	// set, so that a registry with sourceRef, whose ref is the Flux source's, has none.
	if r.Spec.Ref != nil || r.Spec.Path != "." || r.Spec.Interval.Duration != v1alpha1.DefaultRegistryInterval || r.Spec.Timeout.Duration != v1alpha1.DefaultRegistryTimeout {
		t.Errorf("ManifestRegistry defaults: %+v", r.Spec)
	}
	var g v1alpha1.ReversiGateway
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "g"}, &g); err != nil {
		t.Fatal(err)
	}
	if g.Spec.Replicas == nil || *g.Spec.Replicas != 1 || g.Spec.Store == nil || g.Spec.Store.Type != v1alpha1.StoreSQLite || g.Spec.Port != 7431 ||
		g.Spec.ValidateSchemas == nil || !*g.Spec.ValidateSchemas || g.Spec.UnclassifiedReads != "block" {
		t.Errorf("ReversiGateway defaults: %+v", g.Spec)
	}
	var a v1alpha1.ApprovalRequest
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, &a); err != nil {
		t.Fatal(err)
	}
	if a.Spec.Quorum == nil || *a.Spec.Quorum != 1 || a.Spec.OnTimeout != "deny" {
		t.Errorf("ApprovalRequest defaults: %+v", a.Spec)
	}
}

// toolManifest is a valid ToolManifest with spec fields replaced or added by extra (YAML
// flow-mapping entries).
func toolManifest(name, extra string) string {
	return `{apiVersion: reversi.dev/v1alpha1, kind: ToolManifest, metadata: {name: ` + name + `}, spec: {tool: notes.write, effect: idempotent, permission: "notes:write"` + extra + `}}`
}

func registry(name, spec string) string {
	return `{apiVersion: reversi.dev/v1alpha1, kind: ManifestRegistry, metadata: {name: ` + name + `}, spec: ` + spec + `}`
}

// gateway is a ReversiGateway with one upstream (a YAML flow mapping).
func gateway(name, upstream string) string {
	return `{apiVersion: reversi.dev/v1alpha1, kind: ReversiGateway, metadata: {name: ` + name + `}, spec: {upstreams: [` + upstream + `]}}`
}

// notifying is a ReversiGateway with these spec.notifications entries.
func notifying(name, receivers string) string {
	return `{apiVersion: reversi.dev/v1alpha1, kind: ReversiGateway, metadata: {name: ` + name + `}, spec: {upstreams: [{name: a, command: a-mcp}], notifications: [` + receivers + `]}}`
}

const digest = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// The API server refuses what the schemas forbid, each time with a message that says what is
// wrong. (Objects that should be accepted are in the same table, so a rule that is too wide
// shows up too.)
func TestSchemaRefusals(t *testing.T) {
	cp := env(t)
	ns := namespace(t, "refusals")
	cases := []struct {
		name, doc string
		want      string // "" when the object must be accepted
	}{
		// ToolManifest: structural schema, no unknown fields.
		{"unknown spec field", toolManifest("tm1", `, colour: red`), `unknown field "spec.colour"`},
		{"unknown nested field", toolManifest("tm2", `, risk: {size: xl}`), `unknown field "spec.risk.size"`},
		{"camelCase name of a manifest field", toolManifest("tm3", `, timeoutMs: 100`), `unknown field "spec.timeoutMs"`},
		{"missing permission", `{apiVersion: reversi.dev/v1alpha1, kind: ToolManifest, metadata: {name: tm4}, spec: {tool: a, effect: read_only}}`, `spec.permission: Required value`},
		{"unknown effect", toolManifest("tm5", `, effect: destructive`), `Unsupported value: "destructive"`},
		{"permission with whitespace", toolManifest("tm6", `, permission: "notes write"`), `spec.permission: Invalid value`},
		{"tool name with a space", toolManifest("tm7", `, tool: "notes write"`), `spec.tool: Invalid value`},
		{"reversible without compensation", toolManifest("tm8", `, effect: reversible`), `compensation is required for reversible and compensable tools`},
		{"read_only with compensation", toolManifest("tm9", `, effect: read_only, compensation: {tool: notes.restore}`), `compensation is only allowed for reversible and compensable tools`},
		{"retry on a compensable tool", toolManifest("tm10", `, effect: compensable, compensation: {tool: notes.restore}, retry: {attempts: 2}`), `only read_only and idempotent tools may retry`},
		{"self compensation", toolManifest("tm11", `, effect: reversible, compensation: {tool: notes.write}`), `a tool cannot compensate itself`},
		{"inverse with residue", toolManifest("tm12", `, effect: reversible, compensation: {tool: notes.restore, kind: inverse, residue: [a log line]}`), `kind: inverse restores the exact prior state`},
		{"replacement without deprecation", toolManifest("tm13", `, replaced_by: notes.write2`), `only a deprecated tool names a replacement`},
		{"bad reference", toolManifest("tm14", `, effect: reversible, compensation: {tool: notes.restore, argument_map: {id: "$input.id"}}`), `spec.compensation.argument_map.id: Invalid value`},
		{"empty expect", toolManifest("tm15", `, effect: reversible, compensation: {tool: notes.restore, verification: {tool: notes.read, expect: {}}}`), `spec.compensation.verification.expect: Invalid value`},
		{"idempotency key without a placeholder", toolManifest("tm16", `, idempotency: {key: constant}`), `spec.idempotency.key: Invalid value`},
		{"duration zero", toolManifest("tm17", `, timeout_ms: 0`), `a duration in milliseconds is between 1 and 31536000000`},
		{"duration 0s", toolManifest("tm18", `, timeout_ms: 0.0s`), `spec.timeout_ms: Invalid value: "0.0s"`},
		{"duration beyond 365 days", toolManifest("tm19", `, retry: {max_ms: 31536000001}`), `spec.retry.max_ms: Invalid value`},
		{"negative duration", toolManifest("tm19b", `, effect: reversible, compensation: {tool: notes.restore, verification: {tool: notes.read, expect: {ok: true}, backoff_ms: -5}}`), `a duration in milliseconds is between 1 and 31536000000`},
		{"duration without a unit", toolManifest("tm20", `, timeout_ms: "30"`), `spec.timeout_ms: Invalid value`},
		{"duration of another type", toolManifest("tm21", `, timeout_ms: true`), `spec.timeout_ms: Invalid value`},
		{"fractional duration", toolManifest("tm22", `, timeout_ms: 1.5`), `spec.timeout_ms: Invalid value`},
		{"quorum above 10", toolManifest("tm23", `, approval: {roles: [ops], quorum: 11}`), `spec.approval.quorum: Invalid value`},
		{"approval rule of the wrong type", toolManifest("tm24", `, approval: {roles: ops}`), `spec.approval.roles: Invalid value`},
		{"requires entry with a bad name", toolManifest("tm25", `, requires: [{tool: "bad name"}]`), `spec.requires[0].tool: Invalid value`},
		{"requires entry with another status", toolManifest("tm26", `, requires: [{tool: a, status: failed}]`), `Unsupported value: "failed"`},
		{"every union form", toolManifest("tm27", `, approval: always, requires: [notes.read, {tool: notes.list, status: succeeded}], retry: {base_ms: 200, max_ms: 5s}`), ``},
		{"approval object form", toolManifest("tm28", `, approval: {roles: [ops], quorum: 2, timeout: 15m, on_timeout: escalate, escalate_to: [cto]}`), ``},
		{"duration beyond int32", toolManifest("tm29", `, timeout_ms: 2592000000`), ``},

		// ManifestRegistry.
		{"two refs", registry("r1", `{url: "file:///srv/m", format: Plain, ref: {branch: main, tag: v1.0.0}}`), `set exactly one of ref.branch, ref.tag, ref.semver or ref.commit`},
		{"empty ref", registry("r2", `{url: "file:///srv/m", format: Plain, ref: {}}`), `set exactly one of ref.branch, ref.tag, ref.semver or ref.commit`},
		{"short commit", registry("r3", `{url: "file:///srv/m", format: Plain, ref: {commit: abc123}}`), `spec.ref.commit: Invalid value`},
		{"registry format without keys", registry("r4", `{url: "file:///srv/m"}`), `format Registry needs verify.manifestKeysSecretRef`},
		{"tag verification on a branch", registry("r5", `{url: "file:///srv/m", format: Plain, verify: {commit: {mode: Tag, secretRef: {name: k}}}}`), `verify.commit.mode Tag and TagAndHEAD need ref.tag or ref.semver`},
		{"ftp url", registry("r6", `{url: "ftp://git.example.com/m.git", format: Plain}`), `spec.url: Invalid value`},
		{"http url to a remote host", registry("r7", `{url: "http://git.example.com/m.git", format: Plain}`), `spec.url: Invalid value`},
		{"path escaping the repository", registry("r8", `{url: "file:///srv/m", format: Plain, path: "manifests/../../etc"}`), `path must be relative to the repository root`},
		{"zero interval", registry("r9", `{url: "file:///srv/m", format: Plain, interval: 0s}`), `interval must be positive`},
		{"unknown format", registry("r10", `{url: "file:///srv/m", format: Zip}`), `Unsupported value: "Zip"`},
		{"scp-like ssh url", registry("r11", `{url: "git@git.example.com:platform/m.git", format: Plain, ref: {semver: ">=1.0.0"}, verify: {commit: {mode: TagAndHEAD, secretRef: {name: k}}}}`), ``},
		{"neither url nor sourceRef", registry("r13", `{format: Plain}`), `set exactly one of url (the controller fetches the git repository) and sourceRef`},
		{"url and sourceRef", registry("r14", `{url: "file:///srv/m", format: Plain, sourceRef: {kind: GitRepository, name: m}}`), `set exactly one of url`},
		{"sourceRef with a ref", registry("r15", `{sourceRef: {kind: GitRepository, name: m}, format: Plain, ref: {branch: main}}`), `ref and secretRef are set on the Flux source`},
		{"sourceRef with git credentials", registry("r16", `{sourceRef: {kind: GitRepository, name: m}, format: Plain, secretRef: {name: git}}`), `ref and secretRef are set on the Flux source`},
		{"sourceRef with mode Chain", registry("r17", `{sourceRef: {kind: GitRepository, name: m}, format: Plain, verify: {commit: {mode: Chain, secretRef: {name: k}}}}`), `verify.commit.mode Chain needs the git history`},
		{"a Bucket with commit verification", registry("r18", `{sourceRef: {kind: Bucket, name: m}, format: Plain, verify: {commit: {secretRef: {name: k}}}}`), `verify.commit cannot be checked for a Bucket`},
		{"sourceRef of another kind", registry("r19", `{sourceRef: {kind: HelmRepository, name: m}, format: Plain}`), `Unsupported value: "HelmRepository"`},
		{"sourceRef with tag verification", registry("r20", `{sourceRef: {kind: GitRepository, name: m, namespace: flux-system}, format: Plain, verify: {commit: {mode: TagAndHEAD, secretRef: {name: k}}}}`), ``},
		{"http url on loopback", registry("r12", `{url: "http://127.0.0.1:8080/m.git", format: Plain, ref: {commit: 0123456789abcdef0123456789abcdef01234567}}`), ``},

		// The other kinds.
		{"approval decision", `{apiVersion: reversi.dev/v1alpha1, kind: Approval, metadata: {name: a1}, spec: {requestRef: {name: r}, decision: Maybe}}`, `Unsupported value: "Maybe"`},
		{"approval without request", `{apiVersion: reversi.dev/v1alpha1, kind: Approval, metadata: {name: a2}, spec: {decision: Approve}}`, `spec.requestRef: Required value`},
		{"escalation without roles", `{apiVersion: reversi.dev/v1alpha1, kind: ApprovalRequest, metadata: {name: q1}, spec: {tool: t, argumentsDigest: "` + digest + `", run: r, actor: x, gateway: g, onTimeout: escalate}}`, `onTimeout escalate needs escalateTo`},
		{"quorum without roles", `{apiVersion: reversi.dev/v1alpha1, kind: ApprovalRequest, metadata: {name: q2}, spec: {tool: t, argumentsDigest: "` + digest + `", run: r, actor: x, gateway: g, quorum: 2}}`, `a quorum above 1 needs roles`},
		{"bad arguments digest", `{apiVersion: reversi.dev/v1alpha1, kind: ApprovalRequest, metadata: {name: q3}, spec: {tool: t, argumentsDigest: "md5:abc", run: r, actor: x, gateway: g}}`, `spec.argumentsDigest: Invalid value`},
		{"upstream with url and command", `{apiVersion: reversi.dev/v1alpha1, kind: ReversiGateway, metadata: {name: g1}, spec: {upstreams: [{name: a, url: "https://mcp.example.com/mcp", command: a-mcp}]}}`, `url, command and container exclude each other: keep one of them per upstream`},
		// Issue 23: container upstreams.
		{"upstream with neither url, command nor container", gateway("c1", `{name: a}`), `set one of url (a Streamable HTTP server), command (a stdio server the gateway image carries) or container (a stdio server image, run as a sidecar of the gateway pod)`},
		{"upstream with command and container", gateway("c2", `{name: a, command: a-mcp, container: {image: "mcp/a:1", command: [a-mcp]}}`), `url, command and container exclude each other: keep one of them per upstream`},
		{"upstream with url and container", gateway("c3", `{name: a, url: "https://mcp.example.com/mcp", container: {image: "mcp/a:1", command: [a-mcp]}}`), `url, command and container exclude each other: keep one of them per upstream`},
		{"container upstream", gateway("c4", `{name: memory, session: PerClient, container: {image: "mcp/memory:1", command: [node, /app/dist/index.js], args: [--x], workingDir: /app,
			env: [{name: A, value: "1"}, {name: T, valueFrom: {secretKeyRef: {name: s, key: t}}}, {name: L, valueFrom: {configMapKeyRef: {name: c, key: l}}}],
			resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {memory: 256Mi}}, securityContext: {runAsUser: 1000, runAsGroup: 1000, readOnlyRootFilesystem: false},
			volumes: [{name: data, mountPath: /data, emptyDir: {sizeLimit: 128Mi}}, {name: conf, mountPath: /etc/mem, configMap: {name: c}}, {name: creds, mountPath: /etc/creds, secret: {name: s}}]}}`), ``},
		{"container without command", gateway("c5", `{name: a, container: {image: "mcp/a:1"}}`), `spec.upstreams[0].container.command: Required value`},
		{"container upstream name with _", gateway("c6", `{name: my_mem, container: {image: "mcp/a:1", command: [a]}}`), `a container upstream's name names its sidecar (upstream-<name>)`},
		{"container env from the downward API", gateway("c7", `{name: a, container: {image: "mcp/a:1", command: [a], env: [{name: P, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]}}`), `unknown field "spec.upstreams[0].container.env[0].valueFrom.fieldRef"`},
		{"container env value and valueFrom", gateway("c8", `{name: a, container: {image: "mcp/a:1", command: [a], env: [{name: P, value: x, valueFrom: {secretKeyRef: {name: s, key: k}}}]}}`), `value and valueFrom exclude each other`},
		{"container env from both", gateway("c9", `{name: a, container: {image: "mcp/a:1", command: [a], env: [{name: P, valueFrom: {secretKeyRef: {name: s, key: k}, configMapKeyRef: {name: c, key: k}}}]}}`), `set exactly one of secretKeyRef or configMapKeyRef`},
		{"container privileged", gateway("c10", `{name: a, container: {image: "mcp/a:1", command: [a], securityContext: {privileged: true}}}`), `unknown field "spec.upstreams[0].container.securityContext.privileged"`},
		{"container as root", gateway("c11", `{name: a, container: {image: "mcp/a:1", command: [a], securityContext: {runAsUser: 0}}}`), `spec.upstreams[0].container.securityContext.runAsUser: Invalid value`},
		{"container volume on the socket", gateway("c12", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: /run/reversi, emptyDir: {}}]}}`), `/tmp, /run/reversi and /reversi-bin are the sidecar's own`},
		{"container volume on /tmp", gateway("c13", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: /tmp, emptyDir: {}}]}}`), `/tmp, /run/reversi and /reversi-bin are the sidecar's own`},
		{"container volume escaping", gateway("c14", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: /data/../reversi-bin, emptyDir: {}}]}}`), `mountPath has no empty, . or .. segments`},
		// A doubled slash is the same path to the runtime: it must not slip past the rules on
		// the sidecar's own folders (shadowing the socket folder or the bridge).
		{"container volume at //tmp", gateway("c14b", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: //tmp, emptyDir: {}}]}}`), `mountPath has no empty, . or .. segments`},
		{"container volume at /run//reversi", gateway("c14c", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: /run//reversi, emptyDir: {}}]}}`), `mountPath has no empty, . or .. segments`},
		{"container volume at //reversi-bin", gateway("c14d", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: //reversi-bin, configMap: {name: c}}]}}`), `mountPath has no empty, . or .. segments`},
		{"container volume of two kinds", gateway("c16", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: /data, emptyDir: {}, secret: {name: s}}]}}`), `set exactly one of emptyDir, configMap or secret`},
		{"container volume hostPath", gateway("c17", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: /data, hostPath: {path: /}}]}}`), `unknown field "spec.upstreams[0].container.volumes[0].hostPath"`},
		{"container volumes on one path", gateway("c18", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: v, mountPath: /data, emptyDir: {}}, {name: w, mountPath: /data, emptyDir: {}}]}}`), `two volumes have the same mountPath`},
		{"container volume named tmp", gateway("c19", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: tmp, mountPath: /scratch, emptyDir: {}}]}}`), `tmp and run are the sidecar's own /tmp and socket folder volumes`},
		{"container volume named run", gateway("c19b", `{name: a, container: {image: "mcp/a:1", command: [a], volumes: [{name: run, mountPath: /scratch, emptyDir: {}}]}}`), `tmp and run are the sidecar's own /tmp and socket folder volumes`},
		{"container gpu", gateway("c20", `{name: a, container: {image: "mcp/a:1", command: [a], resources: {limits: {nvidia.com/gpu: 1}}}}`), `requests and limits name cpu, memory or ephemeral-storage`},
		{"container env for a url upstream", gateway("c21", `{name: a, url: "https://mcp.example.com/mcp", env: [{name: A, value: b}]}`), `args and env are for command upstreams`},
		// Issue 24: notification receivers, URLs and keys from Secrets only.
		{"notification receivers", notifying("n1", `{name: hook, type: Webhook, urlSecretRef: {name: hooks, key: url}, secretRef: {name: hmac, key: k}, events: [approval.requested, approval.denied], tools: ["payments.*"], risk: [high, critical]},
			{name: chat, type: Slack, urlSecretRef: {name: hooks, key: slack}}`), ``},
		{"slack with an HMAC key", notifying("n2", `{name: chat, type: Slack, urlSecretRef: {name: hooks, key: slack}, secretRef: {name: hmac, key: k}}`), `secretRef (the HMAC key of X-Reversi-Signature) is for Webhook receivers`},
		{"notification url written literally", notifying("n3", `{name: hook, type: Webhook, url: "https://hooks.example.com/x", urlSecretRef: {name: hooks, key: url}}`), `unknown field "spec.notifications[0].url"`},
		{"notification without url", notifying("n4", `{name: hook, type: Webhook}`), `spec.notifications[0].urlSecretRef: Required value`},
		{"notification of another type", notifying("n5", `{name: hook, type: Email, urlSecretRef: {name: hooks, key: url}}`), `Unsupported value: "Email"`},
		{"notification of an unknown event", notifying("n6", `{name: hook, type: Webhook, urlSecretRef: {name: hooks, key: url}, events: [approval.requested, run.started]}`), `Unsupported value: "run.started"`},
		{"notification of an unknown risk", notifying("n7", `{name: hook, type: Webhook, urlSecretRef: {name: hooks, key: url}, risk: [severe]}`), `Unsupported value: "severe"`},
		{"notification name with a dot", notifying("n8", `{name: hook.a, type: Webhook, urlSecretRef: {name: hooks, key: url}}`), `spec.notifications[0].name: Invalid value`},
		{"two receivers of one name", notifying("n9", `{name: hook, type: Webhook, urlSecretRef: {name: hooks, key: url}}, {name: hook, type: Slack, urlSecretRef: {name: hooks, key: slack}}`), `spec.notifications[1]: Duplicate value`},
		{"sqlite with two replicas", `{apiVersion: reversi.dev/v1alpha1, kind: ReversiGateway, metadata: {name: g2}, spec: {replicas: 2, upstreams: [{name: a, command: a-mcp}]}}`, `the sqlite store holds one replica's ledger`},
		{"postgres without its secret", `{apiVersion: reversi.dev/v1alpha1, kind: ReversiGateway, metadata: {name: g3}, spec: {replicas: 2, store: {type: postgres}, upstreams: [{name: a, command: a-mcp}]}}`, `store.type postgres needs store.postgres.urlSecretRef`},
		{"no upstream", `{apiVersion: reversi.dev/v1alpha1, kind: ReversiGateway, metadata: {name: g4}, spec: {upstreams: []}}`, `spec.upstreams: Invalid value`},
		{"run with an unknown field", `{apiVersion: reversi.dev/v1alpha1, kind: ReversiRun, metadata: {name: run1}, spec: {actor: a, gateway: g, colour: red}}`, `unknown field "spec.colour"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := object(t, c.doc)
			u.SetNamespace(ns)
			err := cp.Client.Create(t.Context(), u, strict)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.want != "" && err == nil:
				t.Errorf("accepted, want a refusal with %q", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Errorf("refused with\n%v\nwant a message with %q", err, c.want)
			}
		})
	}
}

// Immutable specs stay as they were: an ApprovalRequest and an Approval cannot be edited, a
// run's actor and gateway cannot change and a confirmed rollback cannot be withdrawn; status
// can still be written through the status subresource.
func TestImmutability(t *testing.T) {
	cp := env(t)
	ctx := t.Context()
	ns := namespace(t, "immutable")
	create := func(doc string) *unstructured.Unstructured {
		u := object(t, doc)
		u.SetNamespace(ns)
		if err := cp.Client.Create(ctx, u, strict); err != nil {
			t.Fatalf("creating %s: %v", doc, err)
		}
		return u
	}
	refused := func(what string, u *unstructured.Unstructured, want string) {
		t.Helper()
		err := cp.Client.Update(ctx, u, strict)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: update gave %v, want a refusal with %q", what, err, want)
		}
	}

	apr := create(`{apiVersion: reversi.dev/v1alpha1, kind: Approval, metadata: {name: alice}, spec: {requestRef: {name: req}, decision: Approve, reason: ticket FIN-12}}`)
	edited := apr.DeepCopy()
	_ = unstructured.SetNestedField(edited.Object, "Deny", "spec", "decision")
	refused("Approval decision", edited, "spec is immutable")
	edited = apr.DeepCopy()
	_ = unstructured.SetNestedField(edited.Object, map[string]any{"username": "mallory"}, "spec", "approver")
	refused("Approval approver", edited, "spec is immutable")
	// Labels and status still change.
	apr.SetLabels(map[string]string{"team": "finance"})
	if err := cp.Client.Update(ctx, apr, strict); err != nil {
		t.Errorf("updating an Approval's labels: %v", err)
	}
	var typed v1alpha1.Approval
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(apr), &typed); err != nil {
		t.Fatal(err)
	}
	typed.Status.Result = v1alpha1.ResultRejected
	typed.Status.Message = "alice is not in the request's roles"
	if err := cp.Client.Status().Update(ctx, &typed); err != nil {
		t.Errorf("updating an Approval's status: %v", err)
	}

	req := create(`{apiVersion: reversi.dev/v1alpha1, kind: ApprovalRequest, metadata: {name: req}, spec: {tool: t, argumentsDigest: "` + digest + `", run: r, actor: x, gateway: g}}`)
	_ = unstructured.SetNestedField(req.Object, int64(3), "spec", "quorum")
	_ = unstructured.SetNestedStringSlice(req.Object, []string{"ops"}, "spec", "roles")
	refused("ApprovalRequest quorum", req, "spec is immutable")

	run := create(`{apiVersion: reversi.dev/v1alpha1, kind: ReversiRun, metadata: {name: run}, spec: {actor: agent-7, gateway: g}}`)
	changed := run.DeepCopy()
	_ = unstructured.SetNestedField(changed.Object, "agent-8", "spec", "actor")
	refused("ReversiRun actor", changed, "actor is immutable")
	_ = unstructured.SetNestedMap(run.Object, map[string]any{"confirm": true}, "spec", "rollback")
	if err := cp.Client.Update(ctx, run, strict); err != nil {
		t.Fatalf("confirming a rollback: %v", err)
	}
	unstructured.RemoveNestedField(run.Object, "spec", "rollback")
	refused("withdrawn rollback", run, "a confirmed rollback cannot be withdrawn")
}

// The unions approval and requires[] cannot be typed exactly by a CRD schema (a string or an
// object), so the API server keeps a value of another shape; the controller's validator, which
// reads ManifestObject, refuses it. Together they refuse everything the format refuses.
func TestUnionValuesReachTheValidator(t *testing.T) {
	cp := env(t)
	ctx := t.Context()
	ns := namespace(t, "unions")
	cases := map[string]struct{ extra, want string }{
		"approval word":               {`, approval: sometimes`, `approval: must be never, always or an object, found string "sometimes"`},
		"approval unknown field":      {`, approval: {rolez: [ops]}`, `approval.rolez: unknown field`},
		"approval list":               {`, approval: [always]`, `approval: must be never, always or an object, found a list`},
		"requires number":             {`, requires: [7]`, `requires[0]: must be a tool name or {tool, status: succeeded}, found number 7`},
		"requires unknown field":      {`, requires: [{tool: notes.read, when: always}]`, `requires[0].when: unknown field`},
		"quorum without roles":        {`, approval: {quorum: 2}`, `approval.quorum: a quorum above 1 needs roles`},
		"irreversible never":          {`, effect: irreversible, approval: never`, `an irreversible tool cannot set approval: never`},
		"requires itself":             {`, requires: [notes.write]`, `requires[0]: a tool cannot require itself`},
		"fractional milliseconds":     {`, timeout_ms: 1.5ms`, `must be a whole number of milliseconds`},
		"duration beyond 365 days":    {`, timeout_ms: 366d`, `longer than 365 days`},
		"placeholder other than args": {`, idempotency: {key: "k-{{args.id}}-{{result.id}}"}`, `placeholder {{result.id}} is not an argument`},
	}
	i := 0
	for name, c := range cases {
		i++
		t.Run(name, func(t *testing.T) {
			u := object(t, toolManifest(fmt.Sprintf("u%d", i), c.extra))
			u.SetNamespace(ns)
			if err := cp.Client.Create(ctx, u, strict); err != nil {
				t.Fatalf("the API server refused it (fine, but then this case belongs in TestSchemaRefusals): %v", err)
			}
			var tm v1alpha1.ToolManifest
			if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(u), &tm); err != nil {
				t.Fatalf("reading it back into the Go type: %v", err)
			}
			raw, err := tm.ManifestObject()
			if err != nil {
				t.Fatal(err)
			}
			_, errs := manifest.Validate(raw)
			var msgs []string
			for _, e := range errs {
				msgs = append(msgs, e.Error())
			}
			if !strings.Contains(strings.Join(msgs, "\n"), c.want) {
				t.Errorf("the validator says %q, want %q", msgs, c.want)
			}
		})
	}
}

// A new ManifestRegistry, ToolManifest or ReversiGateway reads as InProgress under kstatus (the
// fluxcd/cli-utils version kustomize-controller's health checks use) until its controller has
// reported on it: the API server serves it with status.observedGeneration 0. Without that
// default an object no controller has looked at has no status, which kstatus reads as Current,
// and a Kustomization with wait: true would pass over an unchecked object.
func TestNewObjectsAreInProgressForKstatus(t *testing.T) {
	cp := env(t)
	ctx := t.Context()
	ns := namespace(t, "kstatus")
	for _, doc := range []string{
		`{apiVersion: reversi.dev/v1alpha1, kind: ManifestRegistry, metadata: {name: r}, spec: {url: "file:///srv/manifests", format: Plain}}`,
		`{apiVersion: reversi.dev/v1alpha1, kind: ReversiGateway, metadata: {name: g}, spec: {upstreams: [{name: fs, command: fs-mcp}]}}`,
		`{apiVersion: reversi.dev/v1alpha1, kind: ToolManifest, metadata: {name: notes-read}, spec: {tool: notes.read, description: Read notes., effect: read_only, permission: notes:read}}`,
	} {
		u := object(t, doc)
		u.SetNamespace(ns)
		if err := cp.Client.Create(ctx, u, strict); err != nil {
			t.Fatalf("creating %s: %v", doc, err)
		}
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(u.GroupVersionKind())
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(u), got); err != nil {
			t.Fatal(err)
		}
		res, err := kstatus.Compute(got)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != kstatus.InProgressStatus {
			t.Errorf("a new %s reads %s under kstatus (%s), want InProgress: status %v", u.GetKind(), res.Status, res.Message, got.Object["status"])
		}
	}
}

// Every reversi.dev object the README shows in a yaml block is accepted by the API server
// (strict field validation, a server-side dry run): the README's examples cannot drift from
// the CRDs.
func TestReadmeObjectsAreAccepted(t *testing.T) {
	cp := env(t)
	ns := namespace(t, "readme")
	b, err := os.ReadFile(filepath.Join(testenv.Root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(b), "```yaml\n")
	n := 0
	for _, blk := range blocks[1:] {
		body, _, _ := strings.Cut(blk, "```")
		if !strings.Contains(body, "apiVersion: reversi.dev/") {
			continue
		}
		u := object(t, body)
		u.SetNamespace(ns)
		if err := cp.Client.Create(t.Context(), u, strict, client.DryRunAll); err != nil {
			t.Errorf("the README's %s %s is refused: %v\n%s", u.GetKind(), u.GetName(), err, body)
		}
		n++
	}
	if n < 1 {
		t.Fatalf("found %d reversi.dev objects in the README's yaml blocks, want at least the ReversiGateway of a stdio server", n)
	}
}
