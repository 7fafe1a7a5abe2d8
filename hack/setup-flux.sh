#!/usr/bin/env bash
# Builds the Flux controllers the tests run, from source through the Go module proxy:
#
#   source-controller    v1.9.0  github.com/fluxcd/source-controller     (hack/tools/flux-source)
#   kustomize-controller v1.9.6  github.com/fluxcd/kustomize-controller  (hack/tools/flux-kustomize)
#
# into ${XDG_CACHE_HOME:-$HOME/.cache}/reversi/flux/source-v1.9.0_kustomize-v1.9.6, with their
# CRDs (config/crd/bases of each module, taken from the module zips in GOMODCACHE) in crds/
# there, and prints that folder (and nothing else) on stdout:
#
#   flux="$(hack/setup-flux.sh)"   # $flux/source-controller, $flux/kustomize-controller, $flux/crds/
#
# Progress goes to stderr. When both binaries are present, their build info (`go version -m`)
# names the pinned module versions and the CRDs are there, the script does no build and returns
# at once (about 0.05 s). The first build, with cold module and build caches, costs about 780
# CPU-seconds (source-controller 440, kustomize-controller 340): 16 minutes of wall clock on a
# busy 2-core machine, about 7 on an idle one; a rebuild with a warm GOCACHE takes 15-20 s. It
# uses the normal GOMODCACHE and GOCACHE and needs only Go. Prebuilt downloads (release
# binaries, images) are deliberately not used.
#
# test/flux runs this script itself when REVERSI_FLUX is not set, but a cold build can outlast
# `go test`'s default 10-minute timeout: on a new machine run it first,
#
#   REVERSI_FLUX="$(hack/setup-flux.sh)" go test ./test/flux/
#
# Why these versions: they are the newest releases whose go.mod says `go 1.26` (1.10.x needs
# Go 1.27) and whose whole build graph the module proxy serves. source-controller v1.9.4..v1.9.6
# need github.com/fluxcd/pkg/artifact v0.18.2/v0.18.3, which the proxy refuses; v1.9.0 needs
# v0.18.0, which it serves. kustomize-controller v1.9.6 reads source-controller/api v1.9.0,
# the same API this source-controller serves.
set -euo pipefail

SOURCE_VERSION=v1.9.0    # github.com/fluxcd/source-controller
KUSTOMIZE_VERSION=v1.9.6 # github.com/fluxcd/kustomize-controller

GO=${GO:-go}
hack_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${XDG_CACHE_HOME:-${HOME}/.cache}
out_dir="${cache_root}/reversi/flux/source-${SOURCE_VERSION}_kustomize-${KUSTOMIZE_VERSION}"

log() { printf 'setup-flux: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# The tool modules pin exactly these versions; refuse to build anything else silently.
grep -Eq "^	github.com/fluxcd/source-controller ${SOURCE_VERSION}( |$)" "${hack_dir}/tools/flux-source/go.mod" ||
	die "hack/tools/flux-source/go.mod does not require github.com/fluxcd/source-controller ${SOURCE_VERSION}"
grep -Eq "^	github.com/fluxcd/kustomize-controller ${KUSTOMIZE_VERSION}( |$)" "${hack_dir}/tools/flux-kustomize/go.mod" ||
	die "hack/tools/flux-kustomize/go.mod does not require github.com/fluxcd/kustomize-controller ${KUSTOMIZE_VERSION}"

command -v "${GO}" >/dev/null 2>&1 || die "'${GO}' not found: Go is needed to build the Flux controllers"

# The CRDs each controller needs at start: source-controller watches all five source kinds
# (and ships the ExternalArtifact CRD, which kustomize-controller can consume behind a
# feature gate); kustomize-controller serves Kustomization.
source_crds=(buckets externalartifacts gitrepositories helmcharts helmrepositories ocirepositories)
kustomize_crds=(kustomizations)

# bin_ok FILE MODULE VERSION: FILE is an executable whose build info (`go version -m`) says its
# main package is MODULE's root and comes from MODULE at VERSION (the "mod" line: for a package
# built as a `tool` of a wrapper module, that is the tool's module, not the wrapper).
bin_ok() {
	local file=$1 module=$2 version=$3 info
	[[ -x ${file} ]] || return 1
	info=$("${GO}" version -m "${file}" 2>/dev/null) || return 1
	grep -Eq "^[[:space:]]+path[[:space:]]+${module}$" <<<"${info}" || return 1
	grep -Eq "^[[:space:]]+mod[[:space:]]+${module}[[:space:]]+${version}([[:space:]]|$)" <<<"${info}"
}

# all_ok DIR: both binaries report the pinned versions and every CRD is there.
all_ok() {
	local dir=$1 c
	bin_ok "${dir}/source-controller" github.com/fluxcd/source-controller "${SOURCE_VERSION}" || return 1
	bin_ok "${dir}/kustomize-controller" github.com/fluxcd/kustomize-controller "${KUSTOMIZE_VERSION}" || return 1
	for c in "${source_crds[@]}"; do [[ -s "${dir}/crds/source.toolkit.fluxcd.io_${c}.yaml" ]] || return 1; done
	for c in "${kustomize_crds[@]}"; do [[ -s "${dir}/crds/kustomize.toolkit.fluxcd.io_${c}.yaml" ]] || return 1; done
}

if all_ok "${out_dir}"; then
	printf '%s\n' "${out_dir}"
	exit 0
fi

mkdir -p "$(dirname "${out_dir}")"
# One build at a time per cache folder: a second caller (another test package, another shell)
# waits for the first and then finds the binaries in place.
if command -v flock >/dev/null 2>&1; then
	exec 9>"${out_dir}.lock"
	flock 9
	if all_ok "${out_dir}"; then
		printf '%s\n' "${out_dir}"
		exit 0
	fi
fi
# Build into a private folder next to the final one and rename into place, so an interrupted
# or concurrent run never leaves a half-written binary or CRD set in out_dir.
work=$(mktemp -d "${out_dir}.tmp.XXXXXX")
trap 'rm -rf "${work}"' EXIT
mkdir -p "${work}/crds"

# The tool modules are self-contained: no workspace, no vendor folder, go.sum as committed.
export GOWORK=off
# Static binaries as the upstream release images have them (and no C toolchain needed).
export CGO_ENABLED=0

# build NAME TOOLDIR MODULE: go build MODULE (its root is package main) in the wrapper module.
build() {
	local name=$1 tooldir=$2 module=$3
	(cd "${hack_dir}/tools/${tooldir}" &&
		"${GO}" build -mod=readonly -trimpath -ldflags "-s -w" -o "${work}/${name}" "${module}") ||
		die "building ${name} (${module}, hack/tools/${tooldir}) failed"
}

# copy_crds TOOLDIR MODULE GROUP NAMES...: the module's config/crd/bases/GROUP_NAME.yaml files.
copy_crds() {
	local tooldir=$1 module=$2 group=$3 dir c
	shift 3
	dir=$(cd "${hack_dir}/tools/${tooldir}" && "${GO}" list -mod=readonly -m -f '{{.Dir}}' "${module}") ||
		die "cannot locate ${module} in GOMODCACHE (hack/tools/${tooldir})"
	[[ -n ${dir} ]] || die "${module} is not downloaded (hack/tools/${tooldir})"
	for c in "$@"; do
		install -m 0644 "${dir}/config/crd/bases/${group}_${c}.yaml" "${work}/crds/" ||
			die "${module} has no config/crd/bases/${group}_${c}.yaml"
	done
}

start=${SECONDS}
log "building source-controller ${SOURCE_VERSION} and kustomize-controller ${KUSTOMIZE_VERSION} into ${out_dir} (7-16 minutes with a cold build cache)"
build source-controller flux-source github.com/fluxcd/source-controller
log "source-controller built after $((SECONDS - start))s"
build kustomize-controller flux-kustomize github.com/fluxcd/kustomize-controller
copy_crds flux-source github.com/fluxcd/source-controller source.toolkit.fluxcd.io "${source_crds[@]}"
copy_crds flux-kustomize github.com/fluxcd/kustomize-controller kustomize.toolkit.fluxcd.io "${kustomize_crds[@]}"

all_ok "${work}" || {
	"${GO}" version -m "${work}/source-controller" >&2 || true
	"${GO}" version -m "${work}/kustomize-controller" >&2 || true
	die "the freshly built binaries do not report source-controller ${SOURCE_VERSION} / kustomize-controller ${KUSTOMIZE_VERSION}"
}
mkdir -p "${out_dir}/crds"
for f in "${work}"/crds/*.yaml; do
	mv -f "${f}" "${out_dir}/crds/"
done
for bin in source-controller kustomize-controller; do
	mv -f "${work}/${bin}" "${out_dir}/${bin}"
done
all_ok "${out_dir}" || die "the files in ${out_dir} do not report the expected versions"
log "built in $((SECONDS - start))s"

printf '%s\n' "${out_dir}"
