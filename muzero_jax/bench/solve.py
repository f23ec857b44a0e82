"""Time to threshold: wall time, environment steps and updates to "solved".

"Solved" (issue 3) = mean greedy evaluation return over >= 32 episodes at or
above the threshold at two consecutive evaluations, compile time included in
the wall time (counted from `train()`; the import is not).
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax

#: The return that counts as solved, per environment.
THRESHOLDS = {"catch": 0.95, "cartpole": 475.0}


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (a shared machine slows every figure)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def solve(env: str, seed: int, *, max_seconds: float,
          overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Trains the preset of `env` with `seed` until solved or `max_seconds`; one row."""
    from muzero_jax.presets import preset
    from muzero_jax.train import train

    if env not in THRESHOLDS:
        raise ValueError(f"no solved threshold for {env!r}; known: {', '.join(THRESHOLDS)}")
    threshold = THRESHOLDS[env]
    overrides = dict(overrides or {})
    config = preset(env, seed=seed, **overrides)
    load_before = load_average()
    start = time.perf_counter()
    result = train(config, max_seconds=max_seconds, stop_threshold=threshold)
    first, last = result.history[0], result.history[-1]
    # Whole-loop throughput (acting + learning + evaluation) after the first
    # iteration, which carries the compile.
    loop_s = last["wall_s"] - first["wall_s"]
    loop_steps = last["env_steps"] - first["env_steps"]
    solved = result.solved_at
    return {
        "env": env, "seed": seed, "threshold": threshold, "overrides": overrides,
        "max_seconds": max_seconds,
        "solved": solved is not None,
        "solved_wall_s": solved and solved["wall_s"],
        "solved_env_steps": solved and solved["env_steps"],
        "solved_updates": solved and solved["updates"],
        "first_iteration_wall_s": first["wall_s"],
        "sps_median": sorted(r["sps"] for r in result.history)[len(result.history) // 2],
        "loop_env_steps_per_s": round(loop_steps / loop_s, 1) if loop_s > 0 else None,
        "final_eval_return": next((r["eval_return"] for r in reversed(result.history)
                                   if "eval_return" in r), None),
        "env_steps": last["env_steps"], "updates": last["updates"],
        "wall_s": round(time.perf_counter() - start, 2),
        "load_before": load_before, "load_after": load_average(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "device": jax.devices()[0].device_kind, "jax": jax.__version__,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of `solve` rows."""
    lines = ["| env | seed | solved | wall s | env steps | updates | first iteration s |"
             " loop steps/s | load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['seed']} | {r['solved']} | {r['solved_wall_s'] or r['wall_s']} | "
            f"{r['solved_env_steps'] or r['env_steps']} | {r['solved_updates'] or r['updates']}"
            f" | {r['first_iteration_wall_s']} | {r['loop_env_steps_per_s']} | "
            f"{r['load_before'] and r['load_before'][0]} |")
    return "\n".join(lines)
