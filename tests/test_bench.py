"""`muzero-jax bench`: the commands run, count the right work and write their JSON."""

import json

import pytest

from muzero_jax import cli
from muzero_jax.bench import cli as bench


def test_unroll_rows_and_json(tmp_path, capsys):
    out = tmp_path / "unroll.json"
    code = cli.main(["bench", "unroll", "--network", "mlp", "--unroll-steps", "2",
                     "--batch-sizes", "8", "--repeats", "2", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["machine"]["jax"] and data["machine"]["device"]
    (row,) = data["rows"]
    assert (row["network"], row["unroll_steps"], row["batch_size"], row["repeats"]) == (
        "mlp", 2, 8, 2)
    # A sample is one sequence in the batch: samples/s = batch / median step time.
    assert row["samples_per_s"] == pytest.approx(8 / row["step_median_s"])
    assert row["samples_per_s_min"] <= row["samples_per_s"] <= row["samples_per_s_max"]
    assert row["flops_per_step"] > 0 and row["num_params"] > 0
    assert "samples_per_s" in capsys.readouterr().out


def test_e2e_counts_environment_steps(tmp_path):
    out = tmp_path / "e2e.json"
    tiny = dict(num_envs=8, rollout_length=4, batch_size=8, replay_ratio=1 / 32,
                num_simulations=4, replay_capacity=40, min_replay_steps=16)
    code = bench.main(["e2e", "--envs", "catch", "--iterations", "2", "--set", json.dumps(tiny),
                       "--json", str(out), "--solve-seeds", "3", "--max-seconds", "0.5"])
    assert code == 0
    row, solve = json.loads(out.read_text())["rows"]
    # The time-to-threshold row: seed 3, stopped by the budget after one
    # iteration (which compiles), before the two evaluations "solved" needs
    # and before learning starts (16 rows per environment).
    assert solve["kind"] == "time_to_threshold" and solve["seed"] == 3
    assert solve["threshold"] == 0.95 and not solve["solved"]
    assert solve["env_steps"] == 32 and solve["updates"] == 0
    # 8 envs x 4 steps per iteration; 1 update of batch 8 per iteration.
    assert row["env_steps_per_s"] == pytest.approx(32 / row["iteration_median_s"])
    assert row["learner_samples_per_s"] == pytest.approx(row["env_steps_per_s"] * 8 / 32)
    assert row["num_devices"] == 1 and row["updates_per_iteration"] == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["unroll", "--network", "transformer"], "--network must list"),
        (["unroll", "--batch-sizes", "0"], "positive integers"),
        (["e2e", "--envs", "pong"], "unknown environment"),
        (["e2e", "--set", "[1]"], "JSON object"),
        (["e2e", "--set", '{"warp": 1}'], "unknown config field"),
        (["e2e", "--set", '{"num_envs": -1}'], "num_envs"),
        (["nonsense"], "invalid choice"),
        (["e2e", "--num-devices", "64"], "JAX sees"),
        (["e2e", "--solve-seeds", "x"], "seeds >= 0"),
        (["e2e", "--max-seconds", "0"], "--max-seconds must be > 0"),
        (["search", "--actions", "x"], None),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv, message, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    if message is not None:
        assert len(err) == 1 and message in err[0], err
