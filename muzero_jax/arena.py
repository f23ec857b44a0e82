"""Opponents for two-player board games, and matches of an agent against them.

Opponents are batched, jittable functions `opponent(env_state, timestep,
rng_key) -> actions [B]` over a batch of games of the pgx environments
(`muzero_jax.envs.pgx`):

* `random`: a uniformly random legal move.
* `minimax` (TicTacToe): perfect play. The game-theoretic value of every
  position and move is solved once on the host (memoised negamax over the 5,478
  reachable positions) into a `[3**9, 9]` table; acting is a table lookup keyed
  by the board seen from the mover's side, with uniformly random tie-breaking
  among the optimal moves (so that matches explore every optimal line).
* `mcts` (any pgx game, meant for Connect Four): plain Monte Carlo tree search,
  UCT (UCB1 selection, `c = uct_c`) with uniformly random rollouts to the end of
  the game as leaf values and the most visited root move as the action, built
  on `mctx.search` with the real game as the model. `mcts` uses 200
  simulations; `mcts:N` uses N.
* `pgx_baseline` (Go 9x9): the AlphaZero-style policy network that pgx ships
  for the game (`pgx.make_baseline_model("go_9x9_v0")`), playing the legal
  move its policy rates highest (ties broken at random), without search.
  Its weights are pgx's pickle, downloaded once from pgx's address into
  `~/.cache/muzero-jax/pgx_baselines/`; `pgx_baseline:DIR` reads
  `DIR/go_9x9_v0.ckpt` instead (pgx's own `download_dir` layout; a pickle, so
  only a trusted file).

`evaluate_against(agent, opponent, num_games=..., rng_key=...)` plays
`num_games` games with the agent moving first and `num_games` with it moving
second, and returns win / draw / loss rates for each seat.

`tactical_positions` and `tactics_score` measure something cheaper than
matches: how often a player takes an immediate win and blocks the opponent's
immediate win, on positions from random play labelled with the real game.
`evaluate_against(..., tactics=True)` measures the same in the matches
themselves (`play_games(..., record_tactics=True)`, `match_tactics`), for
both players, and says what the agent's lost games began with.
"""

from __future__ import annotations

import functools
import os
import pickle
import urllib.request
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np

from muzero_jax.envs.base import Environment, TimeStep
from muzero_jax.envs.pgx import game_state, pgx_game, reward_of_seat
from muzero_jax.files import atomic_path

__all__ = [
    "OPPONENTS",
    "OpponentFn",
    "PGX_BASELINES",
    "TACTICS_GAMES",
    "TacticalPositions",
    "evaluate_against",
    "make_mcts_opponent",
    "make_minimax_opponent",
    "make_opponent",
    "make_pgx_baseline_opponent",
    "match_env",
    "match_tactics",
    "move_consequences",
    "outcome_rates",
    "play_games",
    "random_opponent",
    "solve_tic_tac_toe",
    "tactical_positions",
    "tactics_score",
]

OpponentFn = Callable[[Any, TimeStep, chex.PRNGKey], chex.Array]
"""`opponent(env_state, timestep, rng_key) -> [B] int32 actions` (batched)."""

OPPONENTS: tuple[str, ...] = ("random", "minimax", "mcts", "pgx_baseline")
"""Opponent names `make_opponent` accepts (`mcts:N` sets N simulations,
`pgx_baseline:DIR` reads the baseline's weights from DIR)."""

PGX_BASELINES: dict[str, str] = {"go_9x9": "go_9x9_v0"}
"""The games for which pgx ships a baseline network, and its model id."""

DEFAULT_PGX_BASELINE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "muzero-jax",
                                        "pgx_baselines")

DEFAULT_MCTS_SIMULATIONS = 200


class Agent(Protocol):
    """What `evaluate_against` needs of an agent (see `muzero_jax.load_agent`)."""

    env: Environment

    def act(self, observation, legal_action_mask=None, *, num_simulations=None, rng=None):
        """`[B]` actions for a batch of observations `[B, *obs]`."""


def _masked_choice(rng_key: chex.PRNGKey, scores: chex.Array, mask: chex.Array) -> chex.Array:
    """`[B]` a uniformly random index among the maxima of `scores` where `mask`."""
    best = jnp.max(jnp.where(mask, scores, -jnp.inf), axis=-1, keepdims=True)
    ties = mask & (scores >= best)
    logits = jnp.where(ties, 0.0, -jnp.inf)
    return jax.random.categorical(rng_key, logits).astype(jnp.int32)


def random_opponent(env_state, timestep: TimeStep, rng_key: chex.PRNGKey) -> chex.Array:
    """A uniformly random legal move in each game."""
    del env_state
    mask = timestep.legal_action_mask
    return _masked_choice(rng_key, jnp.zeros(mask.shape, jnp.float32), mask)


# TicTacToe, solved.

_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_ILLEGAL = -2.0


def _won(board: tuple[int, ...], who: int) -> bool:
    return any(all(board[i] == who for i in line) for line in _LINES)


@functools.lru_cache(maxsize=1)
def solve_tic_tac_toe() -> np.ndarray:
    """Game-theoretic move values of every TicTacToe position, from the mover's side.

    A position is keyed by `sum_i code_i * 3**i` over the cells i = 0..8 (row
    major, pgx's action numbering), `code` 0 for empty, 1 for the mover's mark,
    2 for the opponent's.

    Returns:
      `[3**9, 9]` float32: +1 if the move wins with best play on both sides, 0
      if it draws, -1 if it loses; -2 for an occupied cell and for every move
      of a finished (or unreachable) position.
    """
    table = np.full((3**9, 9), _ILLEGAL, np.float32)
    powers = 3 ** np.arange(9)

    @functools.cache
    def value(board: tuple[int, ...]) -> float:
        """Value for the player to move (code 1) of a live position."""
        best = -1.0
        moves = np.full(9, _ILLEGAL, np.float32)
        for a in range(9):
            if board[a]:
                continue
            after = board[:a] + (1,) + board[a + 1:]
            if _won(after, 1):
                q = 1.0
            elif all(after):
                q = 0.0
            else:  # The opponent moves next: swap the codes and negate.
                q = -value(tuple((0, 2, 1)[c] for c in after))
            moves[a] = q
            best = max(best, q)
        table[int(np.dot(board, powers))] = moves
        return best

    value((0,) * 9)
    return table


def make_minimax_opponent() -> OpponentFn:
    """Perfect TicTacToe play by lookup in `solve_tic_tac_toe()` (jittable).

    The board is read from the observation (channel 0: the mover's marks,
    channel 1: the opponent's), so it works on any batch of TicTacToe
    timesteps. Among the optimal moves one is drawn uniformly at random.
    """
    table = jnp.asarray(solve_tic_tac_toe())
    powers = jnp.asarray(3 ** np.arange(9), jnp.int32)

    def opponent(env_state, timestep: TimeStep, rng_key: chex.PRNGKey) -> chex.Array:
        del env_state
        obs = timestep.observation.reshape(timestep.observation.shape[0], 9, 2)
        codes = (obs[..., 0] > 0.5).astype(jnp.int32) + 2 * (obs[..., 1] > 0.5).astype(jnp.int32)
        q = table[codes @ powers]
        return _masked_choice(rng_key, q, timestep.legal_action_mask & (q > _ILLEGAL))

    return opponent


# Plain MCTS with random rollouts.


def make_mcts_opponent(
    env: Environment,
    *,
    num_simulations: int = DEFAULT_MCTS_SIMULATIONS,
    uct_c: float = 2.0,
) -> OpponentFn:
    """UCT with random rollouts on the real game (no learning), via `mctx.search`.

    Every new node is valued by one uniformly random playout to the end of the
    game, from the point of view of its player to move; values pass between
    plies with `discount = -1` and stop at terminal states (`discount = 0`).
    Selection is UCB1, `Q + uct_c * sqrt(ln N / n)` with Q in [-1, 1] (untried
    legal moves first, in random order), at every node, over legal moves only.

    Args:
      env: a pgx environment (`muzero_jax.envs.pgx`).
      num_simulations: simulations per move.
      uct_c: the UCB1 exploration constant.

    Returns:
      An `OpponentFn` playing the most visited legal root move.
    """
    if num_simulations < 1:
        raise ValueError(f"MCTS needs num_simulations >= 1, got {num_simulations}")
    game = pgx_game(env.name)
    max_plies = env.max_episode_steps

    def playout_value(g, rng_key):
        """One random playout from `g`: the outcome for `g`'s player to move."""
        player = g.current_player

        def cond(carry):
            g, _, n = carry
            return ~(g.terminated | g.truncated) & (n < max_plies)

        def body(carry):
            g, key, n = carry
            key, move_key = jax.random.split(key)
            logits = jnp.where(g.legal_action_mask, 0.0, -jnp.inf)
            g = game.step(g, jax.random.categorical(move_key, logits))
            return g, key, n + 1

        g, _, _ = jax.lax.while_loop(cond, body, (g, rng_key, jnp.int32(0)))
        return g.rewards[player]

    def recurrent_fn(params, rng_key, action, embedding):
        del params
        mover = embedding.current_player
        g = jax.vmap(game.step)(embedding, action)
        reward = jnp.take_along_axis(g.rewards, mover[:, None], axis=1)[:, 0]
        terminal = g.terminated | g.truncated
        keys = jax.random.split(rng_key, action.shape[0])
        value = jnp.where(terminal, 0.0, jax.vmap(playout_value)(g, keys))
        out = mctx.RecurrentFnOutput(
            reward=reward,
            discount=jnp.where(terminal, 0.0, -1.0),
            prior_logits=jnp.zeros(g.legal_action_mask.shape, jnp.float32),
            value=value,
        )
        return out, g

    def ucb1(rng_key, tree: mctx.Tree, node_index, depth=None):
        del depth
        visits = tree.children_visits[node_index].astype(jnp.float32)
        total = jnp.maximum(tree.node_visits[node_index].astype(jnp.float32), 1.0)
        q = tree.qvalues(node_index)
        bonus = uct_c * jnp.sqrt(jnp.log(total) / jnp.maximum(visits, 1.0))
        noise = 1e-6 * jax.random.uniform(rng_key, visits.shape)
        score = jnp.where(visits > 0, q + bonus, 1e9) + noise
        legal = tree.embeddings.legal_action_mask[node_index]
        return jnp.argmax(jnp.where(legal, score, -jnp.inf)).astype(jnp.int32)

    def opponent(env_state, timestep: TimeStep, rng_key: chex.PRNGKey) -> chex.Array:
        g = game_state(env_state).game
        root_key, search_key, pick_key = jax.random.split(rng_key, 3)
        keys = jax.random.split(root_key, timestep.legal_action_mask.shape[0])
        root = mctx.RootFnOutput(
            prior_logits=jnp.zeros(g.legal_action_mask.shape, jnp.float32),
            value=jax.vmap(playout_value)(g, keys),
            embedding=g,
        )
        tree = mctx.search(
            params=(),
            rng_key=search_key,
            root=root,
            recurrent_fn=recurrent_fn,
            root_action_selection_fn=ucb1,
            interior_action_selection_fn=ucb1,
            num_simulations=num_simulations,
            invalid_actions=~timestep.legal_action_mask,
        )
        visits = tree.children_visits[:, mctx.Tree.ROOT_INDEX].astype(jnp.float32)
        return _masked_choice(pick_key, visits, timestep.legal_action_mask)

    return opponent


def _check_pgx_checkpoint(data: bytes, source: str) -> None:
    """Raises one ValueError unless `data` unpickles to pgx's baseline format."""
    try:
        checkpoint = pickle.loads(data)
        if not (isinstance(checkpoint, dict) and {"args", "params", "state"} <= set(checkpoint)):
            raise ValueError("not a dict with args, params and state")
    except Exception as e:  # any unpickling failure: say which file, once
        raise ValueError(f"opponent 'pgx_baseline': {source} is not a pgx baseline checkpoint "
                         f"({type(e).__name__}: {e})") from None


def _download_pgx_baseline(model_id: str, path: str) -> bytes:
    """pgx's checkpoint for `model_id`, fetched from pgx's address and checked
    (`path`: where it was looked for, named in the error)."""
    from pgx._src.baseline import _get_download_url  # pgx < 3, pinned in pyproject

    url = _get_download_url(model_id)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
    except OSError as e:
        raise ValueError(
            f"opponent 'pgx_baseline': {path} does not exist and downloading pgx's "
            f"{model_id} from {url} failed ({e}); fetch that file to {path} by hand, or "
            "write pgx_baseline:DIR for a directory holding "
            f"{model_id}.ckpt") from None
    _check_pgx_checkpoint(data, f"what {url} sent")
    return data


def _write_whole(path: str, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file: whole or not at all."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def make_pgx_baseline_opponent(env: Environment, directory: str | None = None) -> OpponentFn:
    """The baseline network pgx ships for `env`'s game, as an opponent: the
    legal move with the highest policy logit (ties broken at random), no search.

    Args:
      env: a game in `PGX_BASELINES` (Go 9x9).
      directory: holds `<model id>.ckpt` (pgx's `download_dir`); None:
        `DEFAULT_PGX_BASELINE_DIR`, downloading pgx's file there the first time
        (kept only once it is checked to be a checkpoint).

    Raises:
      ValueError: for a game pgx ships no baseline for, a missing file (or a
        failed download), or a file that is not a pgx baseline checkpoint.
    """
    model_id = PGX_BASELINES.get(env.name)
    if model_id is None:
        raise ValueError(f"opponent 'pgx_baseline': pgx ships a baseline network for "
                         f"{', '.join(PGX_BASELINES)} only, not {env.name!r}")
    path = os.path.join(directory or DEFAULT_PGX_BASELINE_DIR, f"{model_id}.ckpt")
    if os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ValueError(f"opponent 'pgx_baseline': cannot read {path} ({e})") from None
        _check_pgx_checkpoint(data, path)
    elif directory is not None:
        raise ValueError(f"opponent 'pgx_baseline:{directory}': no {path} (pgx's "
                         f"{model_id} checkpoint)")
    else:
        _write_whole(path, _download_pgx_baseline(model_id, path))
    # pgx unpickles the file again to build its network (its loader reads
    # only from a directory); the check above gives bad files one clear line.
    import pgx

    apply = pgx.make_baseline_model(model_id, download_dir=os.path.dirname(path))

    def opponent(env_state, timestep: TimeStep, rng_key: chex.PRNGKey) -> chex.Array:
        del env_state
        logits, _ = apply(timestep.observation)
        return _masked_choice(rng_key, logits, timestep.legal_action_mask)

    return opponent


def make_opponent(name: str, env: Environment) -> OpponentFn:
    """Builds the opponent called `name` for `env` (see `OPPONENTS`).

    Raises:
      ValueError: for an unknown name, a malformed `mcts:N`, `minimax` on a
        game other than TicTacToe, or `pgx_baseline` without its weights or on
        a game pgx ships no baseline for.
    """
    base, _, arg = name.partition(":")
    if base == "random" and not arg:
        return random_opponent
    if base == "minimax" and not arg:
        if env.name != "tic_tac_toe":
            raise ValueError(f"opponent 'minimax' plays tic_tac_toe only, not {env.name!r}")
        return make_minimax_opponent()
    if base == "mcts":
        try:
            sims = int(arg) if arg else DEFAULT_MCTS_SIMULATIONS
        except ValueError:
            sims = 0
        if sims < 1:
            raise ValueError(f"opponent {name!r}: write mcts or mcts:N with N >= 1 simulations")
        return make_mcts_opponent(env, num_simulations=sims)
    if base == "pgx_baseline":
        return make_pgx_baseline_opponent(env, arg or None)
    raise ValueError(f"unknown opponent {name!r}; known: random, minimax, mcts, mcts:N, "
                     "pgx_baseline, pgx_baseline:DIR")


def outcome_rates(results: np.ndarray) -> dict[str, float]:
    """`{"win", "draw", "loss"}` shares of `[G]` outcomes (+1, 0, -1)."""
    n = max(len(results), 1)
    return {
        "win": float(np.sum(results > 0) / n),
        "draw": float(np.sum(results == 0) / n),
        "loss": float(np.sum(results < 0) / n),
    }


def match_env(agent: Any) -> Environment:
    """The game an agent's matches are played in: its training environment, or,
    when the run built that with `env_kwargs` (e.g. Go's
    `min_plies_before_pass`, which shapes only self-play), the registered game
    at its defaults."""
    config = getattr(agent, "config", None)
    if config is None or not config.parsed_env_kwargs():
        return agent.env
    from muzero_jax.envs import make_env

    return make_env(config.env)


def play_games(
    agent_fn: Callable[[Any, TimeStep, chex.PRNGKey], chex.Array],
    opponent_fn: OpponentFn,
    env: Environment,
    agent_seat: chex.Array,
    rng_key: chex.PRNGKey,
    *,
    record_tactics: bool = False,
) -> np.ndarray | tuple[np.ndarray, dict[str, np.ndarray]]:
    """Plays one game per entry of `agent_seat` and returns the agent's results.

    Args:
      agent_fn: the agent, with the `OpponentFn` signature (host callable).
      opponent_fn: the opponent (jittable).
      env: a two-player environment.
      agent_seat: `[G]` int, 0 where the agent moves first, 1 where second.
      rng_key: consumed.
      record_tactics: also label every move played with its one-ply
        consequences on the real game (`move_consequences`; a pgx game in
        `TACTICS_GAMES`).

    Returns:
      `[G]` float32 outcomes for the agent: +1 win, 0 draw, -1 loss; with
      `record_tactics`, also a dict of `[T, G]` bool arrays over the plies:
      `played` (the game was still on), `agent_moved`, `has_win` (some move
      won at once), `took_win`, `must_block` (no move won, some let the
      opponent win at once and some did not) and `blocked` (the move played
      did not let the opponent win at once).
    """
    agent_seat = jnp.asarray(agent_seat, jnp.int32)
    num_games = agent_seat.shape[0]
    reset_key, rng_key = jax.random.split(rng_key)
    state, ts = jax.jit(jax.vmap(env.reset))(jax.random.split(reset_key, num_games))
    opponent_fn = jax.jit(opponent_fn)
    step = jax.jit(jax.vmap(env.step))
    label = jax.jit(jax.vmap(_label_move(env.name))) if record_tactics else None
    done = np.zeros(num_games, bool)
    results = np.zeros(num_games, np.float32)
    record: dict[str, list[np.ndarray]] = {}
    for _ in range(env.max_episode_steps):
        rng_key, agent_key, opp_key = jax.random.split(rng_key, 3)
        agent_turn = ts.to_play == agent_seat
        agent_action = jnp.asarray(agent_fn(state, ts, agent_key), jnp.int32)
        opp_action = opponent_fn(state, ts, opp_key)
        action = jnp.where(agent_turn, agent_action, opp_action)
        if label is not None:
            row = {k: np.asarray(v) for k, v in label(game_state(state).game, action).items()}
            row.update(played=~done, agent_moved=np.asarray(agent_turn))
            for k, v in row.items():
                record.setdefault(k, []).append(v)
        state, ts = step(state, action)
        finished = np.asarray(ts.last) & ~done
        results = np.where(finished, np.asarray(reward_of_seat(ts, agent_seat)), results)
        done |= np.asarray(ts.last)
        if done.all():
            break
    if not record_tactics:
        return results
    return results, {k: np.stack(v) for k, v in record.items()}


TACTICS_GAMES: tuple[str, ...] = ("tic_tac_toe", "connect_four")
"""Games whose matches can be labelled with one-ply wins and blocks (Go's
games end by passing, and 82 x 82 replies per move would cost too much)."""


def _label_move(game_name: str):
    """`label(g, action) -> dict of [] bool`: one move's one-ply consequences."""
    game = pgx_game(game_name)

    def label(g, action):
        wins, loses = move_consequences(game, g)
        has_win = jnp.any(wins)
        safe = g.legal_action_mask & ~loses
        must_block = ~has_win & jnp.any(safe) & (safe.sum() < g.legal_action_mask.sum())
        return {"has_win": has_win, "took_win": wins[action], "must_block": must_block,
                "blocked": safe[action]}

    return label


def match_tactics(record: dict[str, np.ndarray], results: np.ndarray) -> dict[str, Any]:
    """Summarises `play_games(..., record_tactics=True)`: both players' tactics
    in the games played, and what the agent's lost games came from.

    Returns:
      `agent` and `opponent`, each `{"wins_available", "wins_taken",
      "must_block", "blocks_made"}` (counts of the positions, and the shares of
      them where the player won at once / blocked; None where there were
      none); and `losses`: the number of the agent's lost games and the share
      of them whose first one-ply error by the agent was a missed win
      (`missed_win`), a missed block (`missed_block`), or that had none
      (`no_error`: lost to a double threat or a longer plan).
    """
    played = record["played"]

    def side(mine: np.ndarray) -> dict[str, Any]:
        on = played & mine
        wins, blocks = on & record["has_win"], on & record["must_block"]
        return {
            "wins_available": int(wins.sum()),
            "wins_taken": float(record["took_win"][wins].mean()) if wins.any() else None,
            "must_block": int(blocks.sum()),
            "blocks_made": float(record["blocked"][blocks].mean()) if blocks.any() else None,
        }

    mine = played & record["agent_moved"]
    missed_win = mine & record["has_win"] & ~record["took_win"]
    missed_block = mine & record["must_block"] & ~record["blocked"]
    lost = results < 0
    kinds = {"missed_win": 0, "missed_block": 0, "no_error": 0}
    for g in np.flatnonzero(lost):
        errors = np.flatnonzero(missed_win[:, g] | missed_block[:, g])
        if errors.size == 0:
            kinds["no_error"] += 1
        else:
            kinds["missed_win" if missed_win[errors[0], g] else "missed_block"] += 1
    num_lost = int(lost.sum())
    return {
        "agent": side(record["agent_moved"]),
        "opponent": side(~record["agent_moved"]),
        "losses": {"num_lost": num_lost,
                   **{k: (v / num_lost if num_lost else None) for k, v in kinds.items()}},
    }


def evaluate_against(
    agent: Agent,
    opponent: str,
    *,
    num_games: int,
    rng_key: chex.PRNGKey,
    num_simulations: int | None = None,
    tactics: bool = False,
) -> dict[str, Any]:
    """Plays the agent against an opponent from both seats.

    Args:
      agent: has `env` (a two-player environment) and `act(observation,
        legal_action_mask, *, num_simulations, rng) -> [B] actions` (e.g. from
        `muzero_jax.load_agent`).
      opponent: `"random"`, `"minimax"` (TicTacToe), `"mcts"` (200
        simulations), `"mcts:N"`, or `"pgx_baseline"` / `"pgx_baseline:DIR"`
        (Go 9x9; see `make_pgx_baseline_opponent`).
      num_games: games per seat: `num_games` with the agent moving first and
        `num_games` with it moving second (all played as one batch).
      rng_key: consumed.
      num_simulations: the agent's simulations per move (None: its default).
      tactics: also label every move of the matches with its one-ply
        consequences on the real game (games in `TACTICS_GAMES`) and report
        both players' wins taken and blocks made, and what the agent's losses
        came from (`match_tactics`).

    Returns:
      A JSON-friendly dict: `env`, `opponent`, `num_games` (per seat),
      `as_first` and `as_second` (each `{"win", "draw",
      "loss"}` rates over that seat's games), `overall` (the same over all
      games), and `win_rate`, `draw_rate`, `loss_rate` (= `overall`); with
      `tactics`, also `tactics` (`match_tactics` over all the games).

    Raises:
      ValueError: on a single-player environment, an unknown opponent, a
        non-positive `num_games` or `tactics` on a game outside
        `TACTICS_GAMES`, before anything is compiled.
    """
    env = match_env(agent)
    if env.num_players != 2:
        raise ValueError(f"evaluate_against needs a two-player game; {env.name!r} has "
                         f"{env.num_players} player(s)")
    if isinstance(num_games, bool) or not isinstance(num_games, int) or num_games < 1:
        raise ValueError(f"num_games must be a positive integer, got {num_games!r}")
    if tactics and env.name not in TACTICS_GAMES:
        raise ValueError(f"tactics are labelled only for {', '.join(TACTICS_GAMES)}, "
                         f"not {env.name!r}")
    opponent_fn = make_opponent(opponent, env)

    # An agent planning in the real game (`load_agent(..., model="env")`) searches
    # from the games' states; others need only the observations.
    plans_in_env = getattr(agent, "model", "learned") == "env"

    def agent_fn(env_state, ts, key):
        state = {"env_state": env_state} if plans_in_env else {}
        return agent.act(ts.observation, ts.legal_action_mask,
                         num_simulations=num_simulations, rng=key, **state)

    seats = np.concatenate([np.zeros(num_games, np.int32), np.ones(num_games, np.int32)])
    record = None
    if tactics:
        results, record = play_games(agent_fn, opponent_fn, env, seats, rng_key,
                                     record_tactics=True)
    else:
        results = play_games(agent_fn, opponent_fn, env, seats, rng_key)
    first, second = outcome_rates(results[:num_games]), outcome_rates(results[num_games:])
    overall = outcome_rates(results)
    extra = {} if record is None else {"tactics": match_tactics(record, results)}
    return {
        "env": env.name,
        "opponent": opponent,
        "num_games": num_games,
        "as_first": first,
        "as_second": second,
        "overall": overall,
        "win_rate": overall["win"],
        "draw_rate": overall["draw"],
        "loss_rate": overall["loss"],
        **extra,
    }


# Tactics: immediate wins and forced blocks.


class TacticalPositions(NamedTuple):
    """Positions from random play, with each move's one-ply consequences.

    Attributes:
      observation: `[N, *obs]` float32, from the point of view of the mover.
      legal_action_mask: `[N, A]` bool.
      wins: `[N, A]` bool, the legal move wins at once.
      loses: `[N, A]` bool, after the legal move the opponent can win at once.
      has_win: `[N]` bool, some legal move wins at once.
      must_block: `[N]` bool, no move wins at once, some moves let the
        opponent win at once and some do not (the others "block").
      game: the pgx `State`s (leaves `[N, ...]`), for players that need them.
    """

    observation: chex.Array
    legal_action_mask: chex.Array
    wins: chex.Array
    loses: chex.Array
    has_win: chex.Array
    must_block: chex.Array
    game: Any


def move_consequences(game, g) -> tuple[chex.Array, chex.Array]:
    """Each legal move's one-ply consequences in one (unbatched) pgx state.

    Args:
      game: the `pgx.Env`.
      g: a non-terminal pgx `State`.

    Returns:
      `wins`: `[A]` bool, the legal move wins at once; `loses`: `[A]` bool,
      after the legal move the game goes on and the opponent can win at once.
    """
    num_actions = g.legal_action_mask.shape[0]

    def every_move(g):
        return jax.vmap(game.step, (None, 0))(g, jnp.arange(num_actions))

    def wins_now(g, after):
        """`[A]` the mover's legal moves that win at once (`after`: every move played)."""
        return g.legal_action_mask & (after.rewards[:, g.current_player] > 0)

    after = every_move(g)
    wins = wins_now(g, after)
    loses = g.legal_action_mask & ~after.terminated & jax.vmap(
        lambda h: jnp.any(wins_now(h, every_move(h))))(after)
    return wins, loses


def tactical_positions(game_name: str, num_positions: int, rng_key: chex.PRNGKey, *,
                       min_plies: int = 4, max_plies: int = 30) -> TacticalPositions:
    """Positions after `min_plies`..`max_plies - 1` uniformly random moves of a pgx game.

    Games that end before their ply count are kept at their last non-terminal
    position. Each legal move is played out one ply (and each reply one more)
    on the real game to label immediate wins and moves that allow one.
    """
    game = pgx_game(game_name)
    init_key, plies_key, play_key = jax.random.split(rng_key, 3)

    def random_move(g, key):
        return jax.random.categorical(key, jnp.where(g.legal_action_mask, 0.0, -jnp.inf))

    def one_position(init_key, plies, play_key):
        def body(i, carry):
            g, key = carry
            key, move_key = jax.random.split(key)
            nxt = game.step(g, random_move(g, move_key))
            stay = (i >= plies) | nxt.terminated
            return jax.tree.map(lambda a, b: jnp.where(stay, a, b), g, nxt), key

        g = jax.lax.fori_loop(0, max_plies, body, (game.init(init_key), play_key))[0]
        wins, loses = move_consequences(game, g)
        return g.observation.astype(jnp.float32), g.legal_action_mask, wins, loses, g

    obs, legal, wins, loses, games = jax.jit(jax.vmap(one_position))(
        jax.random.split(init_key, num_positions),
        jax.random.randint(plies_key, (num_positions,), min_plies, max_plies),
        jax.random.split(play_key, num_positions),
    )
    has_win = jnp.any(wins, axis=1)
    safe = legal & ~loses
    must_block = ~has_win & jnp.any(safe, axis=1) & (safe.sum(1) < legal.sum(1))
    return TacticalPositions(obs, legal, wins, loses, has_win, must_block, games)


def tactics_score(choose: Callable[[chex.Array, chex.Array], chex.Array],
                  positions: TacticalPositions) -> dict[str, float]:
    """How often `choose(observation, legal_action_mask) -> [N] actions` plays tactically.

    Returns:
      `wins_taken`: the fraction of positions with an immediate win where the
      chosen move wins; `blocks_made`: the fraction of must-block positions
      where it does not let the opponent win at once; `random_blocks`: what a
      uniformly random legal move scores on the latter; and the counts
      `num_has_win`, `num_must_block`.
    """
    action = np.asarray(choose(positions.observation, positions.legal_action_mask))
    rows = np.arange(action.shape[0])
    legal, wins, loses = (np.asarray(x) for x in
                          (positions.legal_action_mask, positions.wins, positions.loses))
    has_win, block = np.asarray(positions.has_win), np.asarray(positions.must_block)
    safe = legal & ~loses
    if not has_win.any() or not block.any():
        raise ValueError("too few positions: none with an immediate win or none to block; "
                         "use more positions")
    return {
        "wins_taken": float(wins[rows, action][has_win].mean()),
        "blocks_made": float(safe[rows, action][block].mean()),
        "random_blocks": float((safe[block].sum(1) / legal[block].sum(1)).mean()),
        "num_has_win": int(has_win.sum()),
        "num_must_block": int(block.sum()),
    }
