"""Fidelity of the unrolled loss to the MuZero pseudocode's `update_weights`."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax import (
    LossBatch,
    MLPConfig,
    ResNetConfig,
    make_networks,
    make_support,
    unrolled_loss,
)

NUM_ACTIONS = 3
# These tests are dominated by compiling; XLA's backend optimisations only slow that down.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
VALUE_SUPPORT = make_support(5)
REWARD_SUPPORT = make_support(3)


def _networks(kind):
    if kind == "mlp":
        cfg = MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,))
        obs_shape = (6,)
    else:
        cfg = ResNetConfig(
            channels=4, num_blocks=1, downsample=False, head_channels=2, head_hidden_sizes=(8,)
        )
        obs_shape = (4, 3, 2)
    nets = make_networks(
        cfg,
        num_actions=NUM_ACTIONS,
        value_bins=VALUE_SUPPORT.num_bins,
        reward_bins=REWARD_SUPPORT.num_bins,
    )
    return nets, obs_shape


# The draws below are jitted: run op by op, each new shape would compile a
# program of its own.
def _random_params(nets, obs_shape, seed):
    @jit
    def draw(init_key, leaf_key):
        params = nets.init(init_key, jnp.zeros((1,) + obs_shape))
        # Heads are zero-initialised; randomise every leaf so that every path
        # through the networks carries gradient.
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(leaf_key, len(leaves))
        leaves = [0.5 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
        return jax.tree.unflatten(treedef, leaves)

    return draw(jax.random.key(seed), jax.random.key(seed + 1000))


@functools.partial(jit, static_argnums=(0, 1, 2))
def _random_batch(obs_shape, batch, k, seed):
    ks = jax.random.split(jax.random.key(seed), 8)
    policy = jax.nn.softmax(jax.random.normal(ks[2], (batch, k + 1, NUM_ACTIONS)))
    policy_mask = (jax.random.uniform(ks[5], (batch, k + 1)) > 0.3).astype(jnp.float32)
    return LossBatch(
        observation=jax.random.normal(ks[0], (batch,) + obs_shape),
        actions=jax.random.randint(ks[1], (batch, k), 0, NUM_ACTIONS),
        target_value=jax.random.uniform(ks[3], (batch, k + 1), minval=-3, maxval=3),
        target_reward=jax.random.uniform(ks[4], (batch, k + 1), minval=-1, maxval=1),
        target_policy=policy,
        value_mask=jnp.ones((batch, k + 1)),
        reward_mask=jnp.ones((batch, k + 1)),
        policy_mask=policy_mask,
        importance_weight=jnp.ones((batch,)),
    )


def pseudocode_loss(params, batch, nets, *, hidden_scale=0.5, late_binding=False,
                    value_loss_weight=0.25):
    """A literal transcription of the pseudocode's `update_weights` loss.

    The pseudocode loops over the batch and sums; here the per-example body is
    transcribed literally (Python loop over the actions, scale_gradient written
    inline) and `jax.vmap` replaces the loop over the batch (one trace instead
    of B, same arithmetic). Averaged over the batch, as the library does.
    """

    def sg(x, s):
        return x * s + jax.lax.stop_gradient(x) * (1 - s)

    def scalar_loss(logits, target, support):
        probs = support.scalar_to_probs(jax.lax.stop_gradient(target))
        return -jnp.sum(probs * jax.nn.log_softmax(logits))

    def example_loss(image, actions, target_value, target_reward, target_policy, policy_mask):
        loss = 0.0
        out = nets.initial_inference(params, image[None])
        hidden_state = out.hidden
        predictions = [(1.0, out.value_logits, None, out.policy_logits)]
        actions = [actions[i : i + 1] for i in range(actions.shape[0])]
        for action in actions:
            out = nets.recurrent_inference(params, hidden_state, action)
            predictions.append((1.0 / len(actions), out.value_logits, out.reward_logits,
                                out.policy_logits))
            hidden_state = sg(out.hidden, hidden_scale)
        if late_binding:  # The bug seen in ports: every step gets the last scale.
            predictions = [(predictions[-1][0],) + p[1:] for p in predictions]
        for k, prediction in enumerate(predictions):
            gradient_scale, value, reward, policy_logits = prediction
            l = value_loss_weight * scalar_loss(value[0], target_value[k], VALUE_SUPPORT)
            if reward is not None:
                l += scalar_loss(reward[0], target_reward[k], REWARD_SUPPORT)
            # Absorbing states past the end of an episode have no policy target.
            l += policy_mask[k] * -jnp.sum(target_policy[k] * jax.nn.log_softmax(policy_logits[0]))
            loss += sg(l, gradient_scale)
        return loss

    losses = jax.vmap(example_loss)(
        batch.observation, batch.actions, batch.target_value, batch.target_reward,
        batch.target_policy, batch.policy_mask,
    )
    return jnp.sum(losses) / batch.actions.shape[0]


def _library_loss(params, batch, nets):
    return unrolled_loss(
        params, batch, networks=nets, value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT
    )[0]


def _max_rel_diff(a, b):
    diffs = jax.tree.map(lambda x, y: jnp.max(jnp.abs(x - y)) / (jnp.max(jnp.abs(y)) + 1e-12),
                         a, b)
    return float(max(jax.tree.leaves(diffs)))


# The default run checks K = 1 for both networks and K = 5 for the MLP (the
# loss code is the same for both; only the networks differ); the rest is slow.
@pytest.mark.parametrize("kind, k", [
    ("mlp", 1), ("resnet", 1), ("mlp", 5),
    pytest.param("resnet", 5, marks=pytest.mark.slow),
    pytest.param("mlp", 3, marks=pytest.mark.slow),
    pytest.param("resnet", 3, marks=pytest.mark.slow),
])
def test_gradients_match_pseudocode(kind, k):
    nets, obs_shape = _networks(kind)
    both = jit(lambda p, b: (
        jax.value_and_grad(_library_loss)(p, b, nets),
        jax.value_and_grad(pseudocode_loss)(p, b, nets),
    ))
    for seed in range(2):
        params = _random_params(nets, obs_shape, seed)
        batch = _random_batch(obs_shape, 4, k, seed + 7)
        (lib_loss, lib_grads), (ref_loss, ref_grads) = both(params, batch)
        np.testing.assert_allclose(lib_loss, ref_loss, rtol=2e-5)
        chex.assert_trees_all_close(lib_grads, ref_grads, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("kind", ["mlp", pytest.param("resnet", marks=pytest.mark.slow)])
def test_gradients_differ_without_the_half(kind):
    # The comparison above can fail: drop the 0.5 on the hidden state, or bind
    # the per-step scale late, and the gradients no longer match.
    nets, obs_shape = _networks(kind)
    params = _random_params(nets, obs_shape, 3)
    batch = _random_batch(obs_shape, 4, 5, 11)
    lib, ok, no_half, late, lib_value, no_half_value = jit(lambda p: (
        jax.grad(_library_loss)(p, batch, nets),
        jax.grad(pseudocode_loss)(p, batch, nets),
        jax.grad(lambda q: pseudocode_loss(q, batch, nets, hidden_scale=1.0))(p),
        jax.grad(lambda q: pseudocode_loss(q, batch, nets, late_binding=True))(p),
        _library_loss(p, batch, nets),
        pseudocode_loss(p, batch, nets, hidden_scale=1.0),
    ))(params)
    assert _max_rel_diff(lib, ok) < 1e-3
    assert _max_rel_diff(lib, no_half) > 1e-2
    assert _max_rel_diff(lib, late) > 1e-2
    # The forward value does not depend on the gradient scales.
    np.testing.assert_allclose(lib_value, no_half_value, rtol=2e-5)


class UnrolledLossTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_metrics_and_masks(self):
        nets, obs_shape = _networks("mlp")
        params = _random_params(nets, obs_shape, 0)
        batch = _random_batch(obs_shape, 5, 3, 1)
        fn = self.variant(
            lambda p, b: unrolled_loss(
                p, b, networks=nets, value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT
            )
        )
        loss, metrics = fn(params, batch)
        np.testing.assert_allclose(metrics.loss, loss)
        np.testing.assert_allclose(
            loss, 0.25 * metrics.value_loss + metrics.reward_loss + metrics.policy_loss, rtol=1e-5
        )
        chex.assert_shape(metrics.value_error, (4,))
        chex.assert_shape(metrics.predicted_value, (5,))
        # Masking every term leaves nothing to learn.
        zeros = jnp.zeros_like(batch.value_mask)
        masked = batch._replace(value_mask=zeros, reward_mask=zeros, policy_mask=zeros)
        loss0, _ = fn(params, masked)
        np.testing.assert_allclose(loss0, 0.0, atol=1e-7)

    def test_importance_weights_scale_each_example(self):
        nets, obs_shape = _networks("mlp")
        params = _random_params(nets, obs_shape, 0)
        batch = _random_batch(obs_shape, 3, 2, 2)
        f = lambda b: unrolled_loss(
            params, b, networks=nets, value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT
        )[0]
        w = jnp.array([0.2, 1.0, 3.0])
        # One program (op by op, the vmapped loss runs thousands of small operations).
        per_example, weighted = jit(lambda b: (
            jax.vmap(lambda e: f(jax.tree.map(lambda x: x[None], e)))(b),
            f(b._replace(importance_weight=w))))(batch)
        np.testing.assert_allclose(weighted, jnp.mean(w * per_example), rtol=1e-5)

    def test_bad_shapes_raise(self):
        nets, obs_shape = _networks("mlp")
        params = _random_params(nets, obs_shape, 0)
        batch = _random_batch(obs_shape, 2, 2, 0)
        with self.assertRaises(AssertionError):
            unrolled_loss(
                params, batch._replace(target_value=batch.target_value[:, :2]),
                networks=nets, value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT,
            )
        with self.assertRaisesRegex(ValueError, "K must be >= 1"):
            unrolled_loss(
                params, batch._replace(actions=batch.actions[:, :0]),
                networks=nets, value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT,
            )


@functools.cache
def _compiled_loss_and_grads(nets, kwargs_items):
    """The jitted `value_and_grad` of the library loss, once per networks and
    keyword arguments (compiling the tiny networks' loss is far cheaper than
    running its thousands of operations one by one)."""
    return jit(jax.value_and_grad(
        lambda p, b: unrolled_loss(p, b, networks=nets, value_support=VALUE_SUPPORT,
                                   reward_support=REWARD_SUPPORT, **dict(kwargs_items)),
        has_aux=True))


def _loss_and_grads(params, batch, nets, **kwargs):
    """`((loss, metrics), grads)` of the library loss with extra keyword arguments."""
    return _compiled_loss_and_grads(nets, tuple(sorted(kwargs.items())))(params, batch)


def test_rolled_and_unrolled_loops_agree():
    """`unroll=True` (the default: K steps inlined) computes what the rolled
    `lax.scan` (unroll=1) computes: loss, metrics and gradients."""
    nets, obs_shape = _networks("mlp")
    params = _random_params(nets, obs_shape, 3)
    batch = _random_batch(obs_shape, 4, 4, 11)

    (loss_a, metrics_a), grads_a = _loss_and_grads(params, batch, nets, unroll=True)
    (loss_b, metrics_b), grads_b = _loss_and_grads(params, batch, nets, unroll=1)
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-5)
    chex.assert_trees_all_close(metrics_a, metrics_b, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(grads_a, grads_b, rtol=1e-4, atol=1e-6)
    # ...and the comparison can fail: a different unroll length is a different loss.
    other = _random_batch(obs_shape, 4, 3, 11)
    loss_c = _loss_and_grads(params, other, nets)[0][0]
    assert not np.isclose(loss_a, loss_c)


def test_reward_loss_weight_scales_the_reward_term_and_its_gradient():
    nets, obs_shape = _networks("mlp")
    params = _random_params(nets, obs_shape, 0)
    batch = _random_batch(obs_shape, 4, 3, 5)

    (loss1, m1), g1 = _loss_and_grads(params, batch, nets, reward_loss_weight=1.0)
    (loss3, m3), g3 = _loss_and_grads(params, batch, nets, reward_loss_weight=3.0)
    np.testing.assert_allclose(m3.reward_loss, m1.reward_loss)  # the metric is unweighted
    np.testing.assert_allclose(
        loss3, 0.25 * m1.value_loss + 3.0 * m1.reward_loss + m1.policy_loss, rtol=1e-5)
    # Only the reward term reads the reward head: its gradient is 3x, the
    # value and policy heads' are unchanged.
    for name in g1:
        if name.startswith("reward"):
            for leaf in g1[name]:
                np.testing.assert_allclose(g3[name][leaf], 3.0 * g1[name][leaf], rtol=1e-4,
                                           atol=1e-7)
        elif name.startswith(("value", "policy")):
            for leaf in g1[name]:
                np.testing.assert_allclose(g3[name][leaf], g1[name][leaf], rtol=1e-5,
                                           atol=1e-7)
    assert any(n.startswith("reward") for n in g1)


def _check_term(params, batch, nets, expected, metric, weight, **kwargs):
    """The library loss with one extra term (`kwargs`) equals `expected` in value
    and gradients, and exceeds the loss without it by `weight` x its unweighted
    metric, which is 0 without the term. Returns `(loss, grads, base_grads)`."""
    (loss, metrics), grads = _loss_and_grads(params, batch, nets, **kwargs)
    ref_loss, ref_grads = jit(jax.value_and_grad(expected))(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=2e-4, atol=2e-6)
    (base, base_metrics), base_grads = _loss_and_grads(params, batch, nets)
    np.testing.assert_allclose(loss - base, weight * getattr(metrics, metric), rtol=1e-4)
    assert getattr(base_metrics, metric) == 0.0 and float(getattr(metrics, metric)) != 0.0
    return loss, grads, base_grads


def _consistency_transcription(params, batch, nets, weight, stop_target=True):
    """EfficientZero's consistency term written out per example and step:
    `-weight * cos(predictor(projection(s_k)), sg(projection(h(o_k))))`,
    counted where the action before step k was taken in the episode, each
    step's term scaled by 1/K and the hidden state by 0.5 as in the loss."""

    def sg(x, s):
        return x * s + jax.lax.stop_gradient(x) * (1 - s)

    def example(image, actions, next_images, policy_mask):
        num_steps = actions.shape[0]
        hidden = nets.initial_inference(params, image[None]).hidden
        total = 0.0
        for k in range(num_steps):
            out = nets.recurrent_inference(params, hidden, actions[k:k + 1])
            _, predicted = nets.projection(params, out.hidden)
            target, _ = nets.projection(params, nets.representation(params, next_images[k:k + 1]))
            if stop_target:
                target = jax.lax.stop_gradient(target)
            cos = jnp.sum(predicted * target) / (jnp.linalg.norm(predicted)
                                                  * jnp.linalg.norm(target))
            total += sg(-weight * cos * policy_mask[k], 1.0 / num_steps)
            hidden = sg(out.hidden, 0.5)
        return total

    return jnp.mean(jax.vmap(example)(batch.observation, batch.actions,
                                      batch.next_observation, batch.policy_mask))


def test_consistency_loss_matches_a_transcription():
    cfg = MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,))
    nets = make_networks(cfg, num_actions=NUM_ACTIONS, value_bins=VALUE_SUPPORT.num_bins,
                         reward_bins=REWARD_SUPPORT.num_bins, projection_size=4)
    obs_shape = (6,)
    params = _random_params(nets, obs_shape, 2)
    assert params["predictor_out"]["w"].shape == (4, 4)
    k = 3
    batch = _random_batch(obs_shape, 5, k, 9)
    batch = batch._replace(
        next_observation=jax.random.normal(jax.random.key(4), (5, k) + obs_shape))
    assert float(jnp.min(batch.policy_mask[:, :k])) == 0.0  # the mask is exercised

    def expected(p):
        return pseudocode_loss(p, batch, nets) + _consistency_transcription(p, batch, nets, 2.0)

    _, grads, _ = _check_term(params, batch, nets, expected, "consistency_loss", 2.0,
                              consistency_loss_weight=2.0)
    # ...and it can fail: without the stop-gradient on the target branch the
    # representation's gradient changes.
    no_stop_grads = jit(jax.grad(lambda p: pseudocode_loss(p, batch, nets) + (
        _consistency_transcription(p, batch, nets, 2.0, stop_target=False))))(params)
    assert _max_rel_diff(no_stop_grads["representation_out"], grads["representation_out"]) > 1e-2
    with pytest.raises(ValueError, match="projection_size"):
        unrolled_loss(params, batch, networks=_networks("mlp")[0], value_support=VALUE_SUPPORT,
                      reward_support=REWARD_SUPPORT, consistency_loss_weight=1.0)
    with pytest.raises(ValueError, match="next_observation"):
        unrolled_loss(params, batch._replace(next_observation=None), networks=nets,
                      value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT,
                      consistency_loss_weight=1.0)


def _reconstruction_transcription(params, batch, nets, weight, mask_shift=0):
    """The reconstruction term written out per example and step:
    `weight * sum((decoder(s_k) - o_k)^2)` at k = 0 (the representation's
    hidden state against the observation, counted where step 0's policy
    counts) and at k = 1..K (the dynamics' hidden state against the
    observation after action k-1, counted where that action was taken in the
    episode), the recurrent steps' terms scaled by 1/K and the hidden state
    by 0.5 as in the loss. `mask_shift` 1 reads step k's mask instead (wrong)."""

    def sg(x, s):
        return x * s + jax.lax.stop_gradient(x) * (1 - s)

    def sq(decoded, target):
        return jnp.sum((decoded - target) ** 2)

    def example(image, actions, next_images, policy_mask):
        num_steps = actions.shape[0]
        hidden = nets.initial_inference(params, image[None]).hidden
        total = weight * sq(nets.decoder(params, hidden)[0], image) * policy_mask[0]
        for k in range(num_steps):
            out = nets.recurrent_inference(params, hidden, actions[k:k + 1])
            term = weight * sq(nets.decoder(params, out.hidden)[0], next_images[k])
            total += sg(term * policy_mask[k + mask_shift], 1.0 / num_steps)
            hidden = sg(out.hidden, 0.5)
        return total

    return jnp.mean(jax.vmap(example)(batch.observation, batch.actions,
                                      batch.next_observation, batch.policy_mask))


@pytest.mark.parametrize("kind", ["mlp", "resnet"])
def test_reconstruction_loss_matches_a_transcription(kind):
    base_nets, obs_shape = _networks(kind)
    cfg = (MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,)) if kind == "mlp"
           else ResNetConfig(channels=4, num_blocks=1, downsample=False, head_channels=2,
                             head_hidden_sizes=(8,)))
    nets = make_networks(cfg, num_actions=NUM_ACTIONS, value_bins=VALUE_SUPPORT.num_bins,
                         reward_bins=REWARD_SUPPORT.num_bins, observation_shape=obs_shape)
    params = _random_params(nets, obs_shape, 2)
    # The decoder maps the (flattened) hidden state to the observation's size.
    assert params["decoder_out"]["w"].shape[-1] == int(np.prod(obs_shape))
    hidden = nets.representation(params, jnp.zeros((2,) + obs_shape))
    assert nets.decoder(params, hidden).shape == (2,) + obs_shape
    # The other parameters are drawn as without the decoder.
    plain = base_nets.init(jax.random.key(7), jnp.zeros((1,) + obs_shape))
    with_decoder = nets.init(jax.random.key(7), jnp.zeros((1,) + obs_shape))
    assert set(with_decoder) - set(plain) == {"decoder_linear_0", "decoder_norm_0", "decoder_out"}
    chex.assert_trees_all_equal(plain, {n: with_decoder[n] for n in plain})
    k = 3
    batch = _random_batch(obs_shape, 5, k, 9)
    batch = batch._replace(
        next_observation=jax.random.normal(jax.random.key(4), (5, k) + obs_shape))
    assert float(jnp.min(batch.policy_mask[:, :k])) == 0.0  # the mask is exercised

    def expected(p, shift=0):
        return pseudocode_loss(p, batch, nets) + _reconstruction_transcription(
            p, batch, nets, 0.5, shift)

    loss, grads, base_grads = _check_term(params, batch, nets, expected, "reconstruction_loss",
                                          0.5, reconstruction_loss_weight=0.5)
    # ...and it can fail: reading step k's mask for the observation after
    # action k-1 is a different loss.
    shifted = jit(expected, static_argnames="shift")(params, shift=1)
    assert not np.isclose(float(shifted), float(loss), rtol=1e-4)
    # The gradient reaches the dynamics through the decoded hidden states.
    dynamics = "dynamics_out" if kind == "mlp" else "dynamics_conv"
    assert _max_rel_diff(grads[dynamics], base_grads[dynamics]) > 1e-2
    with pytest.raises(ValueError, match="observation_shape"):
        unrolled_loss(params, batch, networks=base_nets, value_support=VALUE_SUPPORT,
                      reward_support=REWARD_SUPPORT, reconstruction_loss_weight=1.0)
    with pytest.raises(ValueError, match="next_observation"):
        unrolled_loss(params, batch._replace(next_observation=None), networks=nets,
                      value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT,
                      reconstruction_loss_weight=1.0)
    with pytest.raises(ValueError, match="observation_shape"):
        make_networks(cfg, num_actions=NUM_ACTIONS, value_bins=VALUE_SUPPORT.num_bins,
                      reward_bins=REWARD_SUPPORT.num_bins, observation_shape=(0, 3))


def _action_reward_transcription(params, batch, nets, weight, steps, threat_weight=0.0,
                                 reply_weight=0.0, predict_weight=0.0):
    """The every-action reward term written out per example, step and action:
    from the hidden state that step k's action is taken from (k < steps), the
    dynamics' reward cross-entropy of each action against its label, summed
    over the labelled actions and divided by their count (at least 1), times
    `weight`, scaled by 1/K; the hidden state by 0.5 between steps. With
    `threat_weight`, also the value cross-entropy of the prediction at each
    action's next hidden state against its threat label, over the labelled
    actions whose label is positive, divided by their count (at least 1).
    With `reply_weight`, also the reward cross-entropy of the dynamics applied
    once more (hidden state scaled by 0.5) to each action's labelled reply,
    over the labelled actions with a reply >= 0, divided by their count.
    With `predict_weight`, also the value cross-entropy of the prediction at
    each action's next hidden state against its value label over the
    labelled actions (divided by their count), plus the policy cross-entropy
    against its policy label over the labelled actions whose label sums to 1
    (divided by their count)."""

    def sg(x, s):
        return x * s + jax.lax.stop_gradient(x) * (1 - s)

    def example(image, actions, labels, mask, threats, replies, reply_rewards, values,
                policies):
        num_steps = actions.shape[0]
        hidden = nets.initial_inference(params, image[None]).hidden
        total = 0.0
        for k in range(num_steps):
            if k < steps:
                term, threat_term, threat_count = 0.0, 0.0, 0.0
                reply_term, reply_count = 0.0, 0.0
                value_term, policy_term, policy_count = 0.0, 0.0, 0.0
                for a in range(NUM_ACTIONS):
                    after, logits = nets.dynamics(params, hidden, jnp.array([a]))
                    probs = REWARD_SUPPORT.scalar_to_probs(labels[k, a])
                    term += -jnp.sum(probs * jax.nn.log_softmax(logits[0])) * mask[k, a]
                    if threat_weight:
                        _, value_logits = nets.prediction(params, after)
                        counted = mask[k, a] * (threats[k, a] > 0)
                        value_probs = VALUE_SUPPORT.scalar_to_probs(threats[k, a])
                        threat_term += -jnp.sum(
                            value_probs * jax.nn.log_softmax(value_logits[0])) * counted
                        threat_count += counted
                    if reply_weight:
                        counted = mask[k, a] * (replies[k, a] >= 0)
                        _, r_logits = nets.dynamics(params, sg(after, 0.5),
                                                    jnp.maximum(replies[k, a:a + 1], 0))
                        r_probs = REWARD_SUPPORT.scalar_to_probs(reply_rewards[k, a])
                        reply_term += -jnp.sum(r_probs * jax.nn.log_softmax(r_logits[0])) * counted
                        reply_count += counted
                    if predict_weight:
                        policy_logits, value_logits = nets.prediction(params, after)
                        value_probs = VALUE_SUPPORT.scalar_to_probs(values[k, a])
                        value_term += -jnp.sum(
                            value_probs * jax.nn.log_softmax(value_logits[0])) * mask[k, a]
                        counted = mask[k, a] * (jnp.sum(policies[k, a]) > 0.5)
                        policy_term += -jnp.sum(
                            policies[k, a] * jax.nn.log_softmax(policy_logits[0])) * counted
                        policy_count += counted
                total += sg(weight * term / jnp.maximum(jnp.sum(mask[k]), 1.0), 1.0 / num_steps)
                if threat_weight:
                    total += sg(threat_weight * threat_term / jnp.maximum(threat_count, 1.0),
                                1.0 / num_steps)
                if reply_weight:
                    total += sg(reply_weight * reply_term / jnp.maximum(reply_count, 1.0),
                                1.0 / num_steps)
                if predict_weight:
                    total += sg(predict_weight * (
                        value_term / jnp.maximum(jnp.sum(mask[k]), 1.0)
                        + policy_term / jnp.maximum(policy_count, 1.0)), 1.0 / num_steps)
            out = nets.recurrent_inference(params, hidden, actions[k:k + 1])
            hidden = sg(out.hidden, 0.5)
        return total

    zeros = jnp.zeros_like(batch.target_action_reward)
    threats = zeros if batch.target_action_threat is None else batch.target_action_threat
    replies = zeros.astype(jnp.int32) if batch.target_reply is None else batch.target_reply
    reply_rewards = zeros if batch.target_reply_reward is None else batch.target_reply_reward
    values = zeros if batch.target_action_value is None else batch.target_action_value
    policies = (jnp.zeros(zeros.shape + (NUM_ACTIONS,)) if batch.target_action_policy is None
                else batch.target_action_policy)
    return jnp.mean(jax.vmap(example)(batch.observation, batch.actions,
                                      batch.target_action_reward, batch.action_reward_mask,
                                      threats, replies, reply_rewards, values, policies))


# Two covered steps exercise both the representation's and the dynamics' hidden
# states, here with the threat-value, reply-reward and action-prediction terms
# too; one step
# without them is the same code with a shorter slice (slow: ~45 s of compile).
@pytest.mark.parametrize("steps,threat_weight,reply_weight,predict_weight",
                         [pytest.param(1, 0.0, 0.0, 0.0, marks=pytest.mark.slow),
                          (2, 2.0, 1.5, 1.25)])
def test_action_reward_loss_matches_a_transcription(steps, threat_weight, reply_weight,
                                                    predict_weight):
    nets, obs_shape = _networks("mlp")
    params = _random_params(nets, obs_shape, 5)
    k, b = 3, 5
    batch = _random_batch(obs_shape, b, k, 11)
    ks = jax.random.split(jax.random.key(12), 8)
    labels = jax.random.choice(ks[0], jnp.array([-1.0, 0.0, 1.0]), (b, k, NUM_ACTIONS))
    mask = (jax.random.uniform(ks[1], (b, k, NUM_ACTIONS)) > 0.3).astype(jnp.float32)
    mask = mask.at[0, 0].set(0.0)  # a position with no labelled action counts 0
    # Threat labels: 1 (the replier wins at once) on ~40 % of actions, 0 elsewhere.
    threats = (jax.random.uniform(ks[2], (b, k, NUM_ACTIONS)) > 0.6).astype(jnp.float32)
    # One reply per action (-1: none, ~25 %) and its reward.
    replies = jax.random.randint(ks[3], (b, k, NUM_ACTIONS), -1, NUM_ACTIONS)
    reply_rewards = jax.random.choice(ks[4], jnp.array([-1.0, 0.0, 1.0]), (b, k, NUM_ACTIONS))
    reply_rewards = jnp.where(replies >= 0, reply_rewards, 0.0)
    # The prediction after each action: a value in [-1, 1], and a policy where
    # the action leaves the game on (~70 %; zeros elsewhere).
    values = jax.random.uniform(ks[5], (b, k, NUM_ACTIONS), minval=-1.0, maxval=1.0)
    has_policy = jax.random.uniform(ks[6], (b, k, NUM_ACTIONS, 1)) > 0.3
    policies = jnp.where(has_policy, jax.nn.softmax(
        jax.random.normal(ks[7], (b, k, NUM_ACTIONS, NUM_ACTIONS))), 0.0)
    batch = batch._replace(target_action_reward=labels, action_reward_mask=mask,
                           target_action_threat=threats if threat_weight else None,
                           target_reply=replies if reply_weight else None,
                           target_reply_reward=reply_rewards if reply_weight else None,
                           target_action_value=values if predict_weight else None,
                           target_action_policy=policies if predict_weight else None)
    kwargs = {"threat_value_loss_weight": threat_weight} if threat_weight else {}
    if reply_weight:
        kwargs["reply_reward_loss_weight"] = reply_weight
    if predict_weight:
        kwargs["action_prediction_loss_weight"] = predict_weight

    def expected(p):
        return pseudocode_loss(p, batch, nets) + _action_reward_transcription(
            p, batch, nets, 3.0, steps, threat_weight, reply_weight, predict_weight)

    (loss, metrics), grads = _loss_and_grads(params, batch, nets, action_reward_loss_weight=3.0,
                                             action_reward_steps=steps, **kwargs)
    ref_loss, ref_grads = jit(jax.value_and_grad(expected))(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=2e-4, atol=2e-6)
    (base, base_metrics), _ = _loss_and_grads(params, batch, nets)
    # Forward, scale_gradient is the identity: each term adds weight x metric.
    np.testing.assert_allclose(
        loss - base, 3.0 * metrics.action_reward_loss + threat_weight * metrics.threat_value_loss
        + reply_weight * metrics.reply_reward_loss
        + predict_weight * metrics.action_prediction_loss, rtol=1e-4)
    assert base_metrics.action_reward_loss == 0.0 and float(metrics.action_reward_loss) > 0
    assert (float(metrics.threat_value_loss) > 0) == bool(threat_weight)
    assert (float(metrics.reply_reward_loss) > 0) == bool(reply_weight)
    assert (float(metrics.action_prediction_loss) > 0) == bool(predict_weight)
    # Masked labels do not count: changing them changes nothing (threat labels
    # count only where positive and the action is labelled).
    moved = batch._replace(target_action_reward=jnp.where(mask > 0, labels, 7.0))
    if threat_weight:
        moved = moved._replace(target_action_threat=jnp.where(mask * threats > 0, threats, 0.0))
    if reply_weight:  # rewards of unlabelled replies do not count either
        moved = moved._replace(target_reply_reward=jnp.where(
            (mask > 0) & (replies >= 0), reply_rewards, 5.0))
    if predict_weight:  # nor the values of unlabelled actions
        moved = moved._replace(target_action_value=jnp.where(mask > 0, values, 0.5))
    (loss_moved, _), _ = _loss_and_grads(params, moved, nets, action_reward_loss_weight=3.0,
                                         action_reward_steps=steps, **kwargs)
    np.testing.assert_allclose(loss_moved, loss, rtol=1e-6)
    # The two deeper terms: refused without the every-action term or their labels.
    for on, weight, labels in ((threat_weight, "threat_value_loss_weight", "target_action_threat"),
                               (reply_weight, "reply_reward_loss_weight", "target_reply"),
                               (predict_weight, "action_prediction_loss_weight",
                                "target_action_value")):
        if not on:
            continue
        with pytest.raises(ValueError, match="needs action_reward_loss_weight"):
            unrolled_loss(params, batch, networks=nets, value_support=VALUE_SUPPORT,
                          reward_support=REWARD_SUPPORT, **{weight: 1.0})
        with pytest.raises(ValueError, match=labels):
            unrolled_loss(params, batch._replace(**{labels: None}), networks=nets,
                          value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT,
                          action_reward_loss_weight=1.0, **{weight: 1.0})
    with pytest.raises(ValueError, match="target_action_reward"):
        unrolled_loss(params, batch._replace(target_action_reward=None), networks=nets,
                      value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT,
                      action_reward_loss_weight=1.0)
    with pytest.raises(ValueError, match="action_reward_steps"):
        unrolled_loss(params, batch, networks=nets, value_support=VALUE_SUPPORT,
                      reward_support=REWARD_SUPPORT, action_reward_loss_weight=1.0,
                      action_reward_steps=k + 1)


def _action_reconstruction_transcription(params, batch, nets, weight, steps):
    """The every-action reconstruction term written out per example, step and
    action: from the hidden state that step k's action is taken from
    (k < steps), each action's next hidden state (the dynamics'), decoded,
    against the observation that action leads to, squared error summed over
    the observation's elements, summed over the labelled actions and divided
    by their count (at least 1), times `weight`, scaled by 1/K; the hidden
    state by 0.5 between steps."""

    def sg(x, s):
        return x * s + jax.lax.stop_gradient(x) * (1 - s)

    def example(image, actions, observations, mask):
        num_steps = actions.shape[0]
        hidden = nets.initial_inference(params, image[None]).hidden
        total = 0.0
        for k in range(num_steps):
            if k < steps:
                term = 0.0
                for a in range(NUM_ACTIONS):
                    after, _ = nets.dynamics(params, hidden, jnp.array([a]))
                    error = nets.decoder(params, after)[0] - observations[k, a]
                    term += jnp.sum(error ** 2) * mask[k, a]
                total += sg(weight * term / jnp.maximum(jnp.sum(mask[k]), 1.0), 1.0 / num_steps)
            out = nets.recurrent_inference(params, hidden, actions[k:k + 1])
            hidden = sg(out.hidden, 0.5)
        return total

    return jnp.mean(jax.vmap(example)(batch.observation, batch.actions,
                                      batch.target_action_observation, batch.action_reward_mask))


def test_action_reconstruction_loss_matches_a_transcription():
    """`action_reconstruction_loss_weight`: the decoded every-action hidden
    states of the first two steps against the observations the actions lead
    to, in value and gradients; unlabelled actions do not count; refusals."""
    base_nets, obs_shape = _networks("mlp")
    cfg = MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,))
    nets = make_networks(cfg, num_actions=NUM_ACTIONS, value_bins=VALUE_SUPPORT.num_bins,
                         reward_bins=REWARD_SUPPORT.num_bins, observation_shape=obs_shape)
    params = _random_params(nets, obs_shape, 6)
    k, b, steps = 3, 5, 2
    batch = _random_batch(obs_shape, b, k, 13)
    ks = jax.random.split(jax.random.key(14), 3)
    labels = jax.random.choice(ks[0], jnp.array([-1.0, 0.0, 1.0]), (b, k, NUM_ACTIONS))
    mask = (jax.random.uniform(ks[1], (b, k, NUM_ACTIONS)) > 0.3).astype(jnp.float32)
    mask = mask.at[0, 0].set(0.0)  # a position with no labelled action counts 0
    observations = jax.random.normal(ks[2], (b, k, NUM_ACTIONS) + obs_shape)
    batch = batch._replace(target_action_reward=labels, action_reward_mask=mask,
                           target_action_observation=observations)

    def expected(p):
        return (pseudocode_loss(p, batch, nets)
                + _action_reward_transcription(p, batch, nets, 3.0, steps)
                + _action_reconstruction_transcription(p, batch, nets, 0.75, steps))

    kwargs = {"action_reward_loss_weight": 3.0, "action_reward_steps": steps}
    (loss, metrics), grads = _loss_and_grads(params, batch, nets,
                                             action_reconstruction_loss_weight=0.75, **kwargs)
    ref_loss, ref_grads = jit(jax.value_and_grad(expected))(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=2e-4, atol=2e-6)
    (base, base_metrics), base_grads = _loss_and_grads(params, batch, nets, **kwargs)
    # Forward, scale_gradient is the identity: the term adds weight x metric.
    np.testing.assert_allclose(loss - base, 0.75 * metrics.action_reconstruction_loss,
                               rtol=1e-4)
    assert base_metrics.action_reconstruction_loss == 0.0
    assert float(metrics.action_reconstruction_loss) > 0
    # The gradient reaches the dynamics (and the decoder) through the term.
    assert _max_rel_diff(grads["dynamics_out"], base_grads["dynamics_out"]) > 1e-2
    assert float(jnp.max(jnp.abs(base_grads["decoder_out"]["w"]))) == 0.0
    assert float(jnp.max(jnp.abs(grads["decoder_out"]["w"]))) > 0.0
    # The observations after unlabelled actions, and after the steps the term
    # does not cover, do not count; a labelled one does.
    covered = jnp.arange(k)[None, :, None, None] < steps
    moved = batch._replace(target_action_observation=jnp.where(
        ((mask > 0) & covered[..., 0])[..., None], observations, 9.0))
    (loss_moved, _), _ = _loss_and_grads(params, moved, nets,
                                         action_reconstruction_loss_weight=0.75, **kwargs)
    np.testing.assert_allclose(loss_moved, loss, rtol=1e-6)
    changed = batch._replace(target_action_observation=observations.at[1, 1].add(1.0))
    assert float(mask[1, 1].sum()) > 0
    (loss_changed, _), _ = _loss_and_grads(params, changed, nets,
                                           action_reconstruction_loss_weight=0.75, **kwargs)
    assert not np.isclose(float(loss_changed), float(loss), rtol=1e-4)
    # Refusals: without the every-action term, its labels or a decoder.
    with pytest.raises(ValueError, match="needs action_reward_loss_weight"):
        unrolled_loss(params, batch, networks=nets, value_support=VALUE_SUPPORT,
                      reward_support=REWARD_SUPPORT, action_reconstruction_loss_weight=1.0)
    with pytest.raises(ValueError, match="target_action_observation"):
        unrolled_loss(params, batch._replace(target_action_observation=None), networks=nets,
                      value_support=VALUE_SUPPORT, reward_support=REWARD_SUPPORT,
                      action_reconstruction_loss_weight=1.0, **kwargs)
    with pytest.raises(ValueError, match="observation_shape"):
        unrolled_loss(params, batch, networks=base_nets, value_support=VALUE_SUPPORT,
                      reward_support=REWARD_SUPPORT, action_reconstruction_loss_weight=1.0,
                      **kwargs)


def test_consistency_batch_covers_its_first_examples_at_the_same_weight():
    """`consistency_batch=M`: the consistency term of a batch of B comes from
    its first M examples only, averaged over those M (the transcription on
    them alone, in value and gradients); the next observations of the other
    examples do not count; M = B is the whole batch; bad values are refused."""
    cfg = MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,))
    nets = make_networks(cfg, num_actions=NUM_ACTIONS, value_bins=VALUE_SUPPORT.num_bins,
                         reward_bins=REWARD_SUPPORT.num_bins, projection_size=4)
    obs_shape = (6,)
    params = _random_params(nets, obs_shape, 5)
    k, b, m = 3, 6, 2
    batch = _random_batch(obs_shape, b, k, 21)
    batch = batch._replace(
        next_observation=jax.random.normal(jax.random.key(22), (b, k) + obs_shape))
    first = jax.tree.map(lambda x: x[:m], batch)
    assert float(jnp.min(first.policy_mask[:, :k])) == 0.0  # the mask is exercised

    def expected(p):
        return pseudocode_loss(p, batch, nets) + _consistency_transcription(p, first, nets, 2.0)

    (loss, metrics), grads = _loss_and_grads(params, batch, nets, consistency_loss_weight=2.0,
                                             consistency_batch=m)
    ref_loss, ref_grads = jit(jax.value_and_grad(expected))(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-5)
    chex.assert_trees_all_close(grads, ref_grads, rtol=2e-4, atol=2e-6)
    # The metric is the mean over the M examples, as for a batch of them alone.
    (_, ref_metrics), _ = _loss_and_grads(params, first, nets, consistency_loss_weight=2.0)
    np.testing.assert_allclose(metrics.consistency_loss, ref_metrics.consistency_loss,
                               rtol=1e-5)
    # M = B is the whole batch, and differs from M < B.
    (whole, _), _ = _loss_and_grads(params, batch, nets, consistency_loss_weight=2.0)
    (whole_b, _), _ = _loss_and_grads(params, batch, nets, consistency_loss_weight=2.0,
                                      consistency_batch=b)
    np.testing.assert_allclose(whole_b, whole, rtol=1e-6)
    assert not np.isclose(float(whole), float(loss), rtol=1e-4)
    # The next observations of examples M.. do not count.
    moved = batch._replace(next_observation=batch.next_observation.at[m:].set(3.0))
    (moved_loss, _), _ = _loss_and_grads(params, moved, nets, consistency_loss_weight=2.0,
                                         consistency_batch=m)
    np.testing.assert_allclose(moved_loss, loss, rtol=1e-6)
    for bad in (0, b + 1, 1.5, True):
        with pytest.raises(ValueError, match="consistency_batch must be an integer"):
            unrolled_loss(params, batch, networks=nets, value_support=VALUE_SUPPORT,
                          reward_support=REWARD_SUPPORT, consistency_loss_weight=2.0,
                          consistency_batch=bad)


def test_action_reward_batch_covers_its_first_examples_at_the_same_weight():
    """`action_reward_batch=M`: the every-action terms (rewards, predictions,
    reconstructions) of a batch of B come from its first M examples only and
    are averaged over those M, so what they add to the loss and its gradients
    equals what they add to a batch of those M examples alone; the other
    examples' every-action labels do not count; bad values are refused."""
    base_nets, obs_shape = _networks("mlp")
    cfg = MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,))
    nets = make_networks(cfg, num_actions=NUM_ACTIONS, value_bins=VALUE_SUPPORT.num_bins,
                         reward_bins=REWARD_SUPPORT.num_bins, observation_shape=obs_shape)
    params = _random_params(nets, obs_shape, 7)
    k, b, m = 3, 6, 2
    batch = _random_batch(obs_shape, b, k, 15)
    ks = jax.random.split(jax.random.key(16), 7)
    policies = jax.nn.softmax(jax.random.normal(ks[4], (b, k, NUM_ACTIONS, NUM_ACTIONS)))
    batch = batch._replace(
        importance_weight=jax.random.uniform(ks[0], (b,), minval=0.2, maxval=1.0),
        target_action_reward=jax.random.choice(ks[1], jnp.array([-1.0, 0.0, 1.0]),
                                               (b, k, NUM_ACTIONS)),
        action_reward_mask=(jax.random.uniform(ks[2], (b, k, NUM_ACTIONS)) > 0.3).astype(
            jnp.float32),
        target_action_value=jax.random.uniform(ks[3], (b, k, NUM_ACTIONS), minval=-1.0,
                                               maxval=1.0),
        target_action_policy=policies,
        target_action_observation=jax.random.normal(ks[5], (b, k, NUM_ACTIONS) + obs_shape))
    kwargs = {"action_reward_loss_weight": 3.0, "action_reward_steps": 2,
              "action_prediction_loss_weight": 1.5, "action_reconstruction_loss_weight": 0.5}

    def every_action_part(batch_, **extra):
        """Loss, metrics and gradients with the every-action terms, minus without."""
        (loss, metrics), grads = _loss_and_grads(params, batch_, nets, **kwargs, **extra)
        (base, _), base_grads = _loss_and_grads(params, batch_, nets)
        return loss - base, metrics, jax.tree.map(jnp.subtract, grads, base_grads)

    part, metrics, grads = every_action_part(batch, action_reward_batch=m)
    first = jax.tree.map(lambda x: x[:m], batch)
    ref_part, ref_metrics, ref_grads = every_action_part(first)
    np.testing.assert_allclose(part, ref_part, rtol=1e-4)
    chex.assert_trees_all_close(grads, ref_grads, rtol=2e-3, atol=2e-6)
    for name in ("action_reward_loss", "action_prediction_loss", "action_reconstruction_loss"):
        np.testing.assert_allclose(getattr(metrics, name), getattr(ref_metrics, name), rtol=1e-5)
        assert float(getattr(metrics, name)) > 0
    # The whole batch (None, or M = B) differs: the other examples count there.
    whole, _, _ = every_action_part(batch)
    np.testing.assert_allclose(every_action_part(batch, action_reward_batch=b)[0], whole,
                               rtol=1e-6)
    assert not np.isclose(float(whole), float(part), rtol=1e-3)
    # The every-action labels of examples M.. do not count.
    def rest(x):  # True on examples M.., broadcast against x
        return (jnp.arange(b) >= m).reshape((b,) + (1,) * (x.ndim - 1))

    moved = batch._replace(**{
        name: jnp.where(rest(x), value, x) for name, value, x in (
            ("target_action_reward", 5.0, batch.target_action_reward),
            ("target_action_value", 0.9, batch.target_action_value),
            ("target_action_observation", 4.0, batch.target_action_observation))})
    np.testing.assert_allclose(every_action_part(moved, action_reward_batch=m)[0], part,
                               rtol=1e-6)
    for bad in (0, b + 1, 1.5, True):
        with pytest.raises(ValueError, match="action_reward_batch must be an integer"):
            unrolled_loss(params, batch, networks=nets, value_support=VALUE_SUPPORT,
                          reward_support=REWARD_SUPPORT, action_reward_batch=bad, **kwargs)
