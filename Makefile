# Everything a fresh Debian machine needs, as root: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
PYTEST_ARGS ?=

.PHONY: venv demo lint test test-fast pdsh podman registry-up registry-down reliability bench slurm-up slurm-down ssh-up ssh-down clusters-up clusters-down clean

# torch is pinned to the CPU build on local disk; never an open range (it would pull a multi-GB CUDA build).
$(STAMP): requirements.txt requirements-deepspeed.txt requirements-frameworks.txt setup.cfg pyproject.toml
	command -v c++ >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q build-essential || \
	  { apt-get update -q && apt-get install -y -q build-essential; }; }   # DeepSpeed's CPU op
	command -v tmux >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q tmux || \
	  { apt-get update -q && apt-get install -y -q tmux; }; }   # tests/test_top.py drives `launch top` in tmux
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile torch==2.13.0
	$(BIN)/pip install -q --no-compile -r requirements.txt
	$(BIN)/pip install -q --no-compile --no-build-isolation --no-deps -r requirements-deepspeed.txt
	# The rest side by side on the 2 cores: DeepSpeed's CPU op prebuilt once into .venv/torch_extensions (~20 s),
	# the frameworks and the project installed, then every module byte-compiled in parallel (pip's own compile
	# is one file at a time: --no-compile above, compileall -j 0 here, its errors ignored as pip ignores them: torch
	# ships a Python 3.12-only test file; editable installs get no bytecode at all).
	$(BIN)/python -m workloads.common.dsops & ds=$$!; \
	  $(BIN)/pip install -q --no-compile --no-deps -r requirements-frameworks.txt && \
	  $(BIN)/pip install -q --no-compile --no-deps --no-build-isolation --config-settings editable_mode=compat -e . && \
	  { $(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
	    >/dev/null 2>&1; $(BIN)/python -m compileall -q -j 0 launchers workloads nccl_tuning >/dev/null; }; rc=$$?; \
	  wait $$ds || rc=1; exit $$rc
	touch $@

venv: $(STAMP)

demo: venv
	$(BIN)/launch local --nodes 4 --gpus-per-node 2 --run-dir $(DEMO_DIR) -- -m workloads.convnet --epochs 8
	$(BIN)/launch status $(DEMO_DIR)

# The whole suite, the real Slurm and SSH clusters included (brought up here, taken down after). The groups run side
# by side (pytest-xdist, --dist loadgroup), a module (the longest local modules: a test) at a time per worker; up
# to 3 workers on the Slurm cluster and 2 on the SSH hosts at once (the others run local modules), and a test marked
# `exclusive` (it kills, pauses or cuts a part of its cluster) has its cluster to itself (tests/clusterturn.py);
# then the few tests marked `alone`, one at a time. At the end: the 15 slowest tests, each group's wall time and
# the CPU seconds of each module's own processes. `make test GROUP=slurm` (or ssh, local) runs one group,
# bringing up only the cluster it needs.
GROUP ?=
TEST_WORKERS ?= 6
TEST_CLUSTERS := $(if $(GROUP),$(filter slurm ssh,$(GROUP)),slurm ssh)
TEST_PODMAN := $(if $(GROUP),$(if $(filter local,$(GROUP)),podman),podman)
test: venv $(TEST_PODMAN) $(if $(filter ssh,$(TEST_CLUSTERS)),pdsh)
	@for c in $(TEST_CLUSTERS); do $(MAKE) $$c-up || exit 1; done
	set -o pipefail; CI=$${CI:-true} $(BIN)/pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup --durations=15 \
	  -m "not alone" $(foreach g,$(GROUP),--group $(g)) $(PYTEST_ARGS) tests; rc=$$?; \
	  CI=$${CI:-true} $(BIN)/pytest -q -ra -m alone $(foreach g,$(GROUP),--group $(g)) $(PYTEST_ARGS) tests; r=$$?; \
	  [ $$r = 0 ] || [ $$r = 5 ] || rc=1; \
	  for c in $(TEST_CLUSTERS) $(if $(TEST_PODMAN),registry); do $(SUBMAKE) $$c-down; done; exit $$rc

# The fault suite (tests/faults/, real local, SSH and Slurm clusters), then RELIABILITY.md generated from the rows
# it recorded in a fresh directory (never written by hand); the table is written even when a fault fails.
# (SUBMAKE, not $(MAKE), in the long line: a line naming $(MAKE) runs even under `make -n`.)
SUBMAKE := $(MAKE)
# ruff (pyproject.toml's [tool.ruff]) over every package, the tests, bench and clusters: `ruff format
# --check` (the formatter's style, 100 columns), then `ruff check` (pyflakes, import order, syntax, E501);
# make test runs the same checks (tests/test_lint.py).
LINTED := launchers workloads nccl_tuning slurm bench tests examples clusters
lint: venv
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/ruff check $(LINTED)

reliability: venv
	$(MAKE) clusters-up
	out=$$(mktemp -d /tmp/launch-faults.XXXXXX); \
	  LAUNCH_FAULTS_OUT=$$out CI=$${CI:-true} $(BIN)/pytest -q -ra $(PYTEST_ARGS) tests/faults tests/test_recovery.py tests/test_recovery_local.py; rc=$$?; \
	  $(SUBMAKE) clusters-down; \
	  $(BIN)/python tests/faults/record.py $$out RELIABILITY.md || rc=1; rm -rf $$out; exit $$rc

# The inner loop (~2.5 min on 2 cores, 4 workers): pure logic and quick local runs; no clusters, no test marked slow
# (the longest local runs are marked slow: make test runs them).
test-fast: venv podman
	$(BIN)/pytest -q -n 4 --durations=10 -m "not slurm and not ssh and not slow" tests

# Side-by-side benchmarks (each prints: name, ours, reference, ratio, goal); needs the dev clusters and pdsh.
# (make test needs pdsh too: tests/test_bench_tiny.py runs each bench script in its tiny form, BENCH_TINY=1.)
bench: venv pdsh
	$(MAKE) clusters-up
	$(BIN)/python bench/run_all.py; rc=$$?; $(MAKE) clusters-down; exit $$rc

pdsh:
	command -v pdsh >/dev/null || { export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q pdsh || \
	  { apt-get update -q && apt-get install -y -q pdsh; }; }

# Podman + runc from Debian (runc as podman's runtime) and the small local test image, built here with no download
# and kept (rebuilt only when its recipe changes): the local group's container tests (tests/test_container_podman.py);
# then the image served by a local registry (Debian's docker-registry, htpasswd auth, 127.0.0.1:5055 only, started
# in the background: tests/test_container_registry.py pulls from it). `make test` takes the registry down at the end.
podman:
	@clusters/image.sh install
	@clusters/image.sh build
	@clusters/registry.sh up

registry-up:
	@clusters/registry.sh up
registry-down:
	@clusters/registry.sh down

clusters-up: slurm-up ssh-up
clusters-down:
	-$(MAKE) slurm-down
	-$(MAKE) ssh-down

clean:
	rm -rf $(VENV) build *.egg-info

# Four real sshd hosts (network namespaces sshhost1..4); the last line printed is the `launch ssh` options.
ssh-up:
	@clusters/ssh-hosts.sh up

ssh-down:
	@clusters/ssh-hosts.sh down

# A real 4-node Slurm cluster (slurmctld + 4 slurmd in network namespaces lnode1..4, fake gpu:8 gres). Its login
# nodes and bastion (clusters/slurm-login.sh) are brought up by the tests that use them; slurm-down removes them too.
slurm-up:
	@slurm/dev-cluster.sh up

slurm-down:
	@clusters/slurm-login.sh down
	@slurm/dev-cluster.sh down
