"""Reanalyse: fresh search targets for rows already in the replay buffer.

MuZero Reanalyze (Schrittwieser et al., 2020, Appendix H; 2021) re-runs the
search on stored positions with the latest networks, so the policy targets
(and the search values that `value_target="search"` bootstraps from) follow
the networks instead of staying as they were when the row was acted on.

Here the buffer is revisited by a sweep: every iteration `R` rows of every
environment, the time rows `(i * R + j) mod N` for `j < R` at iteration `i`,
are searched again with the parameters self-play acts with, the same search
and the same number of simulations, and their `search_policy` and
`search_value` are overwritten in place. A row is therefore re-searched once
every `N / R` iterations, and each costs one search, as one acting step does.
Rows never written and `last` rows (no legal move, no policy target) keep what
they hold. Nothing else in the row changes (observations, actions, rewards,
labels), nor the sampling priorities (the learner recomputes them from the
search value when it next samples the row).
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax.numpy as jnp
import mctx

from muzero_jax.replay import ReplayState
from muzero_jax.search import RootFn, batch_search

__all__ = ["make_reanalyse", "sweep_rows"]


def sweep_rows(iteration: chex.Array, rows: int, capacity: int) -> chex.Array:
    """`[rows]` int32: the time rows the sweep re-searches at `iteration`.

    `(iteration * rows + j) mod capacity` for `j = 0 .. rows - 1`: consecutive
    rows, wrapping, distinct when `rows <= capacity`.
    """
    start = (jnp.asarray(iteration, jnp.int32) % capacity) * rows % capacity
    return (start + jnp.arange(rows, dtype=jnp.int32)) % capacity


def make_reanalyse(
    root_fn: RootFn,
    recurrent_fn: mctx.RecurrentFn,
    search_fn: Callable[..., mctx.PolicyOutput],
    *,
    num_simulations: int,
    rows: int,
):
    """Returns `reanalyse(params, replay, rng_key, iteration) -> replay`.

    Args:
      root_fn: `root_fn(params, observation) -> mctx.RootFnOutput`, as acting uses.
      recurrent_fn: the model the search expands nodes with.
      search_fn: a search with mctx's policy signature.
      num_simulations: simulations per search.
      rows: `R`, time rows per environment re-searched per call (`1 <= R <= N`).

    The returned function takes one device's `ReplayState` (leaves `[B, N, ...]`)
    and runs one batched search over its `B * R` swept rows (see the module
    docstring); `iteration` (an int32 scalar, traced is fine) places the sweep.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be an integer >= 1, got {rows!r}")
    search = batch_search(search_fn, root_fn, recurrent_fn, num_simulations=num_simulations)

    def reanalyse(params, replay: ReplayState, rng_key: chex.PRNGKey,
                  iteration: chex.Array) -> ReplayState:
        data = replay.data
        num_envs, capacity = data.last.shape[:2]
        if rows > capacity:
            raise ValueError(f"rows={rows} exceeds the buffer's {capacity} rows per environment")
        if rows * capacity >= 2**31:  # the sweep's index arithmetic is int32
            raise ValueError(f"rows * capacity = {rows} * {capacity} must be below 2**31")
        index = sweep_rows(iteration, rows, capacity)
        observation = data.observation[:, index]  # [B, R, ...]
        legal = data.legal_action_mask[:, index].astype(bool)  # [B, R, A]

        def flat(x):
            return x.reshape((num_envs * rows,) + x.shape[2:])

        out = search(params, rng_key, flat(observation), flat(legal))
        policy = out.action_weights.astype(jnp.float32).reshape(legal.shape)
        value = out.search_tree.node_values[:, mctx.Tree.ROOT_INDEX].astype(
            jnp.float32).reshape(legal.shape[:2])
        written = (replay.num_added >= capacity) | (index < replay.num_added)  # [R]
        fresh = written[None, :] & ~data.last[:, index] & jnp.any(legal, axis=-1)  # [B, R]
        policy = jnp.where(fresh[..., None], policy, data.search_policy[:, index])
        value = jnp.where(fresh, value, data.search_value[:, index])
        data = data._replace(
            search_policy=data.search_policy.at[:, index].set(policy),
            search_value=data.search_value.at[:, index].set(value),
        )
        return replay._replace(data=data)

    return reanalyse
