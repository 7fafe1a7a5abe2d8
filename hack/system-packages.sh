#!/usr/bin/env bash
# Installs the system tools the tests use beside Go, git, Node.js and npm, from Debian's
# packages, when they are missing: ssh-keygen and gpg (the git tests sign commits as git does)
# and the PostgreSQL server (test/pgtest starts a throwaway one), and buildah (test/image builds
# the Dockerfile without a daemon). As root it runs apt-get; otherwise it names the packages to
# install and fails (buildah only warns: without it the image test skips, saying why).
set -euo pipefail

missing=()
command -v ssh-keygen >/dev/null || missing+=(openssh-client)
command -v gpg >/dev/null || missing+=(gnupg)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null || missing+=(postgresql)
if ! command -v buildah >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing+=(buildah)
  else
    echo "system-packages: buildah is missing (Debian: sudo apt-get install buildah); the image test will skip" >&2
  fi
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "system-packages: installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
  exit 0
fi
echo "system-packages: missing ${missing[*]}: install them (Debian: sudo apt-get install ${missing[*]}) and run make test again" >&2
exit 1
