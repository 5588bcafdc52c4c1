.PHONY: test lint bench demo
test:
	pytest -q
lint:
	ruff check pipeline tests bench && ruff format --check pipeline tests && mypy && lint-imports
bench:
	pytest -q -m bench bench -p no:cacheprovider -o addopts=""
	python bench/table.py
demo:
	lunasol run fixtures/bundles/h0-demo --replay fixtures/recordings/h0-demo
