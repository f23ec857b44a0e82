"""Checkpoints: exact resume, kill -9 mid-write, corrupt checkpoints, non-finite guard."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax import learning
from muzero_jax.checkpoint import Checkpointer, CheckpointError, latest_step
from muzero_jax.cli import main
from muzero_jax.learning import make_train
from muzero_jax.loss import unrolled_loss
from muzero_jax.networks import MLPConfig
from muzero_jax.presets import preset
from muzero_jax.train import NonFiniteError, train

TINY = dict(
    num_envs=8, rollout_length=4, batch_size=8, replay_ratio=1 / 32, num_simulations=4,
    replay_capacity=40, min_replay_steps=16, eval_every=2, eval_episodes=4,
    # layer_norm as in the Catch preset: the CLI's --mlp.* flags below update
    # the preset's network config, and a checkpoint must match the config.
    mlp=MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,), layer_norm=False),
)
_VOLATILE = ("wall_s", "sps")


def _rows(logdir):
    with open(os.path.join(logdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in _VOLATILE} for line in f]


def _leaves(tree):
    out = []
    for x in jax.tree.leaves(tree):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        out.append(np.asarray(x))
    return out


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory):
    """One run straight through, one stopped half-way and resumed (one trainer)."""
    config = preset("catch", seed=2, **TINY)
    trainer = make_train(config)
    root = tmp_path_factory.mktemp("resume")
    a, b = str(root / "a"), str(root / "b")
    # stop_at=-1 is reached by any two evaluations: evaluations at iterations 2
    # and 4 solve the run, so the resumed run (stopped at 3) stops at 4 only if
    # the evaluation at 2 was restored with the checkpoint.
    kw = dict(trainer=trainer, stop_threshold=-1.0, checkpoint_every=2)
    full = train(config, logdir=a, max_iterations=8, **kw)
    first = train(config, logdir=b, max_iterations=3, **kw)
    second = train(config, logdir=b, max_iterations=8, resume=True, **kw)
    return config, trainer, (a, full), (b, first, second)


def test_resume_is_exact(resumed_runs):
    config, trainer, (a, full), (b, first, second) = resumed_runs
    assert full.stop_reason == "solved" and full.solved_at["iteration"] == 4
    assert first.stop_reason == "max_iterations"
    assert second.stop_reason == "solved"
    rows_a, rows_b = _rows(a), _rows(b)
    assert [r["iteration"] for r in rows_a] == [1, 2, 3, 4]
    assert rows_a == rows_b  # losses, returns, evaluations, counters: all equal
    assert "eval_return" in rows_b[3] and rows_b[3]["updates"] > 0
    for x, y in zip(_leaves(full.state), _leaves(second.state)):
        np.testing.assert_array_equal(x, y)  # params, optimiser, replay, rng, envs
    # The last checkpoint restores to the final state, NamedTuples intact.
    restored = Checkpointer(os.path.join(b, "checkpoints")).restore(trainer)
    assert restored.step == 4 and restored.meta["eval_history"] == [
        rows_b[1]["eval_return"], rows_b[3]["eval_return"]]
    assert type(restored.state.opt_state) is type(full.state.opt_state)
    for x, y in zip(_leaves(full.state), _leaves(restored.state)):
        np.testing.assert_array_equal(x, y)


def test_run_directory_contents(resumed_runs):
    _, trainer, (a, _), (b, first, _) = resumed_runs
    names = os.listdir(a)
    assert {"config.json", "metrics.jsonl", "curve.png", "checkpoints",
            "environment.jsonl"} <= set(names)
    # One environment record per start: the resumed run's second names the
    # iteration it resumed from (the first run's last checkpoint) and this machine.
    import importlib.metadata
    import json

    with open(os.path.join(b, "environment.jsonl")) as f:
        records = [json.loads(line) for line in f]
    last = first.history[-1]["iteration"]
    assert [(r["iteration"], r["resumed"]) for r in records] == [(0, False), (last, True)]
    for r in records:
        assert r["packages"]["jax"] == jax.__version__
        assert r["packages"]["mctx"] == importlib.metadata.version("mctx")
        assert r["devices"]["count"] == trainer.mesh.devices.size
        assert r["devices"]["platform"] == jax.devices()[0].platform and r["cpu"]["model"]
    assert any(n.startswith("events.out.tfevents.") for n in names)
    assert sorted(os.listdir(os.path.join(a, "checkpoints"))) == ["2", "4"]
    # A step that was not kept is refused with the steps that were.
    with pytest.raises(CheckpointError, match=r"no checkpoint step 3 .*\(saved steps: 2, 4\)"):
        Checkpointer(os.path.join(a, "checkpoints")).restore(trainer, step=3)
    row = json.loads(open(os.path.join(a, "metrics.jsonl")).readline())
    for key in ("env_steps", "wall_s", "updates", "episode_return", "sps", "loss",
                "value_loss", "reward_loss", "policy_loss"):
        assert key in row
    assert "eval_return" not in row  # iteration 1 is not evaluated


def test_mismatched_and_corrupt_checkpoints(resumed_runs, tmp_path, capsys):
    config, trainer, _, (b, _, _) = resumed_runs
    other = make_train(preset("catch", seed=2, **dict(TINY, num_envs=16)))
    with pytest.raises(CheckpointError, match="different config"):
        Checkpointer(os.path.join(b, "checkpoints")).restore(other)
    run = str(tmp_path / "run")
    shutil.copytree(b, run)
    # A config.json edited behind the run's back: shapes no longer match.
    with open(os.path.join(run, "config.json")) as f:
        data = json.load(f)
    with open(os.path.join(run, "config.json"), "w") as f:
        json.dump(dict(data, num_envs=16), f)
    assert main(["train", "--resume", run, "--progress", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different config" in err[0]
    # Garbage in every array file of the latest step.
    with open(os.path.join(run, "config.json"), "w") as f:
        json.dump(data, f)
    step_dir = os.path.join(run, "checkpoints", "4", "params")
    for dirpath, _, files in os.walk(step_dir):
        for name in files:
            with open(os.path.join(dirpath, name), "wb") as f:
                f.write(b"\x00garbage")
    before = open(os.path.join(run, "metrics.jsonl")).read()
    assert main(["train", "--resume", run, "--progress", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoints/4" in err[0], err
    assert open(os.path.join(run, "metrics.jsonl")).read() == before  # nothing rewritten


def test_non_finite_guard_keeps_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    config = preset("catch", **dict(TINY, eval_every=0))

    def nan_loss(params, batch, **kw):
        loss, metrics = unrolled_loss(params, batch, **kw)
        return loss * jnp.nan, metrics

    # Learning starts once 16 rows per environment exist: iteration 16 / 4 = 4.
    real = learning.make_train
    monkeypatch.setattr(learning, "make_train", lambda c, **kw: real(c, loss_fn=nan_loss))
    logdir = str(tmp_path / "nan")
    argv = ["train", "--env", "catch", "--logdir", logdir, "--checkpoint-every", "1",
            "--progress", "none", "--num-envs", "8", "--rollout-length", "4",
            "--batch-size", "8", "--replay-ratio", "0.03125", "--num-simulations", "4",
            "--replay-capacity", "40", "--min-replay-steps", "16", "--eval-every", "0",
            "--eval-episodes", "4",
            "--mlp.hidden-sizes", "16", "--mlp.latent-size", "8", "--mlp.head-hidden-sizes", "8"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "non-finite loss or parameters at iteration 4" in err
    assert all(f"{k}=" in err for k in ("loss", "value_loss", "reward_loss", "policy_loss"))
    assert len(err.strip().splitlines()) == 1
    assert latest_step(os.path.join(logdir, "checkpoints")) == 3
    trainer = real(config)
    restored = Checkpointer(os.path.join(logdir, "checkpoints")).restore(trainer)
    assert all(np.isfinite(x).all() for x in _leaves(restored.params))
    assert [r["iteration"] for r in _rows(logdir)] == [1, 2, 3]  # no non-finite row
    # From Python the same guard raises NonFiniteError.
    with pytest.raises(NonFiniteError, match="iteration 4"):
        train(config, trainer=real(config, loss_fn=nan_loss), max_iterations=6)


_CHILD = textwrap.dedent(
    """
    import sys
    from muzero_jax.networks import MLPConfig
    from muzero_jax.presets import preset
    from muzero_jax.train import train
    # A large replay so that each checkpoint write takes a while.
    config = preset("catch", num_envs=8, rollout_length=4, batch_size=8,
                    replay_ratio=1 / 32, num_simulations=2, replay_capacity=100_000,
                    min_replay_steps=16, eval_every=0,
                    mlp=MLPConfig(hidden_sizes=(8,), latent_size=8, head_hidden_sizes=(8,)))
    train(config, logdir=sys.argv[1], checkpoint_every=1, max_iterations=200,
          keep_checkpoints=10)
    """
)


def test_kill_during_checkpoint_write_keeps_previous(tmp_path):
    logdir = str(tmp_path / "killed")
    ckpt = os.path.join(logdir, "checkpoints")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, logdir], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    partial = None
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
            complete = [n for n in names if n.isdigit()]
            in_flight = [n for n in names if not n.isdigit()]
            if complete and in_flight:  # a later checkpoint is being written now
                proc.send_signal(signal.SIGKILL)
                partial = in_flight[0]
                break
            time.sleep(0.002)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert partial is not None, proc.stderr.read().decode()[-2000:]
    assert proc.returncode == -signal.SIGKILL
    names = os.listdir(ckpt)
    assert partial in names  # the half-written step was left behind, unfinished
    step = latest_step(ckpt)
    assert step is not None and str(step) in names
    config = preset("catch", num_envs=8, rollout_length=4, batch_size=8, replay_ratio=1 / 32,
                    num_simulations=2, replay_capacity=100_000, min_replay_steps=16,
                    eval_every=0,
                    mlp=MLPConfig(hidden_sizes=(8,), latent_size=8, head_hidden_sizes=(8,)))
    restored = Checkpointer(ckpt).restore(make_train(config))
    assert restored.step == step
    assert int(jax.device_get(restored.state.counters.iterations)) == step


def test_checkpoint_from_before_new_config_fields_still_loads(resumed_runs, tmp_path,
                                                             monkeypatch):
    # A checkpoint whose saved config lacks fields added later (here the
    # exploration_plies, reward_loss_weight and conv-stem fields) restores against today's config,
    # where those fields hold their defaults; any real difference still fails.
    config, trainer, (a, _), _ = resumed_runs
    from muzero_jax import checkpoint as ckpt
    from muzero_jax.config import config_to_dict

    def old_config_to_dict(cfg):
        data = config_to_dict(cfg)
        data.pop("exploration_plies")
        data.pop("reward_loss_weight")
        for name in ("conv_channels", "conv_kernel", "conv_layers"):
            data["mlp"].pop(name)
        return data

    state = Checkpointer(os.path.join(a, "checkpoints")).restore(trainer).state
    directory = str(tmp_path / "old")
    monkeypatch.setattr(ckpt, "config_to_dict", old_config_to_dict)
    Checkpointer(directory).save(5, state, {}, config)
    monkeypatch.undo()
    restored = Checkpointer(directory).restore(trainer)
    for x, y in zip(_leaves(restored.state.params), _leaves(state.params)):
        np.testing.assert_array_equal(x, y)
    other = make_train(preset("catch", seed=2, **dict(TINY, exploration_plies=3)))
    with pytest.raises(CheckpointError, match="exploration_plies"):
        Checkpointer(directory).restore(other)


def test_checkpoint_from_before_new_replay_fields_still_resumes(resumed_runs, tmp_path):
    # Optional replay fields (`Trajectory.action_rewards`, `action_threats`)
    # are None when their option is off and stored as such; a checkpoint
    # written before a field existed has no entry for it at all. Here the
    # entries are taken out of a saved step's tree metadata, which is what
    # such a checkpoint holds: it restores, the fields come back None, and the
    # run goes on.
    config, trainer, (a, full), _ = resumed_runs
    directory = str(tmp_path / "old")
    shutil.copytree(os.path.join(a, "checkpoints"), directory)
    meta_file = os.path.join(directory, "4", "replay", "_METADATA")
    with open(meta_file) as f:
        meta = json.load(f)
    optional = ("action_rewards", "action_threats")
    dropped = [k for k in meta["tree_metadata"] if any(f"'{n}'" in k for n in optional)]
    assert len(dropped) == 2
    for k in dropped:
        del meta["tree_metadata"][k]
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    restored = Checkpointer(directory).restore(trainer)
    data = restored.state.replay.data
    assert type(data).__name__ == "Trajectory"
    assert data.action_rewards is None and data.action_threats is None
    for x, y in zip(_leaves(full.state), _leaves(restored.state)):
        np.testing.assert_array_equal(x, y)
    state, metrics = trainer.iteration(restored.state)
    assert bool(metrics.finite)
