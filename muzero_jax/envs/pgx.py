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
  otherwise (a draw, or a game still running); with Go's `score_reward`, the
  mover's area-score margin at the end. Two-player values follow, from
  the point of view of the player to move, with mctx's `discount = -1`.
* An illegal action loses at once (pgx's rule: reward -1 to the mover); the
  search masks illegal actions, so agents never take one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax.numpy as jnp

from muzero_jax.envs.base import Environment, TimeStep, auto_reset, make_timestep, wrap_reset
from muzero_jax.symmetries import Symmetries, board_symmetries

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


def make_pgx(game: str, *, min_plies_before_pass: int = 0,
             score_reward: bool = False) -> Environment:
    """Builds an auto-resetting `Environment` around a pgx board game.

    Args:
      game: one of `PGX_GAMES` (`"tic_tac_toe"`, `"connect_four"`, `"go_9x9"`).
      min_plies_before_pass: Go only. When > 0, the legal-action mask offers
        pass only from this ply on (or when no other move is legal), so agents
        acting on the mask (self-play, the search) do not pass before it, as
        Leela Zero's `--nopassbefore`; the rules themselves are pgx's. Early
        in training a Go agent can settle on passing at once: with komi the
        first player then loses whatever it does, its values are all -1 and
        nothing teaches it to play on (README, Go 9x9).
      score_reward: Go only. The final reward is the mover's score margin
        under pgx's area scoring, `(own - opponent -+ komi) / (size**2 +
        komi)` (in [-1, 1]), instead of +-1 for the win: a value that keeps
        telling better positions from worse ones when one side loses nearly
        every game. A superko loss stays -1. The winner is the same.

    Returns:
      An `Environment` named `game` with `num_players=2`; its state is
      `(PgxState, last, rng_key)` (see `base.wrap_reset`).

    Raises:
      ValueError: an unsupported game, a `min_plies_before_pass` that is
        negative or not an integer, a `score_reward` that is not a bool, or
        either option given for a game other than Go.
    """
    env = pgx_game(game)
    if isinstance(min_plies_before_pass, bool) or not isinstance(min_plies_before_pass, int) \
            or min_plies_before_pass < 0:
        raise ValueError(f"min_plies_before_pass must be an integer >= 0, "
                         f"got {min_plies_before_pass!r}")
    if min_plies_before_pass and not game.startswith("go_"):
        raise ValueError(f"min_plies_before_pass is for Go; {game!r} has no pass")
    if not isinstance(score_reward, bool):
        raise ValueError(f"score_reward must be true or false, got {score_reward!r}")
    if score_reward and not game.startswith("go_"):
        raise ValueError(f"score_reward is for Go; {game!r} has no score")

    def legal_actions(g) -> chex.Array:
        if not min_plies_before_pass:
            return g.legal_action_mask
        # pgx's `_step_count` counts the plies played.
        return mask_early_pass(g.legal_action_mask, g._step_count, min_plies_before_pass)

    def timestep(state: PgxState, reward, first) -> TimeStep:
        g = state.game
        return make_timestep(
            g.observation,
            reward=reward,
            first=first,
            terminated=g.terminated,
            truncated=g.truncated,
            legal_action_mask=legal_actions(g),
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
        reward = g.rewards[mover]
        if score_reward:
            reward = jnp.where(g.terminated & ~g._x.is_psk,
                               _go_margin(env, g._x, state.game._x.color), reward)
        return new_state, timestep(new_state, reward, False)

    return Environment(
        name=game,
        observation_shape=tuple(env.observation_shape),
        num_actions=int(env.num_actions),
        num_players=2,
        max_episode_steps=PGX_GAMES[game],
        reset=wrap_reset(reset),
        step=auto_reset(reset, step),
        reward_range=(-1.0, 1.0),
        binary_observation=True,
        # pgx rewards a game only when it ends (the score margin included).
        terminal_rewards_only=True,
        symmetries=game_symmetries(game, tuple(env.observation_shape)),
    )


def game_symmetries(game: str, observation_shape: tuple[int, ...]) -> Symmetries:
    """The board symmetries of a supported game: Connect Four's left-right
    mirror (actions are columns); the square's eight for TicTacToe and Go (actions
    are points; Go's pass stays)."""
    height, width, channels = observation_shape
    if game == "connect_four":
        return board_symmetries(height, width, channels, dihedral=False, actions="columns")
    return board_symmetries(height, width, channels, dihedral=True, actions="cells",
                            pass_action=game.startswith("go_"))


def mask_early_pass(mask: chex.Array, plies: chex.Array, min_plies: int) -> chex.Array:
    """`mask` (`[A]`, pass last, as pgx's Go) with pass removed before ply
    `min_plies`, unless no other move is legal (then pass stays, so a game can
    always go on)."""
    allow = (plies >= min_plies) | ~jnp.any(mask[:-1])
    return mask.at[-1].set(mask[-1] & allow)


def _area_counts(x, size: int) -> chex.Array:
    """`[2]` (black, white) Tromp-Taylor areas of pgx's internal Go state `x`.
    The one place that reads pgx 2.x's private Go code (hence `pgx<3`)."""
    from pgx._src.games.go import _count_scores

    return _count_scores(x, size)


def go_areas(game) -> chex.Array:
    """`[2]` (black, white) area of a pgx Go `State`: pgx's own Tromp-Taylor
    count (stones plus the empty points only they reach; an empty region that
    reaches no stone counts for both), komi not included."""
    x = game._x
    return _area_counts(x, int(round(x.board.shape[-1] ** 0.5)))


def _go_margin(env, x, color: chex.Array) -> chex.Array:
    """Area-score margin of `color` (0 black, 1 white) on pgx Go state `x`, komi
    included, divided by `size**2 + komi`."""
    game = env._game
    black, white = _area_counts(x, game.size)
    black_margin = (black - white - game.komi) / (game.size ** 2 + game.komi)
    return jnp.where(color == 0, black_margin, -black_margin).astype(jnp.float32)


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


__all__ += ["game_state", "game_symmetries", "go_areas", "mask_early_pass", "reward_of_seat",
            "seat"]

