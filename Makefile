# The two commands of the README: `make serve` and `make test`.
.PHONY: setup model serve test lint bench loadtest soak

VENV := .venv/bin

setup:
	@bash scripts/setup.sh

model: setup
	@$(VENV)/ooo-spec models prepare

serve: model
	@$(VENV)/ooo-spec serve --config configs/local.yaml

test: model
	@bash scripts/test.sh

lint: setup
	@$(VENV)/ruff check app deployments tests load_tests
	@$(VENV)/mypy app deployments

# The results table of docs/benchmarks.md: plain, vLLM n-gram, ooo and ooo+tools on one server (started from
# configs/bench.yaml and stopped at the end), interleaved; JSON + PNG under bench_out/.
BENCH_PORT ?= 8124
BENCH_LIMIT ?= 50
BENCH_DATASET ?= bfcl:simple_python,multiple,agent
bench: model
	@$(VENV)/python -m load_tests.bench --start --config configs/bench.yaml --port $(BENCH_PORT) \
		--dataset $(BENCH_DATASET) --modes plain,ngram,ooo,ooo+tools --limit $(BENCH_LIMIT)

# Locust, headless: 16 users for 2 minutes against the local default (started if none answers
# on LOADTEST_PORT); prints throughput, p50/p95/p99 and errors, fails on any error.
loadtest: model
	@bash load_tests/loadtest.sh

# Bounded soak: 16 clients, good and bad requests mixed, 5 minutes against the local default
# (started on SOAK_PORT, stopped at the end). Fails on a good request not answered 200, a bad
# one not answered with its 4xx, a replica's RSS growing past the bound, or engine requests
# left open; the summary also lands in bench_out/soak.json.
SOAK_PORT ?= 8125
SOAK_DURATION ?= 300
soak: model
	@$(VENV)/python -m load_tests.soak --start --config configs/local.yaml --port $(SOAK_PORT) \
		--duration $(SOAK_DURATION) --json bench_out/soak.json
