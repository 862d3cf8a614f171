#!/usr/bin/env bash
# Provide the add-ons that make the bare control plane of kube-current.sh useful for end-to-end tests, in
# one directory printed on the last stdout line (progress goes to stderr):
#   kwok                the kwok controller (sigs.k8s.io/kwok/cmd/kwok, not kwokctl): it plays the kubelet
#                       for fake nodes, so scheduled pods become Running and Ready without containers
#                       (it has no built-in stages: give it those in scripts/kwok/ with --config);
#   prometheus-adapter  the custom.metrics.k8s.io server backed by Prometheus (cmd/adapter);
#   coredns             the cluster DNS of the local node (scripts/coredns: CoreDNS v1.15.0 with the plugins a
#                       cluster's DNS uses, 63 s and a 55 MiB binary, where its own main with every plugin and
#                       the cloud SDKs they bring builds several times longer);
#   kube-router         the local node's NetworkPolicy controller (cmd/kube-router, run with its firewall only: the
#                       bridge CNI enforces no policy); v2.1.0, the one version the module proxy serves here.
# (metrics-server v0.9.0 builds the same way, in 3 to 6 minutes; it is left out because nothing here can feed it:
# it scrapes each node's kubelet, and kwok's fake nodes serve no resource metrics without more configuration.)
#
# The binaries are built from the Go module proxy into
# ${INFEROP_CACHE:-$HOME/.cache/inferop}/kube-addons/bin, once; a filled cache answers in milliseconds.
# None of the modules has replace directives, so each is built from a throw-away wrapper module that
# requires it at a pinned version: the module graph is then exactly the one its own go.mod selects. The
# proxy serves the prometheus-adapter versions but no version list, so its version cannot be looked up
# and stays pinned. The module and build caches are private to the build directory (so the download can
# be measured) and removed afterwards.
# Measured with Go 1.26.8 on 2 cores shared with a test suite: about 7.5 minutes for both (kwok 4, the adapter
# 3.5), 120 MiB of static binaries (61 and 59 MiB); kube-router alone, 109 s and 135 MiB downloaded, 58 MiB
# (2 cores, nothing beside it, 2026-12-06).
#
# --no-build: never build; exit 3 when no binaries are ready (for test suites that skip instead).
set -euo pipefail

# name, module, version, main package, and the variable its release build sets to the version (- for none: kwok
# carries its version in the source, prometheus-adapter prints none).
ADDONS=(
    "kwok sigs.k8s.io/kwok v0.8.0 sigs.k8s.io/kwok/cmd/kwok -"
    "prometheus-adapter sigs.k8s.io/prometheus-adapter v0.12.0 sigs.k8s.io/prometheus-adapter/cmd/adapter -"
    "kube-router github.com/cloudnativelabs/kube-router/v2 v2.1.0 github.com/cloudnativelabs/kube-router/v2/cmd/kube-router github.com/cloudnativelabs/kube-router/v2/pkg/version.Version"
)
NEEDED=()
for addon in "${ADDONS[@]}"; do NEEDED+=("${addon%% *}"); done
NEEDED+=(coredns)
COREDNS_SOURCE="$(cd "$(dirname "$0")" && pwd)/coredns"
SCRIPT=kube-addons
CACHE="${INFEROP_CACHE:-$HOME/.cache/inferop}/kube-addons"
WHAT="add-on binaries"
BUILD_TIME="about 10.5 minutes on 2 cores"
# shellcheck source=scripts/go-cache.sh
source "$(dirname "$0")/go-cache.sh"
go_cache_begin "$@"

for addon in "${ADDONS[@]}"; do
    # shellcheck disable=SC2086 # the fields are single words
    build_from_module $addon
done
build_from_source coredns "$COREDNS_SOURCE"
go_cache_finish
