#!/usr/bin/env bash
# Provide NVIDIA's perf_analyzer, the reference client of `make bench`, in one directory printed on the last stdout
# line (progress goes to stderr):
#   perf_analyzer  the binary of the tritonclient $TRITONCLIENT_VERSION manylinux wheel (the release of the server's
#                  Triton; newer wheels need a newer glibc than Debian 12's), run by a wrapper that puts its two
#                  libraries on LD_LIBRARY_PATH: libb64.so.0d from Debian's libb64-0d (unpacked, not installed) and
#                  libcudart.so.12 from PyPI's nvidia-cuda-runtime-cu12 (it loads without a GPU; nothing calls it).
#
# Cached in ${INFEROP_CACHE:-$HOME/.cache/inferop}/perf-analyzer, once (about 15 MB of downloads, seconds).
# --no-build: never fetch; exit 3 when nothing is ready.
set -euo pipefail

TRITONCLIENT_VERSION=2.51.0
CUDART_VERSION=12.9.79
PYTHON=${PYTHON:-python3}
DIR="${INFEROP_CACHE:-$HOME/.cache/inferop}/perf-analyzer"
FETCH="$(cd "$(dirname "$0")" && pwd)/fetch.py"

log() { echo "perf-analyzer: $*" >&2; }
die() { log "error: $*"; exit 1; }
ready() { [[ -x "$DIR/bin/perf_analyzer" ]]; }

if ready; then echo "$DIR/bin"; exit 0; fi
if [[ "${1:-}" == --no-build ]]; then
    log "perf_analyzer is not here: run $0 (seconds)"
    exit 3
fi
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
if ready; then echo "$DIR/bin"; exit 0; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "tritonclient $TRITONCLIENT_VERSION and nvidia-cuda-runtime-cu12 $CUDART_VERSION from PyPI, libb64-0d from apt"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    --platform manylinux2014_x86_64 --python-version 3.11 --dest "$tmp" \
    "tritonclient==$TRITONCLIENT_VERSION" "nvidia-cuda-runtime-cu12==$CUDART_VERSION" >&2
chmod a+rwx "$tmp"  # apt downloads as user _apt where it can
(cd "$tmp" && apt-get download libb64-0d >&2) || die "apt-get could not download libb64-0d (Debian 12)"
dpkg-deb -x "$tmp"/libb64-0d_*.deb "$tmp/libb64"

rm -rf "$DIR/lib" "$DIR/libexec" "$DIR/bin"
"$PYTHON" "$FETCH" unzip "$tmp"/tritonclient-*.whl "tritonclient-$TRITONCLIENT_VERSION.data/data/bin/perf_analyzer" \
    "$DIR/libexec/perf_analyzer"
"$PYTHON" "$FETCH" unzip "$tmp"/nvidia_cuda_runtime_cu12-*.whl nvidia/cuda_runtime/lib/libcudart.so.12 \
    "$DIR/lib/libcudart.so.12"
install -m 0644 "$tmp"/libb64/usr/lib/*/libb64.so.0d "$DIR/lib/"
mkdir -p "$DIR/bin.tmp"
cat >"$DIR/bin.tmp/perf_analyzer" <<WRAPPER
#!/bin/sh
LD_LIBRARY_PATH="$DIR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$DIR/libexec/perf_analyzer" "\$@"
WRAPPER
chmod 0755 "$DIR/bin.tmp/perf_analyzer"
version=$("$DIR/bin.tmp/perf_analyzer" --version 2>&1) || die "perf_analyzer does not run: $version"
[[ $version == *"$TRITONCLIENT_VERSION"* ]] || die "perf_analyzer says $version, not $TRITONCLIENT_VERSION"
mv "$DIR/bin.tmp" "$DIR/bin"
log "$version"
echo "$DIR/bin"
