package podrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Kubelet plays the kubelet (and the Deployment controller's status) for pods on a control
// plane that has no nodes.
type Kubelet struct {
	// Client reads the objects a pod refers to and writes the Pod and Deployment status
	// (an admin client).
	Client client.Client
	// Config is the API server (host and CA of the kubeconfigs it writes) with credentials
	// that may request ServiceAccount tokens.
	Config *rest.Config
	// Dir holds each pod's folders (Dir/<pod>/<volume>) and kubeconfigs (Dir/<sa>.kubeconfig).
	Dir string
	// BaseEnv is the environment every container starts from (PATH, HOME, …), before TMPDIR
	// and its own env.
	BaseEnv []string
}

// CreatePod creates the Pod name from the Deployment's template (its labels, annotations
// and spec) and marks it and the Deployment ready and rolled out, as a kubelet and the
// Deployment controller would for one replica.
func (k *Kubelet) CreatePod(ctx context.Context, dep *appsv1.Deployment, name string) (*corev1.Pod, error) {
	tmpl := dep.Spec.Template
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: dep.Namespace, Name: name, Labels: tmpl.Labels, Annotations: tmpl.Annotations},
		Spec: *tmpl.Spec.DeepCopy()}
	if err := k.Client.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating pod %s: %w", name, err)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := k.Client.Status().Update(ctx, pod); err != nil {
		return nil, fmt.Errorf("marking pod %s ready: %w", name, err)
	}
	dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
	if err := k.Client.Status().Update(ctx, dep); err != nil {
		return nil, fmt.Errorf("marking Deployment %s rolled out: %w", dep.Name, err)
	}
	return pod, nil
}

// Container is one container of a pod, ready to run as a local process.
type Container struct {
	// Command is the container's command (its entrypoint; empty: the image's), expanded and
	// localised as Args are.
	Command []string
	// Args are the container's args with $(VAR) references expanded from its env (as the
	// kubelet does), every mount path but /tmp replaced by its local folder and an empty --kubeconfig
	// (in-cluster credentials) replaced by Kubeconfig.
	Args []string
	// Env is Kubelet.BaseEnv, TMPDIR (the /tmp mount's folder when there is one) and the
	// container's env, every valueFrom resolved.
	Env []string
	// Mounts maps each mount path to its local folder.
	Mounts map[string]string
	// Kubeconfig is the file with a token of the pod's ServiceAccount.
	Kubeconfig string
}

// Prepare makes the container (or init container) of the pod ready to run: a token of the pod's ServiceAccount in
// a kubeconfig, each volume mount written to a local folder (ConfigMap and Secret items as
// files, empty folders otherwise), the env resolved and the args localised. Call it again
// before a restart: the folders stay (a data volume keeps what the process wrote), the files
// of ConfigMaps and Secrets are written anew and the env is resolved again, as for a new
// container of the same pod.
func (k *Kubelet) Prepare(ctx context.Context, pod *corev1.Pod, container string) (*Container, error) {
	var c *corev1.Container
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == container {
				c = &list[i]
			}
		}
	}
	if c == nil {
		return nil, fmt.Errorf("pod %s has no container %q", pod.Name, container)
	}
	out := &Container{}
	var err error
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	out.Kubeconfig = filepath.Join(k.Dir, sa+".kubeconfig")
	if _, err = ServiceAccountKubeconfig(ctx, k.Config, pod.Namespace, sa, out.Kubeconfig); err != nil {
		return nil, err
	}
	var restamped map[string]string
	if out.Mounts, restamped, err = k.volumes(ctx, pod, *c); err != nil {
		return nil, err
	}
	out.Env = append([]string(nil), k.BaseEnv...)
	if tmp, ok := out.Mounts["/tmp"]; ok {
		out.Env = append(out.Env, "TMPDIR="+tmp)
	}
	vars := map[string]string{}
	for _, e := range c.Env {
		v, err := k.envValue(ctx, pod, e)
		if err != nil {
			return nil, err
		}
		vars[e.Name] = v
		if local, ok := restamped[v]; ok {
			v = local // a digest of a file the player localised (REVERSI_CONFIG_DIGEST): the copy's
		}
		out.Env = append(out.Env, e.Name+"="+v)
	}
	// /tmp is not localised in the command line: host paths under the real /tmp (a checkout, a
	// test's folders) appear there, as in the files (see volumes).
	named := maps.Clone(out.Mounts)
	delete(named, "/tmp")
	out.Command = make([]string, len(c.Command))
	for i, a := range c.Command {
		out.Command[i] = Localise(ExpandVars(a, vars), named)
	}
	out.Args = make([]string, len(c.Args))
	for i, a := range c.Args {
		out.Args[i] = Localise(ExpandVars(a, vars), named)
		if i > 0 && c.Args[i-1] == "--kubeconfig" && a == "" {
			out.Args[i] = out.Kubeconfig // in-cluster credentials: the ServiceAccount's token
		}
	}
	return out, nil
}

// ExpandVars replaces each $(NAME) in s by vars[NAME], as the kubelet expands a container's
// args with its env: "$$" is a literal "$", and $(NAME) of a variable not in vars stays as it
// is.
func ExpandVars(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// Start prepares the container (Prepare) and starts it as a process named name running bin,
// its output appended to <Dir>/<name>.log.
func (k *Kubelet) Start(ctx context.Context, pod *corev1.Pod, container, bin, name string) (*Process, *Container, error) {
	c, err := k.Prepare(ctx, pod, container)
	if err != nil {
		return nil, nil, err
	}
	p, err := Start(name, bin, c.Args, c.Env, filepath.Join(k.Dir, name+".log"))
	return p, c, err
}

// ServiceAccountKubeconfig requests a token of the ServiceAccount (TokenRequest, as the
// kubelet does for a pod) and writes a kubeconfig with it to path. It returns a rest.Config of
// the same identity.
func ServiceAccountKubeconfig(ctx context.Context, cfg *rest.Config, ns, sa, path string) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("TokenRequest for ServiceAccount %s/%s: %w", ns, sa, err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts[sa] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: sa, Namespace: ns}
	kc.CurrentContext = sa
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return nil, err
	}
	out := rest.CopyConfig(cfg)
	out.CertData, out.KeyData, out.CertFile, out.KeyFile = nil, nil, "", ""
	out.BearerToken = tr.Status.Token
	return out, nil
}

// volumes writes each mounted volume of the container to a local folder, as the kubelet
// would: ConfigMap and Secret items, empty folders for emptyDir and claims. It returns
// mountPath → local folder, and for each file it had to localise (its text names other mounted
// files) `sha256:<hex>` of the file as mounted → of its local copy, so that an env var naming
// the mounted file's digest can name the copy's instead.
func (k *Kubelet) volumes(ctx context.Context, pod *corev1.Pod, c corev1.Container) (map[string]string, map[string]string, error) {
	restamped := map[string]string{}
	mounts := map[string]string{}
	files := map[string]string{} // the ConfigMap and Secret mounts only
	for _, m := range c.VolumeMounts {
		local := filepath.Join(k.Dir, pod.Name, m.Name)
		if err := os.MkdirAll(local, 0o700); err != nil {
			return nil, nil, err
		}
		mounts[m.MountPath] = local
		for _, v := range pod.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var data map[string][]byte
			var items []corev1.KeyToPath
			switch {
			case v.ConfigMap != nil:
				var cm corev1.ConfigMap
				if err := k.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: v.ConfigMap.Name}, &cm); err != nil {
					return nil, nil, err
				}
				data = map[string][]byte{}
				for key, val := range cm.Data {
					data[key] = []byte(val)
				}
				items = v.ConfigMap.Items
				files[m.MountPath] = local
			case v.Secret != nil:
				var sec corev1.Secret
				if err := k.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: v.Secret.SecretName}, &sec); err != nil {
					return nil, nil, err
				}
				data, items = sec.Data, v.Secret.Items
				files[m.MountPath] = local
			}
			if items == nil {
				for key := range data {
					items = append(items, corev1.KeyToPath{Key: key, Path: key})
				}
			}
			for _, it := range items {
				if err := os.WriteFile(filepath.Join(local, it.Path), data[it.Key], 0o600); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	// Files that name other mounted paths (gateway.yaml's auth.keys, a socket: in a sidecar's
	// folder) name their local copies; /tmp is left alone there: host paths under the real
	// /tmp (a test's folders) appear in such files too.
	named := maps.Clone(mounts)
	delete(named, "/tmp")
	for _, local := range files {
		entries, _ := os.ReadDir(local)
		for _, e := range entries {
			p := filepath.Join(local, e.Name())
			b, err := os.ReadFile(p)
			if err != nil || e.IsDir() {
				continue
			}
			if l := Localise(string(b), named); l != string(b) {
				if err := os.WriteFile(p, []byte(l), 0o600); err != nil {
					return nil, nil, err
				}
				restamped[digest(b)] = digest([]byte(l))
			}
		}
	}
	return mounts, restamped, nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Localise replaces every mount path in text by its local folder, in one pass (a local
// folder may itself lie under a mount path such as /tmp).
func Localise(text string, mounts map[string]string) string {
	if local, ok := mounts[text]; ok {
		return local
	}
	paths := make([]string, 0, len(mounts))
	for mp := range mounts {
		paths = append(paths, mp)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	var pairs []string
	for _, mp := range paths {
		pairs = append(pairs, mp+"/", mounts[mp]+"/")
	}
	return strings.NewReplacer(pairs...).Replace(text)
}

// envValue resolves one env var of the container: a literal, the downward API's pod name or
// namespace, or a key of a Secret or ConfigMap in the pod's namespace.
func (k *Kubelet) envValue(ctx context.Context, pod *corev1.Pod, e corev1.EnvVar) (string, error) {
	from := e.ValueFrom
	switch {
	case from == nil:
		return e.Value, nil
	case from.FieldRef != nil && from.FieldRef.FieldPath == "metadata.name":
		return pod.Name, nil
	case from.FieldRef != nil && from.FieldRef.FieldPath == "metadata.namespace":
		return pod.Namespace, nil
	case from.SecretKeyRef != nil:
		var sec corev1.Secret
		if err := k.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: from.SecretKeyRef.Name}, &sec); err != nil {
			return "", fmt.Errorf("env %s: %w", e.Name, err)
		}
		v, ok := sec.Data[from.SecretKeyRef.Key]
		if !ok && !ptr.Deref(from.SecretKeyRef.Optional, false) {
			return "", fmt.Errorf("env %s: Secret %s has no key %s", e.Name, from.SecretKeyRef.Name, from.SecretKeyRef.Key)
		}
		return string(v), nil
	case from.ConfigMapKeyRef != nil:
		var cm corev1.ConfigMap
		if err := k.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: from.ConfigMapKeyRef.Name}, &cm); err != nil {
			return "", fmt.Errorf("env %s: %w", e.Name, err)
		}
		v, ok := cm.Data[from.ConfigMapKeyRef.Key]
		if !ok && !ptr.Deref(from.ConfigMapKeyRef.Optional, false) {
			return "", fmt.Errorf("env %s: ConfigMap %s has no key %s", e.Name, from.ConfigMapKeyRef.Name, from.ConfigMapKeyRef.Key)
		}
		return v, nil
	}
	return "", fmt.Errorf("env %s: a source podrun does not play (%+v)", e.Name, from)
}
