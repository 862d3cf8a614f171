#!/usr/bin/env bash
# Package one model directory of a Triton repository as an OCI image that an InferenceService consumes with
#   storageUri: oci://IMAGE
# The image is busybox with the model directory at /model: the operator's fetch-model init container runs
# `cp -R /model/. <emptyDir>` in it (operator/inferop_operator/builders.py), so the image needs a shell, cp
# and files readable by any user (the pod runs as UID 1000 with a read-only root filesystem).
#
# usage: scripts/package-model.sh [--repo DIR] [--push] [--context-only DIR] MODEL IMAGE
#   MODEL             directory name in the repository, e.g. conv_net (from `inferop export conv_net`)
#   IMAGE             image reference to build, e.g. registry.example/models/conv-net:1
#   --repo DIR        the Triton model repository (default: model_repo)
#   --push            push the image after building it
#   --context-only D  write the build context (Dockerfile + model/) to D and stop: no container engine needed
# Environment: DOCKER (default docker; podman works too), BASE_IMAGE (default busybox:1.36.1).
set -euo pipefail

DOCKER=${DOCKER:-docker}
BASE_IMAGE=${BASE_IMAGE:-busybox:1.36.1}
REPO=model_repo
PUSH=
CONTEXT_ONLY=

log() { echo "package-model: $*" >&2; }
die() { log "error: $*"; exit 2; }
usage() { sed -n '/^# usage:/,/^# Environment/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

args=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --repo) REPO=${2:?--repo needs a directory}; shift 2 ;;
        --push) PUSH=1; shift ;;
        --context-only) CONTEXT_ONLY=${2:?--context-only needs a directory}; shift 2 ;;
        -h|--help) usage ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) args+=("$1"); shift ;;
    esac
done
[[ ${#args[@]} -eq 2 ]] || usage
MODEL=${args[0]}
IMAGE=${args[1]}
SOURCE="$REPO/$MODEL"

[[ -d $SOURCE ]] || die "$SOURCE is not a directory (export it first: inferop export $MODEL --repo $REPO)"
[[ $MODEL =~ ^[a-zA-Z0-9_.-]+$ ]] || die "model name '$MODEL' must match [a-zA-Z0-9_.-]+ (it is Triton's URL path)"
shopt -s nullglob
versions=("$SOURCE"/[0-9]*/)
[[ ${#versions[@]} -gt 0 ]] || die "$SOURCE holds no version directory (e.g. $SOURCE/1/model.onnx)"
for version in "${versions[@]}"; do
    files=("$version"*)
    [[ ${#files[@]} -gt 0 ]] || die "version directory $version is empty"
done
[[ -f $SOURCE/config.pbtxt ]] && log "note: $SOURCE/config.pbtxt is packaged too, but the operator serves the config it renders from the InferenceService spec"

if [[ -n $CONTEXT_ONLY ]]; then
    context=$CONTEXT_ONLY
    mkdir -p "$context"
else
    command -v "$DOCKER" >/dev/null || die "$DOCKER not found: install Docker (or set DOCKER=podman), or use --context-only"
    "$DOCKER" info >/dev/null 2>&1 || die "$DOCKER cannot reach its daemon (is it running? may this user use it?)"
    context=$(mktemp -d)
    trap 'rm -rf "$context"' EXIT
fi
rm -rf "$context/model"
# -L: links are followed, the image holds the files themselves.
cp -RL "$SOURCE" "$context/model"
chmod -R a+rX "$context/model"
cat >"$context/Dockerfile" <<DOCKERFILE
FROM $BASE_IMAGE
COPY model/ /model/
LABEL org.opencontainers.image.title="inferop model $MODEL" \\
      org.opencontainers.image.description="Triton model directory $MODEL at /model, for storageUri: oci://" \\
      dev.inferop.model="$MODEL"
USER 65534:65534
DOCKERFILE

if [[ -n $CONTEXT_ONLY ]]; then
    log "build context written to $context"
    exit 0
fi
log "building $IMAGE from $SOURCE ($(du -sh "$context/model" | cut -f1))"
"$DOCKER" build --quiet -t "$IMAGE" "$context" >&2
if [[ -n $PUSH ]]; then
    log "pushing $IMAGE"
    "$DOCKER" push "$IMAGE" >&2
fi
echo "storageUri: oci://$IMAGE"
