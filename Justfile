# Recipes; `./dev RECIPE` sets up the machine first (Docker engine, .venv), then runs one.
set shell := ["bash", "-euo", "pipefail", "-c"]
export PATH := justfile_directory() + "/.venv/bin:" + env_var("PATH")

# the main job: the service on the local Docker engine, real commands in sandboxes
demo: images example-repos
    orchard up
    python examples/quickstart.py || (orchard down; exit 1)
    orchard down
    orchard eval --tasks examples/tasks/tasks.jsonl --repos {{repos}} --model scripted:gold --harness bash,tools,cli
    orchard demo

repos := env_var_or_default("XDG_CACHE_HOME", env_var("HOME") + "/.cache") + "/orchard/example-repos"

# the example tasks' repositories, as git repositories with fixed commits
example-repos:
    python examples/tasks/make_repos.py --force {{repos}} >/dev/null

# base images, built offline and cached
images:
    orchard image build-base
    orchard image build-busybox

# the agent CLIs (codex, claude, opencode, pi, hermes, mini) in a bundle any sandbox mounts, from npm and PyPI, cached
tools:
    orchard image build-tools

# llama.cpp's server and GGUF converter, built once from PyPI's llama-cpp-python sources (for `llama:` models)
llama:
    orchard model llama-server

# the learning run: SmolLM2-135M-Instruct before and after the pipeline, on held-out tasks (about 42 min)
learning: images llama
    python bench/learning.py

# the test suite (CI runs exactly this through .ci/run); `just test tests/AREA` runs one area
test *ARGS: images llama tools
    pytest -n 3 --dist loadfile -p no:cacheprovider {{ARGS}}

# the inner loop: the tests that need no container, no API server and no pretrained model (under 90 s)
test-quick *ARGS:
    pytest -n 4 -p no:cacheprovider -m "not docker and not kube and not model" {{ARGS}}

# format, lint, types, tests
check: lint test

lint:
    ruff format --check orchard tests bench examples
    ruff check orchard tests bench examples
    mypy orchard

# real SWE-bench Lite rows on their real repositories, gold and broken patches (slow): DIR holds tasks.jsonl and repos/*.tar.gz
swe-real DIR: images
    orchard image build-base --release bullseye
    ORCHARD_SWE_REAL={{DIR}} pytest -m swe_real -p no:cacheprovider tests/tasks/test_swe_real.py
