#!/usr/bin/env bash
# End to end on a kind cluster (`make e2e-kind`): build the operator image and a model image, load both
# into a fresh kind cluster, install the chart, apply an InferenceService whose model comes from the image
# (storageUri: oci://), wait until it is Ready, port-forward and call it with `inferop infer`. The cluster,
# the images it built and its temporary files are deleted on exit, whatever happened.
#
# Needs Docker (a reachable daemon) and kind; helm and kubectl come from scripts/helm-kubectl.sh, the
# client from the project's venv (make install). The nodes pull the Triton image (several GB) unless the
# local Docker holds it already, in which case it is loaded from there.
#
# Environment:
#   INFEROP_KIND_CLUSTER        cluster name (default inferop-e2e; an existing cluster of that name is refused)
#   INFEROP_TRITON_IMAGE        Triton image (default: the chart's tritonImage)
#   INFEROP_E2E_READY_SECONDS   how long the InferenceService may take to become Ready (default 1200)
#   INFEROP_E2E_KEEP=1          keep the cluster and images for debugging (delete with `kind delete cluster`)
#   PYTHON                      interpreter with inferop installed (default .venv/bin/python)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CLUSTER=${INFEROP_KIND_CLUSTER:-inferop-e2e}
READY_SECONDS=${INFEROP_E2E_READY_SECONDS:-1200}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
MODEL=conv_net
SERVICE=conv-net
OPERATOR_IMAGE=inferop/operator:e2e
MODEL_IMAGE=inferop/model-conv-net:e2e
SYSTEM_NS=inferop-system
APP_NS=inferop-e2e

log() { echo "e2e-kind: $*" >&2; }
die() { log "error: $*"; exit 2; }

# --- what is needed, said plainly ------------------------------------------------------------------------
command -v docker >/dev/null || die "docker not found: install Docker Engine (https://docs.docker.com/engine/install/)"
docker info >/dev/null 2>&1 || die "docker cannot reach its daemon: start it, or give this user access to it"
command -v kind >/dev/null \
    || die "kind not found: install it (https://kind.sigs.k8s.io/docs/user/quick-start/#installation, e.g. go install sigs.k8s.io/kind@latest)"
[[ -x $PYTHON ]] || die "$PYTHON not found: run make install"
TOOLS=$(bash scripts/helm-kubectl.sh | tail -n 1)
export PATH="$TOOLS:$PATH"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    die "a kind cluster named $CLUSTER exists already: delete it (kind delete cluster --name $CLUSTER) or set INFEROP_KIND_CLUSTER"
fi
TRITON_IMAGE=${INFEROP_TRITON_IMAGE:-$(sed -n 's/^tritonImage: *//p' charts/inferop/values.yaml)}

WORK=$(mktemp -d)
export KUBECONFIG="$WORK/kubeconfig"
PF_PID=
CREATED=

cleanup() {
    local status=$?
    set +e
    [[ -n $PF_PID ]] && kill "$PF_PID" 2>/dev/null
    if [[ $status -ne 0 && -n $CREATED ]]; then
        log "failed (exit $status); what the cluster says:"
        kubectl get pods,deployments,inferenceservices -A -o wide >&2
        kubectl -n "$APP_NS" describe inferenceservice "$SERVICE" >&2
        kubectl -n "$APP_NS" logs "deployment/$SERVICE" --all-containers --tail=50 >&2
        kubectl -n "$SYSTEM_NS" logs deployment/inferop --tail=50 >&2
    fi
    if [[ ${INFEROP_E2E_KEEP:-} == 1 ]]; then
        log "kept cluster $CLUSTER and images (INFEROP_E2E_KEEP=1); kubeconfig: kind get kubeconfig --name $CLUSTER"
    else
        [[ -n $CREATED ]] && kind delete cluster --name "$CLUSTER" >&2
        docker image rm "$OPERATOR_IMAGE" "$MODEL_IMAGE" >/dev/null 2>&1
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- images --------------------------------------------------------------------------------------------
if [[ ! -d model_repo/$MODEL ]]; then
    log "exporting $MODEL into model_repo (needs the export distribution, export/: make install)"
    "$PYTHON" -m inferop_core.cli export "$MODEL" --repo model_repo >&2
fi
log "building $OPERATOR_IMAGE"
docker build --quiet -f operator/Dockerfile -t "$OPERATOR_IMAGE" . >&2
bash scripts/package-model.sh "$MODEL" "$MODEL_IMAGE" >&2

# --- cluster -------------------------------------------------------------------------------------------
log "creating kind cluster $CLUSTER"
CREATED=1
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 180s >&2
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$MODEL_IMAGE" >&2
if docker image inspect "$TRITON_IMAGE" >/dev/null 2>&1; then
    log "loading $TRITON_IMAGE from the local Docker"
    kind load docker-image --name "$CLUSTER" "$TRITON_IMAGE" >&2
else
    log "the node pulls $TRITON_IMAGE (several GB) when the InferenceService starts"
fi

# --- chart: kind has a kubelet, so --wait means the operator really runs --------------------------------
helm install inferop charts/inferop --namespace "$SYSTEM_NS" --create-namespace \
    --set image.repository="${OPERATOR_IMAGE%:*}" --set image.tag="${OPERATOR_IMAGE##*:}" \
    --set image.pullPolicy=Never --set tritonImage="$TRITON_IMAGE" \
    --wait --timeout 5m >&2

# --- the example, with its model from the image and a footprint one kind node can hold ---------------------
kubectl create namespace "$APP_NS" >&2
"$PYTHON" - "operator/examples/conv-net.yaml" "oci://$MODEL_IMAGE" >"$WORK/service.yaml" <<'PY'
import sys
import yaml

manifest = yaml.safe_load(open(sys.argv[1]))
spec = manifest["spec"]
spec["model"]["storageUri"] = sys.argv[2]
spec["instances"] = 1
spec["resources"] = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
spec["timeouts"]["startupSeconds"] = 300
print(yaml.safe_dump(manifest, sort_keys=False))
PY
kubectl apply -n "$APP_NS" -f "$WORK/service.yaml" >&2
# Polled rather than `kubectl wait`, which fails at once while the status has no conditions yet.
log "waiting up to ${READY_SECONDS}s for $SERVICE to become Ready"
deadline=$((SECONDS + READY_SECONDS))
ready_jsonpath='{.status.conditions[?(@.type=="Ready")].status}'
until [[ $(kubectl get -n "$APP_NS" inferenceservice "$SERVICE" -o jsonpath="$ready_jsonpath") == True ]]; do
    ((SECONDS < deadline)) || die "$SERVICE not Ready after ${READY_SECONDS}s"
    sleep 5
done
kubectl get -n "$APP_NS" inferenceservice "$SERVICE" >&2

# --- call it ---------------------------------------------------------------------------------------------
PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
kubectl -n "$APP_NS" port-forward "service/$SERVICE" "$PORT:8000" >"$WORK/port-forward.log" 2>&1 &
PF_PID=$!
for _ in $(seq 1 60); do
    if "$PYTHON" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$PORT/v2/health/ready', timeout=2)" 2>/dev/null; then
        break
    fi
    kill -0 "$PF_PID" 2>/dev/null || { cat "$WORK/port-forward.log" >&2; die "kubectl port-forward exited"; }
    sleep 1
done
"$PYTHON" -m inferop_core.cli infer --url "127.0.0.1:$PORT" --model "$MODEL"
log "passed: $SERVICE served from oci://$MODEL_IMAGE on kind"
