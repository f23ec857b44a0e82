"""Connect Four probes of a trained run: does its learned model see the
opponent's winning replies, and does a search that looks for them win more?

Two probes, each on a run directory (`muzero-jax train --logdir RUN`), with
the run's evaluation settings (its `search_model`, `eval_weights` and
`eval_symmetry_ensemble`, as `muzero-jax eval` uses them):

`--reply-detection RUN`: on the 1,024 tactics positions of
`experiments/board_games.py` (random play, labelled on the real game), for
every legal move of the must-block positions, the model's step to the
position after the move (decoded to the board, rounded and encoded again in
the decoded model, as the search does), then its predicted reward for every
reply there. Prints, after the moves that let the opponent win at once
("losing") and after the others ("safe"): the mean best reply reward, the
share above 0.5, the value of the position after the move (for the player to
reply), and the share of decoded boards that equal the real one.

`--win-lookahead RUN`: `muzero-jax eval --opponent mcts` with one change to
the search: every node the search expands also gets the model's reward for
each move from it (one more dynamics call per move), and where one of them
is above `--threshold` the node's value becomes at least that reward. In
the pgx two-player games a positive reward for the mover comes only with a
winning move, after which nothing follows, so that reward is a lower bound
of the node's value for the player to move there: a move that lets the
opponent win at once is refuted on its first visit, whatever the prior of
the winning reply. The learned model's rewards only, no rule of the game.

    python experiments/connect_four_probes.py --reply-detection RUN
    python experiments/connect_four_probes.py --win-lookahead RUN --seed 1 \
        [--end-at-win] [--forced-loss]

With `--end-at-win`, a step whose own predicted reward is above the
threshold also ends the game in the search (discount 0 after it), so the
model's imaginings past a win cannot undo it. With `--forced-loss`, a node
where the player to move cannot win at once but every move leaves the
opponent a reply above the threshold (a double threat) is a loss, worth at
most minus the weakest of those replies (`A * A` more dynamics steps per
expansion).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def _search_networks(agent):
    """The networks the agent's search evaluates (the ensemble when it uses one)."""
    from muzero_jax.symmetries import ensemble_networks

    networks = agent.trainer.networks
    if agent.symmetry_ensemble:
        networks = ensemble_networks(networks, agent.env.symmetries)
    return networks


def _best_move_reward(networks, params, reward_support, hidden):
    """`[B]`: the model's highest reward over the moves from hidden states `[B, ...]`."""
    from muzero_jax.search import every_move_step

    return every_move_step(networks, params, reward_support, hidden)[1].max(axis=1)


def win_lookahead_eval(logdir: str, *, episodes: int, seed: int, threshold: float,
                       opponent: str = "mcts", end_at_win: bool = False,
                       forced_loss: bool = False) -> dict:
    from muzero_jax import load_agent
    from muzero_jax.arena import evaluate_against
    from muzero_jax.search import with_win_lookahead

    agent = load_agent(logdir, win_lookahead=False)
    if agent.model == "env":
        raise ValueError("the win lookahead is for a learned model; this run plans in the game")
    agent._recurrent_fn = with_win_lookahead(
        agent._recurrent_fn, _search_networks(agent), agent.trainer.reward_support,
        threshold=threshold, end_at_win=end_at_win, forced_loss=forced_loss)
    stats = evaluate_against(agent, opponent, num_games=episodes, rng_key=jax.random.key(seed),
                             tactics=True)
    row = {"run": logdir, "step": agent.step, "seed": seed, "threshold": threshold,
           "end_at_win": end_at_win, "forced_loss": forced_loss, "model": agent.model,
           "weights": agent.weights, "symmetry_ensemble": agent.symmetry_ensemble, **stats}
    print(json.dumps(row))
    return row


def reply_detection(logdir: str) -> dict:
    from experiments.board_games import _connect_four_positions
    from muzero_jax import load_agent
    from muzero_jax.envs.pgx import pgx_game

    agent = load_agent(logdir, win_lookahead=False)  # the plain model
    if agent.model == "env":
        raise ValueError("reply detection probes a learned model; this run plans in the game")
    networks, params = _search_networks(agent), agent.params
    reward_support = agent.trainer.reward_support
    num_actions = agent.env.num_actions
    decoded_model = agent.model == "decoded"
    positions = _connect_four_positions()

    @jax.jit
    def after_every_move(observation):
        root = networks.representation(params, observation)

        def after(action):
            actions = jnp.full((observation.shape[0],), action, jnp.int32)
            # The search's own step (re-grounded in the decoded board when the
            # run plans in the decoded model): the value and hidden state there.
            output, hidden = agent._recurrent_fn(params, None, actions, root)
            best = _best_move_reward(networks, params, reward_support, hidden)
            if not decoded_model:
                return best, output.value
            # The board that step decoded, for the exactness share (recurrent_fn
            # does not return it, so the dynamics run once more here).
            board = (networks.decoder(params, networks.dynamics(params, root, actions)[0])
                     >= 0.5).astype(jnp.float32)
            return best, output.value, board

        return jax.vmap(after)(jnp.arange(num_actions))  # leaves [A, B, ...]

    outputs = [np.swapaxes(np.asarray(x), 0, 1)
               for x in after_every_move(positions.observation)]
    best, value = outputs[:2]
    if decoded_model:  # only the decoded model's boards can be compared with the game's
        game = pgx_game("connect_four")
        real = np.asarray(jax.jit(jax.vmap(lambda g: jax.vmap(game.step, (None, 0))(
            g, jnp.arange(num_actions)).observation))(positions.game), np.float32)
        exact = (outputs[2].reshape(real.shape) == real).reshape(real.shape[:2] + (-1,)).all(-1)
    must_block = np.asarray(positions.must_block)[:, None]
    legal, loses = np.asarray(positions.legal_action_mask), np.asarray(positions.loses)
    row = {"run": logdir, "step": agent.step, "model": agent.model, "weights": agent.weights,
           "symmetry_ensemble": agent.symmetry_ensemble,
           "must_block_positions": int(must_block.sum())}
    for name, sel in (("losing", must_block & loses), ("safe", must_block & legal & ~loses)):
        row[f"moves_{name}"] = int(sel.sum())
        row[f"best_reply_reward_after_{name}"] = float(best[sel].mean())
        row[f"reply_reward_above_half_after_{name}"] = float((best[sel] > 0.5).mean())
        row[f"value_after_{name}"] = float(value[sel].mean())
        if decoded_model:
            row[f"decoded_board_exact_after_{name}"] = float(exact[sel].mean())
    print(json.dumps(row))
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    probe = parser.add_mutually_exclusive_group(required=True)
    probe.add_argument("--reply-detection", metavar="RUN")
    probe.add_argument("--win-lookahead", metavar="RUN")
    parser.add_argument("--episodes", type=int, default=100, help="games per seat")
    parser.add_argument("--seed", type=int, default=1, help="seed of the evaluation games")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--opponent", default="mcts")
    parser.add_argument("--end-at-win", action="store_true",
                        help="with --win-lookahead: a step predicted to win ends the game "
                             "in the search (discount 0 after it)")
    parser.add_argument("--forced-loss", action="store_true",
                        help="with --win-lookahead: a node where every move lets the "
                             "opponent win at once is a loss (a predicted double threat)")
    args = parser.parse_args(argv)
    if args.reply_detection:
        reply_detection(args.reply_detection)
    else:
        win_lookahead_eval(args.win_lookahead, episodes=args.episodes, seed=args.seed,
                           threshold=args.threshold, opponent=args.opponent,
                           end_at_win=args.end_at_win, forced_loss=args.forced_loss)


if __name__ == "__main__":
    main()
