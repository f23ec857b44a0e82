"""Test-session set-up: one persistent XLA compilation cache for the whole run.

Many tests build the same training program more than once (a run and its
resume, the CLI in a subprocess and the same config from Python). JAX's
persistent compilation cache lets every process of this test session (the
pytest-xdist workers and the tests' subprocesses inherit the environment set
here in the controlling process) reuse what an earlier test compiled. The
cache lives in a fresh temporary directory, so every session starts cold and
no state leaks between runs; set JAX_COMPILATION_CACHE_DIR to choose another.

The tests' programs run a few steps each, so compiling them is most of the
suite's time. The session's XLA_FLAGS ask XLA's CPU compiler for less work:
LLVM optimisation level 1 for every program (the level that
`learning.default_compiler_options` already gives training programs; XLA's
default is 2) and XLA's classic loop emitters instead of its newer MLIR
fusion emitters. With them the default run took 620 s instead of 800 s
(2026-12-01, this 2-core machine), with the same tolerances everywhere
(test_puct's bit-identical parity programs keep the fusion emitters).
Level 0 would compile faster still, but it changed which moves a search took
in one test, so it is not used. The flags also keep each program's machine
code in one LLVM module: XLA splits it to compile the parts on several
threads, and on this 2-core machine the split cost more than the threads
saved, even in one process. That cut XLA's compile time by ~15 % (test_loss's
transcription and pseudocode tests, one process: 73-78 s instead of 89-90 s;
the default run 1,121 s instead of 1,207 s; 2026-12-07, AMD EPYC family 25
model 1). Two of XLA:CPU's backend options (`--xla_backend_extra_options`)
go further: no LLVM loop unrolling, and functions optimised for size. With
them the tests' Catch training iteration compiled in 8.9-10.5 s of CPU
instead of 15.8-16.9 s, and four of the heaviest test files ran in 363 s
instead of 400 s (2026-12-08, model 1; the commands are in
docs/development.md). They suit the tests' tiny programs only: the Connect
Four preset's iterations ran 8-17 % slower with them, so the product keeps
XLA's defaults. These flags go first in XLA_FLAGS, so a flag
of your own overrides them (backend options of your own are added to these
two: XLA merges them), and the tests' subprocesses inherit them (those
that fake CPU devices append their device count);
MUZERO_JAX_TEST_FAST_COMPILE=0 leaves XLA_FLAGS alone.
"""

import os
import shutil
import tempfile

import pytest

_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="muzero-jax-tests-xla-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false"
                      " --xla_cpu_parallel_codegen_split_count=1"
                      " --xla_backend_extra_options="
                      "xla_cpu_disable_loop_unrolling,xla_cpu_optimize_for_size")
if os.environ.get("MUZERO_JAX_TEST_FAST_COMPILE", "1") != "0":
    os.environ["XLA_FLAGS"] = f"{FAST_COMPILE_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()

import jax  # noqa: E402  (after the environment above)

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


def pytest_sessionfinish(session, exitstatus):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


class Console:
    """A console whose reader can go away, as `muzero-jax train ... | head -N` leaves it.

    The reader takes `lines` lines (None: all) and goes; every write after that,
    or after `reader_gone` is set, fails with EPIPE."""

    def __init__(self, lines: int | None = None):
        self.text, self.lines, self.reader_gone = "", lines, False

    def _gone(self) -> bool:
        return self.reader_gone or (self.lines is not None and self.text.count("\n") >= self.lines)

    def write(self, text: str) -> int:
        if self._gone():
            raise BrokenPipeError(32, "Broken pipe")
        self.text += text
        return len(text)

    def flush(self) -> None:  # what was written before the reader went had reached it
        if self.reader_gone:
            raise BrokenPipeError(32, "Broken pipe")

    def isatty(self) -> bool:
        return False


@pytest.fixture
def console():
    """A fresh `Console` that shows everything until `reader_gone` is set."""
    return Console()
