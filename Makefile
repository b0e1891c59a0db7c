# inboxcrm: two commands on a fresh machine — `make up` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: pin-hashes up test test-fast test-stack test-long lint typecheck chaos bench bench-neighbour bench-imap test-ui clean-data dist

$(BIN)/python:
	$(PY) -m venv $(VENV)

# The dependencies in pip's hash-checking mode (constraints.txt carries every pin's sha256s,
# `make pin-hashes`), then the project itself, editable, without them: hash-checking refuses an
# editable requirement. $(1): the extras; $(2): a name for the list of requirements.
define install_pinned
	$(BIN)/python deploy/requirements.py $(1) > $(VENV)/requirements-$(2).txt
	$(BIN)/python -m pip install --quiet --require-hashes -c constraints.txt -r $(VENV)/requirements-$(2).txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
endef

$(STAMP): $(BIN)/python pyproject.toml constraints.txt deploy/pip.txt
	$(BIN)/python -m pip install --quiet --require-hashes -r deploy/pip.txt
	$(call install_pinned,dev local,dev)
	touch $(STAMP)

## pin-hashes: after a pin in constraints.txt or deploy/pip.txt changes, write every pin's file
## hashes from PyPI (deploy/pin_hashes.py)
pin-hashes: $(STAMP)
	$(BIN)/python deploy/pin_hashes.py

## up: the whole stack on the embedded defaults (Ctrl-C stops it; data stays in .data/)
up: $(STAMP)
	$(BIN)/inboxcrm up

## test: lint, types, the fast tier, then the real-component tier (PostgreSQL, Temporal, sandbox)
test: test-fast test-stack

## test-fast: no stack at all (pure functions, the rooms contract, workflow branches in the
## SDK's time-skipping environment, the alert rules under promtool); under a minute.
## -rs prints why a test was skipped (promtool missing where apt could not install it).
## FAST_WORKERS: pytest-xdist processes (default 2; 0 runs them in this one)
FAST_WORKERS ?= 2
test-fast: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -n $(FAST_WORKERS) tests/fast $(PYTEST_ARGS)

## test-stack: every test that talks to real PostgreSQL, a Temporal server and the sandbox, in
## STACK_WORKERS pytest-xdist processes (default 2), each with its own PostgreSQL and stack and
## whole files to itself (--dist loadfile); tests marked `isolated` stop a shared server, so they
## run after the rest, in one process; the long runs (marker `long`) are `make test-long`'s.
## --durations: the 40 slowest tests are printed, so the suite's time can be read off CI
STACK_WORKERS ?= 2
test-stack: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=40 --ignore=tests/fast -n $(STACK_WORKERS) --dist loadfile -m "not isolated and not long" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -p no:cacheprovider --ignore=tests/fast -m "isolated and not long" $(PYTEST_ARGS)

## test-long: the long runs, one after another on one stack: chaos at CI size, the full
## rehearsal, the IMAP durability run and the crash loop, then chaos on Salesforce and on
## Pipedrive on stacks of their own (about 20 min); CI runs it after `make test`
test-long: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 --ignore=tests/fast -m long $(PYTEST_ARGS)

## lint: ruff, and the rooms contract (.importlinter): an upward import fails here
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

## dist: the release artifacts, a wheel and an sdist under dist/ (`python -m build`), version from
## the git tag (setuptools-scm; pyproject.toml [tool.setuptools_scm]), and dist/sbom.cdx.json, the
## CycloneDX bill of materials of what installing the wheel brings (the wheel installed, without
## extras, into a venv of its own); CI builds them after the tests
dist: $(STAMP)
	rm -rf dist .data/dist-venv
	$(BIN)/python -m build --outdir dist .
	$(PY) -m venv .data/dist-venv
	.data/dist-venv/bin/python -m pip install --quiet --require-hashes -r deploy/pip.txt
	wheel=$$(ls dist/inboxcrm-*.whl) && echo "inboxcrm @ file://$(CURDIR)/$$wheel --hash=sha256:$$(sha256sum $$wheel | cut -d' ' -f1)" > .data/dist-venv/requirements.txt
	.data/dist-venv/bin/python -m pip install --quiet --require-hashes -c constraints.txt -r .data/dist-venv/requirements.txt
	$(BIN)/cyclonedx-py environment --pyproject pyproject.toml --output-reproducible \
		--of JSON -o dist/sbom.cdx.json .data/dist-venv/bin/python
	$(BIN)/python -m tests.helpers.dist_check dist

clean-data:
	rm -rf .data/test-stack* .data/test-pg*

## chaos: >=1,000 events with sandbox faults, kill -9s of either of two worker processes
## (CHAOS_WORKERS) and a relay restart, then a
## long-fault phase (the store frozen CHAOS_FREEZE s, default 330, under a send pause spanning
## the run), on a fresh stack of its own under .data/chaos (free ports); exit 1 on an invariant
## violation or a failed workflow. CHAOS_CRM: the tenant's CRM (hubspot, salesforce or
## pipedrive, on the sandbox's surface of each)
chaos: $(STAMP)
	$(BIN)/inboxcrm chaos --events $${CHAOS_EVENTS:-1000} --seed $${CHAOS_SEED:-1} --kills $${CHAOS_KILLS:-5} --workers $${CHAOS_WORKERS:-2} --freeze $${CHAOS_FREEZE:-330} --crm $${CHAOS_CRM:-hubspot}

## test-ui: the review desk in a real browser (tests/ui): the Temporal Web UI driven by
## Playwright in Debian's headless chromium (`apt-get install chromium`; no browser download),
## on a UI-enabled stack of its own under .data/ui-stack. Screenshots: test-artifacts/ui/
UI_STAMP := $(VENV)/.installed-ui

$(UI_STAMP): $(STAMP)
	$(call install_pinned,dev local ui,ui)
	touch $(UI_STAMP)

test-ui: $(UI_STAMP)
	INBOXCRM_UI_TESTS=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/ui $(PYTEST_ARGS)

## bench: figures, not pass/fail (bench/README.md): one fresh stack of its own under .data/bench
## (free ports); table on stdout, JSON + PNG under bench/results/. BENCH_ARGS=--quick: smoke run
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(call install_pinned,dev local bench,bench)
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)
	$(BIN)/python -m bench.neighbour $(NEIGHBOUR_ARGS)
	$(BIN)/python -m bench.imap_source $(IMAP_ARGS)

## bench-neighbour: tenant A's burst of 600 against tenant B's ordinary mail, on a fresh stack of
## its own (bench/neighbour.py; NEIGHBOUR_ARGS=--quick: burst 60). Also run by `make bench`.
bench-neighbour: $(BENCH_STAMP)
	$(BIN)/python -m bench.neighbour $(NEIGHBOUR_ARGS)

## bench-imap: the IMAP source against the webhook source on a fresh stack of its own with a
## real Dovecot (bench/imap_source.py; IMAP_ARGS=--quick: burst 60, paced 15). Also run by
## `make bench`.
bench-imap: $(BENCH_STAMP)
	$(BIN)/python -m bench.imap_source $(IMAP_ARGS)
