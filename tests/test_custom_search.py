"""The user-written search of experiments/custom_search.py, plugged into training."""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SPEC = "experiments.custom_search:ucb_policy"

TINY = dict(
    num_envs=8, rollout_length=4, batch_size=8, replay_ratio=1 / 32, num_simulations=4,
    replay_capacity=40, min_replay_steps=8, eval_every=0, eval_episodes=4,
)


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    # `experiments` is a directory of the repository, importable from its root.
    monkeypatch.syspath_prepend(str(REPO))


def _ucb_policy():
    from experiments.custom_search import ucb_policy

    return ucb_policy


def test_ucb_policy_tries_every_legal_root_action_then_finds_the_best():
    # One-step bandits: arm a pays payout[b, a] and ends the episode; the prior
    # points at a poor arm. Arm 3 of example 1 is illegal (and the best there).
    payout = jnp.array([[0.1, 0.9, 0.3, 0.5], [0.2, 0.6, 0.0, 1.0]])
    invalid = jnp.array([[0, 0, 0, 0], [0, 0, 0, 1]], bool)
    batch, num_actions = payout.shape

    def recurrent_fn(params, rng_key, action, embedding):
        del params, rng_key, embedding
        out = mctx.RecurrentFnOutput(
            reward=payout[jnp.arange(batch), action], discount=jnp.zeros(batch),
            prior_logits=jnp.zeros((batch, num_actions)), value=jnp.zeros(batch),
        )
        return out, jnp.zeros((batch, 1))

    root = mctx.RootFnOutput(
        prior_logits=jnp.array([[0.0, 0.0, 3.0, 1.0], [3.0, 0.0, 1.0, 0.0]]),
        value=jnp.zeros(batch), embedding=jnp.zeros((batch, 1)),
    )
    search = jax.jit(
        lambda key: _ucb_policy()(
            None, key, root, recurrent_fn, num_simulations=12, invalid_actions=invalid,
            greedy=True,
        ),
        compiler_options={"xla_backend_optimization_level": 0},
    )
    out = search(jax.random.key(0))
    tree = out.search_tree
    # Node i + 1 is created by simulation i: the first simulations try the legal
    # root actions in prior order (example 0: 2, 3, 0, 1; example 1: 0, 2, 1).
    np.testing.assert_array_equal(tree.parents[:, 1:4], 0)
    np.testing.assert_array_equal(tree.action_from_parent[:, 1:4], [[2, 3, 0], [0, 2, 1]])
    visits = np.asarray(tree.children_visits[:, 0])
    assert visits.sum(-1).tolist() == [12, 12]
    assert (visits[0] >= 1).all() and (visits[1, :3] >= 1).all() and visits[1, 3] == 0
    np.testing.assert_array_equal(visits.argmax(-1), [1, 1])  # the best legal arms
    np.testing.assert_array_equal(out.action, [1, 1])
    np.testing.assert_allclose(out.action_weights, visits / 12)


def test_custom_search_resolves_from_a_module_path():
    from muzero_jax.search import resolve_search

    fn = resolve_search(SPEC, {"c_uct": 0.5})
    assert fn.func is _ucb_policy() and fn.keywords == {"c_uct": 0.5}


def _config():
    from muzero_jax.presets import preset

    return preset("catch", seed=3, search_kwargs='{"c_uct": 0.5}', **TINY)


def _train(trainer, seed, num_iterations=5):
    """Runs a few iterations; returns the final params and the losses of learning ones."""
    state = trainer.init(jax.random.key(seed))
    losses = []
    for _ in range(num_iterations):
        state, metrics = trainer.iteration(state)
        metrics = jax.device_get(metrics)
        assert bool(metrics.finite)
        if bool(metrics.learned):
            losses.append(float(metrics.loss))
    return jax.device_get(state.params), losses


def test_trains_with_the_custom_search_given_from_python():
    from muzero_jax.learning import make_train

    config = _config()
    trainer = make_train(config, search_fn=_ucb_policy())
    # search_kwargs from the config are bound to the function given in Python.
    assert trainer.search_fn.func is _ucb_policy()
    assert trainer.search_fn.keywords == {"c_uct": 0.5}
    _, losses = _train(trainer, config.seed)
    assert len(losses) >= 2  # learning ran (and stayed finite)


def test_config_string_builds_the_same_trainer():
    """Through the config string: resolved, kwargs bound, checked (no compile)."""
    from muzero_jax.learning import make_train

    trainer = make_train(dataclasses.replace(_config(), search=SPEC))
    assert trainer.search_fn.func is _ucb_policy()
    assert trainer.search_fn.keywords == {"c_uct": 0.5}
    with pytest.raises(ValueError, match="does not take the keyword argument.s. c_puct"):
        make_train(dataclasses.replace(_config(), search=SPEC, search_kwargs="c_puct=1"))


@pytest.mark.slow
def test_trains_identically_from_python_and_from_the_config_string():
    """Same seed, search given as a function or as a string: bit-identical runs."""
    from muzero_jax.learning import make_train

    config = _config()
    params_a, losses_a = _train(make_train(config, search_fn=_ucb_policy()), config.seed)
    params_b, losses_b = _train(make_train(dataclasses.replace(config, search=SPEC)), config.seed)
    assert len(losses_a) >= 2
    assert losses_a == losses_b
    for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
        np.testing.assert_array_equal(a, b)
