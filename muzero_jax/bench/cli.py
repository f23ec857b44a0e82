"""`muzero-jax bench unroll|search|e2e`: throughput tables as text and JSON.

- `unroll`: learner samples/s of the jitted learner step (the library's
  `unrolled_loss`, its gradient and the run's Optax update), per network,
  unroll length K and batch size; compile time apart; the step's matmul
  FLOPs counted from its jaxpr (`muzero_jax.bench.flops`, forward and
  backward, every unroll step), the FLOP/s achieved and, on a device with a
  known peak (or with `--peak-tflops`), the MFU. `flops_per_step` is XLA's
  `cost_analysis` count, kept for reference: it counts a loop body once, so it
  hardly grows with K. `--updates-per-call U` runs U steps per call in a
  `lax.scan`, as a training iteration does, and reports per-step figures.
- `search`: simulations/s of the built-in searches and raw mctx policies
  (`muzero_jax.bench.search`).
- `e2e`: environment steps/s of whole training iterations (acting with search,
  replay, learning at the preset's replay ratio) per environment, with the
  games (episodes) finished per second and the self-play search's
  simulations per second; with
  `--solve-seeds 0,1,2`, also the wall time (compile included), environment
  steps and updates each seed needs to reach the solved threshold
  (`muzero_jax.bench.solve`).

Timings: one warm-up call (which compiles), then `--repeats` timed calls, each
ended with `block_until_ready`; the table shows the median and the min-max
spread. Every row in the JSON (`--json FILE`) carries its settings, and the
file the machine, device and versions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from muzero_jax.logger import Printer

__all__ = ["main", "run_e2e", "run_unroll", "time_calls"]

_PROG = "muzero-jax bench"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message}")


def time_calls(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    """Seconds of the first call (compile included) and of `repeats` timed calls."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return first, times


def _summary(times: list[float], work: float) -> dict[str, float]:
    med = statistics.median(times)
    return {
        "median_s": med,
        "min_s": min(times),
        "max_s": max(times),
        "per_s": work / med,
        "per_s_min": work / max(times),
        "per_s_max": work / min(times),
    }


def _random_batch(rng: np.random.Generator, obs_shape, num_actions: int, batch: int, k: int):
    from muzero_jax.loss import LossBatch

    policy = rng.random((batch, k + 1, num_actions)).astype(np.float32)
    ones = np.ones((batch, k + 1), np.float32)
    return LossBatch(
        observation=rng.standard_normal((batch,) + tuple(obs_shape)).astype(np.float32),
        actions=rng.integers(0, num_actions, (batch, k)).astype(np.int32),
        target_value=rng.standard_normal((batch, k + 1)).astype(np.float32),
        target_reward=rng.standard_normal((batch, k + 1)).astype(np.float32),
        target_policy=policy / policy.sum(-1, keepdims=True),
        value_mask=ones, reward_mask=ones, policy_mask=ones,
        importance_weight=np.ones((batch,), np.float32),
    )


def repeat_update(step: Callable, updates: int) -> Callable:
    """`step(params, opt_state, data) -> (params, opt_state)` run `updates`
    times on the same data, in a `lax.scan` as a training iteration runs its
    updates (`updates` 1: `step` itself)."""
    if updates == 1:
        return step

    def call(params, opt_state, data):
        return jax.lax.scan(lambda carry, _: (step(*carry, data), None),
                            (params, opt_state), None, length=updates)[0]

    return call


def run_unroll(
    *, env: str, networks: Sequence[str], unroll_steps: Sequence[int],
    batch_sizes: Sequence[int], repeats: int, seed: int = 0,
    peak_flops_per_s: float | None = None, updates_per_call: int = 1,
    compute_dtypes: Sequence[str] = ("float32",),
) -> list[dict[str, Any]]:
    """Learner samples/s (a sample = one sequence of K unroll steps) per setting.

    `updates_per_call`: learner steps per timed call; above 1 they run in a
    `lax.scan`, as a training iteration runs its updates, so the figure is the
    one training sees (on XLA:CPU a step inside a loop can compile to slower
    code than the same step alone).
    `compute_dtypes`: the networks' compute dtypes to compare
    (`Config.compute_dtype`); each row's MFU is against the peak for its dtype.
    `peak_flops_per_s`: the device's peak for the MFU column, for every row
    (None: looked up from the device kind and the row's dtype in
    `muzero_jax.bench.flops.PEAK_TFLOPS` / `PEAK_TFLOPS_BF16`; no MFU when
    unknown, e.g. on CPU).
    """
    import optax

    from muzero_jax.bench.flops import matmul_flops, peak_flops
    from muzero_jax.envs import make_env
    from muzero_jax.learning import make_optimizer
    from muzero_jax.loss import unrolled_loss
    from muzero_jax.networks import make_networks
    from muzero_jax.presets import preset
    from muzero_jax.value_transforms import make_support

    environment = make_env(env)
    device_kind = jax.devices()[0].device_kind
    rows = []
    rng = np.random.default_rng(seed)
    settings = [(n, k, b, d) for n in networks for k in unroll_steps for b in batch_sizes
                for d in compute_dtypes]
    for network, k, batch, dtype in settings:
        config = preset(env, network=network, num_unroll_steps=k)
        vs = make_support(config.value_support_size)
        rs = make_support(config.reward_support_size)
        nets = make_networks(
            config.mlp if network == "mlp" else config.resnet,
            num_actions=environment.num_actions, value_bins=vs.num_bins,
            reward_bins=rs.num_bins, compute_dtype=dtype,
        )
        optimizer, _ = make_optimizer(config)
        data = _random_batch(rng, environment.observation_shape,
                             environment.num_actions, batch, k)
        params = nets.init(jax.random.key(seed), jnp.asarray(data.observation[:1]))
        opt_state = optimizer.init(params)

        def step(params, opt_state, data, nets=nets, vs=vs, rs=rs,
                 optimizer=optimizer, weight=config.value_loss_weight):
            grads, _ = jax.grad(unrolled_loss, has_aux=True)(
                params, data, networks=nets, value_support=vs, reward_support=rs,
                value_loss_weight=weight)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        call = repeat_update(step, updates_per_call)
        t0 = time.perf_counter()
        compiled = jax.jit(call).lower(params, opt_state, data).compile()
        compile_s = time.perf_counter() - t0
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops = float(cost.get("flops", 0.0)) if cost else 0.0
        model_flops = matmul_flops(step, params, opt_state, data)
        data_dev = jax.device_put(data)
        _, times = time_calls(lambda c=compiled, p=params, o=opt_state, d=data_dev:
                              c(p, o, d), repeats)
        summary = _summary(times, batch * updates_per_call)
        step_s = summary["median_s"] / updates_per_call
        row_peak = peak_flops_per_s or peak_flops(device_kind, dtype)
        rows.append({
            "bench": "unroll", "env": env, "network": network, "unroll_steps": k,
            "compute_dtype": dtype, "batch_size": batch,
            "updates_per_call": updates_per_call,
            "repeats": repeats,
            "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
            "compile_s": compile_s, "flops_per_step": flops,
            "samples_per_s": summary["per_s"],
            "samples_per_s_min": summary["per_s_min"],
            "samples_per_s_max": summary["per_s_max"],
            "step_median_s": step_s,
            "achieved_flops_per_s": flops / step_s,
            "model_flops_per_step": model_flops,
            "model_flops_per_s": model_flops / step_s,
            "device_kind": device_kind,
            "peak_flops_per_s": row_peak,
            "mfu": model_flops / step_s / row_peak if row_peak else None,
        })
    return rows


def run_e2e(*, envs: Sequence[str], iterations: int, overrides: dict[str, Any],
            seed: int = 0) -> list[dict[str, Any]]:
    """Environment steps/s of whole training iterations (act + replay + learn)."""
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset

    rows = []
    for env in envs:
        config = preset(env, seed=seed, eval_every=0, **overrides)
        trainer = make_train(config)
        state = trainer.init(jax.random.key(seed))
        t0 = time.perf_counter()
        state, metrics = trainer.iteration(state)
        jax.block_until_ready(metrics)
        first = time.perf_counter() - t0
        # Iterate until learning has started, so timed iterations include updates.
        warm = 0
        while not bool(metrics.learned) and warm < 1000:
            state, metrics = trainer.iteration(state)
            warm += 1
        times, games = [], 0.0
        for _ in range(iterations):
            t0 = time.perf_counter()
            state, metrics = trainer.iteration(state)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - t0)
            games += float(metrics.episode_count)
        summary = _summary(times, config.env_steps_per_iteration)
        rows.append({
            "bench": "e2e", "env": env, "num_envs": config.num_envs,
            "rollout_length": config.rollout_length, "num_simulations": config.num_simulations,
            "search": config.search, "batch_size": config.batch_size,
            "updates_per_iteration": config.updates_per_iteration,
            "num_devices": trainer.mesh.devices.size, "iterations": iterations,
            "first_iteration_s": first, "env_steps_per_s": summary["per_s"],
            "env_steps_per_s_min": summary["per_s_min"],
            "env_steps_per_s_max": summary["per_s_max"],
            "learner_samples_per_s": summary["per_s"] * config.updates_per_iteration
            * config.batch_size / config.env_steps_per_iteration,
            "iteration_median_s": summary["median_s"],
            # Episodes (games) finished, over the total timed time; and the
            # self-play search's simulations (one search per env step).
            "games": games, "timed_s": sum(times), "games_per_s": games / sum(times),
            "search_simulations_per_s": summary["per_s"] * config.num_simulations,
            # Reanalyse's searches (reanalyse_rows per environment per
            # iteration, i.e. R / T per env step), counted apart; 0 when off.
            "reanalyse_rows": config.reanalyse_rows,
            "reanalyse_simulations_per_s": summary["per_s"] * config.num_simulations
            * config.reanalyse_rows / config.rollout_length,
        })
    return rows


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected seeds >= 0 like 0,1,2, got {text!r}")
    return seeds


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    def fmt(v):
        if v is None:
            return "n/a"
        if isinstance(v, float):
            return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
        return str(v)

    cells = [[fmt(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = [" | ".join(c.rjust(w) for c, w in zip(columns, widths)),
             "-|-".join("-" * w for w in widths)]
    lines += [" | ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    from muzero_jax.envs import ENV_NAMES

    parser = _Parser(prog=_PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    unroll = sub.add_parser("unroll", help="learner samples/s of the unrolled loss + update")
    unroll.add_argument("--env", default="catch", choices=ENV_NAMES,
                        help="environment giving observation shape and action count")
    unroll.add_argument("--network", default="mlp,resnet",
                        help="comma-separated: mlp, resnet (default: both)")
    unroll.add_argument("--unroll-steps", type=_ints, default=[1, 5, 10], help="K values")
    unroll.add_argument("--batch-sizes", type=_ints, default=[64, 256, 1024])
    unroll.add_argument("--repeats", type=_positive, default=10)
    unroll.add_argument("--updates-per-call", type=_positive, default=1,
                        help="learner steps per timed call, in a lax.scan as in a training "
                             "iteration (default 1: one step alone)")
    unroll.add_argument("--compute-dtypes", default="float32",
                        help="comma-separated: float32, bfloat16 (the networks' compute "
                             "dtype, Config.compute_dtype)")
    unroll.add_argument("--peak-tflops", type=_positive_float, default=None,
                        help="the device's peak TFLOP/s for the MFU column (default: "
                             "known GPUs/TPUs, see muzero_jax.bench.flops; none on CPU)")
    unroll.add_argument("--json", default=None, help="write the rows and machine info here")
    e2e = sub.add_parser("e2e", help="environment steps/s of whole training iterations")
    e2e.add_argument("--envs", default="catch,cartpole", help="comma-separated environments")
    e2e.add_argument("--iterations", type=_positive, default=10, help="timed iterations")
    e2e.add_argument("--num-devices", type=_ints, default=None,
                     help="comma-separated device counts to compare, e.g. 1,2,4 "
                     "(default: all devices JAX sees)")
    e2e.add_argument("--cpu-devices", type=_positive, default=None,
                     help="on a CPU, split the host into this many JAX devices first "
                          "(as `train --cpu-devices`); compare them with --num-devices")
    e2e.add_argument("--set", default="{}", help="JSON object of config overrides")
    e2e.add_argument("--solve-seeds", type=_seeds, default=[],
                     help="also train these seeds (e.g. 0,1,2) to the solved threshold "
                          "(catch 0.95, cartpole 475) and report wall time, env steps "
                          "and updates (compile included)")
    e2e.add_argument("--max-seconds", type=float, default=120.0,
                     help="wall-time budget of each --solve-seeds run")
    e2e.add_argument("--json", default=None, help="write the rows and machine info here")
    sub.add_parser("search", help="simulations/s of batched search (see --help there)",
                   add_help=False)
    return parser


def _write(rows: list[dict[str, Any]], path: str | None, argv: Sequence[str]) -> None:
    if path is None:
        return
    from muzero_jax.bench.search import machine_info
    from muzero_jax.files import atomic_path

    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump({"machine": machine_info(), "argv": list(argv), "rows": rows}, f, indent=2)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `muzero-jax bench`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "search":
        from muzero_jax.bench import search

        try:
            code = search.main(argv[1:], prog=f"{_PROG} search")
        except SystemExit as e:  # argparse inside: 2 on bad flags, 0 on --help
            return int(e.code or 0)
        return code if isinstance(code, int) else 0
    show = Printer()  # a console gone (`| head`) costs no results
    try:
        args = _parser().parse_args(argv)
        if args.command == "unroll":
            from muzero_jax.envs import make_env  # noqa: F401 - fail early on bad env
            from muzero_jax.networks import COMPUTE_DTYPES

            networks = [n.strip() for n in args.network.split(",") if n.strip()]
            bad = [n for n in networks if n not in ("mlp", "resnet")]
            if bad or not networks:
                raise _UsageError(f"{_PROG} unroll: --network must list mlp and/or resnet, "
                                  f"got {args.network!r}")
            dtypes = [d.strip() for d in args.compute_dtypes.split(",") if d.strip()]
            bad = [d for d in dtypes if d not in COMPUTE_DTYPES]
            if bad or not dtypes:
                raise _UsageError(f"{_PROG} unroll: --compute-dtypes must list "
                                  f"{' and/or '.join(COMPUTE_DTYPES)}, got {args.compute_dtypes!r}")
            rows = run_unroll(env=args.env, networks=networks, unroll_steps=args.unroll_steps,
                              batch_sizes=args.batch_sizes, repeats=args.repeats,
                              peak_flops_per_s=args.peak_tflops and args.peak_tflops * 1e12,
                              updates_per_call=args.updates_per_call, compute_dtypes=dtypes)
            _write(rows, args.json, argv)  # the file before the console, which may be gone
            show(_table(rows, ("network", "unroll_steps", "compute_dtype", "batch_size",
                                "updates_per_call",
                                "samples_per_s",
                                "samples_per_s_min", "samples_per_s_max", "compile_s",
                                "model_flops_per_step", "mfu")))
        else:
            if args.cpu_devices is not None:  # before anything starts JAX's backends
                from muzero_jax.distributed import use_cpu_devices

                try:
                    use_cpu_devices(args.cpu_devices)
                except ValueError as e:
                    raise _UsageError(f"{_PROG} e2e: {e}") from None
            from muzero_jax.envs import ENV_NAMES

            envs = [e.strip() for e in args.envs.split(",") if e.strip()]
            unknown = [e for e in envs if e not in ENV_NAMES]
            if unknown or not envs:
                raise _UsageError(f"{_PROG} e2e: unknown environment(s) {unknown or envs}; "
                                  f"known: {', '.join(ENV_NAMES)}")
            try:
                overrides = json.loads(args.set)
                assert isinstance(overrides, dict)
            except (json.JSONDecodeError, AssertionError):
                raise _UsageError(
                    f"{_PROG} e2e: --set must be a JSON object, got {args.set!r}") from None
            from muzero_jax.config import Config

            names = {f.name for f in dataclasses.fields(Config)}
            if set(overrides) - names:
                raise _UsageError(f"{_PROG} e2e: --set: unknown config field(s) "
                                  f"{sorted(set(overrides) - names)}")
            try:
                from muzero_jax.presets import preset

                for env in envs:
                    preset(env, **overrides)
            except (ValueError, TypeError) as e:
                raise _UsageError(f"{_PROG} e2e: {e}") from None
            if args.max_seconds <= 0:
                raise _UsageError(f"{_PROG} e2e: --max-seconds must be > 0, "
                                  f"got {args.max_seconds:g}")
            counts = args.num_devices or [overrides.get("num_devices", 0)]
            if max(counts) > jax.device_count():
                raise _UsageError(f"{_PROG} e2e: --num-devices {max(counts)} but JAX sees "
                                  f"{jax.device_count()} device(s)")
            rows = []
            for count in counts:
                rows += run_e2e(envs=envs, iterations=args.iterations,
                                overrides=dict(overrides, num_devices=count))
            _write(rows, args.json, argv)
            show(_table(rows, ("env", "num_devices", "env_steps_per_s", "env_steps_per_s_min",
                                "env_steps_per_s_max", "learner_samples_per_s",
                                "games_per_s", "search_simulations_per_s",
                                "first_iteration_s")))
            if args.solve_seeds:
                from muzero_jax.bench.solve import THRESHOLDS, solve, table

                for env in envs:
                    if env not in THRESHOLDS:
                        continue
                    solved = [solve(env, seed, max_seconds=args.max_seconds,
                                    overrides=overrides) for seed in args.solve_seeds]
                    rows += [dict(r, kind="time_to_threshold") for r in solved]
                    _write(rows, args.json, argv)
                    show(table(solved))
    except _UsageError as e:
        print(str(e).splitlines()[0], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
