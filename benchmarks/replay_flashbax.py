"""Benchmark: muzero_jax.replay against flashbax's prioritised trajectory buffer.

Both buffers store the same `Trajectory` pytree, with the same number of
environments `B`, time steps per environment `N`, rows added per call `T`,
sample batch and sequence length `L`. Every operation is jitted (the state is
donated to `add` and `set_priorities`), compiled and warmed up on a full,
wrapped buffer, then timed in rounds that alternate the two implementations
(A B A B ...). Each round times `--inner` chained calls; the table reports the
median over rounds of the time per call.

flashbax is not a dependency of this project; run this script with an
interpreter that has it, e.g.::

    python3 -m venv /tmp/venv-fbx
    /tmp/venv-fbx/bin/pip install flashbax jax==0.10.2 jaxlib==0.10.2 chex
    PYTHONPATH=. /tmp/venv-fbx/bin/python benchmarks/replay_flashbax.py --json out.json

flashbax's `sample` returns probabilities but no importance weights; ours also
computes the weights (a few element-wise operations on the batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from muzero_jax.replay import Trajectory, make_replay_buffer

NUM_ACTIONS = 4


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark configuration.

    Attributes:
      name: label in the table.
      num_envs: `B`, environments added per call.
      capacity: `N`, time steps stored per environment.
      add_length: `T`, time steps added per `add` call.
      batch_size: sequences per `sample` call.
      sequence_length: `L`, rows per sampled sequence.
      obs_shape: shape of one observation.
    """

    name: str
    num_envs: int
    capacity: int
    add_length: int
    batch_size: int
    sequence_length: int
    obs_shape: tuple[int, ...]


CASES = {
    "small-obs4": Case("small-obs4", 64, 1000, 16, 256, 16, (4,)),
    "small-obs10x5": Case("small-obs10x5", 64, 1000, 16, 256, 16, (10, 5)),
    "large-obs4": Case("large-obs4", 1024, 2000, 16, 256, 16, (4,)),
    "large-obs10x5": Case("large-obs10x5", 512, 2000, 16, 1024, 16, (10, 5)),
}


def example_row(obs_shape: tuple[int, ...]) -> Trajectory:
    """One unbatched `Trajectory` row of zeros."""
    return Trajectory(
        observation=jnp.zeros(obs_shape, jnp.float32),
        action=jnp.zeros((), jnp.int32),
        reward=jnp.zeros((), jnp.float32),
        first=jnp.zeros((), bool),
        last=jnp.zeros((), bool),
        terminated=jnp.zeros((), bool),
        truncated=jnp.zeros((), bool),
        legal_action_mask=jnp.ones((NUM_ACTIONS,), bool),
        to_play=jnp.zeros((), jnp.int32),
        search_policy=jnp.full((NUM_ACTIONS,), 1.0 / NUM_ACTIONS, jnp.float32),
        search_value=jnp.zeros((), jnp.float32),
    )


def random_chunk(key: jax.Array, case: Case) -> Trajectory:
    """A `[B, T, ...]` chunk with random content and ~2% episode ends."""
    shape = (case.num_envs, case.add_length)
    keys = jax.random.split(key, 4)
    last = jax.random.uniform(keys[0], shape) < 0.02
    return Trajectory(
        observation=jax.random.normal(keys[1], shape + case.obs_shape),
        action=jax.random.randint(keys[2], shape, 0, NUM_ACTIONS),
        reward=jax.random.normal(keys[3], shape),
        first=jnp.zeros(shape, bool),
        last=last,
        terminated=last,
        truncated=jnp.zeros(shape, bool),
        legal_action_mask=jnp.ones(shape + (NUM_ACTIONS,), bool),
        to_play=jnp.zeros(shape, jnp.int32),
        search_policy=jnp.full(shape + (NUM_ACTIONS,), 1.0 / NUM_ACTIONS),
        search_value=jnp.zeros(shape),
    )


@dataclasses.dataclass
class Impl:
    """A buffer under test: jitted operations and a mutable current state.

    Attributes:
      name: label.
      state: the current buffer state (replaced by donated calls).
      add: `(state, chunk) -> state`, jitted with donation.
      sample: `(state, key) -> sample`, jitted.
      set_priorities: `(state, sample, priorities) -> state`, jitted with donation.
    """

    name: str
    state: Any
    add: Callable[..., Any]
    sample: Callable[..., Any]
    set_priorities: Callable[..., Any]


def make_ours(case: Case, alpha: float, beta: float) -> Impl:
    buffer = make_replay_buffer(
        num_envs=case.num_envs,
        capacity=case.capacity,
        sequence_length=case.sequence_length,
        batch_size=case.batch_size,
        alpha=alpha,
    )

    def set_priorities(state, sample, priorities):
        return buffer.set_priorities(state, sample.env_index, sample.time_index, priorities)

    return Impl(
        name="ours",
        state=buffer.init(example_row(case.obs_shape)),
        add=jax.jit(buffer.add, donate_argnums=0),
        sample=jax.jit(lambda state, key: buffer.sample(state, key, beta)),
        set_priorities=jax.jit(set_priorities, donate_argnums=0),
    )


def make_flashbax(case: Case, alpha: float) -> Impl:
    import flashbax

    device = "gpu" if jax.default_backend() == "gpu" else "cpu"
    buffer = flashbax.make_prioritised_trajectory_buffer(
        add_batch_size=case.num_envs,
        sample_batch_size=case.batch_size,
        sample_sequence_length=case.sequence_length,
        period=1,
        min_length_time_axis=case.sequence_length,
        max_length_time_axis=case.capacity,
        priority_exponent=alpha,
        device=device,
    )

    def set_priorities(state, sample, priorities):
        return buffer.set_priorities(state, sample.indices, priorities)

    return Impl(
        name="flashbax",
        state=buffer.init(example_row(case.obs_shape)),
        add=jax.jit(buffer.add, donate_argnums=0),
        sample=jax.jit(buffer.sample),
        set_priorities=jax.jit(set_priorities, donate_argnums=0),
    )


def time_round(impl: Impl, op: str, chunks: list, keys: list, priorities: jax.Array) -> float:
    """Seconds per call of `op`, over len(chunks) chained calls."""
    if op == "add":
        jax.block_until_ready(impl.state)
        start = time.perf_counter()
        for chunk in chunks:
            impl.state = impl.add(impl.state, chunk)
        jax.block_until_ready(impl.state)
    elif op == "sample":
        jax.block_until_ready(impl.state)
        start = time.perf_counter()
        samples = [impl.sample(impl.state, key) for key in keys]
        jax.block_until_ready(samples)
    elif op == "set_priorities":
        samples = [impl.sample(impl.state, key) for key in keys]
        jax.block_until_ready((impl.state, samples))
        start = time.perf_counter()
        for sample in samples:
            impl.state = impl.set_priorities(impl.state, sample, priorities)
        jax.block_until_ready(impl.state)
    else:
        raise ValueError(op)
    return (time.perf_counter() - start) / len(chunks)


def run_case(case: Case, args: argparse.Namespace) -> dict:
    key = jax.random.PRNGKey(0)
    chunks = [random_chunk(k, case) for k in jax.random.split(key, args.inner)]
    keys = list(jax.random.split(jax.random.PRNGKey(1), args.inner))
    priorities = jax.random.uniform(jax.random.PRNGKey(2), (case.batch_size,)) + 0.1
    impls = [make_ours(case, args.alpha, args.beta)]
    if not args.no_flashbax:
        impls.append(make_flashbax(case, args.alpha))

    # Warm-up: compile everything and fill the buffer past one wrap.
    fills = -(-case.capacity // case.add_length) + 2
    for impl in impls:
        for i in range(fills):
            impl.state = impl.add(impl.state, chunks[i % len(chunks)])
        for op in ("sample", "set_priorities", "add"):
            time_round(impl, op, chunks, keys, priorities)

    ops = ("add", "sample", "set_priorities")
    times: dict[str, dict[str, list[float]]] = {i.name: {op: [] for op in ops} for i in impls}
    for repeat in range(args.repeats):
        order = impls if repeat % 2 == 0 else impls[::-1]
        for op in ops:
            for impl in order:
                times[impl.name][op].append(time_round(impl, op, chunks, keys, priorities))

    result = {"case": dataclasses.asdict(case), "ms_per_call": {}}
    for name, per_op in times.items():
        result["ms_per_call"][name] = {
            op: 1e3 * statistics.median(values) for op, values in per_op.items()
        }
    return result


def print_table(results: list[dict]) -> None:
    header = (
        f"{'case':<15} {'B':>5} {'N':>5} {'batch':>5} {'op':<15} "
        f"{'ours ms':>9} {'fbx ms':>9} {'fbx/ours':>9}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        case = result["case"]
        ours = result["ms_per_call"]["ours"]
        fbx = result["ms_per_call"].get("flashbax")
        for op in ("add", "sample", "set_priorities"):
            other = f"{fbx[op]:9.3f}" if fbx else f"{'-':>9}"
            ratio = f"{fbx[op] / ours[op]:9.2f}" if fbx else f"{'-':>9}"
            print(
                f"{case['name']:<15} {case['num_envs']:>5} {case['capacity']:>5} "
                f"{case['batch_size']:>5} {op:<15} {ours[op]:9.3f} {other} {ratio}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--repeats", type=int, default=11, help="timed rounds per op")
    parser.add_argument("--inner", type=int, default=20, help="calls per timed round")
    parser.add_argument("--alpha", type=float, default=1.0, help="priority exponent")
    parser.add_argument("--beta", type=float, default=1.0, help="importance exponent")
    parser.add_argument("--no-flashbax", action="store_true", help="time ours only")
    parser.add_argument("--json", type=str, default=None, help="write results here")
    args = parser.parse_args()

    results = []
    for name in args.cases:
        results.append(run_case(CASES[name], args))
        print(f"done {name}", flush=True)
    print_table(results)
    if args.json:
        meta = {
            "jax": jax.__version__,
            "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
            "machine": platform.machine(),
            "python": platform.python_version(),
            "alpha": args.alpha,
            "beta": args.beta,
            "repeats": args.repeats,
            "inner": args.inner,
        }
        if not args.no_flashbax:
            meta["flashbax"] = importlib.metadata.version("flashbax")
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
