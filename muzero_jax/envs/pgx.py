"""Two-player board games from pgx (2.x) behind the environment protocol.

`make_pgx(game)` wraps `pgx.make(game)` for `"tic_tac_toe"`, `"connect_four"`
and `"go_9x9"`. pgx games are pure JAX, so they run under `jax.vmap` and
`lax.scan` like the built-in environments.

Conventions (see `base.TimeStep`):

* `to_play` is the *seat*: 0 for the player who moved first in this episode, 1
  for the other. pgx draws which of its player ids moves first at random; the
  seat is what matters for "as first / as second player" evaluation.
* `observation` is pgx's, from the point of view of the player to move
  (channel 0: the mover's stones, channel 1: the opponent's; Go adds history and
  a colour plane), as float32.
* `reward` is the mover's: +1 when the move just made won, -1 when it lost, 0
  otherwise (a draw, or a game still running). Two-player values follow, from
  the point of view of the player to move, with mctx's `discount = -1`.
* An illegal action loses at once (pgx's rule: reward -1 to the mover); the
  search masks illegal actions, so agents never take one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax.numpy as jnp

from muzero_jax.envs.base import Environment, TimeStep, auto_reset, make_timestep, wrap_reset

__all__ = ["PGX_GAMES", "PgxState", "make_pgx", "pgx_game"]

PGX_GAMES: dict[str, int] = {
    "tic_tac_toe": 9,
    "connect_four": 42,
    "go_9x9": 2 * 9 * 9,
}
"""Supported games and their maximum episode length in plies (pgx ends a Go
game after `2 * size**2` moves and scores it)."""


class PgxState(NamedTuple):
    """The inner state of one game.

    Attributes:
      game: pgx's `State`.
      first_player: `[]` int32, pgx's id of the player who moved first.
    """

    game: Any
    first_player: chex.Array


def pgx_game(name: str):
    """The `pgx.Env` behind the environment registered as `name`.

    Raises:
      ValueError: for a game this adapter does not support.
      ImportError: when pgx is not installed (with the install command).
    """
    if name not in PGX_GAMES:
        raise ValueError(f"unsupported pgx game {name!r}; supported: {', '.join(PGX_GAMES)}")
    try:
        import pgx
    except ImportError as e:  # pragma: no cover - pgx is a core dependency
        raise ImportError(f"{name} needs pgx: pip install 'pgx>=2.6'") from e
    return pgx.make(name)


def seat(state: PgxState) -> chex.Array:
    """`[]` int32 seat of the player to move (0: moved first)."""
    return (state.game.current_player != state.first_player).astype(jnp.int32)


def make_pgx(game: str) -> Environment:
    """Builds an auto-resetting `Environment` around a pgx board game.

    Args:
      game: one of `PGX_GAMES` (`"tic_tac_toe"`, `"connect_four"`, `"go_9x9"`).

    Returns:
      An `Environment` named `game` with `num_players=2`; its state is
      `(PgxState, last, rng_key)` (see `base.wrap_reset`).
    """
    env = pgx_game(game)

    def timestep(state: PgxState, reward, first) -> TimeStep:
        g = state.game
        return make_timestep(
            g.observation,
            reward=reward,
            first=first,
            terminated=g.terminated,
            truncated=g.truncated,
            legal_action_mask=g.legal_action_mask,
            to_play=seat(state),
        )

    def reset(rng_key: chex.PRNGKey) -> tuple[PgxState, TimeStep]:
        g = env.init(rng_key)
        # A copy: an aliased leaf would be donated twice by the training step.
        first = jnp.array(g.current_player, jnp.int32, copy=True)
        state = PgxState(game=g, first_player=first)
        return state, timestep(state, 0.0, True)

    def step(state: PgxState, action: chex.Array) -> tuple[PgxState, TimeStep]:
        mover = state.game.current_player
        g = env.step(state.game, jnp.asarray(action, jnp.int32))
        new_state = PgxState(game=g, first_player=state.first_player)
        return new_state, timestep(new_state, g.rewards[mover], False)

    return Environment(
        name=game,
        observation_shape=tuple(env.observation_shape),
        num_actions=int(env.num_actions),
        num_players=2,
        max_episode_steps=PGX_GAMES[game],
        reset=wrap_reset(reset),
        step=auto_reset(reset, step),
        reward_range=(-1.0, 1.0),
    )


def game_state(env_state) -> PgxState:
    """The `PgxState` inside an auto-reset environment state `(inner, last, key)`."""
    return env_state[0]


def reward_of_seat(timestep: TimeStep, seat_index: chex.Array) -> chex.Array:
    """The reward of a finished game for `seat_index`, from a `last` timestep.

    The timestep's reward is the mover's, and the mover is the player *not* to
    play in the returned timestep.
    """
    mover = 1 - timestep.to_play
    return jnp.where(mover == seat_index, timestep.reward, -timestep.reward)


__all__ += ["game_state", "reward_of_seat", "seat"]

