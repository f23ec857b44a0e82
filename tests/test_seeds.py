"""Many seeds in one program: `--num-seeds S` equals S separate runs, one stream each."""

import json

import pytest

from muzero_jax import cli
from muzero_jax.learning import make_train
from muzero_jax.presets import preset
from muzero_jax.train import train

TINY = dict(
    num_envs=8, rollout_length=4, batch_size=8, replay_ratio=1 / 32, num_simulations=4,
    replay_capacity=40, min_replay_steps=16, eval_every=3, eval_episodes=4,
)
FLAGS = ["--num-envs", "8", "--rollout-length", "4", "--batch-size", "8",
         "--replay-ratio", "0.03125", "--num-simulations", "4", "--replay-capacity", "40",
         "--min-replay-steps", "16", "--eval-every", "3", "--eval-episodes", "4"]


def test_seeds_in_one_program_equal_separate_runs(tmp_path):
    logdir = tmp_path / "seeds"
    code = cli.main(["train", "--env", "catch", "--seed", "5", "--num-seeds", "2",
                     "--max-iterations", "6", "--logdir", str(logdir), *FLAGS])
    assert code == 0
    assert (logdir / "curve.png").stat().st_size > 0
    assert json.loads((logdir / "config.json").read_text())["seed"] == 5
    streams = {}
    for seed in (5, 6):
        rows = [json.loads(x) for x in (logdir / f"seed_{seed}" / "metrics.jsonl").read_text()
                .splitlines()]
        assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]
        assert all(r["seed"] == seed for r in rows)
        streams[seed] = rows
    # The two seeds are different runs...
    assert [r["loss"] for r in streams[5]] != [r["loss"] for r in streams[6]]
    # ... and each equals the separate run with that seed (to float rounding).
    trainer = make_train(preset("catch", **TINY))
    for seed in (5, 6):
        single = train(preset("catch", seed=seed, **TINY), trainer=trainer, max_iterations=6,
                       stop_threshold=None).history
        for a, b in zip(streams[seed], single):
            assert a["env_steps"] == b["env_steps"] and a["updates"] == b["updates"]
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
            assert a.get("eval_return") == b.get("eval_return")
            assert a["episode_return"] == b["episode_return"]
    assert sum("eval_return" in r for r in streams[5]) == 2


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-seeds", "0"], "--num-seeds must be >= 1"),
        (["--num-seeds", "2", "--resume", "nowhere"], None),
    ],
)
def test_bad_num_seeds(flags, message, capsys):
    assert cli.main(["train", "--env", "catch", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    if message:
        assert message in err[0], err


def test_make_train_checks_num_seeds_and_keys():
    with pytest.raises(ValueError, match="num_seeds must be an integer >= 1"):
        make_train(preset("catch", **TINY), num_seeds=0)
    # A trainer built for S seeds runs only through train_seeds(S), and back.
    from muzero_jax.train import train_seeds

    config = preset("catch", **TINY)
    three = make_train(config, num_seeds=3)
    assert three.num_seeds == 3 and make_train(config).num_seeds == 1
    with pytest.raises(ValueError, match="batches 3 seeds"):
        train(config, trainer=three, max_iterations=1)
    with pytest.raises(ValueError, match="made for num_seeds=3, not 2"):
        train_seeds(config, 2, trainer=three, max_iterations=1)
