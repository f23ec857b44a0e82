"""`muzero-jax play` with a scripted stdin and a stand-in agent."""

from __future__ import annotations

import io
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pytest

import muzero_jax
from muzero_jax import play
from muzero_jax.envs import make_env


class Output(NamedTuple):
    action: jnp.ndarray
    value: jnp.ndarray
    policy: jnp.ndarray


class LowestLegal:
    """Plays the lowest-numbered legal move; reports a search value of +0.25."""

    def __init__(self, env_name):
        self.env = make_env(env_name)
        self.calls = 0

    def search(self, observation, legal_action_mask=None, *, num_simulations=None, rng=None):
        self.calls += 1
        mask = np.asarray(legal_action_mask)
        action = jnp.asarray(np.argmax(mask, axis=-1))
        return Output(action, jnp.full(action.shape, 0.25), jnp.asarray(mask, jnp.float32))


@pytest.fixture
def agent(monkeypatch):
    made = {}

    def load(logdir, step=None):
        if logdir == "missing":
            raise FileNotFoundError("no checkpoint")
        if step == 7:
            raise ValueError("no checkpoint step 7 in x/checkpoints (saved steps: 2, 4)")
        made["agent"] = LowestLegal(logdir)
        made["step"] = step
        return made["agent"]

    monkeypatch.setattr(muzero_jax, "load_agent", load, raising=False)
    return made


def run(argv, lines):
    out = io.StringIO()
    code = play.main(argv, stdin=io.StringIO("".join(f"{x}\n" for x in lines)), stdout=out)
    return code, out.getvalue()


def test_human_wins_tic_tac_toe_and_bad_moves_are_refused(agent):
    # You (X): 4; agent: 0; "4" again (taken), "x", "9" refused; you: 8; agent: 1;
    # you: 2; agent: 3; you: 6 completes 2-4-6.
    code, text = run(["--logdir", "tic_tac_toe"], [4, 4, "x", 9, 8, 2, 6])
    assert code == 0
    assert "illegal move 4: choose one of 1, 2, 3, 5, 6, 7, 8" in text
    assert "'x' is not a move number" in text
    assert "illegal move 9" in text
    assert text.count("(search value") == 3
    assert "agent plays 0 (search value +0.25 for the agent)" in text
    assert text.rstrip().endswith("you win")
    # The opening board shows every move number; the final one the marks.
    assert " 0 | 1 | 2\n---+---+---\n 3 | 4 | 5\n---+---+---\n 6 | 7 | 8" in text
    assert " O | O | X\n---+---+---\n O | X | 5\n---+---+---\n X | 7 | X" in text


def test_agent_first_wins_connect_four_and_quit(agent):
    # Agent (X) always plays column 0; you play 1: it stacks four in column 0.
    code, text = run(["play", "--logdir", "connect_four", "--second"], [1, 1, 1])
    assert code == 0 and text.rstrip().endswith("the agent wins")
    assert "0 1 2 3 4 5 6" in text
    code, text = run(["--logdir", "connect_four"], ["q"])
    assert code == 0 and "game abandoned" in text and agent["agent"].calls == 0
    code, text = run(["--logdir", "connect_four"], [])  # end of input
    assert code == 0 and "game abandoned" in text and agent["step"] is None
    code, text = run(["--logdir", "connect_four", "--step", "4"], ["q"])
    assert code == 0 and agent["step"] == 4


def test_bad_input_exits_2_with_one_line(agent, capsys):
    assert play.main(["--logdir", "missing"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot load an agent from missing" in err
    assert play.main(["--logdir", "catch"]) == 2
    assert "not a two-player game" in capsys.readouterr().err
    assert play.main([]) == 2
    assert "--logdir" in capsys.readouterr().err
    assert play.main(["--logdir", "connect_four", "--step", "7"]) == 2
    assert "(saved steps: 2, 4)" in capsys.readouterr().err
    assert play.main(["--logdir", "connect_four", "--step", "-1"]) == 2
    assert "--step must be >= 0" in capsys.readouterr().err


def test_render_go_shows_move_numbers_and_pass():
    board = np.zeros((9, 9, 17), np.float32)
    board[0, 0, 0] = 1  # the mover's stone at 0
    text = play.render("go_9x9", board, 1)  # mover is O
    assert text.splitlines()[0].startswith("  O  1  2")
    assert "80" in text and text.endswith("pass: 81")
