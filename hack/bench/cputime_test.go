package main

import (
	"os"
	"testing"
	"time"
)

// TestCPUTimeCountsThisProcess: spinning raises this process's CPU time as cpuTime reads it.
func TestCPUTimeCountsThisProcess(t *testing.T) {
	self := []int{os.Getpid()}
	before, err := cpuTime(self)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second) // a bound, not a measurement
	for {
		for start := time.Now(); time.Since(start) < 20*time.Millisecond; { // spin: CPU, not sleep
		}
		now, err := cpuTime(self)
		if err != nil {
			t.Fatal(err)
		}
		if now-before >= 50*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time went from %s to %s over 30 s of spinning", before, now)
		}
	}
	if _, err := cpuTime([]int{1 << 30}); err == nil {
		t.Fatal("a process that does not exist must be an error")
	}
}
