"""`muzero-jax play --logdir DIR`: play a board game against a trained agent.

The board is drawn in the terminal with the move numbers in the free cells
(TicTacToe, Go) or under the columns (Connect Four); you type a move number.
Illegal or unreadable moves are refused with a message and asked for again.
After each of its moves the agent shows its search value: the root value of
its search, from its own point of view (+1: it expects to win, -1: to lose).
`q` or end of input quits.
"""

from __future__ import annotations

import argparse
import sys
import typing
from typing import Any, TextIO

import jax
import numpy as np

__all__ = ["main", "render"]

MARKS = ("X", "O")
"""Seat 0 (moves first) plays X, seat 1 plays O."""


class _UsageError(Exception):
    """Bad input: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise _UsageError(f"muzero-jax play: {message}")


def _cells(observation: np.ndarray, to_play: int) -> np.ndarray:
    """`[H, W]` array of "X", "O" or "" from a mover's-view observation."""
    mover, other = MARKS[to_play], MARKS[1 - to_play]
    mine, theirs = observation[..., 0] > 0.5, observation[..., 1] > 0.5
    return np.where(mine, mover, np.where(theirs, other, ""))


def render(env_name: str, observation: Any, to_play: int) -> str:
    """The board as text, with move numbers where a move can go.

    Args:
      env_name: `"tic_tac_toe"`, `"connect_four"` or `"go_9x9"`.
      observation: one pgx observation `[H, W, C]` (channel 0: the stones of
        the player to move, channel 1: the opponent's).
      to_play: seat of the player to move (0 plays X, 1 plays O).
    """
    cells = _cells(np.asarray(observation), int(to_play))
    rows, cols = cells.shape
    if env_name == "connect_four":
        lines = [" ".join(c or "." for c in row) for row in cells]
        lines.append(" ".join(str(c) for c in range(cols)))
        return "\n".join(lines)
    width = len(str(rows * cols - 1))
    lines = []
    for r in range(rows):
        items = [(c or str(r * cols + k)).rjust(width) for k, c in enumerate(cells[r])]
        sep = " | " if env_name == "tic_tac_toe" else " "
        lines.append(" " + sep.join(items))
        if env_name == "tic_tac_toe" and r < rows - 1:
            lines.append("---+---+---")
    if env_name.startswith("go_"):
        lines.append(f"pass: {rows * cols}")
    return "\n".join(lines)


def _load_agent(logdir: str, step: int | None = None):
    import muzero_jax

    loader = getattr(muzero_jax, "load_agent", None)
    if loader is None:
        from muzero_jax.agent import load_agent as loader
    try:
        return loader(logdir, step=step)
    except (OSError, ValueError) as e:
        raise _UsageError(f"muzero-jax play: cannot load an agent from {logdir}: {e}") from e


def _read_move(stdin: TextIO, out: TextIO, legal: np.ndarray) -> int | None:
    """A legal move number from the user, or None to quit (q or end of input)."""
    while True:
        out.write(f"your move ({MARKS_PROMPT}): ")
        out.flush()
        line = stdin.readline()
        if not line:
            out.write("\n")
            return None
        text = line.strip().lower()
        if text in ("q", "quit", "exit"):
            return None
        try:
            move = int(text)
        except ValueError:
            out.write(f"'{line.strip()}' is not a move number; type one of "
                      f"{_legal_list(legal)} (q quits)\n")
            continue
        if not 0 <= move < legal.shape[0] or not legal[move]:
            out.write(f"illegal move {move}: choose one of {_legal_list(legal)}\n")
            continue
        return move


MARKS_PROMPT = "a number, q to quit"


def _legal_list(legal: np.ndarray) -> str:
    return ", ".join(str(a) for a in np.flatnonzero(legal))


def main(argv: list[str] | None = None, *, stdin: TextIO | None = None,
         stdout: TextIO | None = None) -> int:
    """Plays one game against the agent in `--logdir`; returns the exit code.

    Args:
      argv: the arguments after `muzero-jax play` (a leading "play" is ignored).
      stdin: where moves are read from (default `sys.stdin`).
      stdout: where the board is written (default `sys.stdout`).
    """
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["play"]:
        argv = argv[1:]
    parser = _Parser(prog="muzero-jax play", description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", required=True, help="a training run's directory")
    side = parser.add_mutually_exclusive_group()
    side.add_argument("--first", dest="human_seat", action="store_const", const=0,
                      help="you move first (X; the default)")
    side.add_argument("--second", dest="human_seat", action="store_const", const=1,
                      help="the agent moves first")
    parser.add_argument("--num-simulations", type=int, default=None,
                        help="the agent's simulations per move (default: the run's)")
    parser.add_argument("--step", type=int, default=None,
                        help="the checkpoint step (iteration) to play (default: the latest)")
    parser.add_argument("--seed", type=int, default=0)
    try:
        args = parser.parse_args(argv)
        if args.num_simulations is not None and args.num_simulations < 1:
            raise _UsageError("muzero-jax play: --num-simulations must be >= 1")
        if args.step is not None and args.step < 0:
            raise _UsageError("muzero-jax play: --step must be >= 0")
        agent = _load_agent(args.logdir, args.step)
        from muzero_jax.arena import match_env

        env = match_env(agent)
        if env.num_players != 2:
            raise _UsageError(f"muzero-jax play: {env.name!r} is not a two-player game; "
                              "play needs a board game run (tic_tac_toe, connect_four, go_9x9)")
    except _UsageError as e:
        print(str(e).splitlines()[0], file=sys.stderr)
        return 2
    human = 0 if args.human_seat is None else args.human_seat
    rng = jax.random.key(args.seed)
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    rng, reset_key = jax.random.split(rng)
    state, ts = reset(reset_key)
    out.write(f"{env.name}: you play {MARKS[human]}, the agent plays {MARKS[1 - human]}\n")
    while True:
        to_play = int(ts.to_play)
        out.write(render(env.name, ts.observation, to_play) + "\n")
        legal = np.asarray(ts.legal_action_mask)
        if to_play == human:
            move = _read_move(stdin, out, legal)
            if move is None:
                out.write("game abandoned\n")
                return 0
        else:
            rng, key = jax.random.split(rng)
            result = agent.search(ts.observation[None], ts.legal_action_mask[None],
                                  num_simulations=args.num_simulations, rng=key)
            move = int(np.asarray(result.action)[0])
            value = float(np.asarray(result.value)[0])
            out.write(f"agent plays {move} (search value {value:+.2f} for the agent)\n")
        state, ts = step(state, move)
        if bool(ts.last):
            out.write(render(env.name, ts.observation, int(ts.to_play)) + "\n")
            reward = float(ts.reward)  # the reward of the move just made
            if reward == 0:
                out.write("draw\n")
            elif (reward > 0) == (to_play == human):
                out.write("you win\n")
            else:
                out.write("the agent wins\n")
            return 0


if __name__ == "__main__":
    sys.exit(main())
