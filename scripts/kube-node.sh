#!/usr/bin/env bash
# Provide what the local cluster's real node needs beside the kubelet (kube-current.sh builds that) and print the
# directory of the node's files on the last stdout line (progress goes to stderr):
#   - Debian bookworm's containerd (1.6), runc (1.1), CNI plugins (1.1: bridge, host-local, portmap, loopback),
#     iptables (kube-proxy's and kube-router's rules), ipset (kube-router's sets of pods) and conntrack, installed
#     with apt-get once;
#   - pause: the sandbox image's program, scripts/node/pause.c compiled static;
#   - busybox: Debian's busybox-static, unpacked without installing it, for small test images;
#   - rootfs-bookworm: a minimal Debian 12 (debootstrap's minbase) with Python 3.11, the base of the Triton and
#     operator images, as NVIDIA's and most images start from a distribution (about a minute, 180 MiB).
# Images are built from these by the cluster itself (inferop_devtools.cluster.local_images), once per content.
#
# --no-build: never install or compile; exit 3 when something is missing (for test suites that skip instead).
set -euo pipefail

DIR="${INFEROP_CACHE:-$HOME/.cache/inferop}/node"
# gcc and libc6-dev compile the sandbox's pause program, statically.
PACKAGES=(containerd runc containernetworking-plugins iptables ipset conntrack debootstrap gcc libc6-dev)
# The base image's packages beyond minbase: the interpreter the Triton python backend's stub links to, and that
# the liveness probe runs.
ROOTFS_PACKAGES=python3,libpython3.11
ROOTFS="rootfs-bookworm"
PAUSE_SOURCE="$(cd "$(dirname "$0")" && pwd)/node/pause.c"

log() { echo "kube-node: $*" >&2; }
die() { log "error: $*"; exit 1; }

installed() {
    local package
    for package in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || return 1
    done
}
# The pause program is rebuilt when its source changes: its digest is part of the file's name.
pause_name() { echo "pause-$(sha256sum "$PAUSE_SOURCE" | cut -c1-12)"; }
# The images' users, as their Dockerfiles make them: NVIDIA's triton-server (uid 1000) and the operator's inferop
# (10001, operator/Dockerfile). kopf asks for its user's name: without an /etc/passwd entry the operator exits.
USERS=("triton-server:1000" "inferop:10001")
rootfs_ready() {
    local user
    [[ -x "$DIR/$ROOTFS/usr/bin/python3" ]] || return 1
    for user in "${USERS[@]}"; do grep -q "^${user%%:*}:x:${user##*:}:" "$DIR/$ROOTFS/etc/passwd" || return 1; done
}
ready() { installed && [[ -x "$DIR/$(pause_name)" && -x "$DIR/busybox" ]] && rootfs_ready; }

finish() {
    ln -sfn "$(pause_name)" "$DIR/pause"
    echo "$DIR"
    exit 0
}

if ready; then finish; fi
if [[ "${1:-}" == --no-build ]]; then
    log "the node's packages and files are not ready: run $0 (apt-get and a compile: under a minute)"
    exit 3
fi
command -v apt-get >/dev/null || die "apt-get is needed to install ${PACKAGES[*]} (Debian 12)"
[[ $(id -u) -eq 0 ]] || die "installing the node's packages needs root"
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
if ready; then finish; fi

if ! installed; then
    log "installing ${PACKAGES[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >&2 ||
        { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >&2; } ||
        die "apt-get could not install ${PACKAGES[*]}"
    # The package starts no daemon here (no systemd), but where one runs, it is not ours: the node runs its own.
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ ! -x "$DIR/$(pause_name)" ]]; then
    gcc -static -O2 -s -o "$tmp/pause" "$PAUSE_SOURCE" || die "compiling $PAUSE_SOURCE failed (libc6-dev missing?)"
    rm -f "$DIR"/pause-*
    mv "$tmp/pause" "$DIR/$(pause_name)"
    log "pause compiled"
fi
if [[ ! -x "$DIR/busybox" ]]; then
    (cd "$tmp" && apt-get download busybox-static >&2) || die "apt-get download busybox-static failed"
    dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/busybox"
    install -m 0755 "$tmp/busybox/bin/busybox" "$DIR/busybox"
    log "busybox unpacked"
fi
if ! rootfs_ready; then
    log "debootstrap of Debian bookworm (minbase, $ROOTFS_PACKAGES): about a minute"
    rm -rf "$DIR/$ROOTFS" "$DIR/.$ROOTFS"
    debootstrap --variant=minbase --include="$ROOTFS_PACKAGES" bookworm "$DIR/.$ROOTFS" \
        http://deb.debian.org/debian >"$DIR/debootstrap.log" 2>&1 ||
        die "debootstrap failed: see $DIR/debootstrap.log"
    for user in "${USERS[@]}"; do
        name=${user%%:*} id=${user##*:}
        chroot "$DIR/.$ROOTFS" groupadd --system --gid "$id" "$name"
        chroot "$DIR/.$ROOTFS" useradd --system --uid "$id" --gid "$id" --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin "$name"
    done
    # What an image needs not carry: the downloaded packages and apt's lists.
    rm -rf "$DIR/.$ROOTFS"/var/cache/apt/archives/*.deb "$DIR/.$ROOTFS"/var/lib/apt/lists/*
    mv "$DIR/.$ROOTFS" "$DIR/$ROOTFS"
    log "$ROOTFS: $(du -sh "$DIR/$ROOTFS" | cut -f1)"
fi
finish
