package redteam

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/pkg/bundle"
)

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func (w *world) configMap(t testing.TB, name string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name}, cm))
	return cm
}

func (w *world) registry(t testing.TB, name string) *v1alpha1.ManifestRegistry {
	t.Helper()
	r := &v1alpha1.ManifestRegistry{}
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name}, r))
	return r
}

func (w *world) reversiGateway(t testing.TB, name string) *v1alpha1.ReversiGateway {
	t.Helper()
	g := &v1alpha1.ReversiGateway{}
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name}, g))
	return g
}

// registryStatus is a field of a ManifestRegistry's status that the Go type may not have yet
// (status.acceptedRevision), read through an unstructured object.
func (w *world) registryStatus(t testing.TB, name, field string) string {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("ManifestRegistry"))
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name}, u))
	v, _, _ := unstructured.NestedString(u.Object, "status", field)
	return v
}

func conditionText(cs []metav1.Condition) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%s (%s): %s", c.Type, c.Status, c.Reason, c.Message))
	}
	if len(parts) == 0 {
		return "no conditions"
	}
	return strings.Join(parts, "; ")
}

func ready(r *v1alpha1.ManifestRegistry) metav1.Condition {
	if c := apimeta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		return *c
	}
	return metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionUnknown, Reason: "None"}
}

// annotate sets annotations on a ManifestRegistry (nil values remove them) with a merge patch.
func (w *world) annotate(t testing.TB, obj client.Object, annotations map[string]any) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	must(t, err)
	must(t, w.k8s.Patch(w.ctx, obj, client.RawPatch(types.MergePatchType, patch)))
}

// reconcile asks for a reconcile of the registry now (reversi.dev/requestedAt) and returns the
// token to wait for.
func (w *world) reconcile(t testing.TB, name string) string {
	t.Helper()
	token := time.Now().UTC().Format(time.RFC3339Nano)
	w.annotate(t, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		map[string]any{v1alpha1.AnnotationRequestedAt: token})
	return token
}

// reconciled waits until the registry has handled the reconcile request token for its
// current generation, and returns it.
func (w *world) reconciled(t testing.TB, name, token string, timeout time.Duration) *v1alpha1.ManifestRegistry {
	t.Helper()
	var r *v1alpha1.ManifestRegistry
	if err := podrun.Poll(w.ctx, timeout, func() string {
		r = w.registry(t, name)
		if r.Status.LastHandledReconcileAt != token || r.Status.ObservedGeneration != r.Generation {
			return fmt.Sprintf("ManifestRegistry %s has not handled request %s of generation %d (handled %q of %d): %s",
				name, token, r.Generation, r.Status.LastHandledReconcileAt, r.Status.ObservedGeneration, conditionText(r.Status.Conditions))
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitReady waits for Ready=True of the registry's current generation.
func (w *world) waitReady(t testing.TB, name string, timeout time.Duration) *v1alpha1.ManifestRegistry {
	t.Helper()
	var r *v1alpha1.ManifestRegistry
	if err := podrun.Poll(w.ctx, timeout, func() string {
		r = w.registry(t, name)
		if c := ready(r); c.Status != metav1.ConditionTrue || r.Status.ObservedGeneration != r.Generation {
			return fmt.Sprintf("ManifestRegistry %s is not Ready: %s", name, conditionText(r.Status.Conditions))
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

// wantNotReady checks that Ready is False with reason, and that the message contains each of
// contains.
func wantNotReady(t testing.TB, r *v1alpha1.ManifestRegistry, reason string, contains ...string) bool {
	t.Helper()
	c := ready(r)
	ok := c.Status == metav1.ConditionFalse && c.Reason == reason
	for _, s := range contains {
		ok = ok && strings.Contains(c.Message, s)
	}
	if !ok {
		want := "Ready=False reason " + reason
		if len(contains) > 0 {
			want += fmt.Sprintf(" naming %q", contains)
		}
		t.Errorf("ManifestRegistry %s: Ready=%s reason %s: %q; want %s (status.artifact.revision %s)",
			r.Name, c.Status, c.Reason, c.Message, want, artifactRevision(r))
	}
	return ok
}

func artifactRevision(r *v1alpha1.ManifestRegistry) string {
	if r.Status.Artifact == nil {
		return ""
	}
	return r.Status.Artifact.Revision
}

// event is an events.k8s.io/v1 Event about one object.
type event struct {
	Type, Reason, Note string
	When               time.Time
}

// events lists the Events regarding kind/name that were last seen at or after since.
func (w *world) events(t testing.TB, kind, name string, since time.Time) []event {
	t.Helper()
	var list eventsv1.EventList
	must(t, w.k8s.List(w.ctx, &list, client.InNamespace(ns)))
	var out []event
	for _, e := range list.Items {
		if e.Regarding.Kind != kind || e.Regarding.Name != name {
			continue
		}
		when := e.EventTime.Time
		if e.Series != nil && e.Series.LastObservedTime.After(when) {
			when = e.Series.LastObservedTime.Time
		}
		if when.IsZero() {
			when = e.CreationTimestamp.Time
		}
		if when.Before(since.Add(-time.Second)) {
			continue
		}
		out = append(out, event{Type: e.Type, Reason: e.Reason, Note: e.Note, When: when})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].When.Before(out[j].When) })
	return out
}

// findEvent returns the first Event regarding kind/name since since with the type (any when
// ""), reason, and a note containing each of contains.
func (w *world) findEvent(t testing.TB, kind, name string, since time.Time, typ, reason string, contains ...string) (event, bool) {
	t.Helper()
next:
	for _, e := range w.events(t, kind, name, since) {
		if e.Reason != reason || (typ != "" && e.Type != typ) {
			continue
		}
		for _, s := range contains {
			if !strings.Contains(e.Note, s) {
				continue next
			}
		}
		return e, true
	}
	return event{}, false
}

func eventsText(es []event) string {
	if len(es) == 0 {
		return "none"
	}
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "\n    %s %s: %s", e.Type, e.Reason, oneLine(e.Note))
	}
	return b.String()
}

// wantEvent waits (deadline) for an Event and reports its absence as an error.
func (w *world) wantEvent(t testing.TB, kind, name string, since time.Time, typ, reason string, contains ...string) {
	t.Helper()
	err := podrun.Poll(w.ctx, 10*time.Second, func() string {
		if _, ok := w.findEvent(t, kind, name, since, typ, reason, contains...); !ok {
			return "no event"
		}
		return ""
	})
	if err != nil {
		what := reason
		if typ != "" {
			what = typ + " " + reason
		}
		t.Errorf("no event %s regarding %s %s naming %q; the events since the attack: %s",
			what, kind, name, contains, eventsText(w.events(t, kind, name, since)))
	}
}

// patchLeaseAnnotations merge-patches the annotations of the Lease a gateway pod reports on
// (named as the pod; issue 17), as the admin.
func (w *world) patchLeaseAnnotations(t testing.TB, pod string, annotations map[string]any) {
	t.Helper()
	w.annotate(t, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}, annotations)
}

// leaseAnnotation is an annotation of the Lease the gateway's pod reports on ("" when the
// Lease or the annotation is missing).
func (g *gateway) leaseAnnotation(t testing.TB, key string) string {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := g.w.k8s.Get(g.w.ctx, types.NamespacedName{Namespace: ns, Name: g.pod.Name}, l); err != nil {
		if apierrors.IsNotFound(err) {
			return ""
		}
		t.Fatal(err)
	}
	return l.Annotations[key]
}

// call makes one tool call as the agent.
func (g *gateway) call(t testing.TB, tool string, args map[string]any) (string, bool) {
	t.Helper()
	text, isErr, err := podrun.CallTool(g.w.ctx, g.agent, tool, args)
	if err != nil {
		t.Fatalf("gateway %s: %v", g.name, err)
	}
	return text, isErr
}

var requestID = regexp.MustCompile(`request (apr-[0-9a-z-]+) is waiting`)

// requireHeld checks that the call is held for approval: blocked with the approval reason,
// and the ApprovalRequest it names exists for the tool.
func (g *gateway) requireHeld(t testing.TB, tool string, args map[string]any) bool {
	t.Helper()
	text, isErr := g.call(t, tool, args)
	m := requestID.FindStringSubmatch(text)
	if !isErr || !strings.HasPrefix(text, "Blocked by Reversi") || !strings.Contains(text, "requires approval") || m == nil {
		t.Errorf("%s is not held for approval (the last good rules are not served): error=%v %q", tool, isErr, oneLine(text))
		return false
	}
	ar := &v1alpha1.ApprovalRequest{}
	if err := g.w.k8s.Get(g.w.ctx, types.NamespacedName{Namespace: ns, Name: m[1]}, ar); err != nil || ar.Spec.Tool != tool {
		t.Errorf("the held call names ApprovalRequest %s: %v (tool %q)", m[1], err, ar.Spec.Tool)
		return false
	}
	return true
}

// requireBlocked checks that the call is blocked with a reason containing why.
func (g *gateway) requireBlocked(t testing.TB, tool string, args map[string]any, why string) bool {
	t.Helper()
	text, isErr := g.call(t, tool, args)
	if !isErr || !strings.HasPrefix(text, "Blocked by Reversi") || !strings.Contains(text, why) {
		t.Errorf("%s is not blocked (%q): error=%v %q", tool, why, isErr, oneLine(text))
		return false
	}
	return true
}

// requireAllowed checks that the call passes.
func (g *gateway) requireAllowed(t testing.TB, tool string, args map[string]any) bool {
	t.Helper()
	if text, isErr := g.call(t, tool, args); isErr {
		t.Errorf("%s was refused: %q", tool, oneLine(text))
		return false
	}
	return true
}

// settled waits until the gateway serves what its one registry renders: the registry's
// rendering, the gateway's and the digest its pod reports (on its Lease) are the same set.
func (g *gateway) settled(t testing.TB, registry string) error {
	t.Helper()
	return podrun.Poll(g.w.ctx, 30*time.Second, func() string {
		reg := g.w.configMap(t, registry+"-manifests").Data[bundle.KeyDigest]
		gw := g.w.configMap(t, g.name+"-manifests").Data[bundle.KeyDigest]
		pod := g.leaseAnnotation(t, v1alpha1.AnnotationManifestDigest)
		if reg != gw || gw != pod {
			return fmt.Sprintf("not settled: registry %s renders %s, gateway %s renders %s, its pod serves %s", registry, reg, g.name, gw, pod)
		}
		return ""
	})
}

func (g *gateway) healthy() string {
	resp, err := http.Get(g.endpoint() + "/healthz")
	if err != nil {
		return err.Error()
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "/healthz: " + resp.Status
	}
	return ""
}

var manifestInfo = regexp.MustCompile(`^reversi_gateway_manifest_info\{(.*)\} 1$`)

// metricsRevision is the revision label of reversi_gateway_manifest_info on /metrics.
func (g *gateway) metricsRevision(t testing.TB) string {
	t.Helper()
	req, err := http.NewRequestWithContext(g.w.ctx, http.MethodGet, g.endpoint()+"/metrics", nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+g.w.auditKey)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		if m := manifestInfo.FindStringSubmatch(sc.Text()); m != nil {
			for _, kv := range strings.Split(m[1], ",") {
				if v, ok := strings.CutPrefix(kv, `revision="`); ok {
					return strings.TrimSuffix(v, `"`)
				}
			}
		}
	}
	return ""
}

// podReports records every manifest digest and revision a pod reports on its Lease while it
// runs.
type podReports struct {
	mu                 sync.Mutex
	digests, revisions []string
	cancel             context.CancelFunc
}

// watchPod starts recording the reports of the pod on its Lease (from its current
// annotations on).
func (w *world) watchPod(t testing.TB, pod string) *podReports {
	t.Helper()
	wc, err := client.NewWithWatch(w.env.Config, client.Options{Scheme: w.env.Scheme})
	must(t, err)
	ctx, cancel := context.WithCancel(w.ctx)
	watcher, err := wc.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": pod})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &podReports{cancel: cancel}
	go func() {
		defer watcher.Stop()
		for ev := range watcher.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			r.mu.Lock()
			r.digests = appendNew(r.digests, l.Annotations[v1alpha1.AnnotationManifestDigest])
			r.revisions = appendNew(r.revisions, l.Annotations[v1alpha1.AnnotationManifestRevision])
			r.mu.Unlock()
		}
	}()
	t.Cleanup(cancel)
	return r
}

func appendNew(list []string, v string) []string {
	if len(list) > 0 && list[len(list)-1] == v {
		return list
	}
	return append(list, v)
}

// seen reports whether the pod reported a digest equal to digest, or a revision containing
// revision (each when not "").
func (r *podReports) seen(digest, revision string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.digests {
		if digest != "" && d == digest {
			return true
		}
	}
	for _, v := range r.revisions {
		if revision != "" && strings.Contains(v, revision) {
			return true
		}
	}
	return false
}

func (r *podReports) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("digests %q, revisions %q", r.digests, r.revisions)
}

// entries are the entries of a one-shard rendering.
func entries(t testing.TB, data map[string]string) []bundle.Entry {
	t.Helper()
	if data[bundle.KeyShards] != "1" {
		t.Fatalf("the rendering has %q shards; the attacks edit one", data[bundle.KeyShards])
	}
	var es []bundle.Entry
	must(t, json.Unmarshal([]byte(data[bundle.KeyManifests]), &es))
	return es
}

func entry(t testing.TB, data map[string]string, tool string) bundle.Entry {
	t.Helper()
	for _, e := range entries(t, data) {
		if e.Tool == tool {
			return e
		}
	}
	t.Fatalf("the rendering has no %s", tool)
	return bundle.Entry{}
}

// withEntries is a copy of a one-shard rendering with other entries and the unsigned digest
// recomputed for them, as an attacker who read the format would write it.
func withEntries(t testing.TB, data map[string]string, es []bundle.Entry) map[string]string {
	t.Helper()
	sort.Slice(es, func(i, j int) bool { return es[i].Tool < es[j].Tool })
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	must(t, enc.Encode(es))
	out := maps.Clone(data)
	out[bundle.KeyManifests] = strings.TrimSuffix(buf.String(), "\n")
	out[bundle.KeyDigest] = bundle.Bundle{Entries: es}.Digest()
	return out
}

// swapped replaces the entry of e.Tool by e.
func swapped(t testing.TB, data map[string]string, e bundle.Entry) map[string]string {
	t.Helper()
	es := entries(t, data)
	for i := range es {
		if es[i].Tool == e.Tool {
			es[i] = e
			return withEntries(t, data, es)
		}
	}
	t.Fatalf("the rendering has no %s to swap", e.Tool)
	return nil
}

// added adds e.
func added(t testing.TB, data map[string]string, e bundle.Entry) map[string]string {
	t.Helper()
	return withEntries(t, data, append(entries(t, data), e))
}
