# The documented verbs. Everything heavy is cached: a second run only re-checks stamps.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CACHE ?= $(HOME)/.cache/inferop
export INFEROP_CACHE := $(CACHE)
# Where the chart and the tests find helm and kubectl, the control planes' binaries (1.20 and the current release, with
# the kubelet and kube-proxy), the node's runtime (containerd, runc, the CNI plugins, a Debian root filesystem for its
# images), the cluster add-ons (kwok, prometheus-adapter), the gateway (Envoy Gateway, Envoy, Gateway API's CRDs) and
# an S3 server (versitygw). On a fresh machine the builds take about 25 minutes once (docs/operations/local-cluster.md).
TOOLS_STAMP := $(CACHE)/.tools-ready

.PHONY: help install demo test unit check lint format bench field drills tools e2e-kind crd docs clean

help:
	@echo "make demo      export both models, serve them with tritonserver, call and benchmark them"
	@echo "make test      unit and integration tests (real tritonserver, control plane, helm)"
	@echo "make check     ruff, mypy, import contracts, drift of generated files (CRD, dashboard, reference pages), the docs site built strictly"
	@echo "make docs      write the generated pages and dashboard again and build the docs site (out/site)"
	@echo "make bench     speed and memory figures, as ratios measured in one run"
	@echo "make field     the four field failures under a pod's limits, naive against inferop (out/field/report.md)"
	@echo "make drills    bad specs, operator kills, control-plane restarts, hostile requests, 1,000 services, rollouts through a real gateway (out/drills/report.md)"
	@echo "make e2e-kind  end to end on a kind cluster (needs Docker and kind)"

install: $(STAMP)

# One distribution per top-level folder (core/, the local runtime here, operator/, export/, devtools/), all five
# editable in one step: the runtime's serve extra (tritonserver) and dev extra (checkers), export's torch and ONNX.
DISTRIBUTIONS := core/pyproject.toml pyproject.toml operator/pyproject.toml export/pyproject.toml devtools/pyproject.toml

$(STAMP): $(DISTRIBUTIONS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	# -qq: errors only. Each editable build's notice ("Please be careful with folders in your working directory...",
	# ten lines for each of the five) goes; a failed build still prints its error and the backend's own output.
	$(BIN)/pip install -qq -e ./core -e '.[serve,dev]' -e ./operator -e ./export -e ./devtools
	# A venv made when the root distribution owned the `inferop` script: replacing that distribution removed the
	# script the core had just written, so the core writes it again.
	test -x $(BIN)/inferop || $(BIN)/pip install -qq --no-deps --force-reinstall -e ./core
	# onnxruntime and onnxruntime-gpu install one `onnxruntime` module: a venv made before the serve extra took
	# onnxruntime-gpu keeps only that one, reinstalled over the files the other overwrote.
	if $(BIN)/pip show --quiet onnxruntime-gpu 2>/dev/null && $(BIN)/pip show --quiet onnxruntime 2>/dev/null; then \
		$(BIN)/pip uninstall --quiet --yes onnxruntime && \
		$(BIN)/pip install --quiet --force-reinstall --no-deps onnxruntime-gpu; fi
	touch $@

tools: $(TOOLS_STAMP)

$(TOOLS_STAMP): scripts/kube-binaries.sh scripts/kube-current.sh scripts/kube-addons.sh scripts/go-cache.sh \
		scripts/helm-kubectl.sh scripts/tools-venv.sh scripts/prometheus.sh scripts/gateway.sh scripts/s3-server.sh \
		scripts/coredns/main.go scripts/coredns/go.mod scripts/kube-node.sh scripts/node/pause.c scripts/fetch.py
	bash scripts/kube-binaries.sh >/dev/null
	bash scripts/kube-current.sh >/dev/null
	bash scripts/kube-node.sh >/dev/null
	bash scripts/kube-addons.sh >/dev/null
	bash scripts/gateway.sh >/dev/null
	bash scripts/s3-server.sh >/dev/null
	bash scripts/helm-kubectl.sh >/dev/null
	bash scripts/tools-venv.sh >/dev/null
	bash scripts/prometheus.sh >/dev/null
	touch $@

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP) $(TOOLS_STAMP)
	$(BIN)/python -m pytest -m "not e2e_kind and not gpu" $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest -m "not integration and not e2e_kind and not gpu" $(PYTEST_ARGS)

check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m inferop_operator.crd --check
	$(BIN)/python -m inferop_devtools.dashboard --check
	$(BIN)/python -m inferop_devtools.docs --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir out/site
	$(BIN)/pre-commit validate-config .pre-commit-config.yaml

crd: $(STAMP)
	$(BIN)/python -m inferop_operator.crd --write

# The generated pages and dashboard written again, and the site built into out/site.
docs: $(STAMP)
	$(BIN)/python -m inferop_devtools.docs
	$(BIN)/python -m inferop_devtools.dashboard
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir out/site

lint: check

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP) $(TOOLS_STAMP)
	$(BIN)/python scripts/bench.py

field: $(STAMP) $(TOOLS_STAMP)
	$(BIN)/python scripts/field.py $(FIELD_ARGS)

drills: $(STAMP) $(TOOLS_STAMP)
	$(BIN)/python scripts/drills.py $(DRILLS_ARGS)

e2e-kind: $(STAMP) $(TOOLS_STAMP)
	bash scripts/e2e-kind.sh

clean:
	rm -rf $(VENV) model_repo/*/ out/ .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
