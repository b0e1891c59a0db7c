"""Benchmarks: figures, never pass/fail (`make bench`, `python -m bench.run`)."""
