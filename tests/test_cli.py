"""The `muzero-jax` command line: exit codes, one-line errors, help, run files, eval."""

import dataclasses
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from muzero_jax.cli import _box_message, main
from muzero_jax.config import Config

TINY_ARGS = [
    "--num-envs", "8", "--rollout-length", "4", "--batch-size", "8",
    "--replay-ratio", "0.03125", "--num-simulations", "4", "--replay-capacity", "40",
    "--min-replay-steps", "16", "--eval-every", "2", "--eval-episodes", "4",
    "--mlp.hidden-sizes", "16", "--mlp.latent-size", "8", "--mlp.head-hidden-sizes", "8",
]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--env", "nope"], "unknown environment 'nope'"),
        (["train"], "--env is required"),
        (["train", "--env", "catch", "--num-envs", "0"], "num_envs must be > 0"),
        (["train", "--env", "catch", "--num-envs", "-4"], "num_envs must be > 0"),
        (["train", "--env", "catch", "--max-seconds", "-1"], "--max-seconds must be > 0"),
        (["train", "--env", "catch", "--search", "no_such_mod:fn"], "does not import"),
        (["train", "--env", "catch", "--search", "nope"], "unknown search 'nope'"),
        (["train", "--env", "catch", "--bogus", "1"], "--bogus"),
        (["train", "--env", "catch", "--num-envs", "abc"], "(usage: --num-envs INT)"),
        (["train", "--env", "catch", "--temperature-schedule", "1.0"],
         "['1.0'] (usage: --temperature-schedule [FLOAT FLOAT [FLOAT FLOAT ...]])"),
        (["train", "--env", "catch", "--num-envs", "63"], "whole number"),
        (["train", "--resume", "/nonexistent/run"], "no run there"),
        (["eval", "--logdir", "/nonexistent/run"], "not a directory"),
        (["eval", "--logdir", ".", "--episodes", "-1"], "--episodes must be >= 1"),
        (["frobnicate"], "unknown command"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


UNICODE_BOX = """\
╭─ Value error ──────────────────────────────────╮
│ Error parsing --num-envs: invalid literal for  │
│ int() with base 10: 'abc'                      │
│ ────────────────────────────────────────────── │
│ Argument helptext:                             │
│     --num-envs INT                             │
│     environments stepped in parallel.          │
│ ────────────────────────────────────────────── │
│ For full helptext, see muzero-jax train --help │
╰────────────────────────────────────────────────╯
"""
ASCII_BOX = """\
 Value error
 ------------------------------------------------
  Error parsing --num-envs: invalid literal for
  int() with base 10: 'abc'
  ------------------------------------------------
  Argument helptext:
      --num-envs INT
      environments stepped in parallel.
  ------------------------------------------------
  For full helptext, see muzero-jax train --help
"""


UNRECOGNISED_BOX = """\
╭─ Unrecognized options ──────────────────╮
│ Unrecognized options: --no-such-flag, 1 │
│ ─────────────────────────────────────── │
│ For full helptext, run x --help         │
╰─────────────────────────────────────────╯
"""
NUM_ENVS_MESSAGE = ("Error parsing --num-envs: invalid literal for int() with base 10: 'abc'"
                    " (usage: --num-envs INT)")


@pytest.mark.parametrize("box,message", [
    (UNICODE_BOX, NUM_ENVS_MESSAGE),
    (ASCII_BOX, NUM_ENVS_MESSAGE),
    (UNRECOGNISED_BOX, "Unrecognized options: --no-such-flag, 1"),
], ids=["unicode", "ascii", "no-usage"])
def test_tyro_error_boxes_become_one_line_with_the_options_usage(box, message):
    assert _box_message(box) == message


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"env_steps": 1}\n')
    assert main(["train", "--env", "catch", "--logdir", str(tmp_path)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == '{"env_steps": 1}\n'


def test_unwritable_logdir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["train", "--env", "catch", "--logdir", str(blocker / "run")]) == 2
    assert "cannot write to --logdir" in capsys.readouterr().err


def test_help_lists_every_config_field_with_default(capsys):
    with pytest.raises(SystemExit) as e:
        from muzero_jax.cli import _parse_train

        _parse_train(["--env", "cartpole", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for field in dataclasses.fields(Config):
        if dataclasses.is_dataclass(field.type) or field.name in ("mlp", "resnet"):
            continue
        assert "--" + field.name.replace("_", "-") in out, field.name
    for flag in ("--mlp.hidden-sizes", "--resnet.channels", "--logdir", "--resume",
                 "--max-seconds", "--stop-at", "--overwrite"):
        assert flag in out
    # Defaults are cartpole's preset and come with the field's documentation.
    assert "(default: 0.99)" in out and "the environment discount gamma" in out
    assert "(default: 475.0)" in out


@pytest.mark.parametrize("argv", [["--help"], ["train", "--env", "catch", "--help"]])
def test_a_reader_gone_from_stdout_ends_quietly_with_141(argv):
    # `muzero-jax train --help | head`: the pipe's read end is closed before the
    # command starts, so every write to stdout fails with EPIPE.
    read_end, write_end = os.pipe()
    os.close(read_end)
    code = "import sys; from muzero_jax.cli import main; sys.exit(main(sys.argv[1:]))"
    try:
        proc = subprocess.run([sys.executable, "-c", code, *argv], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141


def test_bench_and_play_forward_their_argv(monkeypatch, capsys):
    seen = {}
    fake = types.ModuleType("muzero_jax.play")
    fake.main = lambda argv: seen.setdefault("argv", argv) and 7
    monkeypatch.setitem(sys.modules, "muzero_jax.play", fake)
    assert main(["play", "--logdir", "x", "--help"]) == 7
    assert seen["argv"] == ["--logdir", "x", "--help"]
    monkeypatch.setitem(sys.modules, "muzero_jax.bench.cli", None)  # import fails
    assert main(["bench", "unroll"]) == 1
    assert "not available" in capsys.readouterr().err


def test_train_then_eval_then_resume_checks(tmp_path, capsys):
    logdir = tmp_path / "run"
    argv = ["train", "--env", "catch", "--logdir", str(logdir), "--max-iterations", "4",
            "--seed", "3", "--stop-at", "None", "--progress", "lines", *TINY_ARGS,
            "--lr-warmup-updates", "0"]  # its one update moves the weights
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "eval" in out and "done (max_iterations)" in out
    config = json.loads((logdir / "config.json").read_text())
    assert config["env"] == "catch" and config["seed"] == 3 and config["mlp"]["latent_size"] == 8
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in rows] == [32 * (i + 1) for i in range(4)]
    for key in ("env_steps", "wall_s", "updates", "episode_return", "sps", "loss",
                "value_loss", "reward_loss", "policy_loss"):
        assert key in rows[-1]
    assert "eval_return" in rows[1] and "eval_return" not in rows[0]
    assert rows[-1]["updates"] == 1  # learning starts at iteration 4 (16 rows / 4)
    assert (logdir / "curve.png").stat().st_size > 0
    assert [p.name for p in (logdir / "checkpoints").iterdir()] == ["4"]

    assert main(["eval", "--logdir", str(logdir), "--episodes", "6",
                 "--num-simulations", "2"]) == 0
    out = capsys.readouterr().out
    result = json.loads((logdir / "eval.json").read_text())
    assert result["episodes"] == 6 and result["num_simulations"] == 2 and result["step"] == 4
    returns = result["returns"]
    assert len(returns) == 6 and set(returns) <= {-1.0, 1.0}  # one Catch episode each
    mean = sum(returns) / 6
    stderr = (sum((r - mean) ** 2 for r in returns) / 5) ** 0.5 / 6 ** 0.5
    assert result["mean"] == pytest.approx(mean) and result["stderr"] == pytest.approx(stderr)
    assert f"{mean:.4f}" in out
    # A game without board symmetries: one line, exit 2, eval.json untouched.
    assert main(["eval", "--logdir", str(logdir), "--symmetry-ensemble", "True"]) == 2
    err = capsys.readouterr().err
    assert "board symmetries" in err and len(err.strip().splitlines()) == 1
    assert json.loads((logdir / "eval.json").read_text()) == result

    # Resuming with a different config is refused before anything is touched.
    before = (logdir / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(logdir), "--num-simulations", "8"]) == 2
    err = capsys.readouterr().err
    assert "does not match" in err and "num_simulations" in err
    assert (logdir / "metrics.jsonl").read_text() == before
    # eval --opponent needs the board-games arena; unknown opponents are bad input.
    code = main(["eval", "--logdir", str(logdir), "--opponent", "no_such_opponent"])
    assert code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    # --tactics labels the moves of matches, so it needs --opponent.
    assert main(["eval", "--logdir", str(logdir), "--tactics"]) == 2
    err = capsys.readouterr().err
    assert "--tactics needs --opponent" in err and len(err.strip().splitlines()) == 1

    # Another search on the same network: PUCT's action weights are visit
    # counts over the simulations (Gumbel MuZero's, the run's, are a softmax).
    import jax

    from muzero_jax import load_agent

    kwargs = '{"dirichlet_fraction": 0.0}'
    assert config["search"] == "gumbel_muzero"
    assert main(["eval", "--logdir", str(logdir), "--episodes", "6", "--num-simulations", "8",
                 "--search", "puct", "--search-kwargs", kwargs]) == 0
    capsys.readouterr()
    result = json.loads((logdir / "eval.json").read_text())
    assert result["search"] == "puct" and json.loads(result["search_kwargs"]) == {
        "dirichlet_fraction": 0.0}
    puct = load_agent(logdir, search="puct", search_kwargs=kwargs)
    assert result["returns"] == [float(r) for r in puct.evaluate(6, jax.random.key(0),
                                                                  num_simulations=8)]
    obs = np.random.default_rng(0).random((5,) + puct.env.observation_shape, np.float32)
    for agent, counts in ((puct, True), (load_agent(logdir), False)):
        weights = np.asarray(agent.search(obs, num_simulations=8).policy) * 8
        assert np.allclose(weights, np.round(weights), atol=1e-4) == counts
    # The run's own search keeps its kwargs; bad ones are one clear error.
    assert load_agent(logdir, search="gumbel_muzero").config.search_kwargs == config[
        "search_kwargs"]
    for bad, message in ((["--search", "no_such_search"], "unknown search"),
                         (["--search-kwargs", "{not json"], "search_kwargs"),
                         (["--search", "puct", "--search-kwargs", '{"gumbel_scale": 1}'],
                          "gumbel_scale"),
                         (["--search-kwargs", '{"qtransform": {"value_scal": 0.2}}'],
                          "does not take ['value_scal']")):
        assert main(["eval", "--logdir", str(logdir), *bad]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert main(["eval", "--logdir", str(logdir), "--model", "oracle"]) == 2
    err = capsys.readouterr().err
    assert "--model must be one of learned, env, decoded" in err and len(
        err.strip().splitlines()) == 1
    # This run trained no decoder: the decoded model is refused in one line.
    assert main(["eval", "--logdir", str(logdir), "--model", "decoded"]) == 2
    err = capsys.readouterr().err
    assert "reconstruction_loss_weight > 0" in err and len(err.strip().splitlines()) == 1
    assert json.loads((logdir / "eval.json").read_text()) == result

    # The same network planning in the environment's own dynamics.
    assert main(["eval", "--logdir", str(logdir), "--episodes", "6", "--num-simulations", "8",
                 "--model", "env"]) == 0
    capsys.readouterr()
    result = json.loads((logdir / "eval.json").read_text())
    assert result["model"] == "env" and result["search"] == "gumbel_muzero"
    in_env = load_agent(logdir, model="env")
    assert result["returns"] == [float(r) for r in in_env.evaluate(6, jax.random.key(0),
                                                                    num_simulations=8)]
    with pytest.raises(ValueError, match="env_state"):
        in_env.search(obs, num_simulations=8)

    # --output: the results go to that file instead, and DIR/eval.json keeps
    # the last run's; a directory or a missing parent is one line, exit 2.
    out = tmp_path / "eval_seed1.json"
    assert main(["eval", "--logdir", str(logdir), "--episodes", "6", "--num-simulations", "8",
                 "--seed", "1", "--output", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert json.loads((logdir / "eval.json").read_text()) == result
    written = json.loads(out.read_text())
    assert written["seed"] == 1 and written["returns"] == [
        float(r) for r in load_agent(logdir).evaluate(6, jax.random.key(1), num_simulations=8)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_seed1.json", "run"]
    for bad, message in ((tmp_path, "is a directory"),
                         (tmp_path / "missing" / "e.json", "does not exist")):
        assert main(["eval", "--logdir", str(logdir), "--output", str(bad)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err

    # The target network's weights (`--weights target`): the checkpoint's
    # target_params, read independently from the full state, not the online ones.
    from muzero_jax.checkpoint import Checkpointer

    assert main(["eval", "--logdir", str(logdir), "--episodes", "6", "--num-simulations", "8",
                 "--weights", "target"]) == 0
    capsys.readouterr()
    result = json.loads((logdir / "eval.json").read_text())
    assert result["weights"] == "target" and result["model"] == "learned"
    target = load_agent(logdir, weights="target")
    online = load_agent(logdir)
    checkpointer = Checkpointer(logdir / "checkpoints", create=False)
    try:
        state = checkpointer.restore(online.trainer).state
    finally:
        checkpointer.close()
    for got, want in zip(jax.tree.leaves(target.params),
                         jax.tree.leaves(state.target_params)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # One update in 4 iterations: the target (copied every 100 updates) is still the
    # initial network, so the two differ.
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree.leaves(target.params), jax.tree.leaves(online.params)))
    assert result["returns"] == [float(r) for r in target.evaluate(6, jax.random.key(0),
                                                                    num_simulations=8)]
    assert main(["eval", "--logdir", str(logdir), "--weights", "ema"]) == 2
    err = capsys.readouterr().err
    assert "--weights must be one of online, target" in err and len(
        err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="weights must be one of"):
        load_agent(logdir, weights="ema")


def test_a_console_gone_while_training_and_evaluating_costs_no_results(
        tmp_path, monkeypatch, console):
    # `muzero-jax train ... | head -1`: the reader goes after the first line.
    logdir = tmp_path / "run"
    console.lines = 1
    monkeypatch.setattr(sys, "stdout", console)
    argv = ["train", "--env", "catch", "--logdir", str(logdir), "--max-iterations", "4",
            "--seed", "3", "--stop-at", "None", "--progress", "lines", *TINY_ARGS,
            "--lr-warmup-updates", "0"]
    assert main(argv) == 141
    assert console.text.startswith("muzero-jax: training catch") and console.text.count("\n") == 1
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert [p.name for p in (logdir / "checkpoints").iterdir()] == ["4"]
    # eval: its results reach eval.json before anything is shown.
    console.reader_gone = True
    assert main(["eval", "--logdir", str(logdir), "--episodes", "6",
                 "--num-simulations", "2"]) == 141
    result = json.loads((logdir / "eval.json").read_text())
    assert result["episodes"] == 6 and result["step"] == 4 and len(result["returns"]) == 6


def test_eval_defaults_to_the_runs_eval_weights(tmp_path, capsys):
    from muzero_jax import load_agent

    logdir = tmp_path / "run"
    assert main(["train", "--env", "catch", "--logdir", str(logdir), "--max-iterations", "4",
                 "--stop-at", "None", "--progress", "none", *TINY_ARGS,
                 "--lr-warmup-updates", "0", "--target-ema", "0.5",
                 "--eval-weights", "target"]) == 0
    assert main(["eval", "--logdir", str(logdir), "--episodes", "2",
                 "--num-simulations", "2"]) == 0
    capsys.readouterr()
    assert json.loads((logdir / "eval.json").read_text())["weights"] == "target"
    default, target = load_agent(logdir), load_agent(logdir, weights="target")
    online = load_agent(logdir, weights="online")
    assert default.weights == "target" and online.weights == "online"
    leaves = [jax_leaves(a.params) for a in (default, target, online)]
    assert all(np.array_equal(a, b) for a, b in zip(leaves[0], leaves[1]))
    assert not all(np.array_equal(a, b) for a, b in zip(leaves[0], leaves[2]))


def jax_leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_eval_ensemble_and_win_lookahead_default_to_the_runs_and_are_refused_where_unfit(
        tmp_path, capsys):
    """`train --eval-symmetry-ensemble --eval-win-lookahead` are stored with
    the run, so `eval` and `load_agent` average the networks over the board's
    symmetries and read the model's rewards as wins by default;
    `eval --symmetry-ensemble False` / `--win-lookahead False` turn them off,
    and planning in the game (`--model env`) leaves the lookahead out unless
    asked for it, which is refused. A game they do not fit gets one line,
    exit 2, before anything is compiled."""
    from muzero_jax import load_agent

    logdir = tmp_path / "ttt"
    assert main(["train", "--env", "tic_tac_toe", "--logdir", str(logdir), "--max-iterations",
                 "2", "--stop-at", "None", "--progress", "none", *TINY_ARGS,
                 "--eval-symmetry-ensemble", "--eval-win-lookahead"]) == 0
    base = ["eval", "--logdir", str(logdir), "--episodes", "2", "--num-simulations", "2"]

    def evaluated(*extra):
        assert main(base + list(extra)) == 0
        result = json.loads((logdir / "eval.json").read_text())
        return result["symmetry_ensemble"], result["win_lookahead"]

    assert evaluated() == (True, True)
    assert evaluated("--symmetry-ensemble", "False", "--win-lookahead", "False") == (False, False)
    assert not load_agent(logdir, model="env").win_lookahead  # the game's ends are exact
    agent = load_agent(logdir)
    assert agent.symmetry_ensemble and agent.win_lookahead
    agent = load_agent(logdir, symmetry_ensemble=False, win_lookahead=False)
    assert not agent.symmetry_ensemble and not agent.win_lookahead
    capsys.readouterr()
    before = (logdir / "eval.json").read_text()
    assert main(base + ["--model", "env", "--win-lookahead", "True"]) == 2
    err = capsys.readouterr().err
    assert "model='env'" in err and len(err.strip().splitlines()) == 1
    assert (logdir / "eval.json").read_text() == before
    # (`eval --symmetry-ensemble True` on a Catch run: test_train_then_eval_then_resume_checks.)
    for flag in ("--eval-symmetry-ensemble", "--eval-win-lookahead"):
        assert main(["train", "--env", "catch", "--logdir", str(tmp_path / "c2"), flag]) == 2
        err = capsys.readouterr().err
        name = flag[2:].replace("-", "_")
        assert f"{name} is set, but" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "c2" / "checkpoints").exists()


def test_train_act_symmetry_ensemble_is_refused_without_symmetries(tmp_path, capsys):
    """`train --act-symmetry-ensemble` on a game without board symmetries:
    one line, exit 2, and no run directory is left behind."""
    logdir = tmp_path / "catch"
    assert main(["train", "--env", "catch", "--logdir", str(logdir),
                 "--act-symmetry-ensemble"]) == 2
    err = capsys.readouterr().err
    assert "act_symmetry_ensemble is set, but" in err and len(err.strip().splitlines()) == 1
    assert not (logdir / "checkpoints").exists()


def test_cpu_devices_is_refused_once_jax_has_started(tmp_path, capsys):
    """In a process whose JAX backends already run, `--cpu-devices` cannot
    take effect: one line that says how, exit 2, nothing written."""
    import jax

    started = len(jax.devices("cpu"))  # starts the backends if no test did
    logdir = tmp_path / "run"
    assert main(["train", "--env", "catch", "--logdir", str(logdir),
                 "--cpu-devices", str(started + 1)]) == 2
    err = capsys.readouterr().err
    assert f"JAX has already started with {started} CPU device(s)" in err
    assert "jax_num_cpu_devices" in err and len(err.strip().splitlines()) == 1
    assert not logdir.exists()
    assert main(["train", "--env", "catch", "--cpu-devices", "-1"]) == 2
    assert "--cpu-devices must be >= 0" in capsys.readouterr().err


def test_cpu_devices_trains_on_that_many_devices_and_resume_starts_the_same_way(
        tmp_path, capsys):
    """`train --cpu-devices 2` (a fresh process: the flag must come before
    JAX starts) runs on two CPU devices, says so and records the flag in
    launch.json; `--resume` without the flag starts two devices again and
    continues. Told another count, the resume is refused with the count to
    use and the run left as it was; eval (parameters only) loads it anywhere."""
    import jax

    here = len(jax.devices())
    if here == 2:
        pytest.skip("this process already has two devices")
    logdir = tmp_path / "run"
    argv = ["train", "--env", "catch", "--logdir", str(logdir), "--max-iterations", "2",
            "--stop-at", "None", "--progress", "none", "--cpu-devices", "2", *TINY_ARGS,
            "--eval-every", "0"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "device_count" not in f)
    proc = subprocess.run([sys.executable, "-m", "muzero_jax.cli", *argv],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on 2 device(s)" in proc.stdout
    assert json.loads((logdir / "launch.json").read_text()) == {"cpu_devices": 2}
    from muzero_jax.checkpoint import Checkpointer

    meta, step = Checkpointer(logdir / "checkpoints", create=False).read_meta()
    assert step == 2 and meta["num_devices"] == 2
    before = (logdir / "metrics.jsonl").read_text()
    # Told JAX's default count (this process: `here`), the checkpoint refuses.
    assert main(["train", "--resume", str(logdir), "--max-iterations", "3",
                 "--cpu-devices", "0"]) == 2
    err = capsys.readouterr().err
    assert f"was written on 2 device(s) and this run has {here}" in err
    assert "--cpu-devices 2" in err and len(err.strip().splitlines()) == 1
    # Not told, it takes the run's 2, which this process (JAX running) cannot start.
    assert main(["train", "--resume", str(logdir), "--max-iterations", "3"]) == 2
    err = capsys.readouterr().err
    assert "--cpu-devices 2: JAX has already started" in err
    assert len(err.strip().splitlines()) == 1
    assert (logdir / "metrics.jsonl").read_text() == before
    assert main(["eval", "--logdir", str(logdir), "--episodes", "2",
                 "--num-simulations", "2"]) == 0
    assert json.loads((logdir / "eval.json").read_text())["step"] == 2
    # A fresh process resumes on the run's two devices without being told.
    proc = subprocess.run([sys.executable, "-m", "muzero_jax.cli", "train", "--resume",
                           str(logdir), "--max-iterations", "3", "--progress", "none"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming catch" in proc.stdout and "on 2 device(s)" in proc.stdout
    meta, step = Checkpointer(logdir / "checkpoints", create=False).read_meta()
    assert step == 3 and meta["num_devices"] == 2
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["iteration"] == 3


def test_resume_refuses_an_unreadable_launch_file(tmp_path, capsys):
    """A damaged launch.json is one clear error that names the way out,
    before anything starts, and the run is left as it was."""
    from muzero_jax.presets import preset
    from muzero_jax.train import config_json

    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "config.json").write_text(config_json(preset("catch")))
    for content, message in (("{", "unreadable launch.json"),
                             ('{"cpu_devices": -1}', "not an integer >= 0")):
        (logdir / "launch.json").write_text(content)
        assert main(["train", "--resume", str(logdir)]) == 2
        err = capsys.readouterr().err
        assert message in err and "--cpu-devices N" in err
        assert len(err.strip().splitlines()) == 1
        assert (logdir / "launch.json").read_text() == content
        # The way out it names: a given --cpu-devices does not read the file
        # (this run has no checkpoint, so that is the next error).
        assert main(["train", "--resume", str(logdir), "--cpu-devices", "0"]) == 2
        err = capsys.readouterr().err
        assert "no checkpoint in" in err and "launch.json" not in err
