#!/usr/bin/env bash
# Provide a current Kubernetes control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl at 1.37.2 and etcd 3.6.17) in one directory and print it on the last stdout line (progress goes to
# stderr).
#
# The binaries are built from the Go module proxy into ${INFEROP_CACHE:-$HOME/.cache/inferop}/kube-1.37/bin,
# once; a filled cache answers in milliseconds. Binaries on PATH or in $KUBEBUILDER_ASSETS are not used:
# their version is unknown, and this script exists to pin one. k8s.io/kubernetes replaces its staging
# modules with ./staging/..., and a dependency's replaces are ignored, so a throw-away wrapper module
# requires k8s.io/kubernetes and maps each staging module to its published v0 release. The module and
# build caches are private to the build directory (so the download can be measured) and removed afterwards.
# Measured with Go 1.26.8 on 2 cores shared with a test suite: 19 minutes, 226 MiB of modules downloaded
# (1.1 GiB unpacked, 4 GiB of build cache on the way), 301 MiB of static binaries.
#
# --no-build: never build; exit 3 when no binaries are ready (for test suites that skip instead).
set -euo pipefail

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.6.17  # the docs quote it, written from here (python -m inferop_devtools.docs)
KUBE_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
NEEDED=("${KUBE_COMMANDS[@]}" etcd)
SCRIPT=kube-current
CACHE="${INFEROP_CACHE:-$HOME/.cache/inferop}/kube-1.37"
WHAT="Kubernetes ${KUBE_VERSION#v} binaries"
BUILD_TIME="about 20 minutes on 2 cores"
# shellcheck source=scripts/go-cache.sh
source "$(dirname "$0")/go-cache.sh"
go_cache_begin "$@"

# go build at the lowest priority: the machine is shared with test suites. The tags are those of Kubernetes'
# own release builds (hack/lib/golang.sh).
timed_build() {
    local name=$1 package=$2 ldflags=$3 start=$SECONDS
    log "building $name ($package)"
    nice -n 19 go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$ldflags" \
        -o "$BIN/.$name.tmp" "$package" >&2
    mv "$BIN/.$name.tmp" "$BIN/$name"
    log "built $name in $((SECONDS - start)) s, $(du -h "$BIN/$name" | cut -f1)"
}

build_kubernetes() {
    has_all "${KUBE_COMMANDS[@]}" && return
    local wrapper="$BUILD/kubernetes" source staging minor ldflags name start
    log "downloading k8s.io/kubernetes@$KUBE_VERSION"
    source=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | awk -F'"' '$2 == "Dir" { print $4 }')
    [[ -d $source ]] || die "k8s.io/kubernetes@$KUBE_VERSION did not download"
    staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$source/go.mod")
    [[ -n $staging ]] || die "no staging replaces found in $source/go.mod"
    use_go_for "$(go_directive "$source/go.mod")"
    log "using $(go version)"

    mkdir -p "$wrapper"
    {
        echo "module inferop.invalid/kube-build"
        echo
        echo "go $(go_directive "$source/go.mod")"
        grep '^godebug ' "$source/go.mod" || true
        echo
        echo "require k8s.io/kubernetes $KUBE_VERSION"
        echo
        echo "replace ("
        for name in $staging; do echo "	$name => $name v0.${KUBE_VERSION#v1.}"; done
        echo ")"
        echo
        echo "tool ("
        for name in "${KUBE_COMMANDS[@]}"; do echo "	k8s.io/kubernetes/cmd/$name"; done
        echo ")"
    } >"$wrapper/go.mod"
    log "$(wc -w <<<"$staging") staging modules mapped to v0.${KUBE_VERSION#v1.}; resolving the module graph"
    start=$SECONDS
    (cd "$wrapper" && nice -n 19 go mod tidy >&2)
    log "module graph resolved and downloaded in $((SECONDS - start)) s"

    minor=${KUBE_VERSION#v1.}
    minor=${minor%%.*}
    ldflags="-s -w"
    for name in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $name.gitVersion=$KUBE_VERSION -X $name.gitMajor=1 -X $name.gitMinor=$minor"
        ldflags+=" -X $name.gitTreeState=clean -X $name.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    for name in "${KUBE_COMMANDS[@]}"; do
        [[ -x "$BIN/$name" ]] && continue
        (cd "$wrapper" && timed_build "$name" "k8s.io/kubernetes/cmd/$name" "$ldflags")
    done
}

build_etcd() {
    has_all etcd && return
    local wrapper="$BUILD/etcd" version source
    # etcd's server module requires its sibling modules at exact versions; its replaces only point them at
    # its own checkout, so the wrapper needs nothing but the requirement.
    version=$ETCD_VERSION
    log "etcd $version"
    source=$(go mod download -json "go.etcd.io/etcd/server/v3@$version" | awk -F'"' '$2 == "Dir" { print $4 }')
    use_go_for "$(go_directive "$source/go.mod")"
    mkdir -p "$wrapper"
    printf 'module inferop.invalid/etcd-build\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n\ntool go.etcd.io/etcd/server/v3\n' \
        "$(go_directive "$source/go.mod")" "$version" >"$wrapper/go.mod"
    (cd "$wrapper" && nice -n 19 go mod tidy >&2)
    (cd "$wrapper" && timed_build etcd go.etcd.io/etcd/server/v3 "-s -w")
}

build_kubernetes
build_etcd
go_cache_finish
