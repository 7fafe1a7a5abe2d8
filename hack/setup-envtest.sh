#!/usr/bin/env bash
# Builds the envtest control plane from source through the Go module proxy:
#
#   kube-apiserver v1.37.2  k8s.io/kubernetes/cmd/kube-apiserver  (hack/tools/kubernetes)
#   kubectl        v1.37.2  k8s.io/kubernetes/cmd/kubectl         (hack/tools/kubernetes)
#   etcd           v3.6.16  go.etcd.io/etcd/server/v3             (hack/tools/etcd)
#
# into ${XDG_CACHE_HOME:-$HOME/.cache}/reversi/envtest/1.37.2 and prints that folder
# (and nothing else) on stdout, for KUBEBUILDER_ASSETS:
#
#   export KUBEBUILDER_ASSETS="$(hack/setup-envtest.sh)"
#
# Progress goes to stderr. When all three binaries are present and report the expected
# versions the script does no build and returns at once (about 0.4 s). The first build takes
# 15 minutes or so on 2 cores (cold module and build caches); a rebuild with a warm GOCACHE
# takes seconds. It uses the normal GOMODCACHE and GOCACHE. Needs only Go (and git).
#
# Prebuilt downloads (setup-envtest, kind) are deliberately not used.
set -euo pipefail

KUBE_VERSION=v1.37.2 # k8s.io/kubernetes; the staging modules are at v0.37.2 (see hack/tools/kubernetes/go.mod)
ETCD_VERSION=v3.6.16 # go.etcd.io/etcd/server/v3

GO=${GO:-go}
hack_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${XDG_CACHE_HOME:-${HOME}/.cache}
assets_dir="${cache_root}/reversi/envtest/${KUBE_VERSION#v}"

log() { printf 'setup-envtest: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# The tool modules pin exactly these versions; refuse to build anything else silently.
grep -Eq "^	k8s.io/kubernetes ${KUBE_VERSION}( |$)" "${hack_dir}/tools/kubernetes/go.mod" ||
	die "hack/tools/kubernetes/go.mod does not require k8s.io/kubernetes ${KUBE_VERSION}"
grep -Eq "^	go.etcd.io/etcd/server/v3 ${ETCD_VERSION}( |$)" "${hack_dir}/tools/etcd/go.mod" ||
	die "hack/tools/etcd/go.mod does not require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}"

# version_ok DIR: all three binaries exist in DIR and report the expected versions.
version_ok() {
	local dir=$1 out
	[[ -x "${dir}/kube-apiserver" && -x "${dir}/etcd" && -x "${dir}/kubectl" ]] || return 1
	out=$("${dir}/kube-apiserver" --version 2>/dev/null) || return 1
	[[ ${out} == "Kubernetes ${KUBE_VERSION}" ]] || return 1
	out=$("${dir}/kubectl" version --client 2>/dev/null) || return 1
	[[ ${out} == *"Client Version: ${KUBE_VERSION}"* ]] || return 1
	out=$("${dir}/etcd" --version 2>/dev/null) || return 1
	[[ ${out} == *"etcd Version: ${ETCD_VERSION#v}"* ]] || return 1
}

if version_ok "${assets_dir}"; then
	printf '%s\n' "${assets_dir}"
	exit 0
fi

command -v "${GO}" >/dev/null 2>&1 || die "'${GO}' not found: Go is needed to build the envtest binaries"

mkdir -p "${assets_dir}"
# Build into a private folder next to the final one and rename into place, so an
# interrupted or concurrent run never leaves a half-written binary in assets_dir.
work=$(mktemp -d "${assets_dir}.tmp.XXXXXX")
trap 'rm -rf "${work}"' EXIT

# The tool modules are self-contained: no workspace, no vendor folder, go.sum as committed.
# (-mod=readonly on the command line wins over any -mod in GOFLAGS.)
export GOWORK=off
# Static binaries as the upstream release builds make them (and no C toolchain needed).
export CGO_ENABLED=0

# Version stamping as kube::version::ldflags (hack/lib/version.sh in k8s.io/kubernetes) does,
# so `kube-apiserver --version` and `kubectl version` report the release and
# controller-runtime / kubectl version checks behave. The build date is the release's
# publication time (deterministic).
minor=${KUBE_VERSION#v*.}
minor=${minor%%.*}
major=${KUBE_VERSION#v}
major=${major%%.*}
build_date=$(cd "${hack_dir}/tools/kubernetes" &&
	"${GO}" list -mod=readonly -m -f '{{with .Time}}{{.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes) ||
	die "cannot resolve k8s.io/kubernetes in hack/tools/kubernetes"
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION}"
	kube_ldflags+=" -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
	kube_ldflags+=" -X ${pkg}.buildDate=${build_date:-1970-01-01T00:00:00Z}"
done

start=${SECONDS}
log "building kube-apiserver and kubectl ${KUBE_VERSION} into ${assets_dir} (10-20 minutes with a cold build cache)"
(cd "${hack_dir}/tools/kubernetes" &&
	"${GO}" build -mod=readonly -trimpath -ldflags "${kube_ldflags}" -o "${work}/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl) ||
	die "building kube-apiserver/kubectl ${KUBE_VERSION} failed"
log "building etcd ${ETCD_VERSION}"
(cd "${hack_dir}/tools/etcd" &&
	"${GO}" build -mod=readonly -trimpath -ldflags "-s -w" -o "${work}/etcd" go.etcd.io/etcd/server/v3) ||
	die "building etcd ${ETCD_VERSION} failed"

version_ok "${work}" || {
	"${work}/kube-apiserver" --version >&2 || true
	"${work}/kubectl" version --client >&2 || true
	"${work}/etcd" --version >&2 || true
	die "the freshly built binaries do not report kube ${KUBE_VERSION} / etcd ${ETCD_VERSION}"
}
for bin in kube-apiserver kubectl etcd; do
	mv -f "${work}/${bin}" "${assets_dir}/${bin}"
done
version_ok "${assets_dir}" || die "binaries in ${assets_dir} do not report the expected versions"
log "built in $((SECONDS - start))s"

printf '%s\n' "${assets_dir}"
