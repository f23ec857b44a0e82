"""The measured property that docs/scale_gradient.md states, on a toy linear model.

The toy model has a linear representation `h_0 = obs @ W + b`, linear dynamics
`h_k = h_{k-1} @ D + c + S[a]` and linear heads reading `h_k`, so every
gradient of the unrolled loss can be written down by hand. With the paper's
scalings (the library's `unrolled_loss`), the step-k loss (k >= 1) sends into
h_0 exactly

    0.5 ** (k - 1) / K * g_k @ (D^T)^k,

where g_k is the gradient of the step-k heads' loss at their input h_k: one
1/K from the step's loss scale and one halving for each of h_1..h_{k-1} (the
state is halved *after* each recurrent step, so h_0 enters step 1 unscaled).
The dynamics application j <= k receives that gradient with 0.5 ** (k - j) / K.
Without the halving both lose their geometric factor (checked to fail), and the
total gradient of the dynamics grows like (K + 1) / 2 instead of staying below 2.
"""

import importlib.util
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax import LossBatch, NetworkOutput, Networks, make_support
from muzero_jax import unrolled_loss as library_loss

_PATH = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "gradient_scaling.py"
_spec = importlib.util.spec_from_file_location("gradient_scaling", _PATH)
gradient_scaling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gradient_scaling)

VALUE_SUPPORT = make_support(3)
REWARD_SUPPORT = make_support(2)
NUM_ACTIONS = 3
OBS, HIDDEN = 4, 5


def toy_networks() -> Networks:
    """The linear toy model as a `Networks` bundle (params are a plain dict)."""

    def representation(params, obs):
        return obs @ params["representation"]["w"] + params["representation"]["b"]

    def dynamics(params, hidden, action):
        d = params["dynamics"]
        nxt = hidden @ d["d"] + d["c"] + d["s"][action]
        return nxt, nxt @ params["reward"]["w"]

    def prediction(params, hidden):
        return hidden @ params["policy"]["w"], hidden @ params["value"]["w"]

    def initial_inference(params, obs):
        hidden = representation(params, obs)
        policy, value = prediction(params, hidden)
        zeros = jnp.zeros((obs.shape[0], REWARD_SUPPORT.num_bins))
        return NetworkOutput(hidden, zeros, policy, value)

    def recurrent_inference(params, hidden, action):
        nxt, reward = dynamics(params, hidden, action)
        policy, value = prediction(params, nxt)
        return NetworkOutput(nxt, reward, policy, value)

    return Networks(
        init=None, representation=representation, dynamics=dynamics, prediction=prediction,
        initial_inference=initial_inference, recurrent_inference=recurrent_inference,
        num_actions=NUM_ACTIONS, value_bins=VALUE_SUPPORT.num_bins,
        reward_bins=REWARD_SUPPORT.num_bins,
    )


def toy_params(seed, identity_dynamics=False):
    rng = np.random.default_rng(seed)
    n = lambda *shape: jnp.asarray(0.5 * rng.standard_normal(shape), jnp.float32)
    d = jnp.eye(HIDDEN) if identity_dynamics else jnp.eye(HIDDEN) * 0.8 + n(HIDDEN, HIDDEN) * 0.4
    return {
        "representation": {"w": n(OBS, HIDDEN), "b": jnp.zeros(HIDDEN)},
        "dynamics": {"d": d, "c": jnp.zeros(HIDDEN),
                     "s": jnp.zeros((NUM_ACTIONS, HIDDEN)) if identity_dynamics
                     else n(NUM_ACTIONS, HIDDEN)},
        "reward": {"w": n(HIDDEN, REWARD_SUPPORT.num_bins)},
        "policy": {"w": n(HIDDEN, NUM_ACTIONS)},
        "value": {"w": n(HIDDEN, VALUE_SUPPORT.num_bins)},
    }


def toy_batch(k, seed, same_targets=False):
    """One example (B = 1) unrolled k steps."""
    rng = np.random.default_rng(seed + 100)
    steps = 1 if same_targets else k + 1
    policy = rng.dirichlet(np.ones(NUM_ACTIONS), size=(1, steps))
    value = rng.uniform(-2, 2, (1, steps))
    reward = rng.uniform(-1, 1, (1, steps))
    if same_targets:
        policy, value, reward = (np.repeat(x, k + 1, axis=1) for x in (policy, value, reward))
    return LossBatch(
        observation=jnp.asarray(rng.standard_normal((1, OBS)), jnp.float32),
        actions=jnp.asarray(rng.integers(0, NUM_ACTIONS, (1, k)), jnp.int32),
        target_value=jnp.asarray(value, jnp.float32),
        target_reward=jnp.asarray(reward, jnp.float32),
        target_policy=jnp.asarray(policy, jnp.float32),
        value_mask=jnp.ones((1, k + 1)),
        reward_mask=jnp.ones((1, k + 1)),
        policy_mask=jnp.ones((1, k + 1)),
        importance_weight=jnp.ones((1,)),
    )


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def hand_gradients(params, batch):
    """Forward states and, per step, the heads' loss gradient g_k at h_k (numpy)."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    obs = np.asarray(batch.observation[0], np.float64)
    actions = np.asarray(batch.actions[0])
    value_probs = np.asarray(VALUE_SUPPORT.scalar_to_probs(batch.target_value[0]), np.float64)
    reward_probs = np.asarray(REWARD_SUPPORT.scalar_to_probs(batch.target_reward[0]), np.float64)
    policy = np.asarray(batch.target_policy[0], np.float64)
    hs = [obs @ p["representation"]["w"] + p["representation"]["b"]]
    for a in actions:
        hs.append(hs[-1] @ p["dynamics"]["d"] + p["dynamics"]["c"] + p["dynamics"]["s"][a])
    heads = []
    for k, h in enumerate(hs):
        # d CE(softmax(h @ W), t) / dh = W @ (softmax(h @ W) - t).
        g = 0.25 * p["value"]["w"] @ (softmax(h @ p["value"]["w"]) - value_probs[k])
        g = g + p["policy"]["w"] @ (softmax(h @ p["policy"]["w"]) - policy[k])
        if k > 0:
            g = g + p["reward"]["w"] @ (softmax(h @ p["reward"]["w"]) - reward_probs[k])
        heads.append(g)
    return hs, heads, p["dynamics"]["d"]


def expected_h0(heads, d, k, num_steps, hidden_scale=0.5, step_scale=None):
    """Gradient into h_0 from step k: `c_k * g_k @ (D^T)^k`, c_0 = 1."""
    step_scale = 1.0 / num_steps if step_scale is None else step_scale
    factor = 1.0 if k == 0 else hidden_scale ** (k - 1) * step_scale
    return factor * heads[k] @ np.linalg.matrix_power(d.T, k)


def expected_dynamics_bias(heads, d, k, num_steps, hidden_scale=0.5):
    """Gradient into the shared dynamics bias c from step k (all applications j <= k)."""
    return sum(
        hidden_scale ** (k - j) / num_steps * heads[k] @ np.linalg.matrix_power(d.T, k - j)
        for j in range(1, k + 1)
    )


def _toy_library(params, batch):
    return library_loss(params, batch, networks=toy_networks(), value_support=VALUE_SUPPORT,
                        reward_support=REWARD_SUPPORT)[0]


def _toy_variant(params, batch, **switches):
    return gradient_scaling.variant_loss(
        params, batch, networks=toy_networks(), value_support=VALUE_SUPPORT,
        reward_support=REWARD_SUPPORT, **switches,
    )[0]


def _per_step(loss_fn):
    """jit: the gradient of each step's loss alone, `[K+1, ...]` (masks one-hot)."""

    def grads(params, batch, *args):
        num_steps = batch.actions.shape[1]
        masked = jax.vmap(lambda k: only_step(batch, k))(jnp.arange(num_steps + 1))
        return jax.vmap(jax.grad(loss_fn), in_axes=(None, 0) + (None,) * len(args))(
            params, masked, *args
        )

    return jax.jit(grads)


def only_step(batch, k):
    """The batch with every loss term but step k's masked out."""
    m = jax.nn.one_hot(jnp.full(batch.value_mask.shape[:1], k), batch.value_mask.shape[1])
    return batch._replace(value_mask=m, reward_mask=m, policy_mask=m)


LIBRARY_PER_STEP = _per_step(_toy_library)
VARIANT_PER_STEP = _per_step(
    lambda p, b, hs, ss: _toy_variant(p, b, hidden_scale=hs, step_scale=ss)
)


@pytest.mark.parametrize("identity", [True, False])
def test_library_loss_gradient_from_step_k_is_half_to_the_k_minus_1_over_k(identity):
    num_steps = 4
    params = toy_params(int(identity), identity_dynamics=identity)
    batch = toy_batch(num_steps, seed=int(identity))
    _, heads, d = hand_gradients(params, batch)
    g = LIBRARY_PER_STEP(params, batch)
    for k in range(num_steps + 1):
        np.testing.assert_allclose(g["representation"]["b"][k],
                                   expected_h0(heads, d, k, num_steps), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(g["dynamics"]["c"][k],
                                   expected_dynamics_bias(heads, d, k, num_steps),
                                   rtol=1e-4, atol=1e-7)
        if identity and k >= 1:
            # D = I: step k's contribution into h_0 is exactly 0.5**(k-1)/K of its heads'.
            np.testing.assert_allclose(g["representation"]["b"][k],
                                       0.5 ** (k - 1) / num_steps * heads[k], rtol=1e-4)


def test_without_the_half_the_decay_is_gone():
    num_steps = 4
    params = toy_params(1, identity_dynamics=True)
    batch = toy_batch(num_steps, seed=1)
    _, heads, d = hand_gradients(params, batch)
    g = VARIANT_PER_STEP(params, batch, 1.0, 1.0 / num_steps)["representation"]["b"]
    for k in range(2, num_steps + 1):
        # Only the 1/K is left: the step-k gradient is g_k / K, not 0.5**(k-1) g_k / K.
        np.testing.assert_allclose(g[k], heads[k] / num_steps, rtol=1e-4)
        paper = expected_h0(heads, d, k, num_steps)
        assert np.linalg.norm(g[k] - paper) > 0.4 * np.linalg.norm(g[k])
        np.testing.assert_allclose(np.linalg.norm(paper) / np.linalg.norm(g[k]),
                                   0.5 ** (k - 1), rtol=1e-4)
    # Without the 1/K, step 1 sends its heads' gradient into h_0 unscaled.
    g = VARIANT_PER_STEP(params, batch, 0.5, 1.0)["representation"]["b"]
    np.testing.assert_allclose(g[1], heads[1], rtol=1e-4)
    np.testing.assert_allclose(g[3], 0.25 * heads[3], rtol=1e-4)


def test_total_dynamics_gradient_bounded_with_half_and_linear_without():
    # D = I, no shifts and equal targets: every recurrent step has the same heads'
    # gradient g, and the dynamics bias collects sum_k sum_{j<=k} s**(k-j) / K times g.
    # Unroll lengths K <= 8 share one compiled loss: steps after K get weight 0.
    max_steps, lengths = 8, np.array([1, 2, 4, 8])
    params = toy_params(1, identity_dynamics=True)
    batch = toy_batch(max_steps, seed=1, same_targets=True)
    _, heads, _ = hand_gradients(params, batch)
    chex.assert_trees_all_close(heads[1], heads[-1], rtol=1e-6)
    weights = jnp.asarray(np.arange(max_steps + 1)[None, :] <= lengths[:, None], jnp.float32)

    def total(hidden_scale, w, num_steps):
        return jax.grad(lambda p: _toy_variant(
            p, batch, hidden_scale=hidden_scale, step_scale=1.0 / num_steps, step_weights=w
        ))(params)["dynamics"]["c"]

    by_length = jax.vmap(total, in_axes=(None, 0, 0))
    paper, no_half = np.asarray(jax.jit(jax.vmap(by_length, in_axes=(0, None, None)))(
        jnp.array([0.5, 1.0]), weights, jnp.asarray(lengths, jnp.float32)
    ))
    for i, num_steps in enumerate(lengths):
        bounded = 2.0 - 2.0 / num_steps * (1.0 - 0.5**num_steps)
        np.testing.assert_allclose(paper[i], bounded * heads[1], rtol=1e-4)
        np.testing.assert_allclose(no_half[i], (num_steps + 1) / 2 * heads[1], rtol=1e-4)
        assert bounded < 2.0


def test_experiment_loss_mirrors_library_loss():
    # The experiment's switchable loss at the paper's switches is the library's
    # loss, value and gradient (two examples, importance weights, a policy mask).
    num_steps = 3
    params = toy_params(4)
    batch = jax.tree.map(lambda *x: jnp.concatenate(x), *(toy_batch(num_steps, s) for s in (3, 4)))
    batch = batch._replace(policy_mask=batch.policy_mask.at[1, -1].set(0.0),
                           importance_weight=jnp.array([1.0, 0.5]))

    @jax.jit
    def both(p):
        lib = jax.value_and_grad(_toy_library)(p, batch)
        var = jax.value_and_grad(_toy_variant)(p, batch)
        off = _toy_variant(p, batch, hidden_scale=1.0, step_scale=1.0)
        return lib, var, off

    lib, var, off = both(params)
    np.testing.assert_allclose(var[0], lib[0], rtol=1e-6)
    chex.assert_trees_all_close(var[1], lib[1], rtol=1e-5, atol=1e-7)
    # The forward value ignores the switches; only the gradient changes.
    np.testing.assert_allclose(off, lib[0], rtol=1e-6)


def test_step_weights_and_hidden_offset_isolate_one_step():
    # The experiment measures step k's gradient with one-hot step weights and the
    # gradient into h_0 through a zero offset: the same as the hand-derived value.
    num_steps = 4
    params = toy_params(2)
    batch = toy_batch(num_steps, seed=2)
    _, heads, d = hand_gradients(params, batch)
    g = jax.jit(jax.vmap(jax.grad(
        lambda o, w: _toy_variant(params, batch, step_weights=w, hidden_offset=o)
    ), in_axes=(None, 0)))(jnp.zeros((1, HIDDEN)), jnp.eye(num_steps + 1))
    for k in range(num_steps + 1):
        np.testing.assert_allclose(g[k, 0], expected_h0(heads, d, k, num_steps), rtol=1e-4,
                                   atol=1e-7)
