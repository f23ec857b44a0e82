"""`muzero_jax.load_agent`: search outputs, greedy actions, masks, loading from checkpoints."""

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

import muzero_jax
from muzero_jax.agent import Agent
from muzero_jax.checkpoint import Checkpointer, CheckpointError
from muzero_jax.learning import make_train
from muzero_jax.networks import MLPConfig
from muzero_jax.presets import preset
from muzero_jax.search import make_recurrent_fn, make_root_fn

CONFIG = preset(
    "catch", num_envs=8, rollout_length=4, batch_size=8, replay_ratio=1 / 32,
    num_simulations=4, replay_capacity=40, min_replay_steps=16, eval_every=0,
    eval_episodes=4, search="muzero",
    mlp=MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,)),
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    trainer = make_train(CONFIG)
    state = trainer.init(jax.random.key(0))
    logdir = tmp_path_factory.mktemp("agent")
    checkpointer = Checkpointer(logdir / "checkpoints")
    checkpointer.save(5, state, {"iteration": 5}, CONFIG)
    checkpointer.close()
    return logdir, trainer, state


def test_load_agent_restores_params(saved):
    logdir, _, state = saved
    for path in (logdir, logdir / "checkpoints", logdir / "checkpoints" / "5"):
        agent = muzero_jax.load_agent(path)
        assert agent.step == 5 and agent.config == CONFIG and agent.env.name == "catch"
        for a, b in zip(jax.tree.leaves(agent.params), jax.tree.leaves(state.params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(CheckpointError, match="not a directory|no checkpoint"):
        muzero_jax.load_agent(logdir / "checkpoints" / "missing")


def test_search_matches_mctx_and_act_is_most_visited(saved):
    _, trainer, state = saved
    agent = Agent(CONFIG, trainer, state.params)
    obs = jax.vmap(lambda k: trainer.env.reset(k)[1].observation)(
        jax.random.split(jax.random.key(1), 5))
    key = jax.random.key(7)
    out = agent.search(obs, rng=key, num_simulations=6)
    assert out.action.shape == (5,) and out.value.shape == (5,) and out.policy.shape == (5, 3)
    # The same search run directly through mctx, with the same key.
    root = make_root_fn(trainer.networks, trainer.value_support)(state.params, obs)
    rec = make_recurrent_fn(trainer.networks, trainer.value_support, trainer.reward_support,
                            discount=CONFIG.discount)
    ref = mctx.muzero_policy(state.params, key, root, rec, num_simulations=6,
                             invalid_actions=jnp.zeros((5, 3), bool))
    visits = np.asarray(ref.search_tree.summary().visit_counts)
    np.testing.assert_allclose(out.policy, ref.action_weights, atol=1e-5)
    np.testing.assert_allclose(out.value, ref.search_tree.node_values[:, 0], atol=1e-5)
    assert visits.sum(axis=1).tolist() == [6] * 5
    chosen = visits[np.arange(5), np.asarray(out.action)]
    np.testing.assert_array_equal(chosen, visits.max(axis=1))
    np.testing.assert_array_equal(agent.act(obs, rng=key, num_simulations=6), out.action)
    assert set(agent._compiled) == {6}  # one program per simulation count
    # Only legal actions are taken; one observation without a batch axis works too.
    mask = np.zeros((5, 3), bool)
    mask[:, 2] = True
    assert agent.act(obs, mask).tolist() == [2] * 5
    single = agent.search(obs[0], np.array([True, False, False]))
    assert single.action.shape == () and int(single.action) == 0
    with pytest.raises(ValueError, match="observation must have shape"):
        agent.act(np.zeros((5, 7)))
