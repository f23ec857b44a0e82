"""The environment protocol: small, pure and jittable.

An environment is a frozen bundle of two pure functions and a spec. Its state is
a pytree that lives on device, so a batch of environments runs under `jax.vmap`
and a rollout under `jax.lax.scan`.

Episode boundaries follow dm_env: the step that ends an episode returns a
timestep with `last=True` and the *final* observation (so that a truncated
episode can be bootstrapped from it). The next call to `step` on that state
ignores its action and returns the first timestep of a new episode
(`first=True`, reward 0). A batch of environments therefore runs forever
without leaving the compiled program, and every episode end is visible in the
stored trajectory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from muzero_jax.symmetries import Symmetries

EnvState = Any
"""The environment's own pytree state (opaque to the rest of the library)."""


class TimeStep(NamedTuple):
    """What the agent sees after `reset` or `step` (one environment, unbatched).

    Attributes:
      observation: `[*observation_shape]` float32, the observation to act on.
      reward: `[]` float32, the reward received on arriving here, from the
        point of view of the player who made the last move (0 when `first`).
      first: `[]` bool, the first timestep of an episode.
      last: `[]` bool, the last timestep of an episode (terminated or truncated).
      terminated: `[]` bool, the episode ended in a terminal (absorbing) state:
        its value is 0 and there is nothing to bootstrap from.
      truncated: `[]` bool, the episode was cut by a time limit: the state is
        not terminal, so value targets bootstrap from it.
      legal_action_mask: `[num_actions]` bool, actions allowed here.
      to_play: `[]` int32, the player to move (always 0 in single-player games).
    """

    observation: chex.Array
    reward: chex.Array
    first: chex.Array
    last: chex.Array
    terminated: chex.Array
    truncated: chex.Array
    legal_action_mask: chex.Array
    to_play: chex.Array


ResetFn = Callable[[chex.PRNGKey], tuple[EnvState, TimeStep]]
StepFn = Callable[[EnvState, chex.Array], tuple[EnvState, TimeStep]]


@dataclasses.dataclass(frozen=True)
class Environment:
    """A pure JAX environment (one instance; `jax.vmap` for a batch).

    Attributes:
      name: the registry name, e.g. `"catch"`.
      observation_shape: shape of one observation.
      num_actions: size of the discrete action space.
      num_players: 1 for single-agent tasks, 2 for two-player zero-sum games
        (players alternate; mctx's `discount = -1` between plies).
      max_episode_steps: an upper bound on episode length, or None.
      reset: `reset(rng_key) -> (state, timestep)`; the key is consumed.
      step: `step(state, action) -> (state, timestep)`; auto-resets after a
        `last` timestep (see the module docstring). Randomness, if any, is
        carried in the state.
      reward_range: `(min, max)` of a single reward, for support sizing.
      symmetries: the game's board symmetries (`muzero_jax.symmetries`), for
        `Config.augment_symmetries`; None when it has none to offer.
      binary_observation: every element of every observation is 0 or 1 (board
        planes, Catch's grid), so a decoded observation can be rounded back
        onto the observations' own values (`search.make_decoded_recurrent_fn`).
      terminal_rewards_only: every reward but the one of an episode's last
        step is 0 (board games), so no value exceeds the largest |reward|;
        the value support is then checked against that instead of the
        largest reward times the horizon.
    """

    name: str
    observation_shape: tuple[int, ...]
    num_actions: int
    num_players: int
    max_episode_steps: int | None
    reset: ResetFn
    step: StepFn
    reward_range: tuple[float, float] = (-1.0, 1.0)
    symmetries: Symmetries | None = None
    binary_observation: bool = False
    terminal_rewards_only: bool = False


def make_timestep(
    observation: chex.Array,
    *,
    reward: chex.Array | float = 0.0,
    first: chex.Array | bool = False,
    terminated: chex.Array | bool = False,
    truncated: chex.Array | bool = False,
    legal_action_mask: chex.Array,
    to_play: chex.Array | int = 0,
) -> TimeStep:
    """Builds a `TimeStep` with the canonical dtypes (`last` is derived)."""
    terminated = jnp.asarray(terminated, jnp.bool_)
    truncated = jnp.logical_and(jnp.asarray(truncated, jnp.bool_), ~terminated)
    return TimeStep(
        observation=jnp.asarray(observation, jnp.float32),
        reward=jnp.asarray(reward, jnp.float32),
        first=jnp.asarray(first, jnp.bool_),
        last=terminated | truncated,
        terminated=terminated,
        truncated=truncated,
        legal_action_mask=jnp.asarray(legal_action_mask, jnp.bool_),
        to_play=jnp.asarray(to_play, jnp.int32),
    )


def auto_reset(
    reset_fn: ResetFn,
    step_fn: StepFn,
) -> StepFn:
    """Wraps a raw `step` (which assumes a live episode) with dm_env auto-reset.

    The wrapped state is `(inner_state, last, rng_key)`: when the previous
    timestep was `last`, the action is ignored and a new episode starts with a
    fresh key split from the carried one.
    """

    def step(state, action):
        inner, was_last, rng_key = state
        rng_key, reset_key = jax.random.split(rng_key)
        reset_state, reset_ts = reset_fn(reset_key)
        stepped_state, stepped_ts = step_fn(inner, action)
        new_inner = jax.tree.map(lambda r, s: jnp.where(was_last, r, s), reset_state, stepped_state)
        ts = jax.tree.map(lambda r, s: jnp.where(was_last, r, s), reset_ts, stepped_ts)
        return (new_inner, ts.last, rng_key), ts

    return step


def wrap_reset(reset_fn: ResetFn) -> ResetFn:
    """The `reset` that goes with `auto_reset`: state `(inner, last, rng_key)`."""

    def reset(rng_key):
        rng_key, reset_key = jax.random.split(rng_key)
        inner, ts = reset_fn(reset_key)
        return (inner, ts.last, rng_key), ts

    return reset
