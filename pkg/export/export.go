// Package export turns registry versions into ToolManifest objects, signed through their
// annotations, for Argo CD, Flux and kubectl users (`reversi manifests export --format crd`).
package export

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/registry"
)

// ToolManifest builds the object of one version. The spec holds the stored canonical manifest
// as written, so the controller computes the same checksum the signature covers; the
// signature and key id go in the reversi.dev/signature and reversi.dev/key-id annotations.
func ToolManifest(namespace, tool string, e registry.Entry, canonical []byte) (*v1alpha1.ToolManifest, error) {
	var raw any
	dec := json.NewDecoder(bytes.NewReader(canonical))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, err
	}
	spec, err := v1alpha1.ToolManifestSpecFromObject(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tool, err)
	}
	tm := &v1alpha1.ToolManifest{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ToolManifest"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      ObjectName(tool),
			Namespace: namespace,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "reversi"},
		},
		Spec: *spec,
	}
	if e.Signed() {
		tm.Annotations = map[string]string{v1alpha1.AnnotationSignature: e.Signature, v1alpha1.AnnotationKeyID: e.KeyID}
	}
	return tm, nil
}

var emptyStatus = regexp.MustCompile(`(?m)^status: \{\}\n`)

// WriteYAML writes one object as a YAML document ("---" first), without the empty status
// (the controller's to write).
func WriteYAML(w io.Writer, tm *v1alpha1.ToolManifest) error {
	out, err := yaml.Marshal(tm)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "---\n%s", emptyStatus.ReplaceAll(out, nil))
	return err
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// ObjectName turns a tool name into a Kubernetes object name (lowercase letters, digits and
// "-", at most 63 characters). When anything had to change, a short hash of the tool name is
// appended so two tools never share a name.
func ObjectName(tool string) string {
	name := strings.Trim(nonName.ReplaceAllString(strings.ToLower(tool), "-"), "-")
	if name == tool && len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(tool))
	if len(name) > 54 {
		name = strings.TrimRight(name[:54], "-")
	}
	return name + "-" + hex.EncodeToString(sum[:])[:8]
}
