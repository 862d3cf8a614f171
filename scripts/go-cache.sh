# Sourced by the scripts that build Go programs from the module proxy into a cache (kube-current.sh,
# kube-addons.sh). The caller sets SCRIPT (its name, for log lines), CACHE, NEEDED (the binaries), WHAT and
# BUILD_TIME (what to say when they are missing), then calls go_cache_begin "$@": it prints the bin directory
# and exits when everything is built (or exits 3 under --no-build when not), and otherwise takes the build lock
# and leaves the shell in a fresh build directory with private module and build caches (so the download can be
# measured). After its builds it calls go_cache_finish.
# shellcheck shell=bash

BIN="$CACHE/bin"
BUILD="$CACHE/build"
# The Go the proxy serves when a module asks for more than the machine's own.
NEWER_TOOLCHAIN=go1.27.3

log() { echo "$SCRIPT: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Whether every binary named is built.
has_all() {
    local name
    for name in "$@"; do [[ -x "$BIN/$name" ]] || return 1; done
}

# The module cache is read-only: make it writable before removing it.
remove_build() { chmod -R u+w "$BUILD" 2>/dev/null || true; rm -rf "$BUILD"; }

go_cache_begin() {
    # shellcheck disable=SC2153  # NEEDED is the caller's
    if has_all "${NEEDED[@]}"; then
        echo "$BIN"
        exit 0
    fi
    if [[ "${1:-}" == --no-build ]]; then
        log "no $WHAT yet: run $0 to build them ($BUILD_TIME)"
        exit 3
    fi
    command -v go >/dev/null || die "building needs the go command (Go 1.26 or newer)"
    # One builder at a time; a second caller waits and then finds the cache filled.
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9
    if has_all "${NEEDED[@]}"; then
        echo "$BIN"
        exit 0
    fi
    remove_build
    mkdir -p "$BUILD" "$BIN"
    cd "$BUILD" || exit 1
    export GOMODCACHE="$BUILD/gomodcache" GOCACHE="$BUILD/gocache" GOPATH="$BUILD/gopath"
    # Static binaries, as Kubernetes releases them; the caller's GOFLAGS (-mod=vendor...) must not reach the
    # wrapper modules.
    export CGO_ENABLED=0 GOFLAGS=
    BUILD_START=$SECONDS
}

# After the caller's builds: check that every binary is there, report the download, remove the build directory
# and print the bin directory.
go_cache_finish() {
    has_all "${NEEDED[@]}" || die "missing after the build: $(for n in "${NEEDED[@]}"; do [[ -x $BIN/$n ]] || echo -n "$n "; done)"
    log "downloaded: $(du -sh "$GOMODCACHE/cache/download" | cut -f1) (module zips and go.mod files)," \
        "$(du -sh "$GOMODCACHE" | cut -f1) module cache unpacked, $(du -sh "$GOCACHE" | cut -f1) build cache"
    log "removing the build directory"
    cd "$CACHE" || exit 1
    remove_build
    log "ready in $((SECONDS - BUILD_START)) s: $BIN"
    echo "$BIN"
}

# Switch to the proxy's newer toolchain only when a go.mod asks for more than the local go.
use_go_for() {
    local needed=$1 have
    have=$(go env GOVERSION)
    have=${have#go}
    if [[ $(printf '%s\n%s\n' "$needed" "$have" | sort -V | head -n1) != "$needed" ]]; then
        log "go $needed needed, go $have here: using $NEWER_TOOLCHAIN from the module proxy"
        export GOTOOLCHAIN=$NEWER_TOOLCHAIN
    fi
}

go_directive() { awk '$1 == "go" { print $2; exit }' "$1"; }

downloaded_kib() { du -sk "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1 || echo 0; }
