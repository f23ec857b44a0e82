"""On-device sequence replay with prioritised sampling.

The buffer keeps `B` environments side by side, each with its own circular
time axis of `N` rows, and every call to `add` writes the same number of rows
to every environment (the batched actor steps all environments together). A
sample is a batch of `L` consecutive rows of one environment, gathered with
wraparound along time.

A row `t` of environment `b` is a *valid start* when the `L` rows `t, ...,
t + L - 1 (mod N)` have all been written and are contiguous in time (the window
does not run past the newest row into the oldest one), and row `t` is not a
`last` row. Windows may cross episode boundaries; the learner masks those.

Prioritised sampling draws a valid start with probability
`P(i) = p_i^alpha / sum_j p_j^alpha` (with replacement). To avoid a pass over
all `B * N` priorities on every call, the state caches, per environment and
per block of `S` consecutive rows (`S` about `sqrt(N)`), the summed sampling
weight and the number of valid starts in that block. `add` and
`set_priorities` recompute only the blocks they touch (from scratch, so the
cache never drifts), and `sample` builds a 64-ary sum tree over the `B * N / S`
block weights, descends it to a block, then picks a row inside the block. Its
cost is `O(B * N / S + batch * (64 * depth + S))` rather than `O(B * N)`, and
apart from the sequence gather it needs no scatter, sort or `cumsum` (which is
slow on XLA:CPU); running sums of at most 64 entries come from a small matmul.

Every function is pure and jittable with static shapes; the state can be
donated (`jax.jit(buffer.add, donate_argnums=0)`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

__all__ = [
    "ReplayBuffer",
    "ReplaySample",
    "ReplayState",
    "Trajectory",
    "make_replay_buffer",
    "valid_start_mask",
]

Array = chex.Array
PRNGKey = chex.PRNGKey

_INT32_MAX = 2**31 - 1


class Trajectory(NamedTuple):
    """One environment time step; batched as `[B, T, ...]` when added.

    Shapes below are for a single row; stored and sampled batches carry extra
    leading axes.

    Attributes:
      observation: `[*obs_shape]` float32, the observation acted on at this step.
      action: `[]` int32, the action taken here (meaningless on `last` rows).
      reward: `[]` float32, the reward received on arriving at this row.
      first: `[]` bool, the first row of an episode.
      last: `[]` bool, the episode ended here (terminated or truncated).
      terminated: `[]` bool, the episode ended in a terminal state.
      truncated: `[]` bool, the episode was cut by a time limit.
      legal_action_mask: `[A]` bool, actions allowed here.
      to_play: `[]` int32, the player to move.
      search_policy: `[A]` float32, the search's visit distribution at this row.
      search_value: `[]` float32, the root value of the search at this row.
      action_rewards: `[A]` float32, the reward each action would have given
        from this row (the mover's, 0 for illegal actions and on `last`
        rows), labelled by stepping the environment once per action; only
        with `Config.action_reward_loss_weight > 0`, None otherwise.
      action_threats: `[A]` float32, for each action after which the game
        goes on and the player to reply can end it at once with a positive
        reward, that reward (the value of the position after the action for
        its mover); 0 elsewhere, for illegal actions and on `last` rows.
        Labelled by stepping the environment once per action and reply; only
        with `Config.threat_value_loss_weight > 0`, None otherwise.
      action_replies: `[A]` int32, for each action, one reply from the state
        it leads to: the one with the highest positive reward if there is
        one, else a uniformly random legal reply; -1 for illegal actions,
        actions that end the episode and on `last` rows. Only with
        `Config.reply_reward_loss_weight > 0`, None otherwise.
      reply_rewards: `[A]` float32, the reward of that reply for its mover
        (0 where the reply is -1); with `action_replies`.
      action_values: `[A]` float32, for each legal action, the networks'
        value (acting parameters) of the observation it leads to, for the
        player to move there; 0 for illegal actions, actions that end the
        episode and on `last` rows. Only with
        `Config.action_prediction_loss_weight > 0`, None otherwise.
      action_policies: `[A, A]` float32, for each such action, the networks'
        policy there (softmax over the legal actions of that position); all
        zeros where the value is 0 for the reasons above. With
        `action_values`.
      action_observations: `[A, *obs]` float32, for each legal action, the
        observation it leads to (for the player to move there; the final
        board where it ends the episode); zeros for illegal actions and on
        `last` rows. Only with `Config.action_reconstruction_loss_weight > 0`,
        None otherwise.
    """

    observation: Array
    action: Array
    reward: Array
    first: Array
    last: Array
    terminated: Array
    truncated: Array
    legal_action_mask: Array
    to_play: Array
    search_policy: Array
    search_value: Array
    action_rewards: Array | None = None
    action_threats: Array | None = None
    action_replies: Array | None = None
    reply_rewards: Array | None = None
    action_values: Array | None = None
    action_policies: Array | None = None
    action_observations: Array | None = None


class ReplayState(NamedTuple):
    """The buffer's contents (a pytree of device arrays).

    Attributes:
      data: a `Trajectory` whose leaves are `[B, N, ...]`: `B` environments,
        `N` time steps each, circular along time.
      priorities: `[B, N]` float32, the priority of starting a sequence at each
        row (0 for rows never written).
      insert_index: `[]` int32, the next write position along time.
      num_added: `[]` int32, rows written per environment so far (saturates
        at `2**31 - 1`).
      max_priority: `[]` float32, the largest priority seen; new rows get it.
      block_weights: `[B, ceil(N / S)]` float32, cache: per block of `S` rows,
        the summed sampling weight (`priority ** alpha`, or 1 when uniform) of
        the valid starts in it. `None` means "not cached": `sample` then
        recomputes it from `priorities` (a full pass).
      block_counts: `[B, ceil(N / S)]` int32, cache: the number of valid
        starts per block, or `None` (see `block_weights`).

    The two cache fields extend the original five-field layout; they default to
    `None`, so `ReplayState(data, priorities, insert_index, num_added,
    max_priority)` still builds a valid (uncached, slower to sample) state.
    Change the state only through the buffer's functions, or drop the cache
    (`block_weights=None, block_counts=None`) after editing `priorities` or
    `data.last` by hand.
    """

    data: Trajectory
    priorities: Array
    insert_index: Array
    num_added: Array
    max_priority: Array
    block_weights: Array | None = None
    block_counts: Array | None = None


class ReplaySample(NamedTuple):
    """A batch of sequences drawn from the buffer.

    Attributes:
      sequences: a `Trajectory` with leaves `[batch, L, ...]`, rows in time
        order (`L = sequence_length`).
      env_index: `[batch]` int32, the environment of each sequence.
      time_index: `[batch]` int32, the buffer position of each first row.
      probabilities: `[batch]` float32, the probability with which each start
        was drawn.
      weights: `[batch]` float32, importance weights
        `(num_valid * P) ** -beta`, divided by their maximum over the batch
        (all 1 for uniform sampling).
    """

    sequences: Trajectory
    env_index: Array
    time_index: Array
    probabilities: Array
    weights: Array


@dataclasses.dataclass(frozen=True)
class ReplayBuffer:
    """A frozen bundle of pure, jittable buffer functions.

    Attributes:
      init: `init(example_row) -> state`, from ONE unbatched `Trajectory` row
        (only shapes and dtypes are used): an empty buffer.
      add: `add(state, trajectory) -> state`, with trajectory leaves
        `[B, T, ...]`, `1 <= T <= N`: writes `T` rows per environment at
        `insert_index`, wrapping along time. New rows get `max_priority`.
      sample: `sample(state, rng_key, beta) -> ReplaySample`, a batch of
        `batch_size` sequences drawn with replacement; `beta >= 0` is the
        importance-sampling exponent (a traced scalar is fine). Only meaningful when
        `can_sample(state)`; otherwise the indices are arbitrary and the
        probabilities and weights are 0.
      set_priorities: `set_priorities(state, env_index, time_index,
        priorities) -> state`, three arrays of one shape (usually `[batch]`):
        stores `|priorities| + epsilon` at those rows and raises
        `max_priority` if needed.
      can_sample: `can_sample(state) -> []` bool, at least one valid start.
    """

    init: Callable[[Trajectory], ReplayState]
    add: Callable[[ReplayState, Trajectory], ReplayState]
    sample: Callable[[ReplayState, PRNGKey, float], ReplaySample]
    set_priorities: Callable[[ReplayState, Array, Array, Array], ReplayState]
    can_sample: Callable[[ReplayState], Array]


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a float, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return value


def _default_block_size(capacity: int) -> int:
    """A power of two near `sqrt(capacity)`, clipped to [8, 128] and to N."""
    size = 2 ** round(math.log2(max(1.0, math.sqrt(capacity))))
    return min(capacity, max(8, min(128, size)))


_FANOUT = 64
"""Children per node of the sampling tree built over the cached block weights."""


def _pick(weights: Array, uniform: Array) -> Array:
    """Draws one index per row with probability proportional to `weights`.

    Inverse-CDF sampling that never returns a zero-weight index while the row
    has a positive weight, even when rounding makes the running sums slightly
    non-monotone (they come from a matmul against a triangular matrix, which
    is faster than `cumsum` on CPU and exact enough for sampling).

    Args:
      weights: `[..., K]` float32, non-negative.
      uniform: `[...]` float32 in `[0, 1)`.

    Returns:
      `[...]` int32 indices in `[0, K)`; 0 for an all-zero row.
    """
    size = weights.shape[-1]
    upper = jnp.triu(jnp.ones((size, size), weights.dtype))
    cumulative = jnp.matmul(weights, upper, precision=jax.lax.Precision.HIGHEST)
    target = uniform * cumulative[..., -1]
    positive = weights > 0
    iota = jnp.arange(size, dtype=jnp.int32)
    # The first positive entry whose running sum exceeds the target; when rounding
    # leaves none, the last positive entry (`first` is at most `last` otherwise).
    hit = (cumulative > target[..., None]) & positive
    first = jnp.min(jnp.where(hit, iota, size), axis=-1)
    last = jnp.max(jnp.where(positive, iota, 0), axis=-1)
    return jnp.minimum(first, last)


def _tree_depth(num_leaves: int) -> int:
    """Levels of the `_FANOUT`-ary tree over `num_leaves` leaves (>= 1)."""
    depth, width = 1, num_leaves
    while width > _FANOUT:
        width = -(-width // _FANOUT)
        depth += 1
    return depth


def _tree_sample(leaf_weights: Array, uniform: Array) -> Array:
    """Samples leaves by descending a sum tree built on the fly.

    Args:
      leaf_weights: `[M]` float32, non-negative.
      uniform: `[_tree_depth(M), batch]` float32 in `[0, 1)`.

    Returns:
      `[batch]` int32 leaf indices in `[0, M)`, each with probability
      `leaf_weights[i] / sum(leaf_weights)` (and positive weight whenever the
      sum is positive).
    """
    num_leaves = leaf_weights.shape[0]
    levels = [leaf_weights]  # Bottom first; each level is padded to whole nodes.
    while levels[-1].shape[0] > _FANOUT:
        width = levels[-1].shape[0]
        padded = jnp.pad(levels[-1], (0, -width % _FANOUT))
        levels[-1] = padded
        levels.append(padded.reshape(-1, _FANOUT).sum(axis=1))
    top = levels.pop()
    index = _pick(jnp.broadcast_to(top, uniform.shape[1:] + top.shape), uniform[0])
    for depth, level in enumerate(reversed(levels), start=1):
        children = level.reshape(-1, _FANOUT)[index]
        index = index * _FANOUT + _pick(children, uniform[depth])
    return jnp.minimum(index, num_leaves - 1)


def _window_fits(state: ReplayState, position: Array, capacity: int, length: int) -> Array:
    """Whether `length` rows from `position` are written and contiguous in time.

    Args:
      state: supplies `insert_index` and `num_added`.
      position: `[...]` int32 buffer positions; values >= `capacity` are padding
        (never valid).
      capacity: `N`.
      length: `L`.

    Returns:
      `[...]` bool.
    """
    num_written = jnp.minimum(state.num_added, capacity)
    oldest = jnp.where(state.num_added >= capacity, state.insert_index, 0)
    age = jnp.mod(position - oldest, capacity)  # 0 for the oldest row.
    return (position < capacity) & (age <= num_written - length)


def valid_start_mask(state: ReplayState, sequence_length: int) -> Array:
    """The rows a sequence may start at (a full pass; for tests and diagnostics).

    Args:
      state: a buffer state.
      sequence_length: `L`, as given to `make_replay_buffer`.

    Returns:
      `[B, N]` bool: the `L` rows from there are written and contiguous in
      time, and the row is not a `last` row.
    """
    capacity = state.priorities.shape[1]
    position = jnp.arange(capacity, dtype=jnp.int32)
    return _window_fits(state, position, capacity, sequence_length)[None, :] & ~state.data.last


def make_replay_buffer(
    *,
    num_envs: int,
    capacity: int,
    sequence_length: int,
    batch_size: int,
    prioritized: bool = True,
    alpha: float = 1.0,
    epsilon: float = 1e-6,
) -> ReplayBuffer:
    """Builds a sequence replay buffer.

    Args:
      num_envs: `B`, environments added side by side (every `add` writes to
        all of them).
      capacity: `N`, time steps kept per environment.
      sequence_length: `L`, rows per sampled sequence (`K + n + 1` in MuZero);
        at most `capacity`.
      batch_size: sequences per `sample` call.
      prioritized: sample starts with probability proportional to
        `priority ** alpha`; when False, uniformly over valid starts.
      alpha: priority exponent (>= 0; 0 is uniform).
      epsilon: added to `|priority|` by `set_priorities` (>= 0).

    Returns:
      A `ReplayBuffer` of pure functions.

    Raises:
      ValueError: an argument is out of range (the message names it).
    """
    num_envs = _check_int("num_envs", num_envs, 1)
    capacity = _check_int("capacity", capacity, 1)
    sequence_length = _check_int("sequence_length", sequence_length, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    if sequence_length > capacity:
        raise ValueError(f"sequence_length ({sequence_length}) must be <= capacity ({capacity})")
    if not isinstance(prioritized, bool):
        raise ValueError(f"prioritized must be a bool, got {prioritized!r}")
    alpha = _check_float("alpha", alpha)
    epsilon = _check_float("epsilon", epsilon)

    n, seq_len = capacity, sequence_length
    block = _default_block_size(n)
    num_blocks = -(-n // block)
    offsets = jnp.arange(block, dtype=jnp.int32)

    def priority_weight(priority: Array) -> Array:
        if not prioritized or alpha == 0.0:
            return jnp.ones_like(priority)
        if alpha == 1.0:
            return priority
        if alpha == 0.5:
            return jnp.sqrt(priority)
        return jnp.where(priority > 0, priority**alpha, 0.0)

    def start_weights(
        state: ReplayState, priority: Array, last: Array, position: Array
    ) -> tuple[Array, Array]:
        """Sampling weight and validity of start rows.

        Args:
          state: supplies `insert_index` and `num_added`.
          priority: `[...]` float32 priorities of the rows.
          last: `[...]` bool `last` flags of the rows.
          position: `[...]` int32 buffer positions (values >= N are padding).

        Returns:
          `([...] float32 weight, [...] bool valid)`; weight is 0 where invalid.
        """
        valid = _window_fits(state, position, n, seq_len) & ~last
        weight = jnp.where(valid, priority_weight(priority), 0.0)
        return weight, valid

    def block_stats(state: ReplayState, env: Array, blocks: Array) -> tuple[Array, Array]:
        """Recomputes cached statistics for `blocks` of `env` (broadcast).

        Args:
          state: the buffer state (priorities and `last` flags are read).
          env: int32 environment indices, broadcastable against `blocks`.
          blocks: int32 block indices.

        Returns:
          `(weights float32, counts int32)`, both of the broadcast shape.
        """
        position = blocks[..., None] * block + offsets
        clipped = jnp.minimum(position, n - 1)
        env = env[..., None]
        weight, valid = start_weights(
            state, state.priorities[env, clipped], state.data.last[env, clipped], position
        )
        return weight.sum(-1), valid.sum(-1, dtype=jnp.int32)

    def all_block_stats(state: ReplayState) -> tuple[Array, Array]:
        envs = jnp.arange(num_envs, dtype=jnp.int32)[:, None]
        blocks = jnp.arange(num_blocks, dtype=jnp.int32)[None, :]
        return block_stats(state, envs, blocks)

    def init(example: Trajectory) -> ReplayState:
        def zeros(leaf):
            leaf = jnp.asarray(leaf)
            return jnp.zeros((num_envs, n) + leaf.shape, leaf.dtype)

        data = jax.tree.map(zeros, example)
        return ReplayState(
            data=data,
            priorities=jnp.zeros((num_envs, n), jnp.float32),
            insert_index=jnp.zeros((), jnp.int32),
            num_added=jnp.zeros((), jnp.int32),
            max_priority=jnp.ones((), jnp.float32),
            block_weights=jnp.zeros((num_envs, num_blocks), jnp.float32),
            block_counts=jnp.zeros((num_envs, num_blocks), jnp.int32),
        )

    def add(state: ReplayState, trajectory: Trajectory) -> ReplayState:
        leaves = jax.tree.leaves(trajectory)
        stored = jax.tree.leaves(state.data)
        if len(leaves) != len(stored):
            raise ValueError("trajectory does not have the structure of the stored data")
        length = None
        for new, old in zip(leaves, stored, strict=True):
            if new.ndim < 2 or new.shape[0] != num_envs or new.shape[2:] != old.shape[2:]:
                raise ValueError(
                    f"trajectory leaf of shape {new.shape} does not match "
                    f"[num_envs={num_envs}, T, *{old.shape[2:]}]"
                )
            if length is None:
                length = new.shape[1]
            elif new.shape[1] != length:
                raise ValueError("trajectory leaves disagree on the time axis length T")
        if not 1 <= length <= n:
            raise ValueError(f"trajectory length T={length} must be in [1, capacity={n}]")

        start = state.insert_index
        rows = jnp.mod(start + jnp.arange(length, dtype=jnp.int32), n)

        def write(buffer, new):
            return buffer.at[:, rows].set(
                new.astype(buffer.dtype), unique_indices=True, mode="promise_in_bounds"
            )

        data = jax.tree.map(write, state.data, trajectory)
        priorities = state.priorities.at[:, rows].set(
            state.max_priority, unique_indices=True, mode="promise_in_bounds"
        )
        num_added = jnp.minimum(state.num_added, _INT32_MAX - length) + length
        new_state = state._replace(
            data=data,
            priorities=priorities,
            insert_index=jnp.mod(start + length, n).astype(jnp.int32),
            num_added=num_added.astype(jnp.int32),
        )
        if state.block_weights is None:
            return new_state

        # Validity or weight can change only for the new rows and for the L - 1
        # rows before them (which may have become valid starts).
        span = length + seq_len - 1
        touched = -(-span // block) + 2  # +1 for misalignment, +1 for the wrap at N.
        if touched >= num_blocks:
            weights, counts = all_block_stats(new_state)
        else:
            first = jnp.mod(start - (seq_len - 1), n) // block
            blocks = jnp.mod(first + jnp.arange(touched, dtype=jnp.int32), num_blocks)
            envs = jnp.arange(num_envs, dtype=jnp.int32)[:, None]
            new_weights, new_counts = block_stats(new_state, envs, blocks[None, :])
            weights = state.block_weights.at[:, blocks].set(new_weights, unique_indices=True)
            counts = state.block_counts.at[:, blocks].set(new_counts, unique_indices=True)
        return new_state._replace(block_weights=weights, block_counts=counts)

    def set_priorities(
        state: ReplayState, env_index: Array, time_index: Array, priorities: Array
    ) -> ReplayState:
        env_index = jnp.asarray(env_index, jnp.int32).reshape(-1)
        time_index = jnp.asarray(time_index, jnp.int32).reshape(-1)
        values = (jnp.abs(jnp.asarray(priorities, jnp.float32)) + epsilon).reshape(-1)
        if not env_index.shape == time_index.shape == values.shape:
            raise ValueError(
                "env_index, time_index and priorities must have the same size, got "
                f"{env_index.shape}, {time_index.shape}, {values.shape}"
            )
        new_state = state._replace(
            priorities=state.priorities.at[env_index, time_index].set(values),
            max_priority=jnp.maximum(state.max_priority, jnp.max(values, initial=0.0)),
        )
        if state.block_weights is None or not prioritized or alpha == 0.0:
            return new_state  # Cached weights do not depend on priorities.
        blocks = time_index // block
        weights, _ = block_stats(new_state, env_index, blocks)
        return new_state._replace(
            block_weights=state.block_weights.at[env_index, blocks].set(weights)
        )

    def cached_stats(state: ReplayState) -> tuple[Array, Array]:
        if state.block_weights is None or state.block_counts is None:
            return all_block_stats(state)
        return state.block_weights, state.block_counts

    def sample(state: ReplayState, rng_key: PRNGKey, beta: float) -> ReplaySample:
        block_weights, block_counts = cached_stats(state)
        flat_weights = block_weights.reshape(-1)
        depth = _tree_depth(flat_weights.shape[0])
        uniform = jax.random.uniform(rng_key, (depth + 1, batch_size), jnp.float32)

        # A block (flat over environments), then a row within that block.
        flat_block = _tree_sample(flat_weights, uniform[:depth])
        env = flat_block // num_blocks
        blocks = flat_block % num_blocks
        position = blocks[:, None] * block + offsets
        clipped = jnp.minimum(position, n - 1)
        row_weights, _ = start_weights(
            state,
            state.priorities[env[:, None], clipped],
            state.data.last[env[:, None], clipped],
            position,
        )
        within = _pick(row_weights, uniform[depth])
        time_index = jnp.minimum(blocks * block + within, n - 1).astype(jnp.int32)
        chosen = jnp.take_along_axis(row_weights, within[:, None], axis=1)[:, 0]
        total = jnp.sum(flat_weights)

        has_data = total > 0
        probabilities = jnp.where(has_data, chosen / jnp.where(has_data, total, 1.0), 0.0)
        if prioritized and alpha != 0.0:
            num_valid = jnp.sum(block_counts).astype(jnp.float32)
            scaled = num_valid * probabilities
            log_weights = -jnp.asarray(beta, jnp.float32) * jnp.log(
                jnp.where(scaled > 0, scaled, 1.0)
            )
            log_weights = jnp.where(scaled > 0, log_weights, -jnp.inf)
            weights = jnp.exp(log_weights - jnp.max(log_weights))
            weights = jnp.where(has_data, weights, 0.0)
        else:
            weights = jnp.where(has_data, 1.0, 0.0) * jnp.ones((batch_size,), jnp.float32)

        steps = jnp.mod(time_index[:, None] + jnp.arange(seq_len, dtype=jnp.int32), n)
        # Materialise the indices: fused into each gather, XLA:CPU would redo the
        # index arithmetic for every gathered element (several times slower).
        rows, steps = jax.lax.optimization_barrier((env[:, None], steps))
        sequences = jax.tree.map(lambda leaf: leaf[rows, steps], state.data)
        return ReplaySample(
            sequences=sequences,
            env_index=env.astype(jnp.int32),
            time_index=time_index,
            probabilities=probabilities.astype(jnp.float32),
            weights=weights.astype(jnp.float32),
        )

    def can_sample(state: ReplayState) -> Array:
        _, block_counts = cached_stats(state)
        return jnp.sum(block_counts) > 0

    return ReplayBuffer(
        init=init,
        add=add,
        sample=sample,
        set_priorities=set_priorities,
        can_sample=can_sample,
    )
