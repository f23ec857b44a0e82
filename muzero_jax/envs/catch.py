"""bsuite Catch as a pure JAX environment.

A ball starts in the top row at a uniformly random column and falls one row per
step; the agent moves a paddle along the bottom row to catch it. The episode
ends when the ball reaches the bottom row, with reward +1 if the paddle is under
the ball and -1 otherwise (0 on every other step), so it always lasts exactly
`rows - 1` steps. The rules follow bsuite's `Catch` (Osband et al., 2019); the
small, fixed-length episodes with a single sparse reward make it a quick sanity
check for value learning and search.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from muzero_jax.envs.base import Environment, TimeStep, auto_reset, make_timestep, wrap_reset

NUM_ACTIONS = 3
"""Actions: 0 moves the paddle left, 1 keeps it still, 2 moves it right."""


class CatchState(NamedTuple):
    """The inner state of one Catch episode (all `[]` int32).

    Attributes:
      ball_row: row of the ball, 0 (top) at reset, `rows - 1` (bottom) at the end.
      ball_col: column of the ball, fixed for the episode.
      paddle_col: column of the paddle, which always sits in the bottom row.
    """

    ball_row: chex.Array
    ball_col: chex.Array
    paddle_col: chex.Array


def make_catch(rows: int = 10, columns: int = 5) -> Environment:
    """Builds bsuite Catch on a `rows x columns` board.

    Args:
      rows: board height (at least 2); an episode lasts `rows - 1` steps.
      columns: board width (at least 1); the paddle starts at `columns // 2`.

    Returns:
      An auto-resetting `Environment` named `"catch"` whose observation is the
      `[rows, columns]` float32 board with 1.0 at the ball and at the paddle. Its
      state is `(CatchState, last, rng_key)` (see `base.wrap_reset`).

    Raises:
      ValueError: for a board too small to play on.
    """
    if rows < 2 or columns < 1:
        raise ValueError(f"Catch needs rows >= 2 and columns >= 1, got {rows}x{columns}")

    row_ids = jnp.arange(rows, dtype=jnp.int32)[:, None]
    col_ids = jnp.arange(columns, dtype=jnp.int32)[None, :]
    legal_action_mask = jnp.ones((NUM_ACTIONS,), jnp.bool_)

    def observe(state: CatchState) -> chex.Array:
        # Comparisons, not scatters: cheap under vmap, and harmless when the
        # ball is off the board (the discarded step after a terminal state).
        ball = (row_ids == state.ball_row) & (col_ids == state.ball_col)
        paddle = (row_ids == rows - 1) & (col_ids == state.paddle_col)
        return (ball | paddle).astype(jnp.float32)

    def reset(rng_key: chex.PRNGKey) -> tuple[CatchState, TimeStep]:
        state = CatchState(
            ball_row=jnp.zeros((), jnp.int32),
            # One draw of raw bits (randint costs a split and two draws), as this
            # runs on every step under auto_reset; the modulo bias is < columns / 2**32.
            ball_col=(jax.random.bits(rng_key, (), jnp.uint32) % columns).astype(jnp.int32),
            paddle_col=jnp.full((), columns // 2, jnp.int32),
        )
        timestep = make_timestep(observe(state), first=True, legal_action_mask=legal_action_mask)
        return state, timestep

    def step(state: CatchState, action: chex.Array) -> tuple[CatchState, TimeStep]:
        move = jnp.clip(jnp.asarray(action, jnp.int32), 0, NUM_ACTIONS - 1) - 1
        paddle_col = jnp.clip(state.paddle_col + move, 0, columns - 1)
        ball_row = state.ball_row + 1
        state = CatchState(ball_row=ball_row, ball_col=state.ball_col, paddle_col=paddle_col)
        terminated = ball_row >= rows - 1
        caught = paddle_col == state.ball_col
        reward = jnp.where(terminated, jnp.where(caught, 1.0, -1.0), 0.0)
        timestep = make_timestep(
            observe(state),
            reward=reward,
            terminated=terminated,
            legal_action_mask=legal_action_mask,
        )
        return state, timestep

    return Environment(
        name="catch",
        observation_shape=(rows, columns),
        num_actions=NUM_ACTIONS,
        num_players=1,
        max_episode_steps=rows - 1,
        reset=wrap_reset(reset),
        step=auto_reset(reset, step),
        reward_range=(-1.0, 1.0),
        binary_observation=True,
    )
