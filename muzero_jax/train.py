"""The host loop: iterations, evaluation, metrics, checkpoints, stopping rules.

The host only sees metrics once per iteration; everything else stays on
device. With a `logdir`, a run writes `config.json`, `metrics.jsonl`,
TensorBoard events and `curve.png` (see `logger.RunLogger`), a line of
`environment.jsonl` per start or resume (`provenance`) and checkpoints in
`logdir/checkpoints/`, and `resume=True` continues it exactly: the restored
`TrainState` carries the rng, replay and counters; the checkpoint's metadata
carries the host-side part (wall time so far, the evaluation history of the
solved rule), and evaluation keys are derived from the seed and the iteration.
"""

from __future__ import annotations

import dataclasses
import functools
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
from muzero_jax.files import atomic_path, write_text_atomically
from muzero_jax.learning import IterationMetrics, Trainer, TrainState, make_train
from muzero_jax.provenance import append_environment_record

__all__ = [
    "DEFAULT_STOP_AT",
    "SeedsResult",
    "train_seeds",
    "NonFiniteError",
    "TrainResult",
    "config_json",
    "metrics_row",
    "solved",
    "train",
]

DEFAULT_STOP_AT: dict[str, float] = {"catch": 0.95, "cartpole": 475.0}
"""Greedy-evaluation return at which `muzero-jax train` stops by default
(two consecutive evaluations): Catch's maximum is 1, CartPole-v1's is 500
(gymnasium's own threshold is 475)."""

LOSS_TERMS = ("loss", "value_loss", "reward_loss", "policy_loss")


class NonFiniteError(FloatingPointError):
    """The loss or the parameters became NaN or infinite.

    Attributes:
      iteration: the iteration that produced them.
      row: its metrics row.
      checkpoint_step: the last good checkpoint's step (None if none).
    """

    def __init__(self, message: str, *, iteration: int, row: dict[str, Any],
                 checkpoint_step: int | None):
        super().__init__(message)
        self.iteration = iteration
        self.row = row
        self.checkpoint_step = checkpoint_step


@dataclasses.dataclass
class TrainResult:
    """What a finished run returns.

    Attributes:
      state: the final `TrainState`.
      history: one dict per iteration of this call (the rows of `metrics.jsonl`).
      solved_at: the first row at which the "solved" criterion held, or None.
      trainer: the `Trainer` used.
      logdir: the run directory, if the run wrote one.
      stop_reason: why the loop ended: "solved", "max_env_steps",
        "max_seconds" or "max_iterations".
    """

    state: TrainState
    history: list[dict[str, Any]]
    solved_at: dict[str, Any] | None
    trainer: Trainer
    logdir: str | None = None
    stop_reason: str = ""


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
        "consistency_loss": float(m.consistency_loss),
        "action_reward_loss": float(m.action_reward_loss),
        "threat_value_loss": float(m.threat_value_loss),
        "reply_reward_loss": float(m.reply_reward_loss),
        "action_prediction_loss": float(m.action_prediction_loss),
        "reconstruction_loss": float(m.reconstruction_loss),
        "action_reconstruction_loss": float(m.action_reconstruction_loss),
        "learning_rate": float(m.learning_rate),
        "temperature": float(m.temperature),
        "learned": bool(m.learned),
        "finite": bool(m.finite),
    }
    return row


def _eval_params(config: Config, state: TrainState):
    """The weights evaluations use: the online or the target (moving-average) ones."""
    return state.target_params if config.eval_weights == "target" else state.params


def solved(history: list[dict[str, Any]], threshold: float) -> bool:
    """Two consecutive evaluations at or above `threshold` (the issue's rule)."""
    evals = [r["eval_return"] for r in history if "eval_return" in r]
    return _solved(evals, threshold)


def _solved(evals: list[float], threshold: float) -> bool:
    return len(evals) >= 2 and evals[-1] >= threshold and evals[-2] >= threshold


def _run_in_background(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Runs `fn` in a thread; the returned function waits and returns its
    result, or raises what it raised."""
    box: dict[str, Any] = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=work, daemon=True)
    thread.start()

    def join():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


def _compile_in_background(compile_fn: Callable[[], Any]) -> Callable[[], None]:
    """`_run_in_background` for a compile: XLA compiles outside the GIL, and the
    executable lands in JAX's caches where the first call finds it. A failure
    is dropped here: the first call compiles again and raises it there."""
    join = _run_in_background(compile_fn)

    def join_quietly() -> None:
        try:
            join()
        except Exception:  # noqa: BLE001 - resurfaces at first use
            pass

    return join_quietly


def _abstract_state(trainer: Trainer, state: TrainState | None, init_key) -> TrainState | None:
    """Shapes, dtypes and shardings of the state the run starts from."""
    if state is not None:
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    if trainer.state_shapes is not None:
        return trainer.state_shapes(init_key)
    return None


def _is_main() -> bool:
    return jax.process_index() == 0


def _agree(flags: tuple[bool, ...]) -> tuple[bool, ...]:
    """Process 0's wall-clock decisions, on every process of a multi-host run.

    Stopping on time and time-based checkpoints are decided by clocks that
    differ between hosts; every process must still run the same iterations and
    join the same (collective) checkpoint writes, so they follow process 0.
    """
    if jax.process_count() == 1:
        return flags
    from jax.experimental import multihost_utils

    agreed = multihost_utils.broadcast_one_to_all(np.asarray(flags, np.int32))
    return tuple(bool(x) for x in np.asarray(agreed))


def train(
    config: Config,
    *,
    trainer: Trainer | None = None,
    state: TrainState | None = None,
    max_seconds: float | None = None,
    stop_threshold: float | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    metrics_path: str | os.PathLike | None = None,
    logdir: str | os.PathLike | None = None,
    resume: bool = False,
    max_iterations: int | None = None,
    checkpoint_every: int = 0,
    checkpoint_every_s: float = 60.0,
    keep_checkpoints: int = 3,
    progress: str = "none",
    plot_every_s: float = 30.0,
) -> TrainResult:
    """Trains until `max_env_steps`, `max_seconds`, `max_iterations` or solved.

    Args:
      config: the run's configuration.
      trainer: a prebuilt `Trainer` (else `make_train(config)`).
      state: a state to continue from (else `trainer.init(seed)`, or the
        latest checkpoint with `resume`).
      max_seconds: wall-clock budget of this call, compile included.
      stop_threshold: stop once two consecutive evaluations reach it.
      on_row: called with each metrics row (progress display, logging).
      metrics_path: without `logdir`, append each row as a JSON line here.
      logdir: the run directory: config, metrics, TensorBoard, curve and
        checkpoints go there (only process 0 writes logs).
      resume: continue from the latest checkpoint in `logdir/checkpoints`
        (its config must equal `config`).
      max_iterations: stop once the run (resumed parts included) has done
        this many iterations.
      checkpoint_every: with `logdir`, save every this many iterations (0:
        every `checkpoint_every_s` seconds); always at the end.
      checkpoint_every_s: seconds between checkpoints when `checkpoint_every`
        is 0.
      keep_checkpoints: how many checkpoints to keep.
      progress: "auto" (a bar on a TTY, lines otherwise), "bar", "lines" or
        "none".
      plot_every_s: seconds between refreshes of `curve.png`.

    Returns:
      A `TrainResult`.

    Raises:
      NonFiniteError: the loss or the parameters became NaN/inf; nothing from
        that iteration is saved, so the last checkpoint stays the last good one.
      checkpoint.CheckpointError: `resume` without a usable checkpoint.
    """
    call_start = time.perf_counter()
    trainer = trainer or make_train(config)
    if trainer.num_seeds != 1:
        raise ValueError(f"this trainer batches {trainer.num_seeds} seeds: run it with "
                         "train_seeds(config, num_seeds, trainer=trainer)")
    root_key = jax.random.key(config.seed)
    init_key, eval_root = jax.random.split(root_key)
    main = _is_main()
    checkpointer = logger = None
    evals: list[float] = []
    solved_at = None
    wall_offset = 0.0
    last_saved = None
    if logdir is not None:
        from muzero_jax.checkpoint import Checkpointer
        from muzero_jax.logger import RunLogger

        logdir = os.fspath(logdir)
        checkpointer = Checkpointer(os.path.join(logdir, "checkpoints"),
                                    max_to_keep=keep_checkpoints)
        if resume:
            restored = checkpointer.restore(trainer)
            state = restored.state
            meta = restored.meta
            evals = list(meta.get("eval_history", []))
            solved_at = meta.get("solved_at")
            wall_offset = float(meta.get("wall_s", 0.0))
            last_saved = restored.step
        if main:
            os.makedirs(logdir, exist_ok=True)
            write_text_atomically(os.path.join(logdir, "config.json"), config_json(config))
            append_environment_record(logdir, iteration=last_saved or 0, resumed=resume,
                                      devices=trainer.mesh.devices.flat)
            logger = RunLogger(
                logdir, total_env_steps=config.max_env_steps,
                start_iteration=last_saved or 0, title=f"muzero-jax {config.env}",
                plot_every_s=plot_every_s, progress=progress,
            )
    elif resume:
        raise ValueError("resume=True needs a logdir")
    start = call_start - wall_offset  # wall_s counts every part of a resumed run
    # Cold start (2-core CPU: every stage is CPU-bound, so the order matters).
    # The critical path is tracing the iteration, then its XLA compile (the
    # longest stage). So: `init` runs in a thread (its own compile overlaps
    # the tracing), the iteration is traced and lowered here from the state's
    # shapes and compiles in a thread, then the evaluation is traced here and
    # compiles beside it. The executables land in JAX's caches, where the
    # first calls find them.
    abstract = _abstract_state(trainer, state, init_key)
    join_init = None
    if state is None and abstract is not None:
        join_init = _run_in_background(lambda: trainer.init(init_key))
    join_iteration_compile = join_eval_compile = None
    try:
        if abstract is not None:
            lowered = trainer.iteration.lower(abstract)
            join_iteration_compile = _compile_in_background(lowered.compile)
        if config.eval_every > 0 and abstract is not None:
            lowered_eval = trainer.evaluate.lower(abstract.params, jax.random.key(0))
            join_eval_compile = _compile_in_background(lowered_eval.compile)
    except BaseException:
        if join_iteration_compile is not None:
            join_iteration_compile()  # no XLA compile left running at exit
        raise
    finally:
        if join_init is not None:
            state = join_init()  # raises what init raised
    if state is None:
        state = trainer.init(init_key)
    if join_eval_compile is None and config.eval_every > 0:
        eval_params = state.params
        join_eval_compile = _compile_in_background(
            lambda: trainer.evaluate.lower(eval_params, jax.random.key(0)).compile())
    history: list[dict[str, Any]] = []
    sink = open(metrics_path, "a") if (metrics_path and logger is None and main) else None  # noqa: SIM115
    iteration = int(jax.device_get(state.counters.iterations))
    last_save_time = time.perf_counter()
    stop_reason = ""
    valid = True  # False while `state` has been donated to a running iteration

    def save(row_iteration: int) -> None:
        nonlocal last_saved, last_save_time
        if checkpointer is None or last_saved == row_iteration:
            return
        meta = {
            "iteration": row_iteration,
            "env_steps": int(jax.device_get(state.counters.env_steps)),
            "wall_s": round(time.perf_counter() - start, 3),
            "eval_history": evals,
            "solved_at": solved_at,
            # The per-device state (replay, actors, keys) has one shard per
            # device: a resume must run on as many.
            "num_devices": int(trainer.mesh.devices.size),
        }
        checkpointer.save(row_iteration, state, meta, config)
        last_saved, last_save_time = row_iteration, time.perf_counter()

    try:
        while True:
            if max_iterations is not None and iteration >= max_iterations:
                stop_reason = "max_iterations"
                break
            t0 = time.perf_counter()
            if join_iteration_compile is not None:
                join_iteration_compile()  # never compile the same program twice at once
                join_iteration_compile = None
            valid = False
            state, metrics = trainer.iteration(state)
            valid = True
            jax.block_until_ready(metrics)
            now = time.perf_counter()
            row = metrics_row(metrics, state, now - start, now - t0, config)
            iteration = row["iteration"]
            if not row["finite"]:
                valid = False  # never checkpoint a non-finite state
                where = (f"; the last good checkpoint is {checkpointer.directory}/{last_saved}"
                         if checkpointer is not None and last_saved is not None else "")
                raise NonFiniteError(
                    f"non-finite loss or parameters at iteration {iteration}: "
                    + ", ".join(f"{k}={row[k]}" for k in LOSS_TERMS) + where,
                    iteration=iteration, row=row, checkpoint_step=last_saved,
                )
            if config.eval_every and iteration % config.eval_every == 0:
                if join_eval_compile is not None:
                    join_eval_compile()
                    join_eval_compile = None
                key = jax.random.fold_in(eval_root, iteration)
                returns = np.asarray(trainer.evaluate(_eval_params(config, state), key))
                row["eval_return"] = float(returns.mean())
                row["eval_return_stderr"] = float(returns.std(ddof=1) / math.sqrt(len(returns)))
                row["wall_s"] = round(time.perf_counter() - start, 3)
                evals.append(row["eval_return"])
            history.append(row)
            if logger is not None:
                logger.write(row)
            if sink:
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            if on_row:
                on_row(row)
            if (stop_threshold is not None and solved_at is None
                    and _solved(evals, stop_threshold)):
                solved_at = row
                stop_reason = "solved"
            elif row["env_steps"] >= config.max_env_steps:
                stop_reason = "max_env_steps"
            elif max_iterations is not None and iteration >= max_iterations:
                stop_reason = "max_iterations"
            timed_out, save_due = _agree((
                max_seconds is not None and time.perf_counter() - call_start >= max_seconds,
                checkpoint_every == 0
                and time.perf_counter() - last_save_time >= checkpoint_every_s,
            ))
            if not stop_reason and timed_out:
                stop_reason = "max_seconds"
            if stop_reason:
                break
            if checkpoint_every > 0:
                if iteration % checkpoint_every == 0:
                    save(iteration)
            elif save_due:
                save(iteration)
        save(iteration)
    except KeyboardInterrupt:
        if valid and iteration > 0:
            save(iteration)  # Ctrl-C between iterations: keep the progress
        raise
    finally:
        if join_iteration_compile is not None:
            join_iteration_compile()
        if join_eval_compile is not None:
            # A run that stops before its first evaluation must not leave XLA
            # compiling in a daemon thread: killed at interpreter exit, it
            # aborts the process ("terminate called ...").
            join_eval_compile()
        if sink:
            sink.close()
        if logger is not None:
            logger.close()
        if checkpointer is not None:
            checkpointer.close()
    return TrainResult(state=state, history=history, solved_at=solved_at, trainer=trainer,
                       logdir=logdir, stop_reason=stop_reason)


def config_json(config: Config) -> str:
    """The resolved config as pretty JSON."""
    return json.dumps(config_to_dict(config), indent=2, sort_keys=True)


@dataclasses.dataclass
class SeedsResult:
    """What `train_seeds` returns.

    Attributes:
      state: the final `TrainState` of all seeds (leading `[S]` axis).
      histories: per seed, one dict per iteration (the rows of its
        `seed_K/metrics.jsonl`).
      seeds: the seed of each run (`config.seed + k`).
      trainer: the `Trainer` (built with `num_seeds=S`).
      stop_reason: "max_env_steps", "max_seconds" or "max_iterations".
    """

    state: TrainState
    histories: list[list[dict[str, Any]]]
    seeds: list[int]
    trainer: Trainer
    stop_reason: str


def train_seeds(
    config: Config,
    num_seeds: int,
    *,
    logdir: str | os.PathLike | None = None,
    max_seconds: float | None = None,
    max_iterations: int | None = None,
    on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
    trainer: Trainer | None = None,
) -> SeedsResult:
    """Trains `num_seeds` independent runs in one compiled program.

    Run k uses seed `config.seed + k` and computes what `train` computes for
    that seed (to float rounding: the seeds are batched with `jax.vmap`), at a
    fraction of the cost of separate runs: the fast way to confidence
    intervals. With `logdir`, writes `config.json`, `seed_K/metrics.jsonl` per
    seed and `curve.png` (mean and min-max spread over seeds). No checkpoints.
    `trainer`, if given, must come from `make_train(config, num_seeds=num_seeds,
    ...)` (e.g. with a custom `loss_fn` or `search_fn`).
    """
    if num_seeds < 2:
        raise ValueError(f"train_seeds needs num_seeds >= 2, got {num_seeds}")
    start = time.perf_counter()
    if trainer is None:
        trainer = make_train(config, num_seeds=num_seeds)
    elif trainer.num_seeds != num_seeds:
        raise ValueError(f"trainer was made for num_seeds={trainer.num_seeds}, "
                         f"not {num_seeds}")
    seeds = [config.seed + k for k in range(num_seeds)]
    keys = [jax.random.split(jax.random.key(seed)) for seed in seeds]
    init_keys = jax.numpy.stack([k[0] for k in keys])
    eval_roots = jax.numpy.stack([k[1] for k in keys])
    state = trainer.init(init_keys)
    main = _is_main()
    sinks = []
    if logdir is not None and main:
        logdir = os.fspath(logdir)
        os.makedirs(logdir, exist_ok=True)
        write_text_atomically(os.path.join(logdir, "config.json"), config_json(config))
        append_environment_record(logdir, iteration=0, resumed=False,
                                  devices=trainer.mesh.devices.flat)
        for seed in seeds:
            os.makedirs(os.path.join(logdir, f"seed_{seed}"), exist_ok=True)
            sinks.append(open(os.path.join(logdir, f"seed_{seed}", "metrics.jsonl"), "w"))  # noqa: SIM115
    histories: list[list[dict[str, Any]]] = [[] for _ in seeds]
    last_plot = time.perf_counter()
    stop_reason = ""
    try:
        while True:
            t0 = time.perf_counter()
            state, metrics = trainer.iteration(state)
            jax.block_until_ready(metrics)
            now = time.perf_counter()
            rows = []
            for k in range(num_seeds):
                pick = functools.partial(_index, k=k)
                row = metrics_row(jax.tree.map(pick, metrics),
                                  state._replace(counters=jax.tree.map(pick, state.counters)),
                                  now - start, now - t0, config)
                row["seed"] = seeds[k]
                rows.append(row)
            if not all(r["finite"] for r in rows):
                bad = [r["seed"] for r in rows if not r["finite"]]
                raise NonFiniteError(
                    f"non-finite loss or parameters at iteration {rows[0]['iteration']} "
                    f"(seeds {bad})", iteration=rows[0]["iteration"], row=rows[0],
                    checkpoint_step=None,
                )
            iteration = rows[0]["iteration"]
            if config.eval_every and iteration % config.eval_every == 0:
                eval_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(eval_roots,
                                                                            iteration)
                returns = np.asarray(trainer.evaluate(_eval_params(config, state), eval_keys))
                for row, r in zip(rows, returns):
                    row["eval_return"] = float(r.mean())
                    row["eval_return_stderr"] = float(r.std(ddof=1) / math.sqrt(len(r)))
                    row["wall_s"] = round(time.perf_counter() - start, 3)
            for history, sink, row in zip(histories, sinks or [None] * num_seeds, rows):
                history.append(row)
                if sink is not None:
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
            if on_rows:
                on_rows(rows)
            if sinks and time.perf_counter() - last_plot >= 30.0:
                _plot_seeds(histories, os.path.join(logdir, "curve.png"), config.env)
                last_plot = time.perf_counter()
            if rows[0]["env_steps"] >= config.max_env_steps:
                stop_reason = "max_env_steps"
            elif max_iterations is not None and iteration >= max_iterations:
                stop_reason = "max_iterations"
            elif _agree((max_seconds is not None
                         and time.perf_counter() - start >= max_seconds,))[0]:
                stop_reason = "max_seconds"
            if stop_reason:
                break
    finally:
        for sink in sinks:
            sink.close()
        if sinks:
            _plot_seeds(histories, os.path.join(logdir, "curve.png"), config.env)
    return SeedsResult(state=state, histories=histories, seeds=seeds, trainer=trainer,
                       stop_reason=stop_reason)


def _index(x, *, k: int):
    return x[k]


def _plot_seeds(histories: list[list[dict[str, Any]]], path: str, env: str) -> None:
    """Mean and min-max spread over seeds of the return vs environment steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "episode_return", "training episodes"),
                           (axes[1], "eval_return", "greedy evaluation")):
        steps = [r["env_steps"] for r in histories[0]]
        values = np.asarray([[r.get(key) if r.get(key) is not None else np.nan for r in h]
                             for h in histories], float)
        keep = ~np.all(np.isnan(values), axis=0)
        if keep.any():
            x = np.asarray(steps)[keep]
            v = values[:, keep]
            ax.plot(x, np.nanmean(v, axis=0), label=f"mean of {len(histories)} seeds")
            ax.fill_between(x, np.nanmin(v, axis=0), np.nanmax(v, axis=0), alpha=0.25,
                            label="min-max over seeds")
            ax.legend()
        ax.set_xlabel("environment steps")
        ax.set_ylabel(f"return ({label})")
        ax.grid(alpha=0.3)
    fig.suptitle(f"muzero-jax {env}: {len(histories)} seeds in one program")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=90)
    plt.close(fig)
