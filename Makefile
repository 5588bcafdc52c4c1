.PHONY: test lint bench demo
test:
	pytest -q
lint:
	ruff check pipeline tests bench && ruff format --check pipeline tests && mypy && lint-imports
# bench/bench_*.py (pytest's default test_*.py collected none of them); the 10,000-cell run is also
# `slow`: pytest -m bench bench -o addopts="" -o python_files="bench_*.py". Smaller sizes on a loaded
# machine: LUNASOL_BENCH_EVENTS=20000 LUNASOL_BENCH_CALLS=100 LUNASOL_BENCH_SIZES=100 make bench
bench:
	pytest -q -m "bench and not slow" bench -p no:cacheprovider -o addopts="" -o python_files="bench_*.py"
	python bench/table.py
demo:
	lunasol run fixtures/bundles/h0-demo --replay fixtures/recordings/h0-demo
