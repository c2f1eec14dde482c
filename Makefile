# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv and install the project on first use; the stamp file makes the second run quick.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint proto bench drill clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m querycoord.cli demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) scripts/gen_proto.py --check
	$(PY) scripts/check_imports.py
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

bench: $(STAMP)
	$(PY) scripts/bench_meta.py
	$(PY) scripts/bench_load.py
	$(PY) scripts/bench_heartbeat.py

drill: $(STAMP)
	$(PY) -m querycoord.cli drill failover --coordinators 3 --nodes 5 --replicas 2 --collections 20 --kills 10 --seed 1
	$(PY) -m querycoord.cli drill failover --coordinators 3 --nodes 5 --replicas 2 --collections 20 --kills 6 --seed 2 \
		--etcd-members 3 --etcd-kills 4 --ttl 3
	$(PY) -m querycoord.cli drill streams --nodes 4 --snodes 2 --streams 50 --seed 7
	$(PY) -m querycoord.cli drill chaos --ops 300 --seed 13 --replicas 2
	$(PY) -m querycoord.cli drill restart --restarts 3 --segments 20000
	$(PY) -m querycoord.cli drill rolling --seed 1
	$(PY) -m querycoord.cli drill chaos --ops 300 --seed 13 --replicas 2 --capacity tight

# The stateful model test (tests/test_model_chaos.py) with a large budget and fresh seeds; a failure is shrunk
# to a minimal step sequence. CI runs the same test with a small derandomized budget.
.PHONY: chaos
chaos: $(STAMP)
	QUERYCOORD_CHAOS_EXAMPLES=50 QUERYCOORD_CHAOS_STEPS=40 $(PY) -m pytest -n 0 tests/test_model_chaos.py -p no:cacheprovider

# Hostile input to every RPC of a running cluster (scripts/fuzz.py): 10,000 requests with a fresh seed (SEED=n
# replays one), then the after-run checks; ends with one JSON line of counts. CI runs 1,000 (tests/test_fuzz.py).
.PHONY: fuzz
fuzz: $(STAMP)
	$(PY) scripts/fuzz.py --requests 10000 $(if $(SEED),--seed $(SEED))

clean:
	rm -rf $(VENV) build *.egg-info
