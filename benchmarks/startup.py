"""Where the start of a training run goes: import, build, init, trace, compile.

Short CPU runs are dominated by start-up (issue 3's 30-s Catch goal counts
compile time), so this splits it into stages, in wall and CPU seconds of this
process, with the persistent compilation cache off (cold) or on:

    python benchmarks/startup.py --env catch                      # cold
    python benchmarks/startup.py --env catch --cache /tmp/xla     # run twice: cold, then warm
    python benchmarks/startup.py --env catch --set '{"num_envs": 8}'   # a preset with overrides

Prints a table and, with --json FILE, writes the rows with the machine, load
and JAX version.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

T0_WALL, T0_CPU = time.perf_counter(), time.process_time()

import jax  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="catch")
    parser.add_argument("--cache", default="none",
                        help="persistent compilation cache directory, or 'none'")
    parser.add_argument("--iterations", type=int, default=5,
                        help="iterations timed after the first")
    parser.add_argument("--set", default="{}", help="JSON object of config overrides")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    try:
        overrides = json.loads(args.set)
    except json.JSONDecodeError:
        overrides = None
    if not isinstance(overrides, dict):
        parser.error(f"--set must be a JSON object, got {args.set!r}")

    from muzero_jax import compile_cache
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset

    cache = compile_cache.enable(args.cache)
    rows: list[dict] = []
    mark = [T0_WALL, T0_CPU]

    def stage(name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        rows.append({"stage": name, "wall_s": round(wall - mark[0], 2),
                     "cpu_s": round(cpu - mark[1], 2)})
        mark[:] = [wall, cpu]

    stage("import jax + muzero_jax")
    load_before = os.getloadavg()
    try:  # preset() refuses bad values and names unknown fields
        config = preset(args.env, **overrides)
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    trainer = make_train(config)
    stage("make_train")
    state = trainer.init(jax.random.key(config.seed))
    jax.block_until_ready(state)
    stage("init (jitted: compile + run)")
    lowered = trainer.iteration.lower(state)
    stage("trace + lower iteration")
    hlo_lines = lowered.as_text().count("\n")
    mark[:] = [time.perf_counter(), time.process_time()]  # the dump counts in no stage
    compiled = lowered.compile()
    stage("compile iteration (XLA)")
    state, metrics = compiled(state)
    jax.block_until_ready(metrics)
    stage("first iteration")
    for _ in range(args.iterations):
        state, metrics = compiled(state)
        jax.block_until_ready(metrics)
    stage(f"{args.iterations} more iterations")
    lowered_eval = trainer.evaluate.lower(state.params, jax.random.key(0))
    stage("trace + lower evaluate")
    lowered_eval.compile()
    stage("compile evaluate (XLA; a background thread in train())")
    print(f"{args.env} {args.set}, cache: {cache or 'off'}, load {load_before[0]:.2f}, "
          f"iteration: {hlo_lines} StableHLO lines")
    print("| stage | wall s | CPU s |\n|---|---|---|")
    for r in rows:
        print(f"| {r['stage']} | {r['wall_s']} | {r['cpu_s']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": args.env, "overrides": overrides, "cache": cache, "rows": rows,
                       "iteration_stablehlo_lines": hlo_lines,
                       "xla_flags": os.environ.get("XLA_FLAGS", ""),
                       "load_before": load_before, "load_after": os.getloadavg(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
                       "device": jax.devices()[0].device_kind, "jax": jax.__version__},
                      f, indent=1)


if __name__ == "__main__":
    main()
