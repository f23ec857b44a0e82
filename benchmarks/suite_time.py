"""Where the test suite's time goes: XLA compiles, tracing, lowering, the rest.

Runs pytest with this module loaded as a plugin in every process of the run
(the pytest-xdist workers too) and adds up, per test, JAX's own monitoring
events: XLA's backend compile (persistent-cache reads included), jaxpr
tracing, lowering to StableHLO, and the persistent compilation cache's hits
and misses. Then it prints the totals, the tests that spent the most, and
the programs (by jitted function name) that took the most compile time:

    python benchmarks/suite_time.py                        # the default run
    python benchmarks/suite_time.py --json t.json -- tests/test_loss.py -n 0

Everything after `--` goes to pytest as given (with nothing, pytest runs as
`pytest` does, with the project's options). A test's "wall" counts its
setup, call and teardown; the programs the tests' own subprocesses (the CLI
and multi-host tests) compile are not seen, only the wall time they take.
Tracing events can nest (a jitted function traced inside another's trace),
so the trace column may count a stretch twice.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

OUT_DIR_ENV = "MUZERO_JAX_SUITE_TIME_DIR"
COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
HITS = "/jax/compilation_cache/cache_hits"
MISSES = "/jax/compilation_cache/cache_misses"
COLUMNS = {"compile_s": COMPILE, "trace_s": TRACE, "lower_s": LOWER}

# ----------------------------------------------------------------- the plugin
# pytest loads this module in each process (`-p suite_time`); the hooks below
# are the plugin. They only record while the run's output directory is set.

_current = ["(outside tests)"]
_tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_programs: list[tuple[str, str, float]] = []


def _on_duration(event: str, duration: float, **kwargs: Any) -> None:
    _tests[_current[0]][event] += duration
    if event == COMPILE:
        _programs.append((_current[0], str(kwargs.get("fun_name", "?")), duration))


def _on_event(event: str, **kwargs: Any) -> None:
    if event in (HITS, MISSES):
        _tests[_current[0]][event] += 1


def pytest_configure(config) -> None:
    if os.environ.get(OUT_DIR_ENV):
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(_on_duration)
        monitoring.register_event_listener(_on_event)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Runs only where the test runs (a pytest-xdist worker, not the controller).
    _current[0] = item.nodeid
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        _tests[item.nodeid]["wall"] += time.perf_counter() - start
        _current[0] = "(outside tests)"


def pytest_unconfigure(config) -> None:
    out_dir = os.environ.get(OUT_DIR_ENV)
    if not out_dir:
        return
    with open(os.path.join(out_dir, f"events-{os.getpid()}.jsonl"), "w") as f:
        for test, counts in _tests.items():
            f.write(json.dumps({"test": test, **counts}) + "\n")
        for test, name, seconds in _programs:
            f.write(json.dumps({"program": name, "test": test, "s": seconds}) + "\n")


# ----------------------------------------------------------------- the report


def summarise(out_dir: str, top: int = 20) -> dict[str, Any]:
    """Merges the processes' event files into totals, the `top` tests by wall
    time and the `top` program names by compile time."""
    tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    programs: dict[str, list[float]] = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(out_dir, "events-*.jsonl"))):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                if "program" in row:
                    programs[row["program"]].append(row["s"])
                else:
                    tests[row.pop("test")].update(row)

    def columns(counts: collections.Counter) -> dict[str, float]:
        row = {"wall_s": round(counts["wall"], 6)}
        row.update({name: round(counts[event], 6) for name, event in COLUMNS.items()})
        row.update(cache_hits=int(counts[HITS]), cache_misses=int(counts[MISSES]))
        return row

    total: collections.Counter = collections.Counter()
    for counts in tests.values():
        total.update(counts)
    by_wall = sorted(tests.items(), key=lambda kv: -kv[1]["wall"])[:top]
    by_compile = sorted(programs.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "tests": sum(1 for name in tests if not name.startswith("(")),
        "total": columns(total),
        "compiles": sum(len(v) for v in programs.values()),
        "compiles_over_1s": sum(1 for v in programs.values() for s in v if s > 1.0),
        "top_tests": [{"test": name, **columns(counts)} for name, counts in by_wall],
        "top_programs": [{"program": name, "compiles": len(v), "compile_s": round(sum(v), 6),
                          "max_s": round(max(v), 6)} for name, v in by_compile],
    }


def _print(report: dict[str, Any], wall_s: float) -> None:
    t = report["total"]
    print(f"\nwall {wall_s:.1f} s for the whole command; over {report['tests']} tests "
          f"(summed across processes): test time {t['wall_s']:.1f} s, XLA compile "
          f"{t['compile_s']:.1f} s, tracing {t['trace_s']:.1f} s, lowering {t['lower_s']:.1f} s; "
          f"{report['compiles']} compiles ({report['compiles_over_1s']} over 1 s), persistent "
          f"cache {t['cache_hits']} hits / {t['cache_misses']} misses")
    print(f"\n{'wall':>7} {'compile':>7} {'trace':>6} {'lower':>6} {'hits':>4} {'miss':>4}  test")
    for r in report["top_tests"]:
        print(f"{r['wall_s']:7.1f} {r['compile_s']:7.1f} {r['trace_s']:6.1f} {r['lower_s']:6.1f} "
              f"{r['cache_hits']:4d} {r['cache_misses']:4d}  {r['test']}")
    print(f"\n{'compile':>7} {'count':>5} {'max':>5}  program")
    for r in report["top_programs"]:
        print(f"{r['compile_s']:7.1f} {r['compiles']:5d} {r['max_s']:5.1f}  {r['program']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    own, pytest_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument("--top", type=int, default=20, help="how many tests and programs to list")
    args = parser.parse_args(own)
    if args.top < 1:
        parser.error(f"--top must be at least 1, got {args.top}")

    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory(prefix="muzero-jax-suite-time-") as out_dir:
        env = dict(os.environ, **{OUT_DIR_ENV: out_dir})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        start = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "suite_time", *pytest_args],
                             env=env)
        wall_s = time.perf_counter() - start
        report = summarise(out_dir, args.top)
    report.update(pytest_exit_code=rc, wall_s=round(wall_s, 1), pytest_args=pytest_args)
    _print(report, wall_s)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
