#!/usr/bin/env bash
# Installs the real MCP servers (and the TypeScript MCP SDK) that the tests run, pinned in
# test/upstreams/package.json + package-lock.json, with `npm ci` into test/upstreams/node_modules,
# and prints that node_modules folder (and nothing else) on stdout, for REVERSI_UPSTREAMS:
#
#   export REVERSI_UPSTREAMS="$(hack/upstreams.sh)"
#
# Progress goes to stderr. The install is skipped when node_modules holds a stamp with the
# sha256 of the current package-lock.json (about 0.1 s); otherwise node_modules is rebuilt from
# the lock file exactly (npm ci), which takes about 8 s on 2 cores (npm cache warm or cold).
# Concurrent runs are serialised with flock(1) when it is available. Needs Node.js >= 20 and npm.
set -euo pipefail

hack_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir="$(cd "${hack_dir}/../test/upstreams" && pwd)"
modules="${dir}/node_modules"
stamp="${modules}/.reversi-lock.sha256"

log() { printf 'upstreams: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

command -v node >/dev/null 2>&1 || die "node not found on PATH (Node.js >= 20 is needed for the test upstreams)"
command -v npm >/dev/null 2>&1 || die "npm not found on PATH (it comes with Node.js)"
[ -f "${dir}/package-lock.json" ] || die "${dir}/package-lock.json is missing"

lock_sum() { sha256sum "${dir}/package-lock.json" | cut -d' ' -f1; }
installed() { [ -f "${stamp}" ] && [ "$(cat "${stamp}")" = "$(lock_sum)" ]; }

if installed; then
	printf '%s\n' "${modules}"
	exit 0
fi

node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "${node_major}" -ge 20 ] || die "Node.js $(node --version) is too old; the test upstreams need >= 20"

# One installer at a time (parallel `make test` runs share this folder). The lock is held on
# the folder itself, so no lock file is left in the repository.
if command -v flock >/dev/null 2>&1; then
	exec 9<"${dir}"
	flock 9
	if installed; then # another run finished the install while we waited
		printf '%s\n' "${modules}"
		exit 0
	fi
fi

sum=$(lock_sum)
log "installing test/upstreams (npm ci, lock sha256 ${sum:0:12}) ..."
# test/upstreams/.npmrc keeps registry host names out of the lock file; npm ci never rewrites it.
(cd "${dir}" && npm ci --no-audit --no-fund --loglevel=error >&2) || die "npm ci failed in ${dir}"
printf '%s\n' "${sum}" >"${stamp}"
log "installed into ${modules}"
printf '%s\n' "${modules}"
