"""Benchmarks for muzero-jax components (run them with `python -m muzero_jax.bench.<name>`)."""
