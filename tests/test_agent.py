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


TRACED = []


def recording_muzero_policy(params, rng_key, root, recurrent_fn, num_simulations,
                            invalid_actions=None, dirichlet_fraction=0.25, pb_c_init=1.25):
    """mctx's muzero_policy, recording each trace's simulations and kwargs."""
    TRACED.append((num_simulations, dirichlet_fraction, pb_c_init))
    return mctx.muzero_policy(params, rng_key, root, recurrent_fn, num_simulations,
                              invalid_actions=invalid_actions,
                              dirichlet_fraction=dirichlet_fraction, pb_c_init=pb_c_init)


def test_the_runs_evaluation_search_is_load_agents_and_the_trainers(saved, tmp_path):
    """A run that self-plays with Gumbel and evaluates with PUCT (`eval_search`):
    `load_agent` searches with PUCT and its kwargs, as mctx does by hand;
    `search=` still picks self-play's with its own kwargs; the trainer's
    evaluation runs that search, with evaluation's simulations."""
    import dataclasses

    _, _, state = saved
    puct_kwargs = '{"dirichlet_fraction": 0.0, "pb_c_init": 2.0}'
    config = dataclasses.replace(CONFIG, search="gumbel_muzero", search_kwargs="gumbel_scale=0.5",
                                 eval_search="muzero", eval_search_kwargs=puct_kwargs)
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    checkpointer.save(5, state, {"iteration": 5}, config)
    checkpointer.close()

    agent = muzero_jax.load_agent(tmp_path)
    assert (agent.config.search, agent.config.search_kwargs) == ("muzero", puct_kwargs)
    obs = jax.vmap(lambda k: agent.env.reset(k)[1].observation)(
        jax.random.split(jax.random.key(1), 5))
    key = jax.random.key(7)
    out = agent.search(obs, rng=key, num_simulations=6)
    trainer = agent.trainer
    root = make_root_fn(trainer.networks, trainer.value_support)(state.params, obs)
    rec = make_recurrent_fn(trainer.networks, trainer.value_support, trainer.reward_support,
                            discount=CONFIG.discount)
    ref = mctx.muzero_policy(state.params, key, root, rec, num_simulations=6,
                             invalid_actions=jnp.zeros((5, 3), bool), dirichlet_fraction=0.0,
                             pb_c_init=2.0)
    np.testing.assert_allclose(out.policy, ref.action_weights, atol=1e-5)
    np.testing.assert_allclose(out.value, ref.search_tree.node_values[:, 0], atol=1e-5)

    # Each search the run used keeps its own kwargs; kwargs alone go to evaluation's.
    for kwargs, (func, keywords) in [
        (dict(search="gumbel_muzero"), (mctx.gumbel_muzero_policy, {"gumbel_scale": 0.5})),
        (dict(search="muzero"), (mctx.muzero_policy, {"dirichlet_fraction": 0.0,
                                                      "pb_c_init": 2.0})),
        (dict(search_kwargs="pb_c_init=3"), (mctx.muzero_policy, {"pb_c_init": 3})),
    ]:
        other = muzero_jax.load_agent(tmp_path, **kwargs)
        for fn in (other.trainer.search_fn, other.trainer.eval_search_fn):
            assert fn.func is func and fn.keywords == keywords, kwargs

    trainer = make_train(config)
    assert trainer.search_fn.func is mctx.gumbel_muzero_policy
    assert trainer.eval_search_fn.func is mctx.muzero_policy
    assert trainer.eval_search_fn.keywords == {"dirichlet_fraction": 0.0, "pb_c_init": 2.0}
    # An Agent built on the run's own trainer searches with evaluation's search too.
    direct = Agent(config, trainer, state.params).search(obs, rng=key, num_simulations=6)
    np.testing.assert_allclose(direct.policy, ref.action_weights, atol=1e-5)
    # The trainer's evaluation runs the evaluation search (traced once, with
    # evaluation's simulations), and self-play does not.
    trainer = make_train(dataclasses.replace(
        config, eval_search=f"{__name__}:recording_muzero_policy", eval_num_simulations=5))
    TRACED.clear()
    returns = trainer.evaluate(state.params, jax.random.key(3))
    assert returns.shape == (CONFIG.eval_episodes,) and TRACED == [(5, 0.0, 2.0)]
    with pytest.raises(ValueError, match="eval_search 'muzero': .* does not take .* c_uct"):
        make_train(dataclasses.replace(config, eval_search_kwargs="c_uct=1"))


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
