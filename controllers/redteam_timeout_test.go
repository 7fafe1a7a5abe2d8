package controllers

import (
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// ATTACK (a ManifestRegistry editor in any namespace, or a hostile git server; time): the
// manager runs one ManifestRegistry reconcile at a time (MaxConcurrentReconciles is not set,
// so it is 1) and spec.timeout has no upper bound (the CRD only requires it positive). A
// tenant creates a registry whose url is a server that accepts the connection and never
// answers, with timeout: 10m: RemoteRevision holds the controller's only worker for ten
// minutes, then the fetch is retried within a minute (retryAfter), so every other registry
// of the cluster — other teams' namespaces included — waits: their writers' changes reach
// no gateway. Even with the 60 s default a few such registries keep the worker busy.
func TestSilentGitServerStallsEveryOtherRegistry(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	// Free the worker for the package's other tests, whatever this one found.
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})

	tenant := namespace(t)
	hostile := newRegistry(tenant, "slow", "http://"+ln.Addr().String()+"/repo.git", func(r *v1alpha1.ManifestRegistry) {
		r.Spec.Format = v1alpha1.FormatPlain
		r.Spec.Timeout = &metav1.Duration{Duration: 10 * time.Minute}
	})
	create(t, hostile)
	t.Cleanup(func() { _ = k8s.Delete(t.Context(), hostile) })
	eventually(t, 10*time.Second, func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(conns) == 0 {
			return "the controller has not connected to the silent server yet"
		}
		return ""
	})

	victim := namespace(t)
	repo := sourcetest.NewRepo(t)
	repo.WriteFile("reg/payments.yaml", mustRead(t, filepath.Join("..", "test", "fixtures", "manifests", "payments.yaml")))
	repo.Commit("payments")
	create(t, newRegistry(victim, "payments", repo.FileURL(), func(r *v1alpha1.ManifestRegistry) { r.Spec.Format = v1alpha1.FormatPlain }))
	start := time.Now()
	deadline := start.Add(45 * time.Second)
	for time.Now().Before(deadline) {
		if c := condition(getRegistry(t, victim, "payments").Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionTrue {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The cause: once the silent server's connections close, the worker is free again.
	waited := time.Since(start).Round(time.Second)
	mu.Lock()
	for _, c := range conns {
		_ = c.Close()
	}
	mu.Unlock()
	_ = ln.Close()
	freed := time.Now()
	eventually(t, 30*time.Second, func() string {
		if c := condition(getRegistry(t, victim, "payments").Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
			return "the victim is not Ready even after the silent server hung up"
		}
		return ""
	})
	t.Fatalf("a registry in namespace %s was not Ready %s after it was created (and became Ready %s after the silent server hung up), because one registry in namespace %s points at a git server that never answers (spec.timeout 10m): "+
		"the controller reconciles one registry at a time; cap spec.timeout (CRD maximum and a controller flag, e.g. --source-max-timeout), "+
		"run several workers (MaxConcurrentReconciles) and keep a slow namespace from occupying all of them",
		victim, waited, time.Since(freed).Round(time.Millisecond), tenant)
}
