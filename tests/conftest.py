"""Test-session set-up: one persistent XLA compilation cache for the whole run.

Many tests build the same training program more than once (a run and its
resume, the CLI in a subprocess and the same config from Python). JAX's
persistent compilation cache lets every process of this test session (the
pytest-xdist workers and the tests' subprocesses inherit the environment set
here in the controlling process) reuse what an earlier test compiled. The
cache lives in a fresh temporary directory, so every session starts cold and
no state leaks between runs; set JAX_COMPILATION_CACHE_DIR to choose another.
"""

import os
import shutil
import tempfile

_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="muzero-jax-tests-xla-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import jax  # noqa: E402  (after the environment above)

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
