"""Tests for `muzero_jax.puct`: parity with mctx, the paper's normalisation, a bandit.

The parity tests compile `mctx.muzero_policy` and our policy once per
configuration (a few seconds each on CPU), so the configurations are chosen to
cover A in {2, 4, 9}, N in {16, 50}, with and without invalid actions and with
`max_depth` in four compilations each; seeds vary inside the batch (every batch
element is a different random network) and across calls.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from muzero_jax.puct import (
    muzero_paper_policy,
    puct_policy,
    qtransform_by_tree_min_max,
    tree_q_min_max,
)

EMBEDDING = 6
HIDDEN = 8
BATCH = 8


# ----------------------------------------------------------------------------
# A batch of random small networks.
# ----------------------------------------------------------------------------


def _random_networks(seed: int, num_actions: int) -> dict[str, np.ndarray]:
    """Per-example weights of a one-hidden-layer model; example 0 has a flat policy.

    A flat policy head gives exactly tied PUCT scores at every fresh node, which
    exercises the tie-break noise that mctx draws and that we must reproduce.
    (NumPy draws the weights: no eager JAX ops to compile.)
    """
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal((BATCH, *shape)).astype(np.float32)

    params = {
        "hidden": normal(EMBEDDING + num_actions, HIDDEN),
        "transition": normal(HIDDEN, EMBEDDING),
        "policy": normal(HIDDEN, num_actions),
        "heads": normal(HIDDEN, 3),  # value, reward, discount
        "root_logits": normal(num_actions),
        "root_embedding": normal(EMBEDDING),
    }
    params["policy"][0] = 0.0
    params["root_logits"][0] = 0.0
    return params


def _matvec(x, w):
    """`x[b] @ w[b]` as a product and a sum: a batched dot may be computed
    differently in two programs (e.g. at different XLA optimisation levels),
    and the comparison is of the searches, not of dot kernels."""
    return jnp.sum(x[:, :, None] * w, axis=1)


def _recurrent_fn(params, rng_key, action, embedding):
    del rng_key
    num_actions = params["policy"].shape[-1]
    inputs = jnp.concatenate([embedding, jax.nn.one_hot(action, num_actions)], axis=-1)
    hidden = jnp.tanh(_matvec(inputs, params["hidden"]))
    heads = _matvec(hidden, params["heads"])
    value, reward, discount = heads[:, 0], heads[:, 1], heads[:, 2]
    output = mctx.RecurrentFnOutput(
        reward=reward,
        discount=jax.nn.sigmoid(discount),
        prior_logits=_matvec(hidden, params["policy"]),
        value=value,
    )
    return output, jnp.tanh(_matvec(hidden, params["transition"]))


def _root(params) -> mctx.RootFnOutput:
    return mctx.RootFnOutput(
        prior_logits=params["root_logits"],
        value=jnp.tanh(params["root_embedding"].sum(-1)),
        embedding=params["root_embedding"],
    )


def _invalid_mask(seed: int, num_actions: int) -> np.ndarray:
    """Random invalid actions; one row keeps a single valid action, one row all valid."""
    mask = (np.random.default_rng(seed).random((BATCH, num_actions)) < 0.4).astype(np.float32)
    mask[:, 0] = 0.0
    mask[1] = 1.0
    mask[1, num_actions - 1] = 0.0
    mask[2] = 0.0
    return mask


def _assert_same_output(ours: mctx.PolicyOutput, theirs: mctx.PolicyOutput) -> None:
    np.testing.assert_array_equal(ours.action, theirs.action)
    np.testing.assert_array_equal(ours.action_weights, theirs.action_weights)
    ours_tree, theirs_tree = ours.search_tree, theirs.search_tree
    np.testing.assert_array_equal(ours_tree.children_visits, theirs_tree.children_visits)
    # The rest of the tree must match too, so that anything read from it
    # (values, Q-values, summaries) is interchangeable.
    for name in (
        "node_visits",
        "raw_values",
        "node_values",
        "parents",
        "action_from_parent",
        "children_index",
        "children_prior_logits",
        "children_values",
        "children_rewards",
        "children_discounts",
        "embeddings",
        "root_invalid_actions",
    ):
        np.testing.assert_array_equal(
            getattr(ours_tree, name), getattr(theirs_tree, name), err_msg=name
        )


# Compiling dominates: XLA's backend optimisations are off (they only slow the
# compilation down; both searches are compiled alike), each configuration is
# compiled once as one program running both searches, and the invalid-action
# mask is always an argument (all zeros for "no invalid actions"). The CPU
# fusion emitters stay on whatever the session's XLA_FLAGS say (conftest.py
# turns them off): with the classic emitters the two searches' node values
# differed in the last bit in the deep A2-N50-depth10 case.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0,
                                                     "xla_cpu_use_fusion_emitters": True})


@functools.cache
def _both(ours, theirs, num_actions, num_simulations, max_depth):
    """Jitted `(params, rng_key, invalid) -> (ours, theirs)` for one configuration."""

    def run(params, rng_key, invalid_actions):
        outputs = []
        for policy in (ours, theirs):
            outputs.append(
                policy(
                    params,
                    rng_key,
                    _root(params),
                    _recurrent_fn,
                    num_simulations,
                    invalid_actions=invalid_actions,
                    max_depth=max_depth,
                )
            )
        return tuple(outputs)

    return _jit(run)


PARITY_CASES = [
    # (num_actions, num_simulations, invalid-action mask dtype or None, max_depth)
    pytest.param(9, 16, bool, 3, id="A9-N16-invalid-depth3"),
    pytest.param(2, 50, None, None, id="A2-N50"),
    # These two extend the grid under `-m slow`.
    pytest.param(4, 50, np.float32, None, id="A4-N50-invalid", marks=pytest.mark.slow),
    pytest.param(9, 50, None, 6, id="A9-N50-depth6", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("num_actions, num_simulations, invalid_dtype, max_depth", PARITY_CASES)
def test_puct_policy_matches_mctx_muzero_policy(
    num_actions, num_simulations, invalid_dtype, max_depth
):
    """Same rng, same Dirichlet noise and tie-breaks: the same actions, weights and tree."""
    run = _both(puct_policy, mctx.muzero_policy, num_actions, num_simulations, max_depth)
    for seed in range(3):
        seed += 1000 * num_actions
        params = _random_networks(seed, num_actions)
        if invalid_dtype is None:
            invalid = np.zeros((BATCH, num_actions), np.float32)
        else:  # acting passes booleans; mctx's own examples use floats
            invalid = _invalid_mask(seed, num_actions).astype(invalid_dtype)
        _assert_same_output(*run(params, jax.random.PRNGKey(seed), invalid))


PAPER_CASES = [
    # (num_actions, num_simulations, invalid actions, max_depth)
    # Paths of up to 11 edges: the cached Q-values are written in two backup chunks.
    pytest.param(4, 16, True, None, id="A4-N16-invalid"),
    # Depth <= 2 with 24 simulations: most simulations end on an existing node.
    pytest.param(3, 24, True, 2, id="A3-N24-invalid-depth2"),
    # Deep trees cut at depth 10: revisits and two-chunk paths together.
    pytest.param(2, 50, False, 10, id="A2-N50-depth10", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("num_actions, num_simulations, invalid, max_depth", PAPER_CASES)
def test_paper_policy_matches_mctx_with_tree_min_max(
    num_actions, num_simulations, invalid, max_depth
):
    """`muzero_paper_policy` == `mctx.muzero_policy(qtransform=qtransform_by_tree_min_max)`.

    Also checks the per-edge Q caches behind the search's tree-wide bounds: a
    stale entry changes a bound, some normalised score and, soon, a selection.
    """
    theirs = functools.partial(mctx.muzero_policy, qtransform=qtransform_by_tree_min_max)
    run = _both(muzero_paper_policy, theirs, num_actions, num_simulations, max_depth)
    for seed in range(7, 10):
        params = _random_networks(seed, num_actions)
        if invalid:
            mask = _invalid_mask(seed, num_actions)
        else:
            mask = np.zeros((BATCH, num_actions), np.float32)
        _assert_same_output(*run(params, jax.random.PRNGKey(seed), mask))


# ----------------------------------------------------------------------------
# The paper's tree-wide min-max normalisation on a hand-built tree.
# ----------------------------------------------------------------------------


def _hand_tree(children, node_values) -> mctx.Tree:
    """An unbatched 3-action tree from `{(node, action): (child, reward, discount)}`."""
    num_nodes, num_actions = len(node_values), 3
    children_index = np.full((num_nodes, num_actions), -1, np.int32)
    rewards = np.zeros((num_nodes, num_actions), np.float32)
    discounts = np.zeros((num_nodes, num_actions), np.float32)
    # Unvisited edges hold junk that must neither be scored nor enter the bounds.
    values = np.full((num_nodes, num_actions), 100.0, np.float32)
    visits = np.zeros((num_nodes, num_actions), np.int32)
    for (node, action), (child, reward, discount) in children.items():
        children_index[node, action] = child
        rewards[node, action] = reward
        discounts[node, action] = discount
        values[node, action] = node_values[child]
        visits[node, action] = 1
    return mctx.Tree(
        node_visits=np.ones(num_nodes, np.int32),
        raw_values=np.asarray(node_values, np.float32),
        node_values=np.asarray(node_values, np.float32),
        parents=np.full(num_nodes, -1, np.int32),
        action_from_parent=np.full(num_nodes, -1, np.int32),
        children_index=children_index,
        children_prior_logits=np.zeros((num_nodes, num_actions), np.float32),
        children_values=values,
        children_visits=visits,
        children_rewards=rewards,
        children_discounts=discounts,
        embeddings=np.zeros((num_nodes, 1), np.float32),
        root_invalid_actions=np.zeros(num_actions, np.float32),
        extra_data=None,
    )


def test_tree_min_max_normalises_with_the_whole_tree():
    # Q(0, 0) = 1 + 0.5 * 2 = 2, Q(0, 1) = 0 + 0.5 * -2 = -1, Q(1, 2) = 0.5 + 1 * 3.5 = 4.
    tree = _hand_tree(
        {(0, 0): (1, 1.0, 0.5), (0, 1): (2, 0.0, 0.5), (1, 2): (3, 0.5, 1.0)},
        node_values=[0.3, 2.0, -2.0, 3.5],
    )
    min_q, max_q = tree_q_min_max(tree)
    assert (float(min_q), float(max_q)) == (-1.0, 4.0)
    # normalize(q) = (q - (-1)) / (4 - (-1)); unvisited children score 0, even
    # though the root's own parent-and-siblings bounds would be [-1, 2].
    np.testing.assert_allclose(qtransform_by_tree_min_max(tree, 0), [0.6, 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(qtransform_by_tree_min_max(tree, 1), [0.0, 0.0, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(qtransform_by_tree_min_max(tree, 3), [0.0, 0.0, 0.0])


def test_tree_min_max_keeps_raw_q_when_max_equals_min():
    # MinMaxStats.normalize returns the value itself unless max > min.
    single = _hand_tree({(0, 1): (1, 1.0, 0.5)}, node_values=[0.0, 1.0])  # Q = 1.5
    np.testing.assert_array_equal(qtransform_by_tree_min_max(single, 0), [0.0, 1.5, 0.0])
    tied = _hand_tree({(0, 0): (1, 0.7, 0.0), (0, 2): (2, 0.2, 1.0)}, node_values=[0, 3, 0.5])
    np.testing.assert_allclose(qtransform_by_tree_min_max(tied, 0), [0.7, 0.0, 0.7], rtol=1e-6)
    empty = _hand_tree({}, node_values=[0.0])
    np.testing.assert_array_equal(qtransform_by_tree_min_max(empty, 0), [0.0, 0.0, 0.0])


# ----------------------------------------------------------------------------
# A bandit whose best arm is known.
# ----------------------------------------------------------------------------


def test_paper_policy_finds_the_best_arm_of_a_bandit():
    """One-step bandits: arm `a` pays `payout[b, a]` and ends the episode.

    The prior favours a poorer arm, so the search has to overrule it; with the
    paper's normalisation the best arm collects the most visits and is played.
    """
    payout = jnp.array(
        [[0.1, 0.9, 0.3, 0.5], [1.0, 0.0, 0.2, 0.4], [0.3, 0.2, 0.1, 0.6], [0.2, 0.5, 0.9, 0.7]]
    )
    batch, num_actions = payout.shape
    best = jnp.argmax(payout, axis=-1)
    misleading_prior = jax.nn.one_hot((best + 1) % num_actions, num_actions)

    def recurrent_fn(params, rng_key, action, embedding):
        del params, rng_key, embedding
        output = mctx.RecurrentFnOutput(
            reward=payout[jnp.arange(batch), action],
            discount=jnp.zeros(batch),
            prior_logits=jnp.zeros((batch, num_actions)),
            value=jnp.zeros(batch),
        )
        return output, jnp.zeros((batch, 1))

    root = mctx.RootFnOutput(
        prior_logits=misleading_prior, value=jnp.zeros(batch), embedding=jnp.zeros((batch, 1))
    )
    output = _jit(
        lambda key: muzero_paper_policy(
            None, key, root, recurrent_fn, 32, dirichlet_fraction=0.0, temperature=0.0
        )
    )(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(jnp.argmax(output.action_weights, axis=-1), best)
    np.testing.assert_array_equal(output.action, best)
