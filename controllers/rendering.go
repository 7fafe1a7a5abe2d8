package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// FieldManager is the field manager of everything the controller writes: a ConfigMap field
// owned by another manager was changed by someone else.
const FieldManager = "reversi-controller"

// maxAhead is how far past the clock (ms) a recorded sequence may lie and still be counted: a
// larger one was written by someone else (status is not the controller's alone) and would,
// signed and accepted once, make every later snapshot look older.
const maxAhead = int64(time.Hour / time.Millisecond)

// nextSequence is the sequence of a new snapshot after last: the larger of last+1 and the time
// in Unix milliseconds, so it grows across restarts, a lost status or a recreated object, and
// never goes back even when the clock does; a last beyond maxAhead of the clock is ignored.
func nextSequence(last int64) int64 {
	now := time.Now().UnixMilli()
	if last > now+maxAhead {
		last = now
	}
	return max(last+1, now)
}

// recorded is a sequence status recorded, or 0 when it lies beyond maxAhead of the clock.
func recorded(seq int64) int64 {
	if seq > time.Now().UnixMilli()+maxAhead {
		return 0
	}
	return seq
}

// sequenceFor is the sequence to sign s with, given the snapshots recorded for its source
// before (the verified rendering's and the one status describes; either may be missing, stale
// or edited): when the highest recorded one says what s says, its sequence, so that a rendering
// made again is the same bytes; else the next sequence after the highest recorded (a lower
// "same" one, such as a status written ahead of the controller, never brings a sequence back).
// Sequences beyond maxAhead of the clock are ignored.
func sequenceFor(s bundle.Snapshot, recordedSnaps ...bundle.Snapshot) int64 {
	var same, highest int64
	for _, c := range recordedSnaps {
		seq := recorded(c.Sequence)
		if seq <= 0 {
			continue
		}
		highest = max(highest, seq)
		s.Sequence, c.Sequence = seq, seq
		s.Format, c.Format = bundle.SnapshotFormat, bundle.SnapshotFormat
		if reflect.DeepEqual(s, c) {
			same = max(same, seq)
		}
	}
	if same > 0 && same == highest {
		return same
	}
	return nextSequence(highest)
}

// previous is what the controller rendered last for an owner, as its ConfigMaps hold it now and
// only as far as it verifies with the controller's own key: the snapshots by source, and the
// entries. The ConfigMaps can be edited by others, so nothing unverified is taken from them;
// status is not trusted alone either (see ManifestRegistryReconciler.lastApplied).
type previous struct {
	snapshots map[string]bundle.Snapshot
	entries   map[string]bundle.Entry // by tool
}

// readPrevious assembles the ConfigMaps names (from the cache: one a little behind only makes
// the baseline older, which the checks and sequenceFor allow for) and keeps what verifies with
// trust; an empty previous when they are missing, incomplete or do not verify.
func readPrevious(ctx context.Context, live client.Reader, owner client.Object, names []string, trust *signing.TrustSet) previous {
	p := previous{snapshots: map[string]bundle.Snapshot{}, entries: map[string]bundle.Entry{}}
	var shards []map[string]string
	for _, name := range names {
		var cm corev1.ConfigMap
		if err := live.Get(ctx, types.NamespacedName{Namespace: owner.GetNamespace(), Name: name}, &cm); err != nil || !metav1.IsControlledBy(&cm, owner) {
			return p
		}
		shards = append(shards, cm.Data)
	}
	b, err := bundle.Assemble(shards)
	if err != nil {
		return p
	}
	if _, errs := b.Verify(nil, trust); len(errs) > 0 {
		return p
	}
	for _, ss := range b.Snapshots {
		p.snapshots[ss.Snapshot.Source] = ss.Snapshot
	}
	for _, e := range b.Entries {
		p.entries[e.Tool] = e
	}
	return p
}

// shardsOf names the shards of the rendering whose shard 0 is base, as shard 0 says (nil when
// shard 0 is missing or says nonsense).
func shardsOf(ctx context.Context, live client.Reader, ns, base string) []string {
	var cm corev1.ConfigMap
	if err := live.Get(ctx, types.NamespacedName{Namespace: ns, Name: base}, &cm); err != nil {
		return nil
	}
	n, err := strconv.Atoi(cm.Data[bundle.KeyShards])
	if err != nil || n < 1 || n > 1000 {
		return nil
	}
	return shardNames(base, n)
}

// renderingDigest is `sha256:<hex>` over the data of shards, in order (keys sorted): what
// status records, to tell an edited ConfigMap at once.
func renderingDigest(shards []map[string]string) string {
	h := sha256.New()
	for i, data := range shards {
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(h, "shard %d %d\n", i, len(keys))
		for _, k := range keys {
			fmt.Fprintf(h, "%d %s %d %s\n", len(k), k, len(data[k]), data[k])
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// liveRenderingDigest is the renderingDigest of the ConfigMaps named, as they are now ("" when
// one is missing or not controlled by owner).
func liveRenderingDigest(ctx context.Context, c client.Reader, owner client.Object, names []string) string {
	shards := make([]map[string]string, 0, len(names))
	for _, name := range names {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, types.NamespacedName{Namespace: owner.GetNamespace(), Name: name}, &cm); err != nil || !metav1.IsControlledBy(&cm, owner) {
			return ""
		}
		shards = append(shards, cm.Data)
	}
	return renderingDigest(shards)
}

// drift is a rendered ConfigMap that held other data than the controller wrote.
type drift struct {
	name     string
	managers []string // field managers other than the controller that own data keys
	what     string   // what differed: "data: <keys>" or "metadata.ownerReferences"
}

func (d drift) String() string {
	who := "a writer whose field manager is not recorded"
	if len(d.managers) > 0 {
		who = strings.Join(d.managers, ", ")
	}
	return fmt.Sprintf("ConfigMap %s was changed by %s (%s)", d.name, who, d.what)
}

// driftNote is the note of a RenderingDrift event.
func driftNote(ns string, ds []drift, restored string) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		d.name = ns + "/" + d.name
		parts[i] = d.String()
	}
	return strings.Join(parts, "; ") + ": restored " + restored + "; gateways refuse such edits, and the controller's field manager is " + FieldManager
}

// diffKeys lists the data keys whose values differ between have and want.
func diffKeys(have, want map[string]string) []string {
	var keys []string
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			keys = append(keys, k)
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// OwnershipConflictError: an object the controller would render exists and is neither
// controlled by Owner nor refers to it (by UID); the controller adopts nothing (issue 17).
type OwnershipConflictError struct {
	// Kind, Namespace and Name are the existing object's.
	Kind, Namespace, Name string
	// OwnerKind and Owner name the object that renders it.
	OwnerKind, Owner string
}

func (e *OwnershipConflictError) Error() string {
	return fmt.Sprintf("%s %s/%s exists and is not controlled by %s %s: the controller adopts nothing and wrote nothing; delete or rename that %s, or give the %s another name",
		e.Kind, e.Namespace, e.Name, e.OwnerKind, e.Owner, e.Kind, e.OwnerKind)
}

// claim returns an *OwnershipConflictError when obj exists (it has a creationTimestamp) and is
// neither controlled by owner nor refers to it; nil when obj may be written. An object that
// refers to owner is the controller's own with its controller reference taken away, and is
// healed (issue 15).
func claim(obj, owner client.Object, kind string) error {
	if ct := obj.GetCreationTimestamp(); ct.IsZero() || metav1.IsControlledBy(obj, owner) || refersTo(obj, owner) {
		return nil
	}
	ownerKind := "owner"
	switch owner.(type) {
	case *v1alpha1.ManifestRegistry:
		ownerKind = "ManifestRegistry"
	case *v1alpha1.ReversiGateway:
		ownerKind = "ReversiGateway"
	}
	return &OwnershipConflictError{Kind: kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), OwnerKind: ownerKind, Owner: owner.GetName()}
}

// refersTo reports whether obj has an owner reference to owner (by UID), controller or not.
func refersTo(obj, owner client.Object) bool {
	for _, r := range obj.GetOwnerReferences() {
		if r.UID == owner.GetUID() {
			return true
		}
	}
	return false
}

// foreignManagers are the field managers of cm other than the controller that own data keys.
func foreignManagers(cm *corev1.ConfigMap) []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range cm.ManagedFields {
		if f.Manager == FieldManager || f.FieldsV1 == nil || seen[f.Manager] {
			continue
		}
		var fields map[string]json.RawMessage
		if json.Unmarshal(f.FieldsV1.Raw, &fields) != nil {
			continue
		}
		_, data := fields["f:data"]
		var meta map[string]json.RawMessage
		_ = json.Unmarshal(fields["f:metadata"], &meta)
		if _, refs := meta["f:ownerReferences"]; data || refs {
			seen[f.Manager] = true
			out = append(out, f.Manager)
		}
	}
	sort.Strings(out)
	return out
}

// shardSet is what one controller renders into ConfigMaps: the shards of a bundle, named, with
// the labels and annotations each carries, controlled by owner.
type shardSet struct {
	owner       client.Object
	names       []string
	shards      []map[string]string
	labels      map[string]string
	annotations map[string]string
}

// apply writes the shards (the last first, so a reader that sees shard 0 finds the others),
// creating missing ones and restoring any whose data, labels or annotations differ, and
// reports the ConfigMaps someone else changed: data or owner references that a field manager
// other than the controller wrote (a new rendering of the controller's own is no drift; a
// stale cached copy of its own earlier write ends in a conflict and a retry). Existing
// ConfigMaps it does not control are taken over (issue 17 turns that into a conflict).
func (s shardSet) apply(ctx context.Context, c client.Client, scheme *runtime.Scheme) ([]drift, error) {
	var drifts []drift
	for i := len(s.shards) - 1; i >= 0; i-- {
		cm := &corev1.ConfigMap{}
		key := types.NamespacedName{Namespace: s.owner.GetNamespace(), Name: s.names[i]}
		err := c.Get(ctx, key, cm)
		exists := err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			return drifts, fmt.Errorf("reading ConfigMap %s: %w", s.names[i], err)
		}
		if !exists {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		} else if err := claim(cm, s.owner, "ConfigMap"); err != nil {
			return drifts, err
		}
		changed := !exists
		if exists && !metav1.IsControlledBy(cm, s.owner) && refersTo(cm, s.owner) {
			// Ours, with its controller reference taken away or pointed elsewhere: that is an
			// edit too (it would stop the healing), and the controller reference comes back.
			drifts = append(drifts, drift{name: s.names[i], managers: foreignManagers(cm), what: "metadata.ownerReferences"})
			cm.OwnerReferences = slices.DeleteFunc(cm.OwnerReferences, func(r metav1.OwnerReference) bool {
				return r.UID == s.owner.GetUID() || (r.Controller != nil && *r.Controller)
			})
			changed = true
		}
		if exists && metav1.IsControlledBy(cm, s.owner) {
			if keys := diffKeys(cm.Data, s.shards[i]); len(keys) > 0 {
				if managers := foreignManagers(cm); len(managers) > 0 {
					drifts = append(drifts, drift{name: s.names[i], managers: managers, what: "data: " + strings.Join(keys, ", ")})
				}
				changed = true
			}
		} else if exists {
			changed = true
		}
		if cm.Labels == nil {
			cm.Labels = map[string]string{}
		}
		for k, v := range s.labels {
			if cm.Labels[k] != v {
				cm.Labels[k], changed = v, true
			}
		}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		for k, v := range s.annotations {
			if cm.Annotations[k] != v {
				cm.Annotations[k], changed = v, true
			}
		}
		if !changed {
			continue
		}
		cm.Data = s.shards[i]
		if err := controllerutil.SetControllerReference(s.owner, cm, scheme); err != nil {
			return drifts, err
		}
		if exists {
			err = c.Update(ctx, cm, client.FieldOwner(FieldManager))
		} else {
			err = c.Create(ctx, cm, client.FieldOwner(FieldManager))
		}
		if err != nil {
			return drifts, fmt.Errorf("writing ConfigMap %s: %w", s.names[i], err)
		}
	}
	return drifts, nil
}

// shardNames names n shards `<base>`, `<base>-1`, ….
func shardNames(base string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = base
		if i > 0 {
			names[i] = base + "-" + strconv.Itoa(i)
		}
	}
	return names
}
