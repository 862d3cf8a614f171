#!/usr/bin/env bash
# Provide a real Prometheus server and promtool and print their paths, promtool on the last stdout line
# (progress goes to stderr). Ones already on PATH are used as they are; elsewhere Debian bookworm's
# `prometheus` package (2.42) is installed with apt-get, once: a second run only looks them up.
#
# The tests run Prometheus as a plain process of their own (inferop/prometheus.py); the package's service
# is not wanted, so the install leaves no daemon running.
set -euo pipefail

LOCK="${INFEROP_CACHE:-$HOME/.cache/inferop}/prometheus.lock"
LOG="${INFEROP_CACHE:-$HOME/.cache/inferop}/prometheus-install.log"

log() { echo "prometheus: $*" >&2; }
die() { log "error: $*"; exit 1; }

ready() { command -v prometheus >/dev/null && command -v promtool >/dev/null; }
report() {
    command -v prometheus
    command -v promtool
}

if ready; then
    report
    exit 0
fi
mkdir -p "$(dirname "$LOCK")"
exec 9>"$LOCK"
flock 9
if ready; then
    report
    exit 0
fi

command -v apt-get >/dev/null ||
    die "prometheus/promtool not on PATH and no apt-get to install Debian's prometheus package: install Prometheus 2.x"
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "installing Debian's prometheus package needs root (or sudo)"
    SUDO=(sudo)
fi
# env, because sudo drops the caller's environment; apt waits for another apt/dpkg instead of failing.
APT=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)

# Keep the package's postinst from starting its service: a policy-rc.d that refuses (exit 101) does that,
# with or without systemd. One the machine already has is left alone.
POLICY=/usr/sbin/policy-rc.d
if [[ ! -e "$POLICY" ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY" >/dev/null
    "${SUDO[@]}" chmod 0755 "$POLICY"
    trap '"${SUDO[@]}" rm -f "$POLICY"' EXIT
fi
before=$(pidof prometheus || true)

log "apt-get install prometheus (about 100 MB; log: $LOG)"
if ! { "${APT[@]}" update && "${APT[@]}" install -y --no-install-recommends prometheus; } >"$LOG" 2>&1; then
    tail -n 20 "$LOG" >&2
    die "apt-get install prometheus failed (full log: $LOG)"
fi

# Whatever prometheus runs now and did not before was started by the install: stop it by its id. Under
# systemd the package also enables its service for the next boot, which the tests never want.
for pid in $(pidof prometheus || true); do
    if [[ " $before " != *" $pid "* ]]; then
        log "stopping the daemon the install started (pid $pid)"
        "${SUDO[@]}" kill "$pid" || true
    fi
done
if [[ -d /run/systemd/system ]]; then
    "${SUDO[@]}" systemctl disable --now prometheus.service >&2 || true
fi

ready || die "the prometheus package installed but prometheus or promtool is not on PATH ($PATH)"
log "$(prometheus --version 2>&1 | head -n1)"
report
