# The two commands of the README: `make serve` and `make test`.
.PHONY: setup model serve test lint

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
