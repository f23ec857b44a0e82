"""The every-action reward loss (`Config.action_reward_loss_weight`): the labels
self-play stores, how they reach the loss, and the refusals.

The loss term itself is checked against a transcription in `test_loss.py`."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import textwrap
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax.envs.pgx import game_symmetries
from muzero_jax.learning import make_train
from muzero_jax.loss import LossBatch, unrolled_loss
from muzero_jax.networks import MLPConfig
from muzero_jax.presets import preset
from muzero_jax.symmetries import augment_batch

_LINES = [[(r, c) for c in range(3)] for r in range(3)] + [
    [(r, c) for r in range(3)] for c in range(3)] + [
    [(i, i) for i in range(3)], [(i, 2 - i) for i in range(3)]]


def _tiny(**overrides):
    return dataclasses.replace(
        preset("tic_tac_toe"), num_envs=8, rollout_length=4, batch_size=8, replay_ratio=0.25,
        num_simulations=4, num_unroll_steps=2, td_steps=9, replay_capacity=32,
        min_replay_steps=12, mlp=MLPConfig(hidden_sizes=(16,), latent_size=8,
                                          head_hidden_sizes=(8,)), **overrides)


def _winning_cells(observation: np.ndarray) -> set[int]:
    """Cells where the player to move completes a line (plane 0: their marks)."""
    mine, theirs = observation[..., 0] > 0, observation[..., 1] > 0
    wins = set()
    for r, c in itertools.product(range(3), range(3)):
        if mine[r, c] or theirs[r, c]:
            continue
        board = mine.copy()
        board[r, c] = True
        if any(all(board[cell] for cell in line) for line in _LINES):
            wins.add(3 * r + c)
    return wins


def _boards(data, num_rows):
    """`(b, t, mine, theirs, empty cells [9], winning cells)` of each stored
    TicTacToe row (environments x the first `num_rows` rows), from the board."""
    for b, t in itertools.product(range(data.observation.shape[0]), range(num_rows)):
        obs = data.observation[b, t]
        mine, theirs = obs[..., 0] > 0, obs[..., 1] > 0
        yield b, t, mine, theirs, ~(mine | theirs).reshape(-1), _winning_cells(obs)


class _Run(NamedTuple):
    trainer: object
    params0: dict  # the acting parameters of the first three iterations (numpy)
    metrics: list  # each iteration's metrics
    data: object  # device 0's first 16 replay rows of each environment (numpy)


@pytest.fixture(scope="module")
def labelled_run():
    """Six iterations of the tiny TicTacToe run with every per-move label on
    (every-move rewards, threats, replies, predictions, observations): one
    compile for the tests below, each of which checks its own labels. Heads
    start at zero (every value ~0, every policy uniform): the parameters are
    perturbed so that the stored predictions depend on the board. Learning
    starts at the third iteration, after its rollout, so rows 0-11 were acted
    with `params0`."""
    config = _tiny(action_reward_loss_weight=1.0, threat_value_loss_weight=1.0,
                   reply_reward_loss_weight=1.0, action_prediction_loss_weight=1.0,
                   action_reconstruction_loss_weight=1.0)
    trainer = make_train(config)
    state = trainer.init(jax.random.key(3))
    leaves, tree = jax.tree.flatten(state.params)
    keys = jax.random.split(jax.random.key(4), len(leaves))
    state = state._replace(params=jax.tree.unflatten(tree, [
        p + 0.3 * jax.random.normal(k, p.shape, p.dtype) for p, k in zip(leaves, keys)]))
    params0 = jax.tree.map(np.array, state.params)  # the iteration donates its input
    metrics = []
    for _ in range(6):
        state, m = trainer.iteration(state)
        metrics.append(jax.device_get(m))
    assert all(bool(m.finite) for m in metrics) and bool(metrics[-1].learned)
    data = jax.tree.map(lambda x: np.asarray(x[0][:, :16]), state.replay.data)
    return _Run(trainer, params0, metrics, data)


def _labels_off(**overrides):
    """The replay rows of the tiny run's initial state with `overrides`."""
    return make_train(_tiny(**overrides)).init(jax.random.key(0)).replay.data


def test_self_play_labels_every_winning_move_and_nothing_else(labelled_run):
    """TicTacToe rows carry reward 1 exactly on the moves that win at once, as
    an independent line check on the stored board finds them, 0 elsewhere
    (illegal moves and episode-end rows included); the played action's label
    is the reward the row after it received."""
    data = labelled_run.data
    assert float(labelled_run.metrics[-1].action_reward_loss) > 0
    labels = data.action_rewards
    assert labels.shape == (8, 16, 9)
    positives = 0
    for b, t in itertools.product(range(8), range(16)):
        expected = np.zeros(9)
        if not data.last[b, t]:
            expected[sorted(_winning_cells(data.observation[b, t]))] = 1.0
        np.testing.assert_array_equal(labels[b, t], expected, err_msg=f"env {b} row {t}")
        positives += int(expected.sum())
        if t + 1 < 16 and not data.last[b, t]:
            assert labels[b, t, data.action[b, t]] == data.reward[b, t + 1]
    assert positives > 0  # the check saw winning moves


def test_without_the_option_nothing_is_stored():
    assert _labels_off().action_rewards is None


def test_the_option_changes_the_update():
    def params_after(weight):
        trainer = make_train(_tiny(action_reward_loss_weight=weight))
        state = trainer.init(jax.random.key(0))
        for _ in range(4):
            state, metrics = trainer.iteration(state)
        assert bool(metrics.finite) and bool(metrics.learned)
        return state.params

    diff = jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))),
                                        params_after(0.0), params_after(5.0)))
    assert max(diff) > 0  # same seed, same self-play start: only the loss differs


def test_symmetries_move_the_labels_with_the_policy():
    """Per-action labels (rewards, threats) and their mask are indexed like
    the policy, so they move by the same map: labels equal to the policy targets (and a mask
    derived from them) stay so after the moves."""
    symmetries = game_symmetries("tic_tac_toe", (3, 3, 2))
    b, k = 32, 2
    ks = jax.random.split(jax.random.key(0), 2)
    policy = jax.nn.softmax(jax.random.normal(ks[0], (b, k + 1, 9)))
    observation = jax.random.normal(ks[1], (b, 3, 3, 2))
    batch = LossBatch(
        observation=observation,
        actions=jnp.zeros((b, k), jnp.int32), target_value=jnp.zeros((b, k + 1)),
        target_reward=jnp.zeros((b, k + 1)), target_policy=policy,
        value_mask=jnp.ones((b, k + 1)), reward_mask=jnp.ones((b, k + 1)),
        policy_mask=jnp.ones((b, k + 1)), importance_weight=jnp.ones((b,)),
        target_action_reward=policy[:, :k],
        action_reward_mask=(policy[:, :k] > 0.1).astype(jnp.float32),
        target_action_threat=2.0 * policy[:, :k],
        # Each action's reply is the action itself (or -1): moved per action and
        # mapped as an action, it stays so.
        target_reply=jnp.where(policy[:, :k] > 0.2, -1, jnp.arange(9)).astype(jnp.int32),
        target_reply_reward=3.0 * policy[:, :k],
        # The policy after each action is over actions too: both axes move.
        target_action_value=4.0 * policy[:, :k],
        target_action_policy=policy[:, :k, :, None] * policy[:, 1:k + 1, None, :],
        # The observation after each action: moved along the action axis and
        # over its own cells, it stays the moved observation times the policy.
        target_action_observation=(observation[:, None, None]
                                   * policy[:, :k, :, None, None, None]))
    out = augment_batch(batch, symmetries, jax.random.key(1))
    assert not np.array_equal(out.target_policy, policy)  # something moved
    np.testing.assert_array_equal(out.target_action_reward, out.target_policy[:, :k])
    np.testing.assert_array_equal(out.action_reward_mask,
                                  (out.target_policy[:, :k] > 0.1).astype(np.float32))
    np.testing.assert_array_equal(out.target_action_threat, 2.0 * out.target_policy[:, :k])
    np.testing.assert_array_equal(out.target_reply_reward, 3.0 * out.target_policy[:, :k])
    np.testing.assert_array_equal(
        out.target_reply, np.where(out.target_policy[:, :k] > 0.2, -1, np.arange(9)))
    assert (out.target_reply == -1).any()
    np.testing.assert_array_equal(out.target_action_value, 4.0 * out.target_policy[:, :k])
    np.testing.assert_allclose(
        out.target_action_policy,
        out.target_policy[:, :k, :, None] * out.target_policy[:, 1:k + 1, None, :], rtol=1e-6)
    np.testing.assert_allclose(
        out.target_action_observation,
        out.observation[:, None, None] * out.target_policy[:, :k, :, None, None, None],
        rtol=1e-6)


def test_refusals_before_compiling():
    with pytest.raises(ValueError, match="action_reward_loss_weight"):
        preset("tic_tac_toe", action_reward_loss_weight=-1.0)
    for bad in (0, 6, True, 1.5):
        with pytest.raises(ValueError, match="action_reward_steps"):
            preset("tic_tac_toe", action_reward_steps=bad)

    def old_style_loss(params, batch, *, networks, value_support, reward_support,
                       value_loss_weight, reward_loss_weight=1.0):
        return unrolled_loss(params, batch, networks=networks, value_support=value_support,
                             reward_support=reward_support, value_loss_weight=value_loss_weight,
                             reward_loss_weight=reward_loss_weight)

    with pytest.raises(ValueError, match="does not accept action_reward_loss_weight"):
        make_train(_tiny(action_reward_loss_weight=1.0), loss_fn=old_style_loss)
    for bad in (-1, 9, True, 2.5):  # _tiny's batch_size is 8
        with pytest.raises(ValueError, match="action_reward_batch_size must be an integer"):
            _tiny(action_reward_batch_size=bad)

    def no_batch_loss(params, batch, *, networks, value_support, reward_support,
                      value_loss_weight, reward_loss_weight=1.0, action_reward_loss_weight=0.0,
                      action_reward_steps=None):
        return unrolled_loss(params, batch, networks=networks, value_support=value_support,
                             reward_support=reward_support, value_loss_weight=value_loss_weight,
                             reward_loss_weight=reward_loss_weight,
                             action_reward_loss_weight=action_reward_loss_weight,
                             action_reward_steps=action_reward_steps)

    make_train(_tiny(action_reward_loss_weight=1.0), loss_fn=no_batch_loss)  # 0: not passed
    with pytest.raises(ValueError, match="does not accept action_reward_batch=; add the "
                                         "argument or leave action_reward_batch_size at 0"):
        make_train(_tiny(action_reward_loss_weight=1.0, action_reward_batch_size=4),
                   loss_fn=no_batch_loss)


_PER_DEVICE_BATCH = textwrap.dedent(
    """
    import json, sys
    import jax
    from muzero_jax.learning import make_train
    from muzero_jax.loss import unrolled_loss
    from muzero_jax.networks import MLPConfig
    from muzero_jax.presets import preset
    tiny = dict(json.loads(sys.argv[1]),
                mlp=MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,)))
    field = sys.argv[2]  # action_reward_batch_size or consistency_batch_size
    seen = []

    def recording_loss(params, batch, **kwargs):
        seen.append((kwargs.get(field[:-len("_size")]), batch.observation.shape[0]))
        return unrolled_loss(params, batch, **kwargs)

    out = {}
    for devices, size in ((1, 4), (4, 8), (4, 0)):
        config = preset("tic_tac_toe", **tiny, num_devices=devices, **{field: size})
        trainer = make_train(config, loss_fn=recording_loss)
        seen.clear()
        trainer.iteration.trace(trainer.state_shapes(jax.random.key(0)))  # traced, not run
        out[f"{devices},{size}"] = sorted(set(seen))
    try:
        make_train(preset("tic_tac_toe", **tiny, num_devices=4, **{field: 6}))
    except ValueError as e:
        out["error"] = str(e)
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("field,weight", [
    ("action_reward_batch_size", "action_reward_loss_weight"),
    ("consistency_batch_size", "consistency_loss_weight")])
def test_subset_batch_sizes_are_split_across_devices(field, weight):
    """`action_reward_batch_size=M` (`consistency_batch_size=M`) reaches each
    device's loss as `action_reward_batch=` (`consistency_batch=`) M / D of its
    B / D sequences (traced on 1 and 4 fake CPU devices, nothing compiled); 0
    passes nothing; a count that does not split is refused."""
    tiny = dict(num_envs=16, rollout_length=4, batch_size=16, replay_ratio=0.25,
                num_simulations=4, num_unroll_steps=2, td_steps=9, replay_capacity=32,
                min_replay_steps=12, **{weight: 1.0})
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    env = dict(os.environ, XLA_FLAGS=flags,
               PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _PER_DEVICE_BATCH, json.dumps(tiny), field],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["1,4"] == [[4, 16]]
    assert out["4,8"] == [[2, 4]]
    assert out["4,0"] == [[None, 4]]
    assert f"{field}=6 does not split evenly across 4 devices" in out["error"]


def _threat_labels(observation: np.ndarray) -> np.ndarray:
    """`[9]` 1 where, after the mover's move, the game goes on and the
    opponent completes a line at once (an independent line check)."""
    mine, theirs = observation[..., 0] > 0, observation[..., 1] > 0
    labels = np.zeros(9)
    wins = _winning_cells(observation)
    for r, c in itertools.product(range(3), range(3)):
        if mine[r, c] or theirs[r, c] or 3 * r + c in wins:
            continue
        after = np.stack([theirs, mine | (np.arange(9).reshape(3, 3) == 3 * r + c)], -1)
        if after.any(-1).all():
            continue  # the board is full: a draw
        labels[3 * r + c] = float(bool(_winning_cells(after.astype(np.float32))))
    return labels


def test_self_play_labels_every_move_that_lets_the_opponent_win(labelled_run):
    """With `threat_value_loss_weight`, TicTacToe rows carry 1 exactly on the
    moves after which the opponent can complete a line at once (the line
    check above, on the stored board), 0 elsewhere; the loss sees them."""
    data = labelled_run.data
    assert float(labelled_run.metrics[-1].threat_value_loss) > 0
    positives = 0
    for b, t in itertools.product(range(8), range(16)):
        expected = np.zeros(9) if data.last[b, t] else _threat_labels(data.observation[b, t])
        np.testing.assert_array_equal(data.action_threats[b, t], expected,
                                      err_msg=f"env {b} row {t}")
        positives += int(expected.sum())
    assert positives > 0
    assert _labels_off(action_reward_loss_weight=1.0).action_threats is None


def test_threat_values_refusals():
    with pytest.raises(ValueError, match="needs action_reward_loss_weight > 0"):
        preset("tic_tac_toe", threat_value_loss_weight=1.0)
    with pytest.raises(ValueError, match="threat_value_loss_weight"):
        preset("tic_tac_toe", threat_value_loss_weight=-1.0)
    with pytest.raises(ValueError, match="two-player game"):
        make_train(preset("catch", action_reward_loss_weight=1.0, threat_value_loss_weight=1.0))

    def old_style_loss(params, batch, *, networks, value_support, reward_support,
                       value_loss_weight, action_reward_loss_weight, action_reward_steps,
                       reward_loss_weight=1.0):
        raise AssertionError("not reached")

    with pytest.raises(ValueError, match="does not accept threat_value_loss_weight"):
        make_train(_tiny(action_reward_loss_weight=1.0, threat_value_loss_weight=1.0),
                   loss_fn=old_style_loss)


def test_self_play_keeps_one_reply_per_move_the_winning_one_first(labelled_run):
    """With `reply_reward_loss_weight`, each TicTacToe row keeps, per move
    that leaves the game on, one legal reply: a winning one whenever the
    opponent can win at once (reward 1), else one that does not win (reward
    0); -1 and 0 for illegal moves, moves that end the game and `last` rows
    (the line check above, on the stored board)."""
    data = labelled_run.data
    assert float(labelled_run.metrics[-1].reply_reward_loss) > 0
    wins_kept = random_kept = 0
    for b, t, mine, theirs, empty, wins in _boards(data, 16):
        for a in range(9):
            reply, reward = data.action_replies[b, t, a], data.reply_rewards[b, t, a]
            after_mine = mine.reshape(-1).copy()
            after_mine[a] = True
            ends = a in wins or empty.sum() == 1
            if data.last[b, t] or not empty[a] or ends:
                assert (reply, reward) == (-1, 0.0), (b, t, a)
                continue
            assert empty[reply] and reply != a, (b, t, a, reply)
            after = np.stack([theirs, after_mine.reshape(3, 3)], -1).astype(np.float32)
            their_wins = _winning_cells(after)
            if their_wins:
                assert reply in their_wins and reward == 1.0
                wins_kept += 1
            else:
                assert reward == 0.0
                random_kept += 1
    assert wins_kept > 0 and random_kept > 0


def test_reply_rewards_refused_without_every_move_rewards():
    with pytest.raises(ValueError, match="reply_reward_loss_weight=1.0 needs"):
        preset("tic_tac_toe", reply_reward_loss_weight=1.0)


def test_self_play_stores_the_prediction_after_every_move(labelled_run):
    """With `action_prediction_loss_weight`, each TicTacToe row keeps, per
    legal move that leaves the game on, the networks' value and policy on the
    board that move leads to, seen by the player to reply (the board built
    here by hand and fed to the acting parameters); value 0 and no policy for
    illegal moves, moves that end the game and `last` rows. Rows 0-11 were
    acted with the (perturbed) initial parameters."""
    assert float(labelled_run.metrics[-1].action_prediction_loss) > 0
    trainer, params0 = labelled_run.trainer, labelled_run.params0
    data = jax.tree.map(lambda x: x[:, :12], labelled_run.data)
    nets, support = trainer.networks, trainer.value_support
    boards, where = [], []
    for b, t, mine, theirs, empty, wins in _boards(data, 12):
        for a in range(9):
            ends = a in wins or empty.sum() == 1
            if data.last[b, t] or not empty[a] or ends:
                assert data.action_values[b, t, a] == 0.0, (b, t, a)
                assert not data.action_policies[b, t, a].any(), (b, t, a)
                continue
            after_mine = mine.reshape(-1).copy()
            after_mine[a] = True
            boards.append(np.stack([theirs, after_mine.reshape(3, 3)], -1).astype(np.float32))
            where.append((b, t, a, empty & (np.arange(9) != a)))
    assert len(where) > 100
    out = jax.jit(nets.initial_inference)(params0, jnp.asarray(np.stack(boards)))
    values = np.asarray(jax.jit(support.logits_to_scalar)(out.value_logits))
    assert values.std() > 0.05  # the values differ from board to board
    logits = np.asarray(out.policy_logits, np.float64)
    for i, (b, t, a, legal) in enumerate(where):
        # (the value transform's inverse loses ~1e-4 to float32 rounding, more
        # for larger values: 2.3e-4 at 2.68 on an AMD EPYC of family 25 model 1)
        np.testing.assert_allclose(data.action_values[b, t, a], values[i], rtol=2e-4,
                                   atol=2e-4)
        expected = np.where(legal, np.exp(logits[i] - logits[i][legal].max()), 0.0)
        np.testing.assert_allclose(data.action_policies[b, t, a], expected / expected.sum(),
                                   atol=1e-5)


def test_action_predictions_refused_without_every_move_rewards():
    with pytest.raises(ValueError, match="action_prediction_loss_weight=1.0 needs"):
        preset("tic_tac_toe", action_prediction_loss_weight=1.0)
    with pytest.raises(ValueError, match="action_prediction_loss_weight"):
        preset("tic_tac_toe", action_prediction_loss_weight=-1.0)
    assert _labels_off(action_reward_loss_weight=1.0).action_values is None


def test_self_play_stores_the_observation_after_every_move(labelled_run):
    """With `action_reconstruction_loss_weight`, each TicTacToe row keeps, per
    legal move, the board that move leads to as the player to reply sees it
    (their marks, then the mover's with the move added; built here by hand),
    the final board too where the move ends the game; zeros for illegal
    moves and `last` rows. The learner's term is on and decreases the loss."""
    data = labelled_run.data
    assert data.action_observations.shape[-3:] == (3, 3, 2)
    assert data.action_observations.shape[-4] == 9
    losses = [float(m.action_reconstruction_loss) for m in labelled_run.metrics]
    assert losses[2] > 0 and losses[-1] < losses[2]  # learning starts at the third iteration
    checked = ending = 0
    for b, t, mine, theirs, empty, wins in _boards(data, 16):
        for a in range(9):
            stored = data.action_observations[b, t, a]
            if data.last[b, t] or not empty[a]:
                assert not stored.any(), (b, t, a)
                continue
            after_mine = mine.reshape(-1).copy()
            after_mine[a] = True
            expected = np.stack([theirs, after_mine.reshape(3, 3)], -1).astype(np.float32)
            np.testing.assert_array_equal(stored, expected, err_msg=f"env {b} row {t} move {a}")
            checked += 1
            ending += a in wins or empty.sum() == 1
    assert checked > 100 and ending > 0
    assert _labels_off(action_reward_loss_weight=1.0).action_observations is None


def test_action_reconstruction_refusals():
    with pytest.raises(ValueError, match="action_reconstruction_loss_weight=1.0 needs"):
        preset("tic_tac_toe", action_reconstruction_loss_weight=1.0)
    with pytest.raises(ValueError, match="action_reconstruction_loss_weight"):
        preset("tic_tac_toe", action_reconstruction_loss_weight=-1.0)

    def old_style_loss(params, batch, *, networks, value_support, reward_support,
                       value_loss_weight, action_reward_loss_weight, action_reward_steps,
                       reward_loss_weight=1.0):
        raise AssertionError("not reached")

    with pytest.raises(ValueError, match="does not accept action_reconstruction_loss_weight"):
        make_train(_tiny(action_reward_loss_weight=1.0, action_reconstruction_loss_weight=1.0),
                   loss_fn=old_style_loss)
