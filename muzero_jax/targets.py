"""MuZero's training targets from a stored sequence, outside autodiff.

For a sequence of L = K + n + 1 stored rows starting at a sampled position,
`make_targets` builds the K + 1 value, reward and policy targets and their masks
(Schrittwieser et al., 2020, Appendix G, `make_target`):

* value: the n-step return `z_j = sum_{i=1..m} d^(i-1) r_{j+i} + d^m v_{j+m}`,
  with `m = min(n, e - j)` where e is the episode's last row in the window,
  `d` the discount (negated for two-player games, so returns alternate sign
  between plies), and `v` the bootstrap value: 0 at a terminal row, else the
  target network's (or the stored search) value. A truncated episode (time
  limit) bootstraps from its final observation; a terminated one does not.
* reward: the stored reward of row j (received on arriving there).
* policy: the stored search policy at row j while the episode is running.

With `search_value_mix` w > 0 the value target of every row j before the
episode's end becomes `(1 - w) z_j + w q_j`, q_j the search value stored at
row j itself (its root value; refreshed by reanalyse): AlphaZero's "average
the outcome and the search value" (A. Prasad, "Lessons from AlphaZero",
part 4, 2019, on Connect Four), which trades the outcome's noise (every
exploratory move after j) for the search's bias.

Past the end of a terminated episode the model sees absorbing states (value 0,
reward 0, no policy); past a truncation there is no information, so the value
and reward losses are masked there too.

Functions here work on one example (rank-1 time axis, rlax style); callers
`jax.vmap` over the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from muzero_jax.replay import Trajectory

__all__ = ["Targets", "make_targets", "n_step_values"]


class Targets(NamedTuple):
    """Targets for one sequence (leading `[B]` when vmapped).

    Attributes:
      actions: `[K]` actions to unroll the model with.
      value: `[K+1]` n-step value targets.
      reward: `[K+1]` reward targets (index 0 unused).
      policy: `[K+1, A]` policy targets.
      value_mask: `[K+1]`.
      reward_mask: `[K+1]`.
      policy_mask: `[K+1]`.
    """

    actions: chex.Array
    value: chex.Array
    reward: chex.Array
    policy: chex.Array
    value_mask: chex.Array
    reward_mask: chex.Array
    policy_mask: chex.Array


def _power(discount: float, exponent: chex.Array) -> chex.Array:
    """`discount ** exponent` for integer exponents, exact for negative discounts."""
    magnitude = abs(discount) ** exponent.astype(jnp.float32)
    if discount < 0:
        return jnp.where(exponent % 2 == 1, -magnitude, magnitude)
    return magnitude


def _episode_end(last: chex.Array) -> chex.Array:
    """Index of the first `last` row (or L when none), as int32."""
    length = last.shape[0]
    idx = jnp.arange(length)
    return jnp.min(jnp.where(last, idx, length)).astype(jnp.int32)


def n_step_values(
    reward: chex.Array,
    bootstrap_value: chex.Array,
    terminal: chex.Array,
    end: chex.Array,
    *,
    positions: int,
    td_steps: int,
    discount: float,
) -> chex.Array:
    """n-step returns at rows `0..positions-1` of one sequence.

    Args:
      reward: `[L]` reward received on arriving at each row.
      bootstrap_value: `[L]` value estimate of each row (from the point of view
        of the player to move there).
      terminal: `[L]` bool, the row is a terminal state (value 0).
      end: `[]` index of the episode's last row in the window (L if none).
      positions: number of rows to compute returns for (K + 1).
      td_steps: n.
      discount: per-step discount, negative for alternating two-player games.

    Returns:
      `[positions]` returns; rows past `end` get 0.
    """
    chex.assert_rank([reward, bootstrap_value, terminal], 1)
    length = reward.shape[0]
    if positions + td_steps > length:
        raise ValueError(
            f"a sequence of {length} rows cannot give {positions} returns of {td_steps} steps"
        )
    j = jnp.arange(positions)[:, None]  # [P, 1]
    i = jnp.arange(1, td_steps + 1)[None, :]  # [1, n]
    steps = jnp.minimum(td_steps, jnp.maximum(end - j, 0))  # [P, 1] m_j
    powers = _power(discount, i - 1)
    rewards = jnp.where(i <= steps, reward[j + i] * powers, 0.0).sum(axis=1)
    boot_index = (j + steps)[:, 0]
    boot = jnp.where(terminal[boot_index], 0.0, bootstrap_value[boot_index])
    values = rewards + _power(discount, steps[:, 0]) * boot
    return jnp.where(j[:, 0] <= end, values, 0.0)


def make_targets(
    sequence: Trajectory,
    bootstrap_value: chex.Array,
    *,
    num_unroll_steps: int,
    td_steps: int,
    discount: float,
    search_value_mix: float = 0.0,
) -> Targets:
    """Value, reward and policy targets for one stored sequence.

    Args:
      sequence: a `Trajectory` with leaves `[L, ...]`, L >= K + n + 1, whose
        row 0 is not the last row of an episode.
      bootstrap_value: `[L]` value of each row to bootstrap from (target
        network or stored search value), from the point of view of the player
        to move at that row.
      num_unroll_steps: K.
      td_steps: n.
      discount: per-step discount; pass `-gamma` for alternating two-player
        zero-sum games (rewards are from the point of view of the mover).
      search_value_mix: w in [0, 1], the weight of row j's own stored search
        value in its value target, at rows before the episode's end (a
        terminal row's target stays 0). 0 is the paper's target.

    Returns:
      `Targets` for the K + 1 unroll positions, under `stop_gradient`.
    """
    k = num_unroll_steps
    chex.assert_rank(sequence.reward, 1)
    end = _episode_end(sequence.last)
    terminated_end = jnp.any(sequence.last & sequence.terminated)
    value = n_step_values(
        sequence.reward, bootstrap_value, sequence.terminated, end,
        positions=k + 1, td_steps=td_steps, discount=discount,
    )
    j = jnp.arange(k + 1)
    if search_value_mix:  # a Python float: 0 leaves the graph as it was
        mixed = ((1.0 - search_value_mix) * value
                 + search_value_mix * sequence.search_value[: k + 1])
        value = jnp.where(j < end, mixed, value)
    in_episode = j <= end
    # Past a terminal state: absorbing (value 0, reward 0) and still trained;
    # past a truncation: unknown, masked.
    known = in_episode | terminated_end
    reward = jnp.where(in_episode, sequence.reward[: k + 1], 0.0)
    policy_mask = j < end
    num_actions = sequence.search_policy.shape[-1]
    policy = jnp.where(
        policy_mask[:, None], sequence.search_policy[: k + 1], 1.0 / num_actions
    )
    reward_mask = known & (j > 0)
    targets = Targets(
        actions=sequence.action[:k].astype(jnp.int32),
        value=value,
        reward=reward,
        policy=policy,
        value_mask=known.astype(jnp.float32),
        reward_mask=reward_mask.astype(jnp.float32),
        policy_mask=policy_mask.astype(jnp.float32),
    )
    return jax.lax.stop_gradient(targets)
