package controllers

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// BenchmarkReconcile5000 reconciles a registry of 5,000 signed tools from a real git
// repository into ConfigMaps against the envtest API server: clone, verify every signature,
// validate the set, render the shards. Each iteration is a new ManifestRegistry object, so
// nothing is skipped; the time includes the manager noticing the object (watch) and a poll of
// at most 10 ms. Reported: time per reconcile and the peak heap growth of the process.
func BenchmarkReconcile5000(b *testing.B) {
	k := newKey(b)
	repo := sourcetest.NewRepo(b)
	ms := fixtures(b)
	base := ms[1] // the seed's compensable stripe.create_charge
	for i := len(ms); i < 5000; i++ {
		m := *base
		m.Tool = fmt.Sprintf("svc%04d.create", i)
		ms = append(ms, &m)
	}
	if _, err := registry.New(filepath.Join(repo.Dir, "reg")).Publish(ms, manifest.Approved, registry.WriteOptions{By: "bench", Signer: k.Signer}); err != nil {
		b.Fatal(err)
	}
	repo.Commit("5,000 tools")
	ns := namespace(b)
	createSecret(b, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	var peak atomic.Uint64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("bench-%d", i)
		runtime.GC()
		var ms0 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // sample the heap while the reconcile runs
			defer wg.Done()
			var m runtime.MemStats
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
					runtime.ReadMemStats(&m)
					if m.HeapAlloc > ms0.HeapAlloc && m.HeapAlloc-ms0.HeapAlloc > peak.Load() {
						peak.Store(m.HeapAlloc - ms0.HeapAlloc)
					}
				}
			}
		}()
		// The suite's manager reconciles the new object; poll until it is rendered.
		if err := k8s.Create(b.Context(), newRegistry(ns, name, repo.FileURL(), withKeys("manifest-keys"))); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			got := &v1alpha1.ManifestRegistry{}
			if err := k8s.Get(b.Context(), types.NamespacedName{Namespace: ns, Name: name}, got); err != nil {
				b.Fatal(err)
			}
			c := condition(got.Status.Conditions, v1alpha1.ConditionReady)
			if c != nil && c.Status == metav1.ConditionTrue && got.Status.Artifact != nil && got.Status.Artifact.Tools == 5000 {
				break
			}
			if c != nil && c.Status == metav1.ConditionFalse || time.Now().After(deadline) {
				b.Fatalf("not rendered: %+v", got.Status)
			}
			time.Sleep(10 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
	}
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MB")
}
