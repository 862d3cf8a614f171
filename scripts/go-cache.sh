# Sourced by the scripts that build Go programs from the module proxy into a cache (kube-current.sh,
# kube-addons.sh). The caller sets SCRIPT (its name, for log lines), CACHE, NEEDED (the binaries), WHAT and
# BUILD_TIME (what to say when they are missing), then calls go_cache_begin "$@": it prints the bin directory
# and exits when everything is built (or exits 3 under --no-build when not), and otherwise takes the build lock
# and leaves the shell in a fresh build directory with private module and build caches (so the download can be
# measured). After its builds it calls go_cache_finish.
# shellcheck shell=bash

BIN="$CACHE/bin"
BUILD="$CACHE/build"
# Downloads checked against their registries (absolute: the builds run in $BUILD).
FETCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/fetch.py"
# The Go the proxy serves when a module asks for more than the machine's own.
NEWER_TOOLCHAIN=go1.27.3
# The Go fetched into the cache where the machine has none, or one older than the builds need (Debian 12's is 1.19).
GO_VERSION=1.26.8
GO_NEEDED=1.26

log() { echo "$SCRIPT: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Whether every binary named is built.
has_all() {
    local name
    for name in "$@"; do [[ -x "$BIN/$name" ]] || return 1; done
}

# The module cache is read-only: make it writable before removing it.
remove_build() { chmod -R u+w "$BUILD" 2>/dev/null || true; rm -rf "$BUILD"; }

# Whether the go command on PATH is at least Go $1.
go_at_least() {
    local have
    have=$(go env GOVERSION 2>/dev/null) || return 1
    have=${have#go}
    [[ $(printf '%s\n%s\n' "$1" "$have" | sort -V | head -n1) == "$1" ]]
}

# Put a Go new enough first on PATH: the machine's, else Go's toolchain from the module proxy (checked against the
# checksum database by fetch.py), fetched once into the cache (about 75 MB, seconds).
use_go() {
    command -v go >/dev/null && go_at_least "$GO_NEEDED" && return
    local root="${INFEROP_CACHE:-$HOME/.cache/inferop}/go/go$GO_VERSION"
    if [[ ! -x $root/bin/go ]]; then
        log "no Go $GO_NEEDED or newer on PATH: fetching Go $GO_VERSION from the Go module proxy into $root"
        python3 "$FETCH" go "$GO_VERSION" "$root" || die "no Go to build with"
    fi
    export PATH="$root/bin:$PATH"
    go_at_least "$GO_NEEDED" || die "$root/bin/go is not Go $GO_NEEDED or newer: $(go version 2>&1)"
}

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
    use_go
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
        "$(du -sh "$GOMODCACHE" | cut -f1) module cache unpacked, $(du -sh "$GOCACHE" 2>/dev/null | cut -f1) build cache"
    log "removing the build directory"
    cd "$CACHE" || exit 1
    remove_build
    log "ready in $((SECONDS - BUILD_START)) s: $BIN"
    echo "$BIN"
}

# Switch to the proxy's newer toolchain only when a go.mod asks for more than the local go.
use_go_for() {
    local needed=$1
    if ! go_at_least "$needed"; then
        log "go $needed needed, $(go env GOVERSION) here: using $NEWER_TOOLCHAIN from the module proxy"
        export GOTOOLCHAIN=$NEWER_TOOLCHAIN
    fi
}

go_directive() { awk '$1 == "go" { print $2; exit }' "$1"; }

downloaded_kib() { du -sk "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1 || echo 0; }

# Build `package` of `module`@`version` into $BIN/`name`, once: a throw-away wrapper module that requires the module
# (its graph is then exactly the module's own go.mod, which must have no replace directives), built at the lowest
# priority (the machine is shared with test suites). `version_variable` is set to the version with -X, or `-`.
build_from_module() {
    local name=$1 module=$2 version=$3 package=$4 version_variable=$5 wrapper="$BUILD/$1" ldflags="-s -w"
    local source start=$SECONDS before
    [[ -x "$BIN/$name" ]] && return
    before=$(downloaded_kib)
    log "downloading $module@$version"
    source=$(go mod download -json "$module@$version" | awk -F'"' '$2 == "Dir" { print $4 }')
    [[ -d $source ]] || die "$module@$version did not download"
    grep -q '^replace\|=>' "$source/go.mod" &&
        die "$module@$version has replace directives now: map them in the wrapper module"
    use_go_for "$(go_directive "$source/go.mod")"
    mkdir -p "$wrapper"
    printf 'module inferop.invalid/%s-build\n\ngo %s\n\nrequire %s %s\n\ntool %s\n' \
        "$name" "$(go_directive "$source/go.mod")" "$module" "$version" "$package" >"$wrapper/go.mod"
    (cd "$wrapper" && nice -n 19 go mod tidy >&2)
    [[ $version_variable == - ]] || ldflags+=" -X $version_variable=$version"
    log "building $name ($package, $(go version | cut -d' ' -f3))"
    (cd "$wrapper" && nice -n 19 go build -trimpath -ldflags="$ldflags" -o "$BIN/.$name.tmp" "$package" >&2)
    mv "$BIN/.$name.tmp" "$BIN/$name"
    log "built $name $version in $((SECONDS - start)) s: $(($(downloaded_kib) - before)) KiB newly downloaded," \
        "binary $(du -h "$BIN/$name" | cut -f1)"
}

# Build the main package of `dir`, a module of this repository whose go.mod and go.sum pin every dependency, into
# $BIN/`name`, once, from a copy in the build directory, at the lowest priority.
build_from_source() {
    local name=$1 dir=$2 start=$SECONDS before
    [[ -x "$BIN/$name" ]] && return
    before=$(downloaded_kib)
    cp -r "$dir" "$BUILD/$name"
    use_go_for "$(go_directive "$BUILD/$name/go.mod")"
    log "building $name ($dir, $(go version | cut -d' ' -f3))"
    (cd "$BUILD/$name" && nice -n 19 go build -mod=readonly -trimpath -ldflags="-s -w" -o "$BIN/.$name.tmp" . >&2)
    mv "$BIN/.$name.tmp" "$BIN/$name"
    log "built $name in $((SECONDS - start)) s: $(($(downloaded_kib) - before)) KiB newly downloaded," \
        "binary $(du -h "$BIN/$name" | cut -f1)"
}
