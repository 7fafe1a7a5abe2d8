package controllers

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// BenchmarkReconcileScale reconciles registries of 100, 1,000, 5,000 and (with
// REVERSI_BENCH_SIZES) other sizes of signed tools, as BenchmarkReconcile5000 does: a new
// ManifestRegistry per iteration, timed from Create to Ready with every tool rendered.
// Reported: s/op, peak-heapinuse-MB (runtime.MemStats.HeapInuse sampled every 10 ms, peak
// minus the value before the reconcile, after a GC), cm-bytes (the sum of the rendered
// ConfigMaps' data) and shards (how many ConfigMaps). Targets: 5,000 tools under 10 s, memory
// growing linearly (issue 10). make bench (go run ./hack/bench suite) records the figures.
func BenchmarkReconcileScale(b *testing.B) {
	sizes := []int{100, 1000, 5000}
	if s := strings.TrimSpace(os.Getenv("REVERSI_BENCH_SIZES")); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 3 {
				b.Fatalf("REVERSI_BENCH_SIZES=%q: want sizes of at least 3, comma-separated", s)
			}
			sizes = append(sizes, n)
		}
	}
	k := newKey(b)
	// Warm-up, unmeasured: the first reconcile in the process pays one-time costs (the
	// manager's informers for the kinds it reads start on first use), which would otherwise
	// land on the smallest size.
	{
		repo := sourcetest.NewRepo(b)
		if _, err := registry.New(filepath.Join(repo.Dir, "reg")).Publish(fixtures(b), manifest.Approved, registry.WriteOptions{By: "bench", Signer: k.Signer}); err != nil {
			b.Fatal(err)
		}
		repo.Commit("warm-up")
		ns := namespace(b)
		createSecret(b, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
		if err := k8s.Create(b.Context(), newRegistry(ns, "warm-up", repo.FileURL(), withKeys("manifest-keys"))); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			got := &v1alpha1.ManifestRegistry{}
			if err := k8s.Get(b.Context(), types.NamespacedName{Namespace: ns, Name: "warm-up"}, got); err != nil {
				b.Fatal(err)
			}
			if c := condition(got.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionTrue {
				break
			} else if c != nil && c.Status == metav1.ConditionFalse || time.Now().After(deadline) {
				b.Fatalf("warm-up registry not rendered: %+v", got.Status)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("tools-%d", n), func(b *testing.B) {
			repo := sourcetest.NewRepo(b)
			ms := fixtures(b)
			base := ms[1] // the seed's compensable stripe.create_charge
			for i := len(ms); i < n; i++ {
				m := *base
				m.Tool = fmt.Sprintf("svc%05d.create", i)
				ms = append(ms, &m)
			}
			if _, err := registry.New(filepath.Join(repo.Dir, "reg")).Publish(ms, manifest.Approved, registry.WriteOptions{By: "bench", Signer: k.Signer}); err != nil {
				b.Fatal(err)
			}
			repo.Commit(fmt.Sprintf("%d tools", n))
			ns := namespace(b)
			createSecret(b, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
			var peak atomic.Uint64
			var cmBytes, shards int
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				name := fmt.Sprintf("scale-%d", i)
				runtime.GC()
				var ms0 runtime.MemStats
				runtime.ReadMemStats(&ms0)
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Go(func() { // sample the heap while the reconcile runs
					var m runtime.MemStats
					for {
						select {
						case <-stop:
							return
						case <-time.After(10 * time.Millisecond):
							runtime.ReadMemStats(&m)
							if m.HeapInuse > ms0.HeapInuse && m.HeapInuse-ms0.HeapInuse > peak.Load() {
								peak.Store(m.HeapInuse - ms0.HeapInuse)
							}
						}
					}
				})
				b.StartTimer()
				if err := k8s.Create(b.Context(), newRegistry(ns, name, repo.FileURL(), withKeys("manifest-keys"))); err != nil {
					b.Fatal(err)
				}
				deadline := time.Now().Add(5 * time.Minute)
				var got *v1alpha1.ManifestRegistry
				for {
					got = &v1alpha1.ManifestRegistry{}
					if err := k8s.Get(b.Context(), types.NamespacedName{Namespace: ns, Name: name}, got); err != nil {
						b.Fatal(err)
					}
					c := condition(got.Status.Conditions, v1alpha1.ConditionReady)
					if c != nil && c.Status == metav1.ConditionTrue && got.Status.Artifact != nil && int(got.Status.Artifact.Tools) == n {
						break
					}
					if c != nil && c.Status == metav1.ConditionFalse || time.Now().After(deadline) {
						b.Fatalf("not rendered: %+v", got.Status)
					}
					time.Sleep(10 * time.Millisecond)
				}
				b.StopTimer()
				close(stop)
				wg.Wait()
				cmBytes, shards = 0, len(got.Status.Artifact.ConfigMaps)
				for _, cmName := range got.Status.Artifact.ConfigMaps {
					cm := &corev1.ConfigMap{}
					if err := k8s.Get(b.Context(), types.NamespacedName{Namespace: ns, Name: cmName}, cm); err != nil {
						b.Fatal(err)
					}
					for k, v := range cm.Data {
						cmBytes += len(k) + len(v)
					}
				}
				if shards == 0 || cmBytes == 0 {
					b.Fatalf("no rendered ConfigMap: %+v", got.Status.Artifact)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heapinuse-MB")
			b.ReportMetric(float64(cmBytes), "cm-bytes")
			b.ReportMetric(float64(shards), "shards")
		})
	}
}
