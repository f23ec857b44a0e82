"""experiments/board_games.py: its --logdir is a run directory the CLI and load_agent take."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    # `experiments` is a directory of the repository, importable from its root.
    monkeypatch.syspath_prepend(str(REPO))


def test_logdir_holds_the_final_state_for_load_agent(tmp_path):
    from experiments.board_games import run
    from muzero_jax import load_agent
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset

    overrides = {"num_envs": 4, "rollout_length": 5, "batch_size": 4, "replay_capacity": 20,
                 "min_replay_steps": 2}
    # No training time: the final state is the seed's initial state.
    result = run("tic_tac_toe", seed=3, max_seconds=0.0, eval_every=1, eval_games=2,
                 opponent="random", overrides=overrides, logdir=str(tmp_path))
    assert result["evaluations"] == []
    config = preset("tic_tac_toe", seed=3, **overrides)
    expected = make_train(config).init(jax.random.key(3)).params

    agent = load_agent(tmp_path)
    assert agent.config == config
    assert json.loads((tmp_path / "config.json").read_text())["seed"] == 3
    for got, want in zip(jax.tree.leaves(agent.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
