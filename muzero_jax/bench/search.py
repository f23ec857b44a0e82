"""Simulations per second of MCTS policies on a small MuZero-style network.

Compares `mctx.muzero_policy`, `mctx.gumbel_muzero_policy`, our `puct_policy` and
`muzero_paper_policy` on the same network, inputs and keys, over a grid of
action counts `A`, batch sizes `B` and simulation budgets `N`.

Method, per grid cell:

* every policy is jitted once; lowering + compilation time is recorded apart;
* one warm-up call per policy, then `repeats` rounds in which every policy is
  called once (the order rotates between rounds, so slow drift of the machine,
  e.g. other processes or frequency scaling, hits all policies alike);
* each call is timed to `block_until_ready`; the table reports the median and
  the min-max over rounds, simulations/s = `B * N / median seconds`, and the
  speed ratio of each policy against `mctx.muzero_policy` in the same cell
  (> 1 means faster).

The network mirrors muzero-general's fully connected model with scalar heads
(the search, not the network, is what is measured): representation
`obs 16 -> 128 -> latent 64`, dynamics `(latent, one-hot action) -> 128 -> latent
64` plus a reward head, prediction `latent -> 128 -> (policy logits A, value)`,
ELU activations and min-max scaled latents.

Usage::

    python -m muzero_jax.bench.search --actions 9 --batch 256 --simulations 50
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import mctx
import numpy as np

from muzero_jax.files import atomic_path
from muzero_jax.logger import Printer
from muzero_jax.puct import muzero_paper_policy, puct_policy

__all__ = [
    "POLICIES",
    "format_table",
    "init_network",
    "machine_info",
    "main",
    "recurrent_fn",
    "root_fn",
    "run_search_benchmark",
]

OBSERVATION_SIZE = 16
HIDDEN_SIZE = 128
LATENT_SIZE = 64
DISCOUNT = 0.997
BASELINE = "mctx_muzero"


def _selection_without_tie_noise(rng_key, tree, node_index, depth, *, pb_c_init, pb_c_base):
    """`mctx.muzero_action_selection` minus its `1e-7 * uniform` tie-break noise."""
    del rng_key
    visit_counts = tree.children_visits[node_index]
    node_visit = tree.node_visits[node_index]
    pb_c = pb_c_init + jnp.log((node_visit + pb_c_base + 1.0) / pb_c_base)
    prior_probs = jax.nn.softmax(tree.children_prior_logits[node_index])
    policy_score = jnp.sqrt(node_visit) * pb_c * prior_probs / (visit_counts + 1)
    scores = mctx.qtransform_by_parent_and_siblings(tree, node_index) + policy_score
    invalid = tree.root_invalid_actions * (depth == 0)
    return jnp.argmax(jnp.where(invalid, -jnp.inf, scores)).astype(jnp.int32)


def mctx_muzero_without_tie_noise(
    params,
    rng_key,
    root,
    recurrent_fn,
    num_simulations,
    invalid_actions=None,
    *,
    dirichlet_fraction=0.25,
    dirichlet_alpha=0.3,
    pb_c_init=1.25,
    pb_c_base=19652.0,
) -> mctx.PolicyOutput:
    """Ablation for the profile: `mctx.muzero_policy` through `mctx.search`, but
    without the per-depth tie-break noise (not a built-in: results differ)."""
    rng_key, dirichlet_key, search_key = jax.random.split(rng_key, 3)
    probs = jax.nn.softmax(root.prior_logits)
    noise = jax.random.dirichlet(
        dirichlet_key, jnp.full(probs.shape[-1:], dirichlet_alpha), probs.shape[:1]
    )
    logits = jnp.log(
        jnp.maximum(
            (1 - dirichlet_fraction) * probs + dirichlet_fraction * noise,
            jnp.finfo(probs.dtype).tiny,
        )
    )
    if invalid_actions is not None:
        logits = jnp.where(invalid_actions, jnp.finfo(logits.dtype).min, logits)
    selection = functools.partial(
        _selection_without_tie_noise, pb_c_init=pb_c_init, pb_c_base=pb_c_base
    )
    tree = mctx.search(
        params,
        search_key,
        root=root.replace(prior_logits=logits),
        recurrent_fn=recurrent_fn,
        root_action_selection_fn=functools.partial(selection, depth=0),
        interior_action_selection_fn=selection,
        num_simulations=num_simulations,
        invalid_actions=invalid_actions,
    )
    weights = tree.summary().visit_probs
    action = jax.random.categorical(rng_key, jnp.log(jnp.maximum(weights, 1e-30)))
    return mctx.PolicyOutput(action=action, action_weights=weights, search_tree=tree)


POLICIES: dict[str, Callable[..., mctx.PolicyOutput]] = {
    "mctx_muzero": mctx.muzero_policy,
    "mctx_gumbel": mctx.gumbel_muzero_policy,
    "puct": puct_policy,
    "muzero_paper": muzero_paper_policy,
    # Opt-in ablation (`--policies mctx_muzero,mctx_muzero_no_tie_noise`).
    "mctx_muzero_no_tie_noise": mctx_muzero_without_tie_noise,
}
DEFAULT_POLICIES = ("mctx_muzero", "mctx_gumbel", "puct", "muzero_paper")

Params = dict[str, tuple[jax.Array, jax.Array]]


# ----------------------------------------------------------------------------
# Network.
# ----------------------------------------------------------------------------


def _dense_init(key: jax.Array, fan_in: int, fan_out: int) -> tuple[jax.Array, jax.Array]:
    """LeCun-normal weights and zero bias."""
    weights = jax.random.normal(key, (fan_in, fan_out)) / np.sqrt(fan_in)
    return weights, jnp.zeros((fan_out,))


def init_network(key: jax.Array, num_actions: int) -> Params:
    """Random parameters of the benchmark network for `num_actions` actions."""
    shapes = {
        "repr_hidden": (OBSERVATION_SIZE, HIDDEN_SIZE),
        "repr_out": (HIDDEN_SIZE, LATENT_SIZE),
        "dyn_hidden": (LATENT_SIZE + num_actions, HIDDEN_SIZE),
        "dyn_out": (HIDDEN_SIZE, LATENT_SIZE),
        "reward": (HIDDEN_SIZE, 1),
        "pred_hidden": (LATENT_SIZE, HIDDEN_SIZE),
        "policy": (HIDDEN_SIZE, num_actions),
        "value": (HIDDEN_SIZE, 1),
    }
    keys = jax.random.split(key, len(shapes))
    return {name: _dense_init(k, *shape) for k, (name, shape) in zip(keys, shapes.items())}


def _dense(params: Params, name: str, x: jax.Array) -> jax.Array:
    weights, bias = params[name]
    return x @ weights + bias


def _scale_latent(latent: jax.Array) -> jax.Array:
    """Min-max scales each latent to [0, 1], as muzero-general does."""
    low = jnp.min(latent, axis=-1, keepdims=True)
    high = jnp.max(latent, axis=-1, keepdims=True)
    return (latent - low) / jnp.maximum(high - low, 1e-5)


def _predict(params: Params, latent: jax.Array) -> tuple[jax.Array, jax.Array]:
    hidden = jax.nn.elu(_dense(params, "pred_hidden", latent))
    return _dense(params, "policy", hidden), _dense(params, "value", hidden)[..., 0]


def root_fn(params: Params, observation: jax.Array) -> mctx.RootFnOutput:
    """Representation + prediction for a batch of observations `[B, 16]`."""
    hidden = jax.nn.elu(_dense(params, "repr_hidden", observation))
    latent = _scale_latent(_dense(params, "repr_out", hidden))
    logits, value = _predict(params, latent)
    return mctx.RootFnOutput(prior_logits=logits, value=value, embedding=latent)


def recurrent_fn(
    params: Params, rng_key: jax.Array, action: jax.Array, latent: jax.Array
) -> tuple[mctx.RecurrentFnOutput, jax.Array]:
    """Dynamics + prediction, in mctx's `recurrent_fn` convention."""
    del rng_key
    num_actions = params["policy"][0].shape[1]
    inputs = jnp.concatenate([latent, jax.nn.one_hot(action, num_actions)], axis=-1)
    hidden = jax.nn.elu(_dense(params, "dyn_hidden", inputs))
    next_latent = _scale_latent(_dense(params, "dyn_out", hidden))
    reward = _dense(params, "reward", hidden)[..., 0]
    logits, value = _predict(params, next_latent)
    output = mctx.RecurrentFnOutput(
        reward=reward,
        discount=jnp.full_like(reward, DISCOUNT),
        prior_logits=logits,
        value=value,
    )
    return output, next_latent


# ----------------------------------------------------------------------------
# Benchmark.
# ----------------------------------------------------------------------------


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not available on this platform
        return None


def machine_info() -> dict[str, Any]:
    """Where and when the numbers were taken (machine, device, versions, load),
    with the provenance a training run records (`provenance.environment_record`:
    the CPU's model and vector instruction sets, the package versions, the
    muzero_jax commit and whether it had uncommitted changes, XLA_FLAGS)."""
    from muzero_jax.provenance import environment_record

    device = jax.devices()[0]
    record = environment_record()
    return {
        "date": record["time"],
        "machine": platform.node(),
        "device": str(device),
        "num_devices": record["devices"]["count"],
        "platform": record["platform"],
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": record["python"],
        "jax": jax.__version__,
        "mctx": mctx.__version__,
        "backend": jax.default_backend(),
        "device_kind": record["devices"]["kind"],
        "load_average": _load_average(),
        "cpu": record["cpu"],
        "packages": record["packages"],
        "git_commit": record["muzero_jax"]["git_commit"],
        "git_dirty": record["muzero_jax"]["git_dirty"],
        "xla_flags": record["xla_flags"],
    }


def _compiled_search(
    policy: Callable[..., mctx.PolicyOutput],
    num_simulations: int,
    params: Params,
    observation: jax.Array,
    key: jax.Array,
) -> tuple[Callable[..., Any], float]:
    """Jits `root_fn` + `policy` and returns the executable and its compile seconds."""

    def search(params, observation, key):
        output = policy(params, key, root_fn(params, observation), recurrent_fn, num_simulations)
        return output.action, output.action_weights

    start = time.perf_counter()
    compiled = jax.jit(search).lower(params, observation, key).compile()
    return compiled, time.perf_counter() - start


def run_search_benchmark(
    actions: Sequence[int] = (2, 4, 9),
    batch: Sequence[int] = (1, 16, 256),
    simulations: Sequence[int] = (16, 50),
    repeats: int = 10,
    policies: Sequence[str] = DEFAULT_POLICIES,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Times every policy on every `(A, B, N)` cell; returns one row per policy and cell.

    Args:
        actions: numbers of actions `A`.
        batch: batch sizes `B`.
        simulations: simulation budgets `N`.
        repeats: timed rounds per cell (each round calls every policy once).
        policies: names from `POLICIES`; ratios need `"mctx_muzero"` among them.
        seed: seeds the network, observations and search keys.
        log: called with a progress line per cell, e.g. `print`.

    Returns:
        Rows with keys `actions, batch, simulations, policy, repeats, seed, compile_s, median_s,
        min_s, max_s, sims_per_s, speedup_vs_mctx_muzero` (ratio of medians) and
        `speedup_vs_mctx_muzero_min` (ratio of the fastest rounds); the ratios are
        None when the baseline was not run.
    """
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise ValueError(f"unknown policies {sorted(unknown)}; choose from {list(POLICIES)}")
    rows = []
    for num_actions in actions:
        params = init_network(jax.random.PRNGKey(seed), num_actions)
        for batch_size in batch:
            observation = jax.random.normal(
                jax.random.PRNGKey(seed + 1), (batch_size, OBSERVATION_SIZE)
            )
            for num_simulations in simulations:
                keys = jax.random.split(jax.random.PRNGKey(seed + 2), repeats + 1)
                compiled, compile_s, times = {}, {}, {}
                for name in policies:
                    compiled[name], compile_s[name] = _compiled_search(
                        POLICIES[name], num_simulations, params, observation, keys[0]
                    )
                    jax.block_until_ready(compiled[name](params, observation, keys[0]))
                    times[name] = []
                for round_index in range(repeats):
                    shift = round_index % len(policies)
                    for name in list(policies[shift:]) + list(policies[:shift]):
                        key = keys[round_index + 1]
                        start = time.perf_counter()
                        jax.block_until_ready(compiled[name](params, observation, key))
                        times[name].append(time.perf_counter() - start)
                baseline = statistics.median(times[BASELINE]) if BASELINE in times else None
                baseline_min = min(times[BASELINE]) if BASELINE in times else None
                for name in policies:
                    median = statistics.median(times[name])
                    rows.append(
                        {
                            "actions": num_actions,
                            "batch": batch_size,
                            "simulations": num_simulations,
                            "policy": name,
                            "repeats": repeats,
                            "seed": seed,
                            "compile_s": compile_s[name],
                            "median_s": median,
                            "min_s": min(times[name]),
                            "max_s": max(times[name]),
                            "sims_per_s": batch_size * num_simulations / median,
                            "speedup_vs_mctx_muzero": (
                                None if baseline is None else baseline / median
                            ),
                            # Fastest round against fastest round: the least
                            # disturbed by other processes on a loaded machine.
                            "speedup_vs_mctx_muzero_min": (
                                None if baseline_min is None else baseline_min / min(times[name])
                            ),
                        }
                    )
                if log is not None:
                    log(format_table(rows[-len(policies) :], header=False))
    return rows


def depth_stats(
    name: str, num_actions: int, batch_size: int, num_simulations: int, seed: int = 0
) -> dict[str, Any]:
    """How deep one search goes, and what that costs mctx's vmapped loops.

    Simulation `i` creates node `i + 1` at depth `d_b` in example `b`; mctx's
    `simulate` and `backward` are while loops vmapped over the batch, so each
    runs `max_b d_b` iterations for that simulation, where an unbatched search
    would need `mean_b d_b` on average.

    Returns:
        `{"policy", "actions", "batch", "simulations", "mean_leaf_depth",
        "batched_loop_iterations", "mean_loop_iterations"}`, the last two summed
        over the simulations of one call and counting `simulate` and `backward`.
    """
    params = init_network(jax.random.PRNGKey(seed), num_actions)
    observation = jax.random.normal(jax.random.PRNGKey(seed + 1), (batch_size, OBSERVATION_SIZE))
    search = jax.jit(
        lambda p, o, k: POLICIES[name](p, k, root_fn(p, o), recurrent_fn, num_simulations)
    )
    tree = jax.device_get(search(params, observation, jax.random.PRNGKey(seed + 2)).search_tree)
    parents = np.asarray(tree.parents)
    depth = np.zeros(parents.shape, np.int64)
    for node in range(1, parents.shape[1]):
        depth[:, node] = depth[np.arange(batch_size), parents[:, node]] + 1
    created = depth[:, 1:]  # [B, N] depth of the node created by each simulation
    return {
        "policy": name,
        "actions": num_actions,
        "batch": batch_size,
        "simulations": num_simulations,
        "mean_leaf_depth": float(created.mean()),
        "batched_loop_iterations": int(2 * created.max(axis=0).sum()),
        "mean_loop_iterations": float(2 * created.mean(axis=0).sum()),
    }


def format_table(rows: Sequence[dict[str, Any]], header: bool = True) -> str:
    """Formats benchmark rows as a fixed-width text table."""
    lines = []
    if header:
        lines.append(
            f"{'A':>2} {'B':>4} {'N':>3} {'policy':<13} {'sims/s':>9} "
            f"{'median ms':>10} {'min-max ms':>17} {'vs mctx':>7} {'(min)':>6} {'compile s':>9}"
        )
    for row in rows:
        ratio = row["speedup_vs_mctx_muzero"]
        ratio_min = row.get("speedup_vs_mctx_muzero_min")
        spread = f"{row['min_s'] * 1e3:.2f}-{row['max_s'] * 1e3:.2f}"
        lines.append(
            f"{row['actions']:>2} {row['batch']:>4} {row['simulations']:>3} "
            f"{row['policy']:<13} {row['sims_per_s']:>9.0f} {row['median_s'] * 1e3:>10.2f} "
            f"{spread:>17} {'-' if ratio is None else f'{ratio:.2f}x':>7} "
            f"{'-' if ratio_min is None else f'{ratio_min:.2f}x':>6} "
            f"{row['compile_s']:>9.1f}"
        )
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """One Markdown row per `(A, B, N)` cell: thousand simulations/s per policy and
    each policy's speed-up over `mctx.muzero_policy` (median; fastest round)."""
    cells: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        key = (row["actions"], row["batch"], row["simulations"])
        cells.setdefault(key, {})[row["policy"]] = row
    names = list(dict.fromkeys(row["policy"] for row in rows))
    others = [name for name in names if name != BASELINE]
    header = ["A", "B", "N"] + [f"{name} k sims/s" for name in names]
    header += [f"{name} / mctx_muzero" for name in others]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (a, b, n), by_name in cells.items():
        values = [str(a), str(b), str(n)]
        values += [
            f"{by_name[name]['sims_per_s'] / 1e3:.1f}" if name in by_name else "-" for name in names
        ]
        for name in others:
            row = by_name.get(name)
            if row is None or row["speedup_vs_mctx_muzero"] is None:
                values.append("-")
            else:
                values.append(
                    f"{row['speedup_vs_mctx_muzero']:.2f}x "
                    f"({row['speedup_vs_mctx_muzero_min']:.2f}x)"
                )
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (exit code 2), without the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def main(argv: Sequence[str] | None = None,
         prog: str = "python -m muzero_jax.bench.search") -> int:
    """Command line entry point: prints the table, optionally writes JSON.

    Args:
        argv: the arguments (without the program name); `None` reads `sys.argv`.
        prog: the command's name in help and error messages (`muzero-jax bench
            search` when reached through `muzero-jax bench`).

    Returns:
        The exit code, 0. Bad arguments exit with code 2 and one line on
        stderr, before anything is compiled.
    """
    parser = _OneLineParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--actions", type=_int_list, default=[2, 4, 9], help="e.g. 2,4,9")
    parser.add_argument("--batch", type=_int_list, default=[1, 16, 256], help="e.g. 1,16,256")
    parser.add_argument("--simulations", type=_int_list, default=[16, 50], help="e.g. 16,50")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds per cell")
    parser.add_argument(
        "--policies",
        type=lambda text: [name for name in text.split(",") if name],
        default=list(DEFAULT_POLICIES),
        help=f"comma separated subset of {','.join(POLICIES)} (default: the first four)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--depth-stats",
        action="store_true",
        help="instead of timing, print how deep each policy searches (mean leaf depth) "
        "and the iterations of mctx's vmapped simulate/backward loops that implies",
    )
    parser.add_argument(
        "--json", metavar="FILE", help="write {machine, command, rows} as JSON to FILE"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown or not args.policies:
        parser.error(f"unknown policies {unknown}; choose from {','.join(POLICIES)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")

    show = Printer()  # a console gone (`| head`) costs no results
    if args.depth_stats:
        for name in args.policies:
            for a in args.actions:
                for b in args.batch:
                    for n in args.simulations:
                        show(json.dumps(depth_stats(name, a, b, n, seed=args.seed)))
        return 0
    info = machine_info()
    show(" | ".join(f"{key}: {value}" for key, value in info.items()))
    show(format_table([]))
    rows = run_search_benchmark(
        actions=args.actions,
        batch=args.batch,
        simulations=args.simulations,
        repeats=args.repeats,
        policies=args.policies,
        seed=args.seed,
        log=show,
    )
    info["load_average_end"] = _load_average()
    if args.json:  # the file before the console
        command = sys.argv[1:] if argv is None else list(argv)
        with atomic_path(args.json) as tmp, open(tmp, "w") as handle:
            json.dump({"machine": info, "argv": command, "rows": rows}, handle, indent=2)
    show(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
