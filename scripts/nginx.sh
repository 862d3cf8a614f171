#!/usr/bin/env bash
# Provide an nginx binary for the hostile-requests drill's ingress and print its path on the last stdout line
# (progress goes to stderr). One already on PATH is used as it is; elsewhere Debian's `nginx` package is
# downloaded with apt-get and unpacked into the cache, once: nothing is installed, no daemon is started.
set -euo pipefail

CACHE="${INFEROP_CACHE:-$HOME/.cache/inferop}"
ROOT="$CACHE/nginx"
BINARY="$ROOT/root/usr/sbin/nginx"

log() { echo "nginx: $*" >&2; }
die() { log "error: $*"; exit 1; }

if command -v nginx >/dev/null; then
    command -v nginx
    exit 0
fi
if [[ -x "$BINARY" ]]; then
    echo "$BINARY"
    exit 0
fi
command -v apt-get >/dev/null || die "no nginx on PATH and no apt-get to download Debian's nginx package"
mkdir -p "$ROOT"
exec 9>"$ROOT.lock"
flock 9
if [[ ! -x "$BINARY" ]]; then
    log "apt-get download nginx (about 1 MB), unpacked into $ROOT"
    (cd "$ROOT" && rm -f nginx_*.deb && apt-get download nginx >&2) || die "apt-get download nginx failed"
    dpkg-deb -x "$ROOT"/nginx_*.deb "$ROOT/root"
fi
"$BINARY" -v 2>&1 | sed 's/^/nginx: /' >&2 || die "$BINARY does not run (a missing library?)"
echo "$BINARY"
