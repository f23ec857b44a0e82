"""Reanalyse: which stored rows get fresh search targets, and that they are the search's."""

import functools

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from muzero_jax.config import Config
from muzero_jax.learning import make_train
from muzero_jax.presets import preset
from muzero_jax.reanalyse import make_reanalyse, sweep_rows
from muzero_jax.replay import Trajectory, make_replay_buffer
from muzero_jax.search import make_recurrent_fn, make_root_fn

A = 3  # actions


def _toy_root(params, observation):
    # Prior logits read off the observation, scaled by the "params".
    return mctx.RootFnOutput(prior_logits=params * observation[:, :A],
                             value=jnp.sum(observation, axis=-1),
                             embedding=observation)


def _toy_recurrent(params, rng_key, action, embedding):
    del rng_key
    out = mctx.RecurrentFnOutput(
        reward=jnp.take_along_axis(embedding, action[:, None], axis=-1)[:, 0],
        discount=jnp.full(action.shape, 0.9),
        prior_logits=jnp.zeros_like(embedding[:, :A]),
        value=jnp.zeros(action.shape))
    return out, embedding


_SEARCH = functools.partial(mctx.gumbel_muzero_policy, gumbel_scale=0.0)


def _search_one(params, observation, legal):
    """The toy search on one observation, on its own (batch of one)."""
    out = _SEARCH(params, jax.random.key(0), _toy_root(params, observation[None]),
                  _toy_recurrent, num_simulations=8, invalid_actions=~legal[None])
    return (np.asarray(out.action_weights[0]),
            float(out.search_tree.node_values[0, mctx.Tree.ROOT_INDEX]))


@pytest.mark.parametrize("iteration,rows,capacity", [(0, 3, 6), (1, 3, 6), (1, 4, 6),
                                                      (5, 4, 6), (7, 6, 6), (123456, 5, 1000)])
def test_sweep_rows_are_consecutive_and_wrap(iteration, rows, capacity):
    expected = [(iteration * rows + j) % capacity for j in range(rows)]
    assert np.asarray(sweep_rows(jnp.int32(iteration), rows, capacity)).tolist() == expected


def _buffer_with_rows(num_added_rows):
    """Two environments, six rows each, `num_added_rows` written (observation 4 floats)."""
    buffer = make_replay_buffer(num_envs=2, capacity=6, sequence_length=2, batch_size=2)
    example = Trajectory(
        observation=jnp.zeros((A + 1,)), action=jnp.int32(0), reward=jnp.float32(0),
        first=jnp.bool_(False), last=jnp.bool_(False), terminated=jnp.bool_(False),
        truncated=jnp.bool_(False), legal_action_mask=jnp.ones((A,), bool),
        to_play=jnp.int32(0), search_policy=jnp.zeros((A,)), search_value=jnp.float32(0))
    state = buffer.init(example)
    rng = np.random.default_rng(0)
    t = num_added_rows
    last = np.zeros((2, t), bool)
    last[1, 1] = True  # a terminal row: keeps its stored targets
    legal = np.ones((2, t, A), bool)
    legal[0, 1, 2] = False  # an illegal action: never in the fresh policy
    legal[1, 1] = False  # no legal move on the terminal row
    traj = Trajectory(
        observation=jnp.asarray(rng.normal(size=(2, t, A + 1)), jnp.float32),
        action=jnp.zeros((2, t), jnp.int32), reward=jnp.zeros((2, t)),
        first=jnp.zeros((2, t), bool), last=jnp.asarray(last),
        terminated=jnp.asarray(last), truncated=jnp.zeros((2, t), bool),
        legal_action_mask=jnp.asarray(legal), to_play=jnp.zeros((2, t), jnp.int32),
        search_policy=jnp.full((2, t, A), 1.0 / A), search_value=jnp.full((2, t), -7.0))
    return buffer.add(state, traj)


@pytest.mark.parametrize("iteration,rows", [(0, 3), (1, 3), (1, 4)])
def test_reanalyse_rewrites_only_the_swept_written_running_rows(iteration, rows):
    before = _buffer_with_rows(4)  # rows 0..3 written, 4 and 5 never
    reanalyse = make_reanalyse(_toy_root, _toy_recurrent, _SEARCH, num_simulations=8, rows=rows)
    params = jnp.float32(2.0)
    after = jax.jit(reanalyse)(params, before, jax.random.key(1), jnp.int32(iteration))
    swept = {(iteration * rows + j) % 6 for j in range(rows)}
    old, new = before.data, after.data
    changed = 0
    for b in range(2):
        for t in range(6):
            fresh = t in swept and t < 4 and not (b == 1 and t == 1)
            if fresh:
                policy, value = _search_one(params, np.asarray(old.observation[b, t]),
                                            np.asarray(old.legal_action_mask[b, t]))
                changed += 1
            else:
                policy, value = np.asarray(old.search_policy[b, t]), float(old.search_value[b, t])
            np.testing.assert_allclose(np.asarray(new.search_policy[b, t]), policy, atol=1e-5)
            np.testing.assert_allclose(float(new.search_value[b, t]), value, atol=1e-5)
            if fresh:  # the toy search's value is never the stored -7
                assert abs(value + 7.0) > 1e-3
            if fresh and b == 0 and t == 1:
                assert float(new.search_policy[b, t, 2]) == 0.0
    assert changed > 0
    # Everything else in the buffer is untouched.
    for name in ("observation", "action", "reward", "last", "legal_action_mask"):
        np.testing.assert_array_equal(np.asarray(getattr(new, name)),
                                      np.asarray(getattr(old, name)))
    np.testing.assert_array_equal(np.asarray(after.priorities), np.asarray(before.priorities))


def test_reanalyse_refuses_bad_rows():
    with pytest.raises(ValueError, match="rows must be an integer >= 1"):
        make_reanalyse(_toy_root, _toy_recurrent, _SEARCH, num_simulations=8, rows=0)
    reanalyse = make_reanalyse(_toy_root, _toy_recurrent, _SEARCH, num_simulations=8, rows=7)
    with pytest.raises(ValueError, match="exceeds the buffer's 6 rows"):
        reanalyse(jnp.float32(1.0), _buffer_with_rows(4), jax.random.key(0), jnp.int32(0))


@pytest.mark.parametrize("rows,message", [
    (-1, "reanalyse_rows must be an integer in \\[0, replay_capacity=40\\]"),
    (41, "reanalyse_rows must be an integer in \\[0, replay_capacity=40\\]"),
    (True, "reanalyse_rows must be an integer"),
    (2.0, "reanalyse_rows must be an integer"),
])
def test_config_refuses_bad_reanalyse_rows(rows, message):
    with pytest.raises(ValueError, match=message):
        Config(replay_capacity=40, reanalyse_rows=rows)


def test_config_keeps_the_sweep_index_within_int32():
    # The sweep's int32 index: rows x capacity below 2**31.
    with pytest.raises(ValueError, match="reanalyse_rows \\* replay_capacity must be below"):
        Config(replay_capacity=50_000, reanalyse_rows=50_000)
    assert Config(replay_capacity=40, reanalyse_rows=40).reanalyse_rows == 40


def test_training_reanalyses_stored_rows_with_the_latest_params():
    # Iteration 0 acts with the initial params and learns; iteration 1
    # sweeps every row (R = N) with the params iteration 0 left, so the rows
    # acted on in iteration 0 must then hold the search of those params on
    # their observations, computed here independently of the trainer.
    config = preset("catch", seed=3, num_envs=4, rollout_length=4, batch_size=4,
                    replay_ratio=1 / 16, num_simulations=4, num_unroll_steps=1, td_steps=1,
                    replay_capacity=8, min_replay_steps=3, eval_every=0,
                    search="gumbel_muzero", search_kwargs='{"gumbel_scale": 0.0}',
                    reanalyse_rows=8, num_devices=1, learning_rate=0.05, lr_warmup_updates=0)
    trainer = make_train(config)
    state = trainer.init(jax.random.key(config.seed))
    # Random weights everywhere (the initialisation zeroes the output layers):
    # an untrained network's values are 0 and its searches' policies uniform
    # up to rounding, so the targets of this early (reward-free) stretch of
    # Catch would be what it already predicts, and the learning step would
    # change the searches only through rounding.
    @jax.jit  # one program: op by op, every leaf's shape would compile its own
    def random_weights(params, key):
        leaves, treedef = jax.tree.flatten(params)
        return jax.tree.unflatten(treedef, [
            0.3 * jax.random.normal(k, x.shape, x.dtype)
            for k, x in zip(jax.random.split(key, len(leaves)), leaves)])

    shardings = jax.tree.map(lambda x: x.sharding, state.params)  # as init placed them
    params, target = (jax.device_put(random_weights(state.params, jax.random.key(4)), shardings)
                      for _ in range(2))
    state = state._replace(params=params, target_params=target)
    state, metrics = trainer.iteration(state)
    assert bool(metrics.learned)
    acted = jax.device_get(state.replay.data)  # rows 0..3, acted on with the initial params
    params = jax.device_get(state.params)
    state, _ = trainer.iteration(state)
    data = jax.device_get(state.replay.data)

    root_fn = make_root_fn(trainer.networks, trainer.value_support)
    recurrent_fn = make_recurrent_fn(trainer.networks, trainer.value_support,
                                     trainer.reward_support, discount=config.discount)
    obs = acted.observation[0, :, :4]  # [B, 4, ...], device 0
    legal = acted.legal_action_mask[0, :, :4]
    flat = obs.reshape((-1,) + obs.shape[2:])
    out = mctx.gumbel_muzero_policy(
        params, jax.random.key(0), root_fn(params, flat), recurrent_fn, num_simulations=4,
        invalid_actions=~legal.reshape(-1, legal.shape[-1]), gumbel_scale=0.0)
    expected_policy = np.asarray(out.action_weights).reshape(legal.shape)
    expected_value = np.asarray(out.search_tree.node_values[:, 0]).reshape(legal.shape[:2])
    running = ~acted.last[0, :, :4]
    assert running.sum() > 0
    np.testing.assert_allclose(data.search_policy[0, :, :4][running], expected_policy[running],
                               atol=1e-5)
    # The batch size changes the float rounding (the toy test above checks
    # values exactly).
    np.testing.assert_allclose(data.search_value[0, :, :4][running], expected_value[running],
                               atol=1e-4)
    # The learning step changed the targets: the test sees fresh ones, not the acted ones.
    assert np.max(np.abs(acted.search_policy[0, :, :4][running]
                         - expected_policy[running])) > 1e-3
    np.testing.assert_array_equal(data.observation[0, :, :4], acted.observation[0, :, :4])

