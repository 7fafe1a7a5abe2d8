package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// BenchmarkReloadScale is a gateway reload of 100, 1,000, 5,000 (and REVERSI_BENCH_SIZES)
// signed tools as a gateway fed from ConfigMaps does it (gateway/kube Manifests.Load): assemble
// the rendered shards, verify every entry (checksum, validation, Ed25519 signature), then
// Reload builds and swaps the engine. The tools are copies of the seed's stripe.create_charge
// (no upstream serves them; the gateway fronts server-memory). Each iteration alternates
// between two renderings (v1 and v2 of every tool), so every reload changes the set.
// Reported: s/op, peak-heapinuse-MB (HeapInuse sampled every 5 ms during the reload, minus
// before), retained-MB (HeapInuse after the reload and a GC, minus before the gateway loaded
// any of these manifests). Target: 5,000 tools under 1 s (issue 10).
func BenchmarkReloadScale(b *testing.B) {
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
	k := signingtest.NewKey(b)
	docs, errs := manifest.ReadPaths(filepath.Join("..", "..", "test", "fixtures", "manifests"))
	fx, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		b.Fatal(errs)
	}
	cmd, args, env := upstreams.MemoryAt(b, filepath.Join(b.TempDir(), "memory.jsonl"))
	for _, n := range sizes {
		b.Run(fmt.Sprintf("tools-%d", n), func(b *testing.B) {
			ms := append([]*manifest.Manifest(nil), fx...)
			for i := len(ms); i < n; i++ {
				m := *fx[1]
				m.Tool = fmt.Sprintf("svc%05d.create", i)
				ms = append(ms, &m)
			}
			reg := registry.New(filepath.Join(b.TempDir(), "reg"))
			var renderings [2][]map[string]string
			for v := range renderings {
				if _, err := reg.Publish(ms, manifest.Approved, registry.WriteOptions{By: "bench", Signer: k.Signer}); err != nil {
					b.Fatal(err)
				}
				snap, errs := reg.Load(k.Trust)
				if len(errs) > 0 {
					b.Fatal(errs)
				}
				shards, err := bundle.FromSnapshot(fmt.Sprintf("v%d", v+1), snap).Shards(0)
				if err != nil {
					b.Fatal(err)
				}
				renderings[v] = shards
			}
			var which atomic.Int32
			load := func(context.Context) (Loaded, error) {
				bu, err := bundle.Assemble(renderings[which.Load()])
				if err != nil {
					return Loaded{}, err
				}
				out, errs := bu.Verify(k.Trust, nil)
				return Loaded{Manifests: out}, errors.Join(errs...)
			}
			u := config.Upstream{Name: "memory", Command: cmd, Args: args, Env: map[string]string{}, Namespace: true}
			for _, kv := range env {
				key, v, _ := strings.Cut(kv, "=")
				u.Env[key] = v
			}
			cfg := &config.Gateway{Mode: config.ModeEnforce, UnclassifiedReads: config.UnclassifiedBlock, Actor: "bench", Upstreams: []config.Upstream{u}}
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			gw, err := New(ctx, Options{Config: cfg, Load: load, Store: store.NewMemory(nil), Stderr: io.Discard})
			if err != nil {
				b.Fatal(err)
			}
			defer gw.Close()
			var peak atomic.Uint64
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				which.Store(int32(i % 2))
				runtime.GC()
				var m0 runtime.MemStats
				runtime.ReadMemStats(&m0)
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Go(func() {
					var m runtime.MemStats
					for {
						select {
						case <-stop:
							return
						case <-time.After(5 * time.Millisecond):
							runtime.ReadMemStats(&m)
							if m.HeapInuse > m0.HeapInuse && m.HeapInuse-m0.HeapInuse > peak.Load() {
								peak.Store(m.HeapInuse - m0.HeapInuse)
							}
						}
					}
				})
				b.StartTimer()
				res := gw.Reload(ctx)
				b.StopTimer()
				close(stop)
				wg.Wait()
				if res.Err != nil || !res.Changed || res.Tools != n {
					b.Fatalf("reload %d: %+v", i, res)
				}
				b.StartTimer()
			}
			b.StopTimer()
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heapinuse-MB")
			b.ReportMetric((float64(after.HeapInuse)-float64(before.HeapInuse))/(1<<20), "retained-MB")
		})
	}
}
