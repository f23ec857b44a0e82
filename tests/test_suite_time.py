"""benchmarks/suite_time.py: the per-test profile of XLA compiles, tracing and lowering."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "suite_time.py"

TESTS = '''
import jax
import jax.numpy as jnp


def test_compiles_one_program():
    @jax.jit
    def my_program(x):
        return jnp.sin(x) * 2.0

    x = jnp.arange(3.0)
    assert float(my_program(x)[0]) == 0.0
    assert float(my_program(x)[0]) == 0.0  # the second call compiles nothing


def test_fails_without_jax():
    assert 1 == 2
'''


def test_attributes_compiles_to_the_test_that_made_them_and_keeps_pytests_exit_code(tmp_path):
    (tmp_path / "test_probe.py").write_text(TESTS)
    out = tmp_path / "report.json"
    # A directory without the project's pytest options: one process, no xdist.
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), "--top", "50", "--",
         "-q", "-p", "no:cacheprovider", "test_probe.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    done_wall_s = time.perf_counter() - start
    assert done.returncode == 1, done.stdout + done.stderr  # one test failed
    report = json.loads(out.read_text())
    assert report["pytest_exit_code"] == 1 and report["tests"] == 2
    rows = {r["test"]: r for r in report["top_tests"]}
    one = rows["test_probe.py::test_compiles_one_program"]
    other = rows["test_probe.py::test_fails_without_jax"]
    assert one["compile_s"] > 0 and one["trace_s"] > 0 and one["lower_s"] > 0
    assert one["compile_s"] <= one["wall_s"] < done_wall_s
    assert other["compile_s"] == other["trace_s"] == 0
    programs = {r["program"]: r for r in report["top_programs"]}
    assert programs["jit(my_program)"]["compiles"] == 1
    assert report["compiles"] >= 1
    assert "jit(my_program)" in done.stdout and "test_compiles_one_program" in done.stdout


def test_bad_top_is_refused():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import suite_time
    finally:
        sys.path.remove(str(SCRIPT.parent))
    with pytest.raises(SystemExit) as e:
        suite_time.main(["--top", "0"])
    assert e.value.code == 2
