"""The `muzero-jax` command line: exit codes, one-line errors, run files."""

import json
import os
import subprocess
import sys

import pytest

from muzero_jax.cli import main


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--env", "nope"], "invalid choice: 'nope'"),
        (["train", "--env", "catch", "--num-envs", "0"], "num_envs must be > 0"),
        (["train", "--env", "catch", "--search", "no_such_mod:fn"], "does not import"),
        (["train", "--env", "catch", "--search", "nope"], "unknown search 'nope'"),
        (["train", "--env", "catch", "--bogus", "1"], "unrecognized arguments"),
        (["train", "--env", "catch", "--num-envs", "63"], "whole number"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"env_steps": 1}\n')
    assert main(["train", "--env", "catch", "--logdir", str(tmp_path)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == '{"env_steps": 1}\n'


def test_train_writes_config_and_metrics(tmp_path):
    logdir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "muzero_jax.cli", "train", "--env", "catch",
        "--logdir", str(logdir), "--max-env-steps", "640", "--num-envs", "16",
        "--rollout-length", "10", "--batch-size", "16", "--replay-ratio", "0.00625",
        "--num-simulations", "4", "--mlp.hidden-sizes", "16", "--mlp.latent-size", "8",
        "--mlp.head-hidden-sizes", "8", "--eval-every", "2", "--eval-episodes", "4",
        "--replay-capacity", "40", "--min-replay-steps", "16", "--seed", "3",
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((logdir / "config.json").read_text())
    assert config["env"] == "catch" and config["seed"] == 3 and config["mlp"]["latent_size"] == 8
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in rows] == [160 * (i + 1) for i in range(4)]
    for key in ("env_steps", "wall_s", "updates", "episode_return", "sps", "loss",
                "value_loss", "reward_loss", "policy_loss"):
        assert key in rows[-1]
    assert "eval_return" in rows[1] and "eval_return" not in rows[0]
    assert rows[-1]["updates"] > 0
