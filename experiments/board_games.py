"""Board games: train MuZero on a pgx game and evaluate it against a baseline.

Trains with the environment's preset (`muzero_jax/presets.py`) and, every
`--eval-every` iterations, plays `--eval-games` games as first and as many as
second player against the opponent (`muzero_jax.arena`). Training wall time
(compile included) is counted without the evaluation pauses; both are recorded.

    nice -n 5 python experiments/board_games.py --env tic_tac_toe --max-seconds 600
    nice -n 5 python experiments/board_games.py --env connect_four --max-seconds 1800

`--cpu-devices N` splits a CPU host into N JAX devices and trains
data-parallel over them, as `muzero-jax train --cpu-devices N` does (the
README's "Several CPU devices on one host": 1.34x Connect Four's env steps/s
with 2 on the 2-core CPU).

Targets (issue 8): TicTacToe, no losses in 100 games vs perfect minimax as
first and as second player after <= 10 minutes of training on a 2-core CPU;
Connect Four, >= 90 % wins vs 200-simulation random-rollout MCTS within 30
minutes. Go 9x9 (`--env go_9x9`) is sized for a GPU.

For TicTacToe with a deterministic search (the preset's `gumbel_scale` 0) each
evaluation also records `exact`: the agent's outcome rates against minimax
computed over the whole game tree (`exact_tic_tac_toe`) rather than sampled.
For Connect Four each evaluation also records `tactics`: on 1,024 positions
from random play, the share of immediate wins the agent takes and of forced
blocks it makes (`muzero_jax.arena.tactics_score`; MCTS-200 scores 1.00 and
0.94 on them: `python experiments/board_games.py --tactics-of mcts`), and
`in_games`: the same two shares in the evaluation's own games, for the agent
and for the opponent, and what the agent's lost games began with
(`muzero_jax.arena.match_tactics`).
`--tactics-of RUN --simulations 1,16,128` scores a run of `muzero-jax train`
on the same positions instead of training.

Go: `--env-kwargs '{"min_plies_before_pass": 81, "score_reward": true}'`
builds the self-play environment with those options (`muzero_jax.envs.pgx`;
evaluations play the standard game); `--random-baseline 1000` prints random
against random (1,000 games per seat), the rates to beat; `--pass-report RUN
--simulations 32 --eval-games 50` prints how often a run's agent passes
against random.

Writes `--out/ENV_seedS.json` (config, every evaluation, the first evaluation
that met the target, machine and load) and prints one line per evaluation.
With `--logdir DIR` it also saves the final state there as a run directory of
`muzero-jax train` (`config.json`, `checkpoints/`), for `muzero-jax eval
--logdir DIR`, `muzero-jax play --logdir DIR` and `muzero_jax.load_agent(DIR)`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from muzero_jax.arena import evaluate_against, solve_tic_tac_toe, tactical_positions, tactics_score
from muzero_jax.config import config_to_dict
from muzero_jax.files import write_text_atomically
from muzero_jax.learning import make_train
from muzero_jax.presets import preset
from muzero_jax.search import every_move_step

OPPONENT = {"tic_tac_toe": "minimax", "connect_four": "mcts", "go_9x9": "random"}


def met_target(env: str, result: dict) -> bool:
    """The issue's figure for `env` holds in this evaluation."""
    first, second = result["as_first"], result["as_second"]
    if env == "tic_tac_toe":
        return first["loss"] == 0.0 and second["loss"] == 0.0
    if env == "connect_four":
        return first["win"] >= 0.9 and second["win"] >= 0.9
    return first["win"] >= 0.99 and second["win"] >= 0.99


_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def exact_tic_tac_toe(agent, agent_seat: int) -> dict:
    """Exact outcome rates of the agent against minimax with uniform tie-breaking.

    Walks the whole game tree: at the agent's turns it takes the agent's move
    (one batched search over every position reached at that ply), at the
    opponent's turns it branches over every optimal move with equal weight, as
    `arena`'s minimax draws among them. Exact only for a deterministic agent
    (e.g. Gumbel search with `gumbel_scale = 0`); the sampled matches of
    `evaluate_against` estimate the same rates.

    Returns:
      `{"win", "draw", "loss"}` probabilities, `losing_lines` (how many
      distinct move sequences of the opponent lead to a loss) and
      `losing_examples` (up to 5 of those games, as cell numbers 0-8, row
      major, first player's move first).
    """
    table, powers = solve_tic_tac_toe(), 3 ** np.arange(9)
    # Board (cells: 0 empty, 1 first player, 2 second) -> (probability, lines, one move list).
    frontier = {(0,) * 9: (1.0, 1, ())}
    out = {"win": 0.0, "draw": 0.0, "loss": 0.0, "losing_lines": 0, "losing_examples": []}
    for ply in range(9):
        mover = 1 + ply % 2
        boards = list(frontier)
        mine = np.array([[c == mover for c in b] for b in boards], np.float32)
        theirs = np.array([[c == 3 - mover for c in b] for b in boards], np.float32)
        if ply % 2 == agent_seat:
            size = max(64, 1 << (len(boards) - 1).bit_length())  # few compiled batch shapes
            obs = np.zeros((size, 9, 2), np.float32)
            obs[: len(boards), :, 0], obs[: len(boards), :, 1] = mine, theirs
            legal = obs.sum(-1) == 0
            actions = np.asarray(agent.act(obs.reshape(size, 3, 3, 2), legal))[: len(boards)]
            moves = [[(int(a), 1.0)] for a in actions]
        else:
            codes = (mine + 2 * theirs).astype(np.int64) @ powers
            q = table[codes]
            moves = [[(int(a), 1.0 / len(best)) for a in best]
                     for best in (np.flatnonzero(row == row.max()) for row in q)]
        nxt: dict = {}
        for board, options in zip(boards, moves):
            prob, lines, history = frontier[board]
            for a, w in options:
                child = board[:a] + (mover,) + board[a + 1:]
                if any(all(child[i] == mover for i in line) for line in _LINES):
                    key = "win" if ply % 2 == agent_seat else "loss"
                    out[key] += prob * w
                    if key == "loss":
                        out["losing_lines"] += lines
                        if len(out["losing_examples"]) < 5:
                            out["losing_examples"].append(list(history + (a,)))
                elif all(child):
                    out["draw"] += prob * w
                else:
                    p0, l0, h0 = nxt.get(child, (0.0, 0, history + (a,)))
                    nxt[child] = (p0 + prob * w, l0 + lines, h0)
        frontier = nxt
        if not frontier:
            break
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run(env: str, *, seed: int, max_seconds: float, eval_every: int, eval_games: int,
        opponent: str, overrides: dict, logdir: str | None = None,
        env_kwargs: dict | None = None, eval_every_seconds: float = 0.0,
        print_every_seconds: float = 0.0, cpu_devices: int = 0) -> dict:
    """Trains, evaluating every `eval_every` iterations (or, with
    `eval_every_seconds` > 0, each time the training wall time passes another
    multiple of it: for a machine whose speed is not known ahead); with `logdir`, saves the
    final state there as `muzero-jax train` does (`config.json`, `checkpoints/`),
    so `muzero-jax eval` / `play` / `load_agent` take the trained agent
    (and `launch.json`: the `cpu_devices` this process was started with,
    which `muzero-jax train --resume` starts with).
    `env_kwargs` build the self-play environment (`make_env(env, **env_kwargs)`);
    evaluations play the standard game."""
    from muzero_jax.agent import Agent  # the CLI's agent (search from a batch of observations)
    from muzero_jax.envs import make_env

    config = preset(env, seed=seed, **overrides)
    # Connect Four: also the share of immediate wins taken and forced blocks made.
    tactics = _connect_four_positions() if env == "connect_four" else None
    trainer = make_train(config, env=make_env(env, **env_kwargs) if env_kwargs else None)
    eval_trainer = make_train(config) if env_kwargs else trainer
    state = trainer.init(jax.random.key(seed))
    evals, met_at = [], None
    train_s, eval_s, loads = 0.0, 0.0, [_load()]
    iteration, next_eval_s, next_print_s = 0, eval_every_seconds, print_every_seconds
    while train_s < max_seconds:
        t0 = time.perf_counter()
        state, metrics = trainer.iteration(state)
        jax.block_until_ready(metrics.loss)
        train_s += time.perf_counter() - t0
        iteration += 1
        if print_every_seconds > 0 and train_s >= next_print_s:
            next_print_s = (train_s // print_every_seconds + 1) * print_every_seconds
            print(f"iter {iteration:5d} steps {int(state.counters.env_steps):8d} "
                  f"train {train_s:7.1f}s | loss {float(metrics.loss):.3f}", flush=True)
        if eval_every_seconds > 0:
            due = train_s >= next_eval_s
            if due:
                next_eval_s = (train_s // eval_every_seconds + 1) * eval_every_seconds
        else:
            due = iteration % eval_every == 0
        if not due and train_s < max_seconds:
            continue
        t0 = time.perf_counter()
        agent = Agent(config, eval_trainer,
                      state.target_params if config.eval_weights == "target" else state.params,
                      weights=config.eval_weights)
        result = evaluate_against(agent, opponent, num_games=eval_games,
                                  rng_key=jax.random.key(10_000 + iteration),
                                  tactics=tactics is not None)
        eval_s += time.perf_counter() - t0
        loads.append(_load())
        row = {
            "iteration": iteration,
            "env_steps": int(state.counters.env_steps),
            "train_s": round(train_s, 1),
            "loss": float(metrics.loss),
            **{k: result[k] for k in ("as_first", "as_second")},
        }
        if env == "tic_tac_toe" and opponent == "minimax" and _deterministic(config):
            row["exact"] = {seat: exact_tic_tac_toe(agent, i)
                            for i, seat in enumerate(("as_first", "as_second"))}
        if tactics is not None:
            row["tactics"] = tactics_score(agent.act, tactics)
            row["in_games"] = result["tactics"]
        evals.append(row)
        exact = "".join(f" | exact {seat[3:]} loss {row['exact'][seat]['loss']:.3f}"
                        for seat in row.get("exact", {}))
        print(f"iter {iteration:5d} steps {row['env_steps']:8d} train {train_s:7.1f}s | "
              f"first W/D/L {_fmt(row['as_first'])} | second W/D/L {_fmt(row['as_second'])}"
              f"{exact}{_fmt_tactics(row)}", flush=True)
        if met_target(env, result) and met_at is None:
            met_at = row
    num_devices = int(trainer.mesh.devices.size)
    if logdir is not None:
        _save(logdir, config, state, iteration, train_s, evals, num_devices, cpu_devices)
    return {
        "env": env,
        "seed": seed,
        "opponent": opponent,
        "eval_games_per_seat": eval_games,
        "command": "python experiments/board_games.py " + " ".join(
            f"--{k} {v:g}" if isinstance(v, float) else f"--{k} {v}" for k, v in (
                ("env", env), ("seed", seed), ("max-seconds", max_seconds),
                ("eval-every-seconds", eval_every_seconds) if eval_every_seconds > 0
                else ("eval-every", eval_every),
                ("eval-games", eval_games))),
        "target_met_at": met_at,
        "final": evals[-1] if evals else None,
        "evaluations": evals,
        "train_s": round(train_s, 1),
        "eval_s": round(eval_s, 1),
        "num_devices": num_devices,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
                   f"{jax.devices()[0].platform} ({jax.devices()[0].device_kind}), "
                   f"jax {jax.__version__}",
        "load_avg": loads,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "config": config_to_dict(config),
    }


def _save(logdir: str, config, state, iteration: int, train_s: float, evals: list,
          num_devices: int, cpu_devices: int) -> None:
    """The final state as a run directory of `muzero-jax train` (its metadata
    records the device count, which a full-state resume must match, and its
    launch.json the `--cpu-devices` that resume starts with)."""
    from muzero_jax.checkpoint import Checkpointer
    from muzero_jax.cli import write_launch_file
    from muzero_jax.provenance import append_environment_record
    from muzero_jax.train import config_json

    os.makedirs(logdir, exist_ok=True)
    write_text_atomically(os.path.join(logdir, "config.json"), config_json(config))
    write_launch_file(logdir, cpu_devices)
    append_environment_record(logdir, iteration=0, resumed=False)
    checkpointer = Checkpointer(os.path.join(logdir, "checkpoints"))
    try:
        checkpointer.save(iteration, state, {"env_steps": int(state.counters.env_steps),
                                             "wall_s": train_s, "board_games_evals": evals,
                                             "num_devices": num_devices},
                          config)
    finally:
        checkpointer.close()


def _deterministic(config) -> bool:
    """The evaluation search has no randomness (Gumbel search with gumbel_scale 0)."""
    return (config.search == "gumbel_muzero"
            and config.parsed_search_kwargs().get("gumbel_scale", 1.0) == 0.0)


def _connect_four_positions():
    """The 1,024 Connect Four positions every tactics score here uses."""
    return tactical_positions("connect_four", 1024, jax.random.key(20_000))


def _fmt_tactics(row: dict) -> str:
    t = row.get("tactics")
    if t is None:
        return ""
    text = (f" | wins taken {t['wins_taken']:.2f} blocks {t['blocks_made']:.2f}"
            f" (random {t['random_blocks']:.2f})")
    games = row.get("in_games")
    if games is not None:
        share = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        lost, mine, theirs = games["losses"], games["agent"], games["opponent"]
        text += (f" | in games blocks {share(mine['blocks_made'])} of {mine['must_block']}"
                 f" (opponent {share(theirs['blocks_made'])} of {theirs['must_block']}),"
                 f" losses from missed blocks "
                 f"{share(lost['missed_block'])}, missed wins {share(lost['missed_win'])}, "
                 f"none {share(lost['no_error'])}")
    return text


def _fmt(rates: dict) -> str:
    return "/".join(f"{rates[k]:.2f}" for k in ("win", "draw", "loss"))


def tactics_report(source: str, simulations: list[int]) -> list[dict]:
    """Tactics of a trained run (`muzero-jax train --logdir`) or of `mcts:N`.

    On the positions `run` scores Connect Four agents on; one row per
    simulation count (the agent's) or one row (the MCTS opponent's own).
    """
    from muzero_jax import load_agent
    from muzero_jax.arena import make_opponent
    from muzero_jax.envs import make_env
    from muzero_jax.envs.base import make_timestep
    from muzero_jax.envs.pgx import PgxState

    positions = _connect_four_positions()
    if source.startswith("mcts"):
        opponent = jax.jit(make_opponent(source, make_env("connect_four")))
        g = positions.game
        state = (PgxState(game=g, first_player=g.current_player), g.terminated, None)
        ts = make_timestep(g.observation, reward=jnp.zeros(g.terminated.shape),
                           first=jnp.zeros(g.terminated.shape, bool),
                           terminated=g.terminated, truncated=g.truncated,
                           legal_action_mask=g.legal_action_mask,
                           to_play=jnp.zeros(g.terminated.shape, jnp.int32))
        rows = [{"player": source, **tactics_score(
            lambda obs, mask: opponent(state, ts, jax.random.key(0)), positions)}]
    else:
        agent = load_agent(source)
        rows = [{"player": f"{source} step {agent.step}", "simulations": n,
                 **tactics_score(lambda obs, mask, n=n: agent.act(obs, mask, num_simulations=n),
                                 positions)} for n in simulations]
    for row in rows:
        print(json.dumps(row))
    return rows


def model_knowledge(networks, params, reward_support, positions, value_support=None) -> dict:
    """What a learned model knows one and two plies deep, without search.

    On Connect Four's tactics positions: the dynamics' reward for every legal
    move from the represented position, and for every reply after each move.

    Returns:
      `reward_picks_win`: in positions with an immediate win, the share where
      the move with the highest predicted reward wins; `reward_on_wins` /
      `reward_on_others`: the mean predicted reward of winning moves / of the
      other legal moves there; `reply_reward_after_losing` /
      `reply_reward_after_safe`: in must-block positions, the mean over moves
      of the best predicted reward of the opponent's reply, after moves that
      let the opponent win at once / after the others; `reply_picks_block`:
      the share of must-block positions where the move with the lowest such
      reward is safe. With `value_support`, also `value_after_losing` /
      `value_after_safe`: in must-block positions, the mean value the
      prediction gives the hidden state after a move (for the player to
      reply there) after moves that let that player win at once / after the
      others; and `value_picks_block`: the share of must-block positions where
      the move with the lowest such value is safe (what the threat-value loss,
      `threat_value_loss_weight`, trains).
    """
    @jax.jit
    def predict(obs):
        after, reward = every_move_step(networks, params, reward_support,
                                        networks.representation(params, obs))
        _, reply = every_move_step(networks, params, reward_support, after)  # [N * A, A]
        if value_support is None:
            value = jnp.zeros_like(reward)
        else:
            value = value_support.logits_to_scalar(
                networks.prediction(params, after)[1]).reshape(reward.shape)
        return reward, reply.max(axis=-1).reshape(reward.shape), value

    reward, reply, value = (np.asarray(x) for x in predict(positions.observation))
    legal, wins, loses = (np.asarray(x) for x in (positions.legal_action_mask, positions.wins,
                                                  positions.loses))
    has_win, block = np.asarray(positions.has_win), np.asarray(positions.must_block)
    rows = np.arange(reward.shape[0])
    best = np.argmax(np.where(legal, reward, -np.inf), axis=1)
    safest = np.argmin(np.where(legal, reply, np.inf), axis=1)
    in_block = block[:, None] & legal
    out = {
        "reward_picks_win": float(wins[rows, best][has_win].mean()),
        "reward_on_wins": float(reward[wins & has_win[:, None]].mean()),
        "reward_on_others": float(reward[legal & ~wins & has_win[:, None]].mean()),
        "reply_reward_after_losing": float(reply[in_block & loses].mean()),
        "reply_reward_after_safe": float(reply[in_block & ~loses].mean()),
        "reply_picks_block": float((legal & ~loses)[rows, safest][block].mean()),
    }
    if value_support is not None:
        calmest = np.argmin(np.where(legal, value, np.inf), axis=1)
        out.update(value_after_losing=float(value[in_block & loses].mean()),
                   value_after_safe=float(value[in_block & ~loses].mean()),
                   value_picks_block=float((legal & ~loses)[rows, calmest][block].mean()))
    return out


_RANDOM_MOVES_SEED = 30_000  # model_drift and decoder_report play the same random moves


def _random_legal_moves(rng_key, legal_action_mask):
    """One uniformly random legal move per row of `legal_action_mask` [B, A] (int32)."""
    keys = jax.random.split(rng_key, legal_action_mask.shape[0])
    return jax.vmap(lambda k, m: jax.random.categorical(k, jnp.where(m, 0.0, -jnp.inf)))(
        keys, legal_action_mask).astype(jnp.int32)


def model_drift(networks, params, value_support, positions, *, depth: int = 3,
                rng_key=None) -> dict:
    """How far the learned model's values drift from the real game's.

    From each of the tactics positions, `depth` uniformly random legal moves
    are played both on the real game (pgx) and in the learned model (the
    dynamics from the represented position). After each move k, the value the
    prediction gives the model's hidden state is compared with the value it
    gives the representation of the real position reached, both for the
    player to move there; positions whose game has ended by then are left
    out. This is what a search in the learned model relies on: on the real
    positions the same network plans well (`muzero-jax eval --model env`).

    Returns:
      for k = 1..depth, `value_gap_k` (mean absolute difference),
      `value_corr_k` (their correlation) and `value_rows_k` (positions still
      in play), and `real_value_size_k` (mean |value| on the real positions).
    """
    from muzero_jax.envs.pgx import pgx_game

    game = pgx_game("connect_four")
    if rng_key is None:
        rng_key = jax.random.key(_RANDOM_MOVES_SEED)

    @jax.jit
    def run(observation, games, key):
        hidden = networks.representation(params, observation)
        alive = jnp.ones(observation.shape[:1], bool)
        rows = []
        for k in jax.random.split(key, depth):
            move = _random_legal_moves(k, games.legal_action_mask)
            hidden, _ = networks.dynamics(params, hidden, move)
            games = jax.vmap(game.step)(games, move)
            alive = alive & ~games.terminated & ~games.truncated
            model = value_support.logits_to_scalar(networks.prediction(params, hidden)[1])
            real_hidden = networks.representation(params, games.observation.astype(jnp.float32))
            real = value_support.logits_to_scalar(networks.prediction(params, real_hidden)[1])
            rows.append((model, real, alive))
        return rows

    out = {}
    for k, (model, real, alive) in enumerate(run(positions.observation, positions.game,
                                                  rng_key), start=1):
        alive = np.asarray(alive)
        model, real = np.asarray(model)[alive], np.asarray(real)[alive]
        out[f"value_gap_{k}"] = float(np.abs(model - real).mean())
        out[f"value_corr_{k}"] = float(np.corrcoef(model, real)[0, 1])
        out[f"value_rows_{k}"] = int(alive.sum())
        out[f"real_value_size_{k}"] = float(np.abs(real).mean())
    return out


def decoder_report(networks, params, value_support, positions, *, depth: int = 3,
                   rng_key=None) -> dict:
    """How well a run's decoder keeps the board, and what re-grounding buys.

    From each of the tactics positions, `depth` uniformly random legal moves
    are played on the real game and in two models: the learned model (the
    dynamics from the represented position, as `model_drift`) and the
    decoded model (`search.make_decoded_recurrent_fn`: after each move the
    next hidden state is decoded, rounded onto 0/1 and encoded again). After
    each move k (and at k = 0, the representation itself) the decoded board
    of each is compared with the real one, cell by cell, and the decoded
    model's value with the value of the real position's representation.
    Positions whose game has ended are left out.

    Returns:
      `board_exact_{latent,decoded}_k` (share of positions whose rounded
      decoded board is exactly the real one; k = 0..depth),
      `decoded_value_gap_k` and `decoded_value_corr_k` (k = 1..depth, as
      `model_drift`'s for the learned model).
    """
    from muzero_jax.envs.pgx import pgx_game

    game = pgx_game("connect_four")
    if rng_key is None:
        rng_key = jax.random.key(_RANDOM_MOVES_SEED)

    def value(hidden):
        return value_support.logits_to_scalar(networks.prediction(params, hidden)[1])

    def exact(hidden, real):
        board = networks.decoder(params, hidden) >= 0.5
        return jnp.all((board == (real > 0.5)).reshape(real.shape[0], -1), axis=-1)

    @jax.jit
    def run(observation, games, key):
        latent = regrounded = networks.representation(params, observation)
        alive = jnp.ones(observation.shape[:1], bool)
        rows = [(exact(latent, observation), exact(latent, observation), None, None, alive)]
        for k in jax.random.split(key, depth):
            move = _random_legal_moves(k, games.legal_action_mask)
            latent, _ = networks.dynamics(params, latent, move)
            nxt, _ = networks.dynamics(params, regrounded, move)
            decoded = (networks.decoder(params, nxt) >= 0.5).astype(jnp.float32)
            regrounded = networks.representation(params, decoded)
            games = jax.vmap(game.step)(games, move)
            alive = alive & ~games.terminated & ~games.truncated
            real_obs = games.observation.astype(jnp.float32)
            real = value(networks.representation(params, real_obs))
            rows.append((exact(latent, real_obs), exact(nxt, real_obs), value(regrounded), real,
                         alive))
        return rows

    out = {}
    for k, (latent_ok, decoded_ok, model, real, alive) in enumerate(
            run(positions.observation, positions.game, rng_key)):
        alive = np.asarray(alive)
        out[f"board_exact_latent_{k}"] = float(np.asarray(latent_ok)[alive].mean())
        out[f"board_exact_decoded_{k}"] = float(np.asarray(decoded_ok)[alive].mean())
        if k:
            model, real = np.asarray(model)[alive], np.asarray(real)[alive]
            out[f"decoded_value_gap_{k}"] = float(np.abs(model - real).mean())
            out[f"decoded_value_corr_{k}"] = float(np.corrcoef(model, real)[0, 1])
    return out


def self_play_knowledge(networks, params, reward_support, data, max_rows: int = 4096) -> dict:
    """`reward_picks_win` on the run's own self-play positions.

    `data`: replay rows (a `Trajectory` with leaves `[..., *]`) that carry the
    environment's every-move reward labels (`action_rewards`, stored when
    `action_reward_loss_weight` > 0). Scores the first `max_rows` rows where
    some move wins at once: the share where the highest predicted reward
    among legal moves is one of them; and the share of rows with such a win.
    """
    labels = np.asarray(data.action_rewards).reshape(-1, networks.num_actions)
    legal = np.asarray(data.legal_action_mask).reshape(labels.shape)
    # The observation shape: what follows the leading axes the labels have too.
    obs_shape = data.observation.shape[data.action_rewards.ndim - 1:]
    obs = np.asarray(data.observation).reshape((-1,) + obs_shape)
    has_win = (labels > 0).any(axis=1) & ~np.asarray(data.last).reshape(-1)
    rows = np.nonzero(has_win)[0][:max_rows]

    @jax.jit
    def predict(o):
        return every_move_step(networks, params, reward_support,
                               networks.representation(params, o))[1]

    reward = np.concatenate([np.asarray(predict(obs[rows[i:i + 512]]))
                             for i in range(0, len(rows), 512)])
    best = np.argmax(np.where(legal[rows], reward, -np.inf), axis=1)
    return {"self_play_rows": int(len(rows)), "self_play_win_share": float(has_win.mean()),
            "self_play_reward_picks_win": float((labels[rows, best] > 0).mean())}


def model_report(logdir: str) -> dict:
    """`model_knowledge` and `model_drift` of a Connect Four run's final agent,
    printed as JSON; with `self_play_knowledge` too when the run stored
    every-move labels."""
    from muzero_jax.checkpoint import Checkpointer, CheckpointError, find_checkpoint_dir
    from muzero_jax.config import config_from_dict
    from muzero_jax.learning import make_train

    directory, given_step = find_checkpoint_dir(logdir)
    checkpointer = Checkpointer(directory, create=False)
    try:
        meta, step = checkpointer.read_meta(given_step)
        trainer = make_train(config_from_dict(meta["config"]))
        labelled = trainer.config.action_reward_loss_weight > 0
        try:
            restored = checkpointer.restore(trainer, step, params_only=not labelled)
        except CheckpointError:
            if not labelled:
                raise
            # A replay saved by an older version: report what the parameters know.
            labelled = False
            restored = checkpointer.restore(trainer, step, params_only=True)
    finally:
        checkpointer.close()
    args = (trainer.networks, restored.params, trainer.reward_support)
    positions = _connect_four_positions()
    row = {"run": logdir, "step": step, **model_knowledge(
        *args, positions, value_support=trainer.value_support),
        **model_drift(trainer.networks, restored.params, trainer.value_support, positions)}
    if trainer.networks.decoder is not None:
        row.update(decoder_report(trainer.networks, restored.params, trainer.value_support,
                                  positions))
    if labelled:
        row.update(self_play_knowledge(*args, restored.state.replay.data))
    print(json.dumps(row))
    return row


def random_baseline(env: str, games: int) -> dict:
    """A random player against a random player, `games` per seat: the rates an
    agent must beat to be better than random (Go's komi favours the second)."""
    from muzero_jax.arena import outcome_rates, play_games, random_opponent
    from muzero_jax.envs import make_env

    seats = np.repeat(np.array([0, 1], np.int32), games)
    random_fn = jax.jit(random_opponent)
    results = play_games(random_fn, random_opponent, make_env(env), seats, jax.random.key(0))
    row = {"env": env, "player": "random", "opponent": "random", "games_per_seat": games,
           "as_first": outcome_rates(results[:games]), "as_second": outcome_rates(results[games:])}
    print(json.dumps(row))
    return row


def pass_report(logdir: str, simulations: int, games: int, *, no_pass_before: int = 0,
                search_kwargs: str | None = None) -> dict:
    """Go: how a trained run's agent passes, wins and loses against random, per seat.

    Plays `games` games per seat (the standard game, the agent searching with
    `simulations`); returns and prints the win rates, the share of the
    agent's moves that were passes (and that were passes with nothing else
    legal), the mean game length, the agent's mean
    search value on its first move, and for its wins and its losses apart:
    how many, their mean length, the agent's passes per game and both sides'
    final area (pgx's Tromp-Taylor count: stones plus the empty points they
    alone reach; komi 7.5 for white).

    Args:
      no_pass_before: when > 0, the agent itself does not pass before this
        ply unless nothing else is legal (as `min_plies_before_pass` in
        self-play); the game and random keep the standard rules.
      search_kwargs: the agent's search hyper-parameters (JSON; default: the
        run's), e.g. '{"gumbel_scale": 0.0}'.
    """
    from muzero_jax import load_agent
    from muzero_jax.arena import match_env, random_opponent
    from muzero_jax.envs.pgx import game_state, go_areas, mask_early_pass, reward_of_seat

    agent = load_agent(logdir, search_kwargs=search_kwargs)
    env = match_env(agent)
    pass_action = env.num_actions - 1
    seats = np.repeat(np.array([0, 1], np.int32), games)
    key = jax.random.key(1)
    state, ts = jax.jit(jax.vmap(env.reset))(jax.random.split(key, 2 * games))
    step, opponent = jax.jit(jax.vmap(env.step)), jax.jit(random_opponent)
    areas = jax.jit(jax.vmap(go_areas))
    early_pass = jax.jit(jax.vmap(lambda m, ply: mask_early_pass(m, ply, no_pass_before)))
    done, results = np.zeros(2 * games, bool), np.zeros(2 * games)
    passes, moves, length = np.zeros(2 * games), np.zeros(2 * games), np.zeros(2 * games)
    forced = np.zeros(2 * games)  # the agent's passes with nothing else legal
    area = np.zeros((2 * games, 2))  # [black, white] at the end
    first_value = np.full(2 * games, np.nan)
    for ply in range(env.max_episode_steps):
        key, k1, k2 = jax.random.split(key, 3)
        turn = np.asarray(ts.to_play) == seats
        mask = ts.legal_action_mask
        if no_pass_before:
            mask = early_pass(mask, jnp.full(2 * games, ply, jnp.int32))
        out = agent.search(ts.observation, mask, num_simulations=simulations, rng=k1)
        action = np.where(turn, np.asarray(out.action), np.asarray(opponent(state, ts, k2)))
        mine = turn & ~done
        first_value = np.where(mine & np.isnan(first_value), np.asarray(out.value), first_value)
        passes += mine & (action == pass_action)
        forced += mine & ~np.asarray(ts.legal_action_mask)[:, :-1].any(-1)
        moves += mine
        length += ~done
        state, ts = step(state, jnp.asarray(action, jnp.int32))
        finished = np.asarray(ts.last) & ~done
        results = np.where(finished, np.asarray(reward_of_seat(ts, seats)), results)
        area = np.where(finished[:, None], np.asarray(areas(game_state(state).game)), area)
        done |= np.asarray(ts.last)
        if done.all():
            break
    row = {"run": logdir, "step": agent.step, "simulations": simulations, "games_per_seat": games,
           "no_pass_before": no_pass_before, "search_kwargs": agent.config.search_kwargs}
    own = np.where(seats == 0, area[:, 0], area[:, 1])  # the first player is black
    theirs = np.where(seats == 0, area[:, 1], area[:, 0])
    for seat, name in enumerate(("as_first", "as_second")):
        m = seats == seat
        row[name] = {"win": float(np.mean(results[m] > 0)),
                     "pass_share": float(passes[m].sum() / max(moves[m].sum(), 1)),
                     "forced_pass_share": float(forced[m].sum() / max(moves[m].sum(), 1)),
                     "mean_length": float(length[m].mean()),
                     "first_move_value": float(np.nanmean(first_value[m]))}
        for outcome, sel in (("wins", m & (results > 0)), ("losses", m & (results <= 0))):
            row[name][outcome] = None if not sel.any() else {
                "games": int(sel.sum()), "mean_length": float(length[sel].mean()),
                "agent_passes": float(passes[sel].mean()),
                "agent_area": float(own[sel].mean()), "opponent_area": float(theirs[sel].mean())}
    print(json.dumps(row))
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="tic_tac_toe", choices=sorted(OPPONENT))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=600.0,
                        help="training wall time, compile included, evaluations excluded")
    parser.add_argument("--eval-every", type=int, default=20, help="iterations")
    parser.add_argument("--eval-every-seconds", type=float, default=0.0,
                        help="evaluate each time the training wall time passes another "
                             "multiple of this instead (0: use --eval-every)")
    parser.add_argument("--eval-games", type=int, default=100, help="games per seat")
    parser.add_argument("--print-every-seconds", type=float, default=0.0,
                        help="also print the iteration, env steps and loss each time the "
                             "training wall time passes another multiple of this")
    parser.add_argument("--opponent", default=None, help="default: minimax / mcts / random")
    parser.add_argument("--set", default="{}", help="JSON config overrides")
    parser.add_argument("--out", default="experiments/results/board_games")
    parser.add_argument("--env-kwargs", default="{}",
                        help="JSON keyword arguments of the self-play environment, e.g. "
                             "'{\"min_plies_before_pass\": 81}' for Go (evaluations play "
                             "the standard game)")
    parser.add_argument("--cpu-devices", type=int, default=0, metavar="N",
                        help="on a CPU, split the host into N JAX devices and train "
                             "data-parallel over them, as `muzero-jax train --cpu-devices` "
                             "(0: JAX's default, one)")
    parser.add_argument("--logdir", default=None,
                        help="also save the final state here as a run directory "
                             "(for muzero-jax eval / play / load_agent)")
    parser.add_argument("--tactics-of", default=None,
                        help="only score tactics (Connect Four): a run directory of "
                             "`muzero-jax train`, or mcts / mcts:N")
    parser.add_argument("--simulations", default="128",
                        help="with --tactics-of a run: comma-separated simulation counts")
    parser.add_argument("--random-baseline", type=int, default=0, metavar="GAMES",
                        help="only play random against random, GAMES per seat, and print "
                             "the rates")
    parser.add_argument("--pass-report", default=None, metavar="RUN",
                        help="only play a Go run's agent (--logdir of this script or "
                             "muzero-jax train) against random, --eval-games per seat, "
                             "with the first of --simulations, and print how often it passes "
                             "and how its wins and losses end (lengths, areas)")
    parser.add_argument("--no-pass-before", type=int, default=0, metavar="PLY",
                        help="with --pass-report: the agent itself does not pass before this "
                             "ply (the game and random keep the standard rules)")
    parser.add_argument("--search-kwargs", default=None,
                        help="with --pass-report: the agent's search hyper-parameters (JSON), "
                             "e.g. '{\"gumbel_scale\": 0.0}'")
    parser.add_argument("--model-report", default=None, metavar="RUN",
                        help="only print what a Connect Four run's learned model knows "
                             "without search: how often its predicted rewards pick a "
                             "winning move, and a safe one where a block is needed, and "
                             "how far its values drift from the real game's 1-3 moves on")
    args = parser.parse_args(argv)
    if args.cpu_devices < 0:
        parser.error(f"--cpu-devices must be >= 0, got {args.cpu_devices}")
    if args.cpu_devices:  # before anything starts JAX's backends
        from muzero_jax.distributed import use_cpu_devices

        try:
            use_cpu_devices(args.cpu_devices)
        except ValueError as error:
            parser.error(str(error))
    if args.no_pass_before < 0:
        parser.error(f"--no-pass-before must be >= 0, got {args.no_pass_before}")
    if (args.no_pass_before or args.search_kwargs is not None) and not args.pass_report:
        parser.error("--no-pass-before and --search-kwargs go with --pass-report")
    if args.model_report:
        model_report(args.model_report)
        return
    if args.pass_report:
        pass_report(args.pass_report, int(args.simulations.split(",")[0]), args.eval_games,
                    no_pass_before=args.no_pass_before, search_kwargs=args.search_kwargs)
        return
    if args.random_baseline:
        random_baseline(args.env, args.random_baseline)
        return
    if args.tactics_of:
        tactics_report(args.tactics_of, [int(n) for n in args.simulations.split(",")])
        return
    overrides = json.loads(args.set)
    result = run(args.env, seed=args.seed, max_seconds=args.max_seconds,
                 eval_every=args.eval_every, eval_games=args.eval_games,
                 opponent=args.opponent or OPPONENT[args.env], overrides=overrides,
                 logdir=args.logdir, env_kwargs=json.loads(args.env_kwargs),
                 eval_every_seconds=args.eval_every_seconds,
                 print_every_seconds=args.print_every_seconds, cpu_devices=args.cpu_devices)
    if args.print_every_seconds > 0:
        result["command"] += f" --print-every-seconds {args.print_every_seconds:g}"
    if args.opponent:
        result["command"] += f" --opponent {args.opponent}"
    if args.cpu_devices:
        result["command"] += f" --cpu-devices {args.cpu_devices}"
    if overrides:
        result["command"] += f" --set '{args.set}'"
    if json.loads(args.env_kwargs):
        result["command"] += f" --env-kwargs '{args.env_kwargs}'"
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.env}_seed{args.seed}.json")
    write_text_atomically(path, json.dumps(result, indent=1))
    print(f"target met at: {result['target_met_at']}; wrote {path}")


if __name__ == "__main__":
    main()
