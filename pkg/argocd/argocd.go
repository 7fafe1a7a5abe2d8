// Package argocd holds the Argo CD health checks of the reversi.dev kinds and renders them as
// the argocd-cm settings Argo CD reads.
//
// Argo CD's health assessment contract (resource.customizations.health): for an object of
// group G and kind K, the argocd-cm key `resource.customizations.health.G_K` holds a Lua
// script. Argo CD runs it with gopher-lua, the object as the global table `obj` (the object's
// JSON: maps as tables with string keys, lists as 1-based arrays), and only the base, table,
// package and a restricted os library unless `useOpenLibs` is set (so no `string.*`). The
// script returns a table `hs` with `hs.status` one of Healthy, Progressing, Degraded,
// Suspended or Missing (anything else is Unknown) and `hs.message`.
//
// The scripts are the files health/<kind in lowercase>.lua, embedded. Argo CD has no prelude
// shared by scripts, so HealthScript puts health/common.lua, the kstatus reading (DESIGN.md,
// "Custom resources"), in front of each kind's code:
// no status, or status.observedGeneration (else the Ready condition's) behind
// metadata.generation → Progressing; Stalled=True → Degraded; Reconciling=True → Progressing;
// Ready=True → Healthy; Ready=False → Degraded. Each kind adds its own states before that
// reading (docs/argocd.md lists them).
package argocd

import (
	"embed"
	"fmt"
	"strings"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

//go:embed health/*.lua
var scripts embed.FS

// Kinds are the reversi.dev kinds with a health check, in the order the settings list them.
var Kinds = []string{"ManifestRegistry", "ToolManifest", "ReversiGateway", "ApprovalRequest", "Approval", "ReversiRun"}

// HealthKey is the argocd-cm key of kind's health check:
// `resource.customizations.health.reversi.dev_<Kind>`.
func HealthKey(kind string) string {
	return "resource.customizations.health." + v1alpha1.GroupVersion.Group + "_" + kind
}

// HealthScript is the Lua health check of kind (one of Kinds), as Argo CD runs it: the kind
// file's leading comment, health/common.lua, then the kind's code.
func HealthScript(kind string) (string, error) {
	b, err := scripts.ReadFile("health/" + strings.ToLower(kind) + ".lua")
	if err != nil {
		return "", fmt.Errorf("no Argo CD health check for kind %q: %w", kind, err)
	}
	common, err := scripts.ReadFile("health/common.lua")
	if err != nil {
		return "", err
	}
	lines := strings.SplitAfter(string(b), "\n")
	i := 0
	for i < len(lines) && strings.HasPrefix(lines[i], "--") {
		i++
	}
	return strings.Join(lines[:i], "") + string(common) + strings.Join(lines[i:], ""), nil
}

// ConfigMapData renders the health checks as the `data:` of argocd-cm, a YAML mapping of
// HealthKey(kind) to the script as a literal block, one key per kind in Kinds order:
//
//	data:
//	  resource.customizations.health.reversi.dev_ManifestRegistry: |
//	    -- Argo CD health of ...
//
// It is a merge patch for argocd-cm (`kubectl -n argocd patch configmap argocd-cm --type merge
// --patch-file config/argocd/argocd-cm-health.yaml`) and the snippet docs/argocd.md shows.
func ConfigMapData() (string, error) {
	var b strings.Builder
	b.WriteString("data:\n")
	for _, kind := range Kinds {
		s, err := HealthScript(kind)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "  %s: |\n", HealthKey(kind))
		for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
			if line == "" {
				b.WriteString("\n")
				continue
			}
			b.WriteString("    " + line + "\n")
		}
	}
	return b.String(), nil
}
