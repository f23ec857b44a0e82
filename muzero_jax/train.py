"""The host loop: iterations, evaluation, metrics, stopping rules.

The host only sees metrics once per iteration; everything else stays on device.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from muzero_jax.config import Config, config_to_dict
from muzero_jax.learning import IterationMetrics, Trainer, TrainState, make_train

__all__ = ["TrainResult", "train", "metrics_row", "solved"]


@dataclasses.dataclass
class TrainResult:
    """What a finished run returns.

    Attributes:
      state: the final `TrainState`.
      history: one dict per iteration (the rows of `metrics.jsonl`).
      solved_at: the first row at which the "solved" criterion held, or None.
      trainer: the `Trainer` used.
    """

    state: TrainState
    history: list[dict[str, Any]]
    solved_at: dict[str, Any] | None
    trainer: Trainer


def metrics_row(metrics: IterationMetrics, state: TrainState, wall_s: float,
                iteration_s: float, config: Config) -> dict[str, Any]:
    """One JSON-friendly metrics row from device metrics (one host sync)."""
    m = jax.device_get(metrics)
    counters = jax.device_get(state.counters)
    count = float(m.episode_count)
    row: dict[str, Any] = {
        "iteration": int(counters.iterations),
        "env_steps": int(counters.env_steps),
        "updates": int(counters.updates),
        "wall_s": round(wall_s, 3),
        "sps": round(config.env_steps_per_iteration / max(iteration_s, 1e-9), 1),
        "episode_return": float(m.episode_return_sum) / count if count > 0 else None,
        "episode_length": float(m.episode_length_sum) / count if count > 0 else None,
        "episodes": int(count),
        "loss": float(m.loss),
        "value_loss": float(m.value_loss),
        "reward_loss": float(m.reward_loss),
        "policy_loss": float(m.policy_loss),
        "value_error": float(m.value_error),
        "policy_entropy": float(m.policy_entropy),
        "grad_norm": float(m.grad_norm),
        "learning_rate": float(m.learning_rate),
        "temperature": float(m.temperature),
        "learned": bool(m.learned),
        "finite": bool(m.finite),
    }
    return row


def solved(history: list[dict[str, Any]], threshold: float) -> bool:
    """Two consecutive evaluations at or above `threshold` (the issue's rule)."""
    evals = [r["eval_return"] for r in history if "eval_return" in r]
    return len(evals) >= 2 and evals[-1] >= threshold and evals[-2] >= threshold


def _precompile(trainer: Trainer, state: TrainState, eval_key) -> Callable[[], None]:
    """Compiles evaluation in a background thread while training starts.

    XLA compiles outside the GIL, so on a multi-core machine the evaluation
    program is ready by the first evaluation at no wall-time cost.
    """
    def work():
        try:
            trainer.evaluate.lower(state.params, eval_key).compile()
        except Exception:  # noqa: BLE001 - a failure here resurfaces at first use
            pass

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread.join


def train(
    config: Config,
    *,
    trainer: Trainer | None = None,
    state: TrainState | None = None,
    max_seconds: float | None = None,
    stop_threshold: float | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    metrics_path: str | os.PathLike | None = None,
) -> TrainResult:
    """Trains until `max_env_steps`, `max_seconds` or the solved criterion.

    Args:
      config: the run's configuration.
      trainer: a prebuilt `Trainer` (else `make_train(config)`).
      state: a state to continue from (else `trainer.init(seed)`).
      max_seconds: wall-clock budget, compile included.
      stop_threshold: stop once two consecutive evaluations reach it.
      on_row: called with each metrics row (progress display, logging).
      metrics_path: append each row as a JSON line to this file.

    Returns:
      A `TrainResult`.
    """
    start = time.perf_counter()
    trainer = trainer or make_train(config)
    root_key = jax.random.key(config.seed)
    init_key, eval_root = jax.random.split(root_key)
    if state is None:
        state = trainer.init(init_key)
    join_eval_compile = None
    if config.eval_every > 0:
        join_eval_compile = _precompile(trainer, state, jax.random.key(0))
    history: list[dict[str, Any]] = []
    solved_at = None
    sink = open(metrics_path, "a") if metrics_path else None  # noqa: SIM115
    try:
        while True:
            t0 = time.perf_counter()
            state, metrics = trainer.iteration(state)
            jax.block_until_ready(metrics)
            now = time.perf_counter()
            row = metrics_row(metrics, state, now - start, now - t0, config)
            if not row["finite"]:
                raise FloatingPointError(
                    f"non-finite loss or parameters at iteration {row['iteration']}: "
                    + ", ".join(f"{k}={row[k]}" for k in
                                ("loss", "value_loss", "reward_loss", "policy_loss"))
                )
            iteration = row["iteration"]
            if config.eval_every and iteration % config.eval_every == 0:
                if join_eval_compile is not None:
                    join_eval_compile()
                    join_eval_compile = None
                key = jax.random.fold_in(eval_root, iteration)
                returns = np.asarray(trainer.evaluate(state.params, key))
                row["eval_return"] = float(returns.mean())
                row["eval_return_stderr"] = float(returns.std(ddof=1) / math.sqrt(len(returns)))
                row["wall_s"] = round(time.perf_counter() - start, 3)
            history.append(row)
            if sink:
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            if on_row:
                on_row(row)
            if stop_threshold is not None and solved_at is None and solved(history,
                                                                          stop_threshold):
                solved_at = row
                break
            if row["env_steps"] >= config.max_env_steps:
                break
            if max_seconds is not None and time.perf_counter() - start >= max_seconds:
                break
    finally:
        if sink:
            sink.close()
    return TrainResult(state=state, history=history, solved_at=solved_at, trainer=trainer)


def config_json(config: Config) -> str:
    """The resolved config as pretty JSON."""
    return json.dumps(config_to_dict(config), indent=2, sort_keys=True)
