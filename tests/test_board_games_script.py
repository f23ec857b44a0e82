"""experiments/board_games.py: its --logdir is a run directory the CLI and load_agent take."""

from __future__ import annotations

import json
import pathlib
from time import gmtime as time_gmtime
from time import strftime as time_strftime

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
    from muzero_jax.checkpoint import Checkpointer
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset

    overrides = {"num_envs": 4, "rollout_length": 5, "batch_size": 4, "replay_capacity": 20,
                 "min_replay_steps": 2}
    # No training time: the final state is the seed's initial state.
    result = run("tic_tac_toe", seed=3, max_seconds=0.0, eval_every=1, eval_games=2,
                 opponent="random", overrides=overrides, logdir=str(tmp_path))
    assert result["evaluations"] == []
    assert result["num_devices"] == len(jax.devices())
    meta, _ = Checkpointer(tmp_path / "checkpoints", create=False).read_meta()
    assert meta["num_devices"] == len(jax.devices())  # what a full-state resume checks
    # How `muzero-jax train --resume` starts its process: JAX's default devices.
    assert json.loads((tmp_path / "launch.json").read_text()) == {"cpu_devices": 0}
    config = preset("tic_tac_toe", seed=3, **overrides)
    expected = make_train(config).init(jax.random.key(3)).params

    agent = load_agent(tmp_path)
    assert agent.config == config
    assert json.loads((tmp_path / "config.json").read_text())["seed"] == 3
    for got, want in zip(jax.tree.leaves(agent.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_model_knowledge_scores_an_oracle_model_perfect_and_its_opposite_zero():
    """A stand-in model whose rewards are the real game's labels (a win: 1;
    every reply after a move that lets the opponent win: 1) picks every win
    and every block; the same model with its rewards negated picks none."""
    import types

    import jax.numpy as jnp

    from experiments.board_games import model_knowledge, self_play_knowledge
    from muzero_jax.arena import tactical_positions
    from muzero_jax.value_transforms import make_support

    positions = tactical_positions("connect_four", 256, jax.random.key(3))
    n, a = positions.legal_action_mask.shape
    assert positions.has_win.any() and positions.must_block.any()
    support = make_support(2)
    value_support = make_support(3)

    def networks(sign):
        # Hidden state: the position's index (root) or n * (move + 1) + index (after a move).
        def representation(params, obs):
            match = jnp.all(obs.reshape(obs.shape[0], 1, -1)
                            == positions.observation.reshape(1, n, -1), axis=-1)
            return jnp.argmax(match, axis=1)

        def dynamics(params, hidden, action):
            root = hidden < n
            index = hidden % n
            label = jnp.where(root, positions.wins[index, action],
                              positions.loses[index, hidden // n - 1]).astype(jnp.float32)
            logits = jnp.log(support.scalar_to_probs(sign * label) + 1e-9)
            return jnp.where(root, n * (action + 1) + index, hidden), logits

        def prediction(params, hidden):
            # The value after a move, for the player to reply: 1 where they win at once.
            index, move = hidden % n, jnp.maximum(hidden // n - 1, 0)
            value = jnp.where(hidden < n, 0.0, positions.loses[index, move].astype(jnp.float32))
            return None, jnp.log(value_support.scalar_to_probs(sign * value) + 1e-9)

        return types.SimpleNamespace(num_actions=a, representation=representation,
                                     dynamics=dynamics, prediction=prediction)

    oracle = model_knowledge(networks(1.0), None, support, positions, value_support)
    assert oracle["reward_picks_win"] == 1.0 and oracle["reply_picks_block"] == 1.0
    assert oracle["value_picks_block"] == 1.0
    np.testing.assert_allclose([oracle["reward_on_wins"], oracle["reward_on_others"],
                                oracle["reply_reward_after_losing"],
                                oracle["reply_reward_after_safe"],
                                oracle["value_after_losing"], oracle["value_after_safe"]],
                               [1, 0, 1, 0, 1, 0], atol=1e-3)
    opposite = model_knowledge(networks(-1.0), None, support, positions, value_support)
    assert opposite["reward_picks_win"] == 0.0 and opposite["reply_picks_block"] == 0.0
    assert opposite["value_picks_block"] == 0.0
    # The same positions as replay rows [devices, envs, time, ...] labelled with their wins.
    rows = types.SimpleNamespace(
        observation=positions.observation[None, None],
        action_rewards=positions.wins.astype(jnp.float32)[None, None],
        legal_action_mask=positions.legal_action_mask[None, None],
        last=jnp.zeros((1, 1, n), bool))
    own = self_play_knowledge(networks(1.0), None, support, rows)
    assert own["self_play_reward_picks_win"] == 1.0
    assert own["self_play_rows"] == int(positions.has_win.sum())
    assert own["self_play_win_share"] == float(positions.has_win.mean())
    assert self_play_knowledge(networks(-1.0), None, support, rows)[
        "self_play_reward_picks_win"] == 0.0


def test_model_drift_is_zero_for_a_model_that_tracks_the_game_and_k_over_42_for_a_frozen_one():
    """A stand-in model whose hidden state is the share of the 42 cells filled
    (value = that share) and whose dynamics adds one stone per move tracks the
    real game exactly: gap 0, correlation 1 at every depth; the same model
    with a dynamics that changes nothing is off by exactly k / 42 after k
    moves."""
    import types

    import jax.numpy as jnp

    from experiments.board_games import model_drift
    from muzero_jax.arena import tactical_positions
    from muzero_jax.value_transforms import make_support

    positions = tactical_positions("connect_four", 64, jax.random.key(4))
    support = make_support(3)

    def networks(stones_per_move):
        def representation(params, obs):
            return jnp.sum(obs, axis=(1, 2, 3)) / 42.0

        def dynamics(params, hidden, action):
            return hidden + stones_per_move / 42.0, None

        def prediction(params, hidden):
            return None, jnp.log(support.scalar_to_probs(hidden) + 1e-9)

        return types.SimpleNamespace(num_actions=7, representation=representation,
                                     dynamics=dynamics, prediction=prediction)

    exact = model_drift(networks(1.0), None, support, positions)
    frozen = model_drift(networks(0.0), None, support, positions)
    for k in (1, 2, 3):
        assert 0 < exact[f"value_rows_{k}"] <= 64
        assert exact[f"value_gap_{k}"] < 1e-3 and exact[f"value_corr_{k}"] > 0.999
        np.testing.assert_allclose(frozen[f"value_gap_{k}"], k / 42.0, atol=1e-3)
        assert frozen[f"value_rows_{k}"] == exact[f"value_rows_{k}"]


def test_decoder_report_rounds_away_errors_that_the_latent_chain_accumulates():
    """A stand-in model whose hidden state is the board itself and whose
    dynamics drops the stone exactly as Connect Four does, then adds 0.3 to
    every cell: decoded (the identity) and rounded after one move the board
    is still right, after two the latent chain's empty cells reach 0.6 and it
    is wrong everywhere, while the decoded model, rounded at every step,
    stays exact, and so does its value (the share of filled cells)."""
    import types

    import jax.numpy as jnp

    from experiments.board_games import decoder_report
    from muzero_jax.arena import tactical_positions
    from muzero_jax.value_transforms import make_support

    positions = tactical_positions("connect_four", 64, jax.random.key(4))
    support = make_support(3)

    def dynamics(params, board, action):
        clean = (board >= 0.5).astype(jnp.float32)
        in_column = jnp.take_along_axis(clean.sum(-1), action[:, None, None], axis=2)[..., 0]
        row = 5 - jnp.sum(in_column, axis=1).astype(jnp.int32)  # row 5 is the bottom
        cell = jax.nn.one_hot(row, 6)[:, :, None] * jax.nn.one_hot(action, 7)[:, None, :]
        # The mover's stones (plane 0) gain the cell; the planes swap for the next mover.
        after = jnp.stack([clean[..., 1], clean[..., 0] + cell], axis=-1)
        return after + (board - clean) + 0.3, None  # errors so far, and 0.3 more

    def prediction(params, board):
        filled = (board >= 0.5).sum(axis=(1, 2, 3)) / 42.0
        return None, jnp.log(support.scalar_to_probs(filled) + 1e-9)

    networks = types.SimpleNamespace(
        num_actions=7, representation=lambda params, obs: obs, dynamics=dynamics,
        prediction=prediction, decoder=lambda params, hidden: hidden)
    out = decoder_report(networks, None, support, positions)
    assert out["board_exact_latent_0"] == out["board_exact_decoded_0"] == 1.0
    assert out["board_exact_latent_1"] == 1.0
    assert out["board_exact_latent_2"] == out["board_exact_latent_3"] == 0.0
    for k in (1, 2, 3):
        assert out[f"board_exact_decoded_{k}"] == 1.0
        assert out[f"decoded_value_gap_{k}"] < 1e-3 and out[f"decoded_value_corr_{k}"] > 0.999


def test_eval_and_print_every_seconds_follow_the_training_clock(monkeypatch, capsys):
    """With `eval_every_seconds`, evaluations come each time the training wall
    time passes another multiple of it (and once at the end), whatever the
    iteration count; `print_every_seconds` likewise prints progress lines."""
    import types

    import jax.numpy as jnp

    import muzero_jax.agent
    from experiments import board_games

    clock = [0.0]

    class FakeTrainer:  # each iteration takes 4 s of the (fake) training clock
        mesh = types.SimpleNamespace(devices=np.zeros(1))

        def init(self, key):
            return types.SimpleNamespace(params=None, counters=types.SimpleNamespace(env_steps=0))

        def iteration(self, state):
            clock[0] += 4.0
            steps = state.counters.env_steps + 100
            return (types.SimpleNamespace(params=None,
                                          counters=types.SimpleNamespace(env_steps=steps)),
                    types.SimpleNamespace(loss=jnp.float32(1.0)))

    fake_time = types.SimpleNamespace(perf_counter=lambda: clock[0], strftime=time_strftime,
                                      gmtime=time_gmtime)
    monkeypatch.setattr(board_games, "time", fake_time)
    monkeypatch.setattr(board_games, "make_train", lambda config, env=None: FakeTrainer())
    monkeypatch.setattr(muzero_jax.agent, "Agent", lambda *args, **kwargs: None)
    rates = {"win": 1.0, "draw": 0.0, "loss": 0.0}
    monkeypatch.setattr(board_games, "evaluate_against",
                        lambda *a, **k: {"as_first": rates, "as_second": rates})

    result = board_games.run("tic_tac_toe", seed=0, max_seconds=30.0, eval_every=1000,
                             eval_games=1, opponent="random", overrides={},
                             eval_every_seconds=10.0, print_every_seconds=8.0)
    # Train time after iteration i is 4 i: past 10 at i = 3 (12 s), past 20 at
    # i = 5 (20 s), then the end at i = 8 (32 s >= 30).
    assert [e["iteration"] for e in result["evaluations"]] == [3, 5, 8]
    assert [e["env_steps"] for e in result["evaluations"]] == [300, 500, 800]
    assert "--eval-every-seconds 10 " in result["command"]
    assert "--eval-every " not in result["command"]
    progress = [line for line in capsys.readouterr().out.splitlines() if "| loss" in line]
    # Past 8, 16, 24 and 32 s: iterations 2, 4, 6, 8.
    assert [int(line.split()[1]) for line in progress] == [2, 4, 6, 8]

    # Without it, `eval_every` counts iterations as before.
    clock[0] = 0.0
    result = board_games.run("tic_tac_toe", seed=0, max_seconds=30.0, eval_every=3,
                             eval_games=1, opponent="random", overrides={})
    assert [e["iteration"] for e in result["evaluations"]] == [3, 6, 8]


def test_pass_report_counts_passes_and_areas_that_agree_with_the_results(tmp_path, capsys):
    from experiments.board_games import pass_report, run

    overrides = {"num_envs": 2, "rollout_length": 4, "batch_size": 2, "replay_capacity": 170,
                 "min_replay_steps": 168, "num_simulations": 2, "replay_ratio": 0.125,
                 "resnet": {"channels": 4, "num_blocks": 1, "head_hidden_sizes": [8]}}
    run("go_9x9", seed=0, max_seconds=0.0, eval_every=1, eval_games=1, opponent="random",
        overrides=overrides, logdir=str(tmp_path))
    capsys.readouterr()
    # The agent may not pass before ply 162, the game's last: it passes only
    # where nothing else is legal, while random keeps the standard rules.
    row = pass_report(str(tmp_path), simulations=2, games=3, no_pass_before=162,
                      search_kwargs='{"gumbel_scale": 0.0}')
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == row
    assert row["search_kwargs"] == '{"gumbel_scale": 0.0}' and row["no_pass_before"] == 162
    for seat, komi_sign in (("as_first", -1.0), ("as_second", 1.0)):
        side = row[seat]
        assert side["pass_share"] == side["forced_pass_share"] < 0.2
        games = {k: side[k]["games"] if side[k] else 0 for k in ("wins", "losses")}
        assert games["wins"] + games["losses"] == 3
        assert side["win"] == games["wins"] / 3
        # Area scoring with komi 7.5 for white decides every game that ends by
        # passes or at the move limit: the winner's area is the larger.
        for outcome, sign in (("wins", 1.0), ("losses", -1.0)):
            if side[outcome]:
                margin = side[outcome]["agent_area"] - side[outcome]["opponent_area"]
                assert sign * (margin + komi_sign * 7.5) > 0, (seat, outcome, side)
                assert 0 < side[outcome]["mean_length"] <= 162


class _PassingAgent:
    """The `Agent` shape: passes whenever the mask it is given allows it, else
    plays its first legal point."""

    def __init__(self, env):
        from muzero_jax.presets import preset
        self.env, self.step, self.config = env, 0, preset("go_9x9")

    def search(self, observation, legal_action_mask, *, num_simulations=None, rng=None):
        from muzero_jax.agent import AgentOutput
        mask = np.asarray(legal_action_mask)
        action = np.where(mask[:, -1], mask.shape[1] - 1, np.argmax(mask, axis=1))
        zeros = np.zeros(mask.shape[0], np.float32)
        return AgentOutput(action=action, value=zeros, policy=mask.astype(np.float32))


def test_no_pass_before_holds_the_agents_own_passes_back(monkeypatch):
    import muzero_jax
    from experiments.board_games import pass_report
    from muzero_jax.envs import make_env

    monkeypatch.setattr(muzero_jax, "load_agent", lambda *a, **k: _PassingAgent(make_env("go_9x9")))
    free = pass_report("stand-in", simulations=1, games=2)
    held = pass_report("stand-in", simulations=1, games=2, no_pass_before=40)
    for seat in ("as_first", "as_second"):
        # Free to pass, it passes on every move; held back, only from ply 40 on
        # (its 20th move) or with nothing else legal.
        assert free[seat]["pass_share"] == 1.0
        side = held[seat]
        assert side["mean_length"] > 40
        moves_before_40 = 20
        assert side["pass_share"] <= 1.0 - moves_before_40 / (side["mean_length"] / 2 + 1)


@pytest.mark.parametrize("argv, message", [
    (["--pass-report", "RUN", "--no-pass-before", "-1"], "--no-pass-before must be >= 0"),
    (["--no-pass-before", "81"], "go with --pass-report"),
    (["--search-kwargs", "{}"], "go with --pass-report"),
])
def test_pass_report_flags_are_checked_before_anything_runs(argv, message, capsys):
    from experiments.board_games import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cpu_devices_is_checked_before_anything_runs(capsys):
    from experiments.board_games import main

    started = len(jax.devices("cpu"))  # this process's JAX backends run from here on
    for argv, message in ((["--cpu-devices", "-1"], "--cpu-devices must be >= 0"),
                          (["--cpu-devices", str(started + 1)], "jax_num_cpu_devices")):
        with pytest.raises(SystemExit) as exit_info:
            main(["--env", "tic_tac_toe", "--max-seconds", "0", *argv])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err, err
    assert len(jax.devices("cpu")) == started


def test_cpu_devices_is_recorded_where_train_resume_reads_it(tmp_path, monkeypatch, capsys):
    """`--cpu-devices N` reaches the run directory's launch.json (from which
    `muzero-jax train --resume` takes its default) and the recorded command.
    JAX already runs in this process, so the device split itself is stood in
    for; the saved run is real (no training time: the initial state)."""
    import muzero_jax.distributed
    from experiments.board_games import main
    from muzero_jax.cli import _launched_cpu_devices

    split = []
    monkeypatch.setattr(muzero_jax.distributed, "use_cpu_devices", split.append)
    overrides = {"num_envs": 4, "rollout_length": 5, "batch_size": 4, "replay_capacity": 20,
                 "min_replay_steps": 2}
    main(["--env", "tic_tac_toe", "--max-seconds", "0", "--opponent", "random",
          "--cpu-devices", "2", "--set", json.dumps(overrides), "--out", str(tmp_path),
          "--logdir", str(tmp_path / "run")])
    assert split == [2]
    assert json.loads((tmp_path / "run" / "launch.json").read_text()) == {"cpu_devices": 2}
    assert _launched_cpu_devices(str(tmp_path / "run")) == 2
    result = json.loads((tmp_path / "tic_tac_toe_seed0.json").read_text())
    assert "--cpu-devices 2" in result["command"]
