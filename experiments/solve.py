"""Time-to-solve runs: wall time and environment steps to the "solved" criterion.

"Solved" = mean greedy evaluation return over >= 32 episodes at or above the
threshold at two consecutive evaluations (compile time included in wall time).

    python experiments/solve.py --env catch --seeds 0,1,2,3,4 --max-seconds 30
    python experiments/solve.py --env cartpole --seeds 0,1,2,3,4 --max-seconds 60

Every run compiles cold unless `--compile-cache DIR` (then the first seed
fills the cache and the later ones start warm; the rows record which).
`--set KEY=VALUE` overrides a preset field (repeatable; values parsed as JSON
when they parse, e.g. `--set lr_decay_updates=3000`). `--vmap-seeds` trains all
seeds together in one program (`muzero_jax.train.train_seeds`) to find the
environment steps and updates each seed needs; its wall times are those of the
batch, not of a single run, so use it to tune, not for time-to-solve figures.

Writes one JSON object per seed to `--out` (default
`experiments/results/solve_ENV.jsonl`) and prints a summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from muzero_jax import provenance
from muzero_jax.bench.solve import THRESHOLDS, load_average, solve, table
from muzero_jax.presets import preset
from muzero_jax.train import solved, train_seeds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="catch", choices=sorted(THRESHOLDS))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a preset field (repeatable)")
    parser.add_argument("--compile-cache", default="none",
                        help="persistent compilation cache: 'none' (default: every run "
                             "compiles cold), 'auto' or a directory (warm after its first run)")
    parser.add_argument("--vmap-seeds", action="store_true",
                        help="train the seeds together in one program (tuning)")
    args = parser.parse_args(argv)
    overrides = _parse_overrides(args.set)
    from muzero_jax import compile_cache

    cache = compile_cache.enable(args.compile_cache)
    out = args.out or os.path.join("experiments", "results", f"solve_{args.env}.jsonl")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    threshold = THRESHOLDS[args.env]
    seeds = [int(s) for s in args.seeds.split(",")]
    host = _host(cache)
    if args.vmap_seeds:
        _vmapped(args, seeds, overrides, threshold, out, host)
        return
    rows = []
    for seed in seeds:
        row = dict(solve(args.env, seed, max_seconds=args.max_seconds, overrides=overrides),
                   **host)
        rows.append(row)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    n_solved = sum(r["solved"] for r in rows)
    print(f"{args.env}: solved {n_solved}/{len(rows)} seeds within {args.max_seconds:g}s")
    print(table(rows))


def _parse_overrides(items: list[str]) -> dict:
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def _host(cache: str | None) -> dict:
    """What each row records of the machine: times depend on the CPU model,
    not only on its cores, and the steps on the code."""
    record = provenance.environment_record()
    return {"machine": platform.machine(), "cpus": os.cpu_count(), "compile_cache": cache,
            "cpu": record["cpu"], "git_commit": record["muzero_jax"]["git_commit"],
            "git_dirty": record["muzero_jax"]["git_dirty"]}


def _vmapped(args, seeds: list[int], overrides: dict, threshold: float, out: str,
             host: dict) -> None:
    """All seeds in one program: env steps and updates to the criterion, per seed."""
    if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise SystemExit("--vmap-seeds needs consecutive seeds, e.g. --seeds 0,1,2,3,4")
    config = preset(args.env, seed=seeds[0], **overrides)
    load_before = load_average()
    result = train_seeds(config, len(seeds), max_seconds=args.max_seconds)
    for seed, history in zip(result.seeds, result.histories):
        evals = [r["eval_return"] for r in history if "eval_return" in r]
        # The first evaluation row at which the run counts as solved.
        solved_at = next((r for i, r in enumerate(history)
                          if "eval_return" in r and solved(history[:i + 1], threshold)), None)
        row = {
            "env": args.env, "seed": seed, "threshold": threshold, "overrides": overrides,
            "mode": "vmap_seeds", "num_seeds": len(seeds),
            "solved": solved_at is not None,
            "solved_env_steps": solved_at and solved_at["env_steps"],
            "solved_updates": solved_at and solved_at["updates"],
            "evals": [round(e, 3) for e in evals],
            "env_steps": history[-1]["env_steps"], "wall_s": history[-1]["wall_s"],
            "load_before": load_before, "load_after": load_average(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), **host,
        }
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"seed {seed}: solved={row['solved']} env_steps={row['solved_env_steps']} "
              f"updates={row['solved_updates']} last evals={row['evals'][-6:]}", flush=True)


if __name__ == "__main__":
    main()
