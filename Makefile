# PEARL — developer entry points. `make run` and `make test` set themselves up (`make setup`).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pearl-setup-$(shell cat pyproject.toml scripts/setup.sh scripts/setup_sglang.sh scripts/setup_swebench.sh 2>/dev/null | sha1sum | cut -c1-12)
MODELS := .models
CONFIG ?= configs/cpu-demo.yaml
PYTEST_ARGS ?=

.PHONY: setup models test test-fast test-soak test-gpu test-gpu-sglang lint typecheck run run-tiny simulate experiments bench predictor-check \
        reliability swebench-qwen3-8b swebench-qwen3-30b-a3b clean

## setup: create .venv and install PEARL with vLLM (CPU), dev tools and local models (idempotent)
setup: $(STAMP) $(MODELS)/.built

$(STAMP): pyproject.toml scripts/setup.sh scripts/setup_sglang.sh scripts/setup_swebench.sh
	PY=$(PY) bash scripts/setup.sh
	@rm -f $(VENV)/.pearl-setup-* && touch $@

## models: build the local model folders (SmolLM2-135M-Instruct untied, tiny Qwen3); no hub access
models: $(MODELS)/.built
$(MODELS)/.built: $(STAMP) pearl/models.py
	$(BIN)/python -m pearl.models build --out $(MODELS)
	@touch $@

## test: the whole suite (unit, property, integration with real vLLM servers on CPU)
test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

## test-fast: everything but the real-engine integration tests
test-fast: setup
	$(BIN)/python -m pytest -q -m "not vllm and not slow" $(PYTEST_ARGS)

## test-soak: long real-engine fault soaks (kill -9 / refused KV transfer / failed weight load on vLLM)
test-soak: setup
	$(BIN)/python -m pytest -q -m soak $(PYTEST_ARGS)

## test-gpu: the one-GPU smoke (NCCL on one GPU, FSDP2 bf16, offload/reload, the trainer on CUDA;
## torch + CUDA only, <= 8 min; scripts/gpu_smoke.py). GPU_PY: that host's python.
## test-gpu-sglang: SglangEngine on real SGLang servers (>= 2 GPUs, pip install -e '.[sglang]' first)
GPU_PY ?= python3
test-gpu:
	timeout 480 $(GPU_PY) scripts/gpu_smoke.py

test-gpu-sglang:
	$(BIN)/python -m pytest -q -m gpu --run-gpu $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check pearl envs tests benchmarks
	$(BIN)/mypy pearl envs --exclude '^envs/repofix/projects/'

## typecheck: mypy over pearl and envs (envs/repofix/projects: fixture projects with planted bugs, excluded)
typecheck: setup
	$(BIN)/mypy pearl envs --exclude '^envs/repofix/projects/'

## run: PEARL end to end on this CPU (real vLLM engines, trainer, a task the model learns, availability trace,
## a training GPU lent between updates; configs/cpu-demo.yaml)
run: setup
	$(BIN)/python -m pearl run --config $(CONFIG)

run-tiny: setup
	$(BIN)/python -m pearl run --config $(CONFIG) --tiny

## simulate: replay a real spot trace at paper scale through the real control plane (virtual time);
## the shipped Bamboo g4dn trace by default (SIM_TRACE=path for another, e.g. a spot-traces JSON)
SIM_CONFIG ?= configs/qwen3-8b-h200.yaml
SIM_TRACE ?= configs/traces/bamboo-g4dn/g4dn-trace.csv
simulate: setup
	$(BIN)/python -m pearl simulate --config $(SIM_CONFIG) --trace $(SIM_TRACE) --systems pearl,roll,rlboost+,oracle

experiments: setup
	$(BIN)/python -m pearl experiments all

## bench: decision + planning latency (and other benchmarks under benchmarks/)
bench: setup
	$(BIN)/python benchmarks/bench_decision.py

## predictor-check: the predictor's figure of record: Table 2 (pearl/sim/experiments.py, table2) on
## 8 paired workload seeds, every allocation of 8/10/12/24/26/28 workers measured in the emulator
## against the decision engine's choice and predictions (about 9 CPU minutes)
predictor-check: setup
	$(BIN)/python -m pearl experiments table2 --table2-seeds 8 --out runs/predictor-check --docs ''
	@cat runs/predictor-check/table2.md

reliability: setup
	$(BIN)/python -m pearl reliability

## swebench-*: the paper's SWE-bench runs (Sec. 6.1) on its 32-GPU H200 cluster: 4 nodes x 8 GPUs,
## SGLang engines, the trainer on the 16 training GPUs. Run the same command on every node, with
## NODE_RANK=0..3 and MASTER_ADDR=<node 0's address>; output_dir must be on a shared filesystem.
## The preflight (pearl/main.py --preflight) stops here with a clear message on a host without
## GPUs, SGLang, Docker or the weights (docs/service.md, "The paper's SWE-bench runs").
SWE_NNODES ?= 4
NODE_RANK ?= 0
MASTER_ADDR ?= 127.0.0.1
MASTER_PORT ?= 29500
SWE_LAUNCH = $(BIN)/python pearl/main.py --preflight --nnodes $(SWE_NNODES) --config $(1) && \
	$(BIN)/torchrun --nnodes $(SWE_NNODES) --nproc-per-node 1 --node-rank $(NODE_RANK) \
	    --master-addr $(MASTER_ADDR) --master-port $(MASTER_PORT) pearl/main.py --config $(1)

swebench-qwen3-8b: setup
	$(call SWE_LAUNCH,configs/swebench-qwen3-8b.yaml)

swebench-qwen3-30b-a3b: setup
	$(call SWE_LAUNCH,configs/swebench-qwen3-30b-a3b.yaml)

clean:
	rm -rf $(VENV) $(MODELS) runs .pytest_cache .mypy_cache .ruff_cache
