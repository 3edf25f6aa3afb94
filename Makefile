# Gemini: one-command entry points. Each target installs what it needs into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check test test-tier lint bench screenshots proto clean kmod kmod-theta uml lab-check lab-6.12 lab-bench images debs

COMPONENTS := api agent booster lab

# $(call with_heartbeat,COMMAND): COMMAND, and a line every 5 one-second sleeps while it runs
# (8-9 s apart on a loaded machine). The first install has quiet steps of a minute or more
# (creating the venv, pip installing ~100 wheels without a word when not on a terminal); pip's
# own progress is shown too (not --quiet).
with_heartbeat = $(1) & job=$$!; t0=$$(date +%s); n=0; \
	while kill -0 $$job 2>/dev/null; do sleep 1; n=$$((n + 1)); \
	  [ $$((n % 5)) -ne 0 ] || ! kill -0 $$job 2>/dev/null || \
	  echo "== still installing ($$(($$(date +%s) - t0)) s)"; \
	done; wait $$job

# The four distributions editable, with the development tools of pyproject.toml's `dev` group
# (pip ≥ 25.1 reads dependency groups). gemini-cc, the single distribution this replaced, is
# removed first so that only one finder maps each package to its folder.
$(STAMP): pyproject.toml $(COMPONENTS:%=%/pyproject.toml)
	@echo "== installing Gemini and its dependencies into $(VENV) (the first time takes minutes)"
	@echo "== creating $(VENV) and upgrading pip"
	@$(call with_heartbeat,$(PYTHON) -m venv $(VENV))
	@$(call with_heartbeat,$(BIN)/pip install --quiet --upgrade pip)
	$(BIN)/pip uninstall --quiet --yes gemini-cc 2>/dev/null || true
	@echo "$(BIN)/pip install --progress-bar on $(COMPONENTS:%=-e ./%) --group dev"
	@$(call with_heartbeat,$(BIN)/pip install --progress-bar on $(COMPONENTS:%=-e ./%) --group dev)
	touch $(STAMP)
	@echo "== installed: $(BIN)/booster, $(BIN)/gemini-agent, $(BIN)/gemini-lab"

# DEMO_ARGS go to `booster demo` (see docs/cli.md): e.g. make demo DEMO_ARGS="--port 8090 --hours 24"
demo: $(STAMP)  ## Booster and a simulated fleet with an A/B experiment: dashboard on :8080 until Ctrl-C
	$(BIN)/booster demo $(DEMO_ARGS)

test: $(STAMP)  ## lint, then every test (real PostgreSQL, embedded)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

check: $(STAMP)  ## the inner loop, a few minutes: lint, then the unit tier (no PostgreSQL, browser, lab or tools)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -m unit

# The tiers of CI (.ci/run), from the markers tests/conftest.py applies: each test runs in one
# tier, the heaviest it needs (lab > tools > browser > postgres), so that together they run
# exactly what `make test` runs. `pytest -m postgres` runs every test that needs PostgreSQL.
TIERS := unit postgres browser tools lab
TIER_unit := unit
TIER_postgres := postgres and not (browser or tools or lab)
TIER_browser := browser and not (tools or lab)
TIER_tools := tools and not lab
TIER_lab := lab

test-tier: $(STAMP)  ## one CI tier's tests: make test-tier TIER=postgres (TIERS: unit postgres browser tools lab)
	@test -n "$(TIER_$(TIER))" || { echo "TIER must be one of: $(TIERS)"; exit 2; }
	$(BIN)/python -m pytest -q -m "$(TIER_$(TIER))" $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: none here

bench: $(STAMP)  ## the benchmarks; results are written to benchmarks/results/
	$(BIN)/python -m benchmarks.ingest
	$(BIN)/python -m benchmarks.get_parameters
	$(BIN)/python -m benchmarks.refit
	$(BIN)/python -m benchmarks.replicas
	$(BIN)/python -m benchmarks.quota
	$(BIN)/python -m benchmarks.agent_lookup

screenshots: $(STAMP)  ## re-record the dashboard screenshots in docs/dashboard/ (headless Chromium)
	GEMINI_DASHBOARD_SHOTS=$(CURDIR)/docs/dashboard $(BIN)/python -m pytest -q tests/test_dashboard_charts.py

proto: $(STAMP)  ## regenerate protobuf/gRPC stubs after editing api/gemini_api/v1/*.proto
	$(BIN)/python scripts/gen_proto.py

kmod:  ## build fusion-kmod/tcp_{fusion,gemini,dcvegas,gear}.ko and gear_int.ko against the newest Debian kernel in /boot (W=1)
	$(MAKE) -C fusion-kmod KVER=$$(ls /boot/vmlinuz-* | sort | tail -1 | sed 's|/boot/vmlinuz-||') W=1

uml:  ## the User-Mode Linux lab kernel (time travel) under var/uml, rebuilt only when its inputs change
	lab/uml/build-kernel.sh

kmod-theta: $(STAMP)  ## regenerate fusion-kmod/<datapath>_theta.h after editing a module datapath's θ spec
	$(BIN)/python scripts/gen_kmod_theta.py

lab-check: $(STAMP)  ## the acceptance plans: outcomes in UML, the module in qemu; exit 1 on any failure
	$(BIN)/gemini-lab check

lab-6.12: $(STAMP)  ## the module's lab tests booted on Debian 13's 6.12 under qemu (fusion-kmod/build-in-trixie.sh setup first)
	fusion-kmod/build-in-trixie.sh build
	GEMINI_LAB_KERNEL_ROOT=$(CURDIR)/var/trixie/kernel GEMINI_LAB_FUSION_KO=$(CURDIR)/var/trixie/out/tcp_fusion.ko \
	  $(BIN)/python -m pytest -q tests/test_lab_fusion.py -k "not outcomes and not warning_free" $(PYTEST_ARGS)

lab-bench: $(STAMP)  ## Fusion vs cubic/bbr/vegas/reno on Table IV, CPU cost; writes benchmarks/results/
	$(BIN)/gemini-lab bench

images: $(STAMP)  ## OCI images gemini-booster and gemini-agent under var/packaging/oci (packaging/install-tools.sh first)
	PYTHON=$(abspath $(BIN))/python packaging/images/build.sh booster agent

debs: $(STAMP)  ## gemini-agent and gemini-fusion-dkms .debs under var/packaging/debs
	PYTHON=$(abspath $(BIN))/python packaging/debian/build.sh

clean:
	rm -rf $(VENV) var .pytest_cache
