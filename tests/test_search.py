"""Tests of the mctx adapter: root/recurrent functions, resolver, checks."""

import functools

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from muzero_jax import (
    BUILTIN_SEARCHES,
    NetworkOutput,
    Networks,
    make_recurrent_fn,
    make_root_fn,
    make_support,
    resolve_search,
)
from muzero_jax.search import batch_search, check_search_fn

SUPPORT = make_support(3)
NUM_ACTIONS = 4
BEST = 2


def _log_probs(x):
    return jnp.log(SUPPORT.scalar_to_probs(x) + 1e-30)


def bandit_networks(rewards=(0.0, 0.1, 1.0, 0.0)):
    """A one-step bandit: the hidden state is a step counter; the reward of
    action a is `rewards[a]` on the first step, 0 afterwards; all values 0,
    priors uniform."""
    rewards = jnp.asarray(rewards)

    def representation(params, obs):
        return jnp.zeros((obs.shape[0], 1))

    def dynamics(params, hidden, action):
        r = jnp.where(hidden[:, 0] == 0, rewards[action], 0.0)
        return hidden + 1, _log_probs(r)

    def prediction(params, hidden):
        b = hidden.shape[0]
        return jnp.zeros((b, NUM_ACTIONS)), _log_probs(jnp.zeros((b,)))

    def initial_inference(params, obs):
        h = representation(params, obs)
        p, v = prediction(params, h)
        return NetworkOutput(h, jnp.zeros_like(v), p, v)

    def recurrent_inference(params, hidden, action):
        h, r = dynamics(params, hidden, action)
        p, v = prediction(params, h)
        return NetworkOutput(h, r, p, v)

    return Networks(None, representation, dynamics, prediction, initial_inference,
                    recurrent_inference, NUM_ACTIONS, SUPPORT.num_bins, SUPPORT.num_bins)


def _run(search, *, two_player=False, invalid=None, num_simulations=32, batch=3):
    nets = bandit_networks()
    root_fn = make_root_fn(nets, SUPPORT)
    rec_fn = make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=0.9, two_player=two_player)
    legal = jnp.ones((batch, NUM_ACTIONS), bool) if invalid is None else ~invalid
    run = jax.jit(batch_search(search, root_fn, rec_fn, num_simulations=num_simulations))
    return run({}, jax.random.key(0), jnp.zeros((batch, 2)), legal)


def test_root_and_recurrent_outputs():
    nets = bandit_networks()
    root = make_root_fn(nets, SUPPORT)({}, jnp.zeros((2, 5)))
    np.testing.assert_allclose(root.value, 0.0, atol=1e-5)
    rec = make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=0.9)
    out, emb = rec({}, jax.random.key(0), jnp.array([2, 1]), root.embedding)
    np.testing.assert_allclose(out.reward, [1.0, 0.1], atol=1e-3)
    np.testing.assert_allclose(out.discount, [0.9, 0.9])
    np.testing.assert_array_equal(emb, 1.0)
    rec2 = make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=1.0, two_player=True)
    out2, _ = rec2({}, jax.random.key(0), jnp.array([2, 1]), root.embedding)
    np.testing.assert_allclose(out2.discount, [-1.0, -1.0])


@pytest.mark.parametrize("name", ["muzero", "gumbel_muzero"])
def test_builtin_searches_find_the_best_arm(name):
    # Without root noise the visit counts must concentrate on the best arm.
    no_noise = {"dirichlet_fraction": 0.0} if name == "muzero" else {}
    out = _run(resolve_search(name, no_noise))
    assert np.all(np.argmax(out.action_weights, -1) == BEST)
    if name == "gumbel_muzero":  # deterministic given the Gumbel noise
        np.testing.assert_array_equal(out.action, BEST)
    greedy = _run(resolve_search(name, {"temperature": 0.0, **no_noise} if no_noise else {}))
    np.testing.assert_array_equal(greedy.action, BEST)


def test_invalid_actions_are_never_chosen():
    invalid = jnp.zeros((3, NUM_ACTIONS), bool).at[:, BEST].set(True)
    greedy_muzero = resolve_search("muzero", {"temperature": 0.0, "dirichlet_fraction": 0.0})
    for fn in (greedy_muzero, resolve_search("gumbel_muzero")):
        out = _run(fn, invalid=invalid)
        np.testing.assert_array_equal(out.action, 1)  # the next best arm
        np.testing.assert_allclose(out.action_weights[:, BEST], 0.0)


def test_search_kwargs_are_bound():
    fn = resolve_search("muzero", {"dirichlet_fraction": 0.0, "temperature": 0.0})
    assert isinstance(fn, functools.partial)
    assert fn.keywords == {"dirichlet_fraction": 0.0, "temperature": 0.0}
    out = _run(fn)
    np.testing.assert_array_equal(out.action, BEST)


def test_resolve_module_attr_and_callable():
    assert resolve_search("mctx:gumbel_muzero_policy") is mctx.gumbel_muzero_policy
    assert resolve_search(mctx.muzero_policy) is mctx.muzero_policy
    assert set(BUILTIN_SEARCHES) >= {"muzero", "gumbel_muzero"}


@pytest.mark.parametrize(
    "spec,message",
    [
        ("nope", "unknown search 'nope'; built-in searches: .*gumbel_muzero"),
        ("no_such_module_xyz:fn", "does not import"),
        ("mctx:not_there", "has no attribute 'not_there'"),
        ("mctx:__name__", "not a callable"),
        (":attr", "must look like"),
        ("", "must be a name"),
    ],
)
def test_resolve_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_search(spec)


def test_check_search_fn_reports_bad_searches():
    nets = bandit_networks()
    root_fn = make_root_fn(nets, SUPPORT)
    rec_fn = make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=0.9)
    obs = jnp.zeros((2, 3))
    legal = jnp.ones((2, NUM_ACTIONS), bool)
    check = functools.partial(check_search_fn, root_fn=root_fn, recurrent_fn=rec_fn, params={},
                              observation=obs, legal_action_mask=legal, num_simulations=4)
    check(mctx.gumbel_muzero_policy)

    def no_kwargs(params, rng_key, root, recurrent_fn):
        return None

    with pytest.raises(ValueError, match="policy signature"):
        check(no_kwargs)

    def wrong_output(params, rng_key, root, recurrent_fn, *, num_simulations, invalid_actions):
        return root.value

    with pytest.raises(ValueError, match="must return mctx.PolicyOutput"):
        check(wrong_output)


def test_bad_discount():
    with pytest.raises(ValueError, match="discount"):
        make_recurrent_fn(bandit_networks(), SUPPORT, SUPPORT, discount=1.5)
