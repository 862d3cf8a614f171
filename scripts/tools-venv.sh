#!/usr/bin/env bash
# Provide a separate virtual environment with the chart's checkers and print its bin directory on the last
# stdout line (progress goes to stderr). Cached in ${INFEROP_CACHE:-$HOME/.cache/inferop}/tools-venv: a
# second run only compares the stamp.
#
# Why a venv of its own: checkov pins many libraries exactly, which must not decide the project's versions;
# and the project's kubernetes-validate no longer ships the Kubernetes 1.20 schemas (1.28.x is the last
# release that does), so the old release lives here, beside checkov, for the 1.20 check.
set -euo pipefail

CHECKOV=checkov==3.3.30
VALIDATE=kubernetes-validate==1.28.3
PYTHON=${PYTHON:-python3}
VENV="${INFEROP_CACHE:-$HOME/.cache/inferop}/tools-venv"
STAMP="$VENV/.installed"
WANT="$CHECKOV $VALIDATE"

log() { echo "tools-venv: $*" >&2; }
die() { log "error: $*"; exit 1; }

ready() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/checkov" ]]; }

if ready; then
    echo "$VENV/bin"
    exit 0
fi
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if ready; then
    echo "$VENV/bin"
    exit 0
fi

command -v "$PYTHON" >/dev/null || die "$PYTHON not found"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" || die "$PYTHON -m venv failed (apt-get install python3-venv)"
log "pip install $WANT (about a minute the first time; log: $VENV.log)"
if ! "$VENV/bin/pip" install --disable-pip-version-check $CHECKOV $VALIDATE >"$VENV.log" 2>&1; then
    tail -n 20 "$VENV.log" >&2
    die "pip install $WANT failed (full log: $VENV.log)"
fi
"$VENV/bin/checkov" --version >/dev/null || die "checkov does not start"
echo "$WANT" >"$STAMP"
log "checkov $("$VENV/bin/checkov" --version), $VALIDATE"
echo "$VENV/bin"
