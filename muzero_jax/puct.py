"""Fast PUCT (MuZero) tree search that reproduces `mctx.muzero_policy` exactly.

`puct_policy` is a drop-in for `mctx.muzero_policy`: same signature, defaults and
key usage. Given the same `rng_key` it returns the same `action`,
`action_weights` and search tree, bit for bit, tie-break noise included
(tests/test_puct.py compares every tree field). `muzero_paper_policy` is the same
search with `qtransform_by_tree_min_max`, the MuZero paper's tree-wide min-max
normalisation, and equals `mctx.muzero_policy(...,
qtransform=qtransform_by_tree_min_max)`.

Where the time goes in `mctx.muzero_policy`
-------------------------------------------
At A=9 actions, B=256, N=50 simulations on a 2-core x86 CPU (jax 0.10.2, mctx
0.0.71, the network of `muzero_jax.bench.search`); docs/search.md has the
commands and the measured numbers. Kernel-time shares are from a
`jax.profiler` trace taken while this module was written (not re-measured
since); the ablation and the trip counts are re-measured by the bench command.

1. Tie-break noise (~57% of kernel time in that trace).
   `muzero_action_selection` adds `1e-7 * uniform(key, [A])` to every score, at
   every depth of every simulation for every example, after splitting a key
   per depth. On CPU a threefry call is a rolled loop of small kernels, and
   under `vmap` the root/interior `lax.cond` becomes a select that evaluates
   both branches, so the noise is drawn twice per step.
2. Batched loop trip counts. `simulate` and `backward` are vmapped while loops,
   and a vmapped loop runs until its deepest example is done; PUCT trees are
   deep (mean depth of a new node 14.8 on the benchmark network, 7.5 for
   Gumbel MuZero), so the cost grows with depth and with A (mctx issues #81,
   #93).
3. `backward` (~21%): the vmapped while loop carries the whole tree, and with a
   batched predicate every iteration selects between the old and the new tree,
   copying the `[B, N + 1, A]` child arrays.
4. The rest: qtransform, score and argmax (~11%), the network (~3%).

What this module does instead (same operations in the same order, so the
results are identical):

* Tie-break noise only where it can matter. The noise is below 1e-7, so it can
  only change an argmax whose best and second best scores are within 1e-7 plus
  a few rounding units. Each descent runs noise-free and records whether any
  selection was that close; only then is it redone with mctx's key chain and
  noise. Networks with distinct priors practically never trigger it; a flat
  policy head (exact ties at every fresh node) triggers it every simulation at
  the cost of one extra descent.
* One batched descent loop for the whole batch, without per-example `vmap` and
  without a root/interior select (the root mask is a `where` on depth 0).
* The descent records its path; backpropagation gathers along it in chunks of
  8 positions and scatters once per field and chunk: no copies of the tree.
* `softmax(prior_logits)` and `sqrt(N) * pb_c(N)` are cached per node, updated
  when a node is created or visited; flat row gathers; fresh nodes are written
  as one column (`dynamic_update_slice`) when no `max_depth` cut-off can make a
  simulation end on an existing node; the per-simulation keys are drawn up
  front.
* Tree-wide min-max bounds (`muzero_paper_policy`) from per-edge caches. An
  edge's Q-value `reward + discount * value` and its visited flag only change
  when backpropagation updates that edge, so two `[B, N + 1, A]` caches (Q of
  visited edges, +inf / -inf elsewhere, the root's edges included) are written
  for the path's edges with the same arithmetic, and each simulation takes
  one contiguous min and max of them instead of recomputing Q from four tree
  fields. Other qtransforms carry no caches. Per-node bounds refreshed only on
  the path (O(depth) rows instead of O(N) per simulation) measured slower on
  CPU: the row gathers of each backup chunk cost more than the scan they save
  at N <= 100.

The speed-ups over the grid A in {2, 4, 9}, B in {1, 16, 256}, N in {16, 50}
are in docs/search.md (`python -m muzero_jax.bench.search`). In the earlier
trace, what remained at A=9, B=256, N=50 was mostly the descent (~21 small
kernels per depth step), then the network and backpropagation; at B=1
per-kernel dispatch overhead dominates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx

__all__ = [
    "muzero_paper_policy",
    "puct_policy",
    "qtransform_by_tree_min_max",
    "tree_q_min_max",
]

Tree = mctx.Tree
QTransform = Callable[[Tree, chex.Array], chex.Array]

# Scale of the tie-breaking noise that mctx adds to every PUCT score.
_TIE_NOISE_SCALE = 1e-7


# ----------------------------------------------------------------------------
# Tree-wide min-max normalisation (the MuZero paper's MinMaxStats).
# ----------------------------------------------------------------------------


def tree_q_min_max(tree: Tree) -> tuple[chex.Array, chex.Array]:
    """Returns the min and max Q-value over all visited edges of an unbatched tree.

    The Q-value of the edge `(node, action)` is `reward + discount * value(child)`,
    the quantity that the MuZero paper's `ucb_score` normalises with its
    `MinMaxStats`. Only edges whose child has been visited take part; with no
    visited edge the result is `(+inf, -inf)`, i.e. "no bounds seen yet".

    Args:
        tree: an unbatched `mctx.Tree` (as seen by a qtransform).

    Returns:
        `(min_q, max_q)`, two scalars.
    """
    lower, upper = _visited_q(tree)
    return jnp.min(lower), jnp.max(upper)


def _visited_q(tree: Tree) -> tuple[chex.Array, chex.Array]:
    """Per edge: `reward + discount * value` if visited, else `+inf` and `-inf`.

    The two operands of `tree_q_min_max`'s reductions; the search also uses
    them to initialise its per-edge caches of the same quantities.
    """
    qvalues = tree.children_rewards + tree.children_discounts * tree.children_values
    visited = tree.children_visits > 0
    return jnp.where(visited, qvalues, jnp.inf), jnp.where(visited, qvalues, -jnp.inf)


def _normalise_by_bounds(
    qvalues: chex.Array,
    visit_counts: chex.Array,
    min_q: chex.Array,
    max_q: chex.Array,
    epsilon: chex.Numeric,
) -> chex.Array:
    """Applies the paper's `MinMaxStats.normalize` and zeroes unvisited children.

    Shared by the qtransform and the fast search so that both compute the very
    same floating point operations.
    """
    scaled = (qvalues - min_q) / jnp.maximum(max_q - min_q, epsilon)
    normalised = jnp.where(max_q > min_q, scaled, qvalues)
    return jnp.where(visit_counts > 0, normalised, jnp.zeros_like(normalised))


def qtransform_by_tree_min_max(
    tree: Tree,
    node_index: chex.Numeric,
    *,
    epsilon: chex.Numeric = 1e-8,
) -> chex.Array:
    """Normalises a node's Q-values with the min and max seen in the whole tree.

    This is the value term of the MuZero paper's `ucb_score` (Schrittwieser et
    al. 2020, appendix pseudocode), expressed as an mctx qtransform:

    * bounds: `min_q`/`max_q` range over `reward + discount * child.value()` of
      every visited edge in the tree (see `tree_q_min_max`): the quantity that
      `ucb_score` normalises, and what muzero-general's `backpropagate` passes to
      `MinMaxStats.update` for each node of the path. (The published pseudocode
      passes `node.value()` there while normalising `reward + discount *
      value`; bounding the normalised quantity itself keeps every score in
      [0, 1].) The root has no incoming edge and so contributes nothing;
    * `normalize(q)`: `(q - min_q) / (max_q - min_q)` when `max_q > min_q`, else
      `q` unchanged, exactly as `MinMaxStats.normalize`. `epsilon` only floors
      the denominator against denormal blow-ups; `epsilon=0` is the pseudocode
      verbatim;
    * `value_score = normalize(child.reward + discount * child.value())` for a
      visited child and `0` for an unvisited one (`child.visit_count == 0`).

    One deliberate difference: the pseudocode's `MinMaxStats` remembers every
    value it was ever given, including values a node held before later visits
    changed its mean, whereas this transform reads the bounds from the tree's
    current values. That keeps it a pure function of the tree, so it gives the
    same result inside `mctx.muzero_policy`, `puct_policy` and any later
    inspection of the returned search tree.

    Args:
        tree: an unbatched `mctx.Tree`.
        node_index: scalar index of the parent node.
        epsilon: floor for `max_q - min_q` in the denominator.

    Returns:
        The value scores of the node's children, shape `[num_actions]`.
    """
    chex.assert_shape(node_index, ())
    min_q, max_q = tree_q_min_max(tree)
    return _normalise_by_bounds(
        tree.qvalues(node_index),
        tree.children_visits[node_index],
        min_q,
        max_q,
        epsilon,
    )


# ----------------------------------------------------------------------------
# Value scorers: how the search obtains the qtransform's output for a batch.
# ----------------------------------------------------------------------------


class _ValueScorer(NamedTuple):
    """Computes value scores for a batch of nodes.

    `prepare(state)` runs once per simulation (the tree does not change while a
    simulation descends); `score(tree, prepared, nodes)` runs at every depth.
    With `edge_q` the search maintains `_Search.edge_q_min`/`edge_q_max`.
    """

    prepare: Callable[[_Search], Any]
    score: Callable[[Tree, Any, chex.Array], chex.Array]
    edge_q: bool = False


def _tree_min_max_epsilon(qtransform: QTransform) -> chex.Numeric | None:
    """Returns `epsilon` if `qtransform` is `qtransform_by_tree_min_max`, else None."""
    if qtransform is qtransform_by_tree_min_max:
        return 1e-8
    if (
        isinstance(qtransform, functools.partial)
        and qtransform.func is qtransform_by_tree_min_max
        and not qtransform.args
        and set(qtransform.keywords) <= {"epsilon"}
    ):
        return qtransform.keywords.get("epsilon", 1e-8)
    return None


# mctx's qtransforms read nothing but the node itself and its children's edges.
_LOCAL_QTRANSFORMS = (
    mctx.qtransform_by_parent_and_siblings,
    mctx.qtransform_by_min_max,
    mctx.qtransform_completed_by_mix_value,
)


def _is_local(qtransform: QTransform) -> bool:
    """Whether `qtransform` (possibly a `functools.partial`) only reads its node's row."""
    while isinstance(qtransform, functools.partial):
        qtransform = qtransform.func
    return any(qtransform is known for known in _LOCAL_QTRANSFORMS)


def _node_view(tree: Tree, nodes: chex.Array) -> Tree:
    """A batch of one-node trees holding row `nodes[b]` of every per-node field."""
    return tree.replace(
        **{
            name: _rows(getattr(tree, name), nodes)[:, None]
            for name in (
                "node_visits",
                "raw_values",
                "node_values",
                "parents",
                "action_from_parent",
                "children_index",
                "children_prior_logits",
                "children_visits",
                "children_rewards",
                "children_discounts",
                "children_values",
            )
        },
        embeddings=None,
    )


def _make_value_scorer(qtransform: QTransform) -> _ValueScorer:
    """Chooses how to evaluate `qtransform` inside the batched search loop."""
    epsilon = _tree_min_max_epsilon(qtransform)
    if epsilon is not None:
        # The tree-wide bounds only change in backpropagation, so compute them
        # once per simulation instead of at every depth, from the per-edge
        # caches that backpropagation keeps: `tree_q_min_max`'s reductions
        # without recomputing their operands from four `[B, N + 1, A]` fields.
        def prepare(state: _Search) -> tuple[chex.Array, chex.Array]:
            return (
                jnp.min(state.edge_q_min, axis=(1, 2)),
                jnp.max(state.edge_q_max, axis=(1, 2)),
            )

        def score(tree: Tree, bounds: tuple[chex.Array, chex.Array], nodes: chex.Array):
            min_q, max_q = bounds
            qvalues = _rows(tree.children_rewards, nodes) + _rows(
                tree.children_discounts, nodes
            ) * _rows(tree.children_values, nodes)
            return _normalise_by_bounds(
                qvalues,
                _rows(tree.children_visits, nodes),
                min_q[:, None],
                max_q[:, None],
                epsilon,
            )

        return _ValueScorer(prepare=prepare, score=score, edge_q=True)

    if _is_local(qtransform):
        # Same function on a gathered one-node tree: identical arithmetic, but
        # the gathers share one flat index instead of per-field batched gathers.
        return _ValueScorer(
            prepare=lambda state: None,
            score=lambda tree, _, nodes: jax.vmap(qtransform, in_axes=(0, None))(
                _node_view(tree, nodes), 0
            ),
        )

    # Any other qtransform sees the whole tree, exactly as in mctx.
    return _ValueScorer(
        prepare=lambda state: None,
        score=lambda tree, _, nodes: jax.vmap(qtransform)(tree, nodes),
    )


# ----------------------------------------------------------------------------
# Search.
# ----------------------------------------------------------------------------


def _flat_nodes(num_nodes: int, nodes: chex.Array) -> chex.Array:
    """Row of `(b, nodes[b, ...])` in a `[B * num_nodes, ...]` flattened array."""
    batch = jnp.arange(nodes.shape[0]).reshape((-1,) + (1,) * (nodes.ndim - 1))
    return batch * num_nodes + nodes


def _rows(x: chex.Array, nodes: chex.Array) -> chex.Array:
    """Gathers `x[b, nodes[b, ...]]` for every batch element `b`.

    Indexes the flattened `[B * num_nodes, ...]` array: one plain row gather
    whose index arithmetic fuses into it, where `x[arange(B), nodes]` lowers to
    a batched gather plus a separate kernel that builds its index tuples.
    """
    flat = x.reshape((-1,) + x.shape[2:])
    return flat[_flat_nodes(x.shape[1], nodes)]


def _edges(x: chex.Array, nodes: chex.Array, actions: chex.Array) -> chex.Array:
    """Gathers `x[b, nodes[b, ...], actions[b, ...]]` from a `[B, num_nodes, A]` array."""
    return x.reshape(-1)[_flat_nodes(x.shape[1], nodes) * x.shape[2] + actions]


def _set_rows(x: chex.Array, nodes: chex.Array, values: chex.Array, keep: chex.Array):
    """`x[b, nodes[b, k]] = values[b, k]` where `keep[b, k]`; other writes are dropped."""
    flat = x.reshape((-1,) + x.shape[2:])
    index = jnp.where(keep, _flat_nodes(x.shape[1], nodes), flat.shape[0])
    return flat.at[index].set(values, mode="drop").reshape(x.shape)


def _set_edges(
    x: chex.Array, nodes: chex.Array, actions: chex.Array, values: chex.Array, keep: chex.Array
) -> chex.Array:
    """`x[b, nodes[b, k], actions[b, k]] = values[b, k]` where `keep[b, k]`."""
    index = _flat_nodes(x.shape[1], nodes) * x.shape[2] + actions
    index = jnp.where(keep, index, x.size)
    return x.reshape(-1).at[index].set(values, mode="drop").reshape(x.shape)


class _Search(NamedTuple):
    """Loop state: the mctx tree plus caches.

    mctx recomputes `softmax(prior_logits)` and `sqrt(N) * pb_c(N)` for every
    node at every depth of every simulation. Both only change when a node is
    created (logits) or visited (`N`), so they are stored once per node with the
    very same operations, which leaves a single fused kernel for the score.

    `edge_q_min`/`edge_q_max` are `_visited_q(tree)`, kept only for the
    tree-wide min-max qtransform (None otherwise). An edge's Q-value or
    visited flag only changes when backpropagation updates it, so they are
    written for the path's edges together with `children_values`.
    """

    tree: Tree
    prior_probs: chex.Array  # [B, num_nodes, A] softmax(children_prior_logits)
    exploration: chex.Array  # [B, num_nodes] sqrt(node_visits) * pb_c(node_visits)
    edge_q_min: chex.Array | None = None  # [B, num_nodes, A] Q if visited, else +inf
    edge_q_max: chex.Array | None = None  # [B, num_nodes, A] Q if visited, else -inf


def _exploration(
    node_visits: chex.Array, pb_c_init: chex.Numeric, pb_c_base: chex.Numeric
) -> chex.Array:
    """`sqrt(N) * (pb_c_init + log((N + pb_c_base + 1) / pb_c_base))`, as mctx orders it."""
    pb_c = pb_c_init + jnp.log((node_visits + pb_c_base + 1.0) / pb_c_base)
    return jnp.sqrt(node_visits) * pb_c


class _KeyChain(NamedTuple):
    """Per-example tie-break keys of one simulation, advanced only when needed.

    mctx gives every example its own key (`split(simulate_key, B)`) and splits it
    once per depth: `key, selection_key = split(key)`, drawing `uniform(
    selection_key, [A])` noise from the second half. Those threefry calls cost
    more than the rest of the descent on CPU, and the noise only matters in near
    ties, so the chain is only advanced when a near tie shows up. `keys[b]` is
    the key mctx holds before the split at depth `depth`.
    """

    keys: chex.Array
    depth: chex.Array


def _tie_break_noise(
    chain: _KeyChain, depth: chex.Array, num_actions: int
) -> tuple[chex.Array, _KeyChain]:
    """Returns mctx's `1e-7 * uniform` noise at `depth` and the advanced chain."""

    def split(_, carry):
        pairs = jax.vmap(jax.random.split)(carry[0])
        return pairs[:, 0], pairs[:, 1]

    keys, selection_keys = jax.lax.fori_loop(
        chain.depth, depth + 1, split, (chain.keys, chain.keys)
    )
    noise = jax.vmap(lambda key: jax.random.uniform(key, (num_actions,)))(selection_keys)
    return _TIE_NOISE_SCALE * noise, _KeyChain(keys=keys, depth=depth + 1)


def _scores(state: _Search, value_score: chex.Array, nodes: chex.Array) -> chex.Array:
    """mctx's PUCT scores `value_score + policy_score`, before noise and masking.

    Same operations in the same order as `mctx.muzero_action_selection`, with
    `softmax(prior_logits)` and `sqrt(N) * pb_c(N)` read from the caches.
    """
    tree = state.tree
    visit_counts = _rows(tree.children_visits, nodes)
    exploration = _rows(state.exploration, nodes)[:, None]
    policy_score = exploration * _rows(state.prior_probs, nodes) / (visit_counts + 1)
    return value_score + policy_score


def _mask_root(tree: Tree, scores: chex.Array, depth: chex.Array) -> chex.Array:
    """`-inf` for the invalid actions, at the root only (as mctx does)."""
    invalid = jnp.logical_and(tree.root_invalid_actions != 0, depth == 0)
    return jnp.where(invalid, -jnp.inf, scores)


def _argmax_and_near_tie(scores: chex.Array) -> tuple[chex.Array, chex.Array]:
    """The argmax, and whether mctx's `[0, 1e-7)` tie-break noise could change it.

    The noise can only overturn a lead of less than 1e-7 plus a few rounding
    units of the score; the margin used here is twice that.
    """
    action = jnp.argmax(scores, axis=-1).astype(jnp.int32)
    best = jnp.max(scores, axis=-1)
    is_best = jnp.arange(scores.shape[-1]) == action[:, None]
    runner_up = jnp.max(jnp.where(is_best, -jnp.inf, scores), axis=-1)
    margin = 2 * _TIE_NOISE_SCALE + 4 * jnp.finfo(scores.dtype).eps * jnp.abs(best)
    return action, best - runner_up <= margin


class _Descent(NamedTuple):
    """State of the batched descent from the root to a leaf."""

    node: chex.Array  # [B] node being expanded from (stays put once finished)
    depth: chex.Array  # scalar, depth of `node` for the examples still going
    length: chex.Array  # [B] number of edges selected so far
    continuing: chex.Array  # [B]
    path: chex.Array  # [B, capacity, 2] (node, action) per depth
    near_tie: chex.Array  # [B] some selection of this descent was a near tie
    chain: _KeyChain  # only advanced by the exact descent


class _Path(NamedTuple):
    """Edges of one simulation: `(nodes[b, k], actions[b, k])` for `k < length[b]`."""

    nodes: chex.Array
    actions: chex.Array
    length: chex.Array


def _descend_once(
    state: _Search,
    example_keys: chex.Array | None,
    prepared: Any,
    scorer: _ValueScorer,
    max_depth: int,
    path_capacity: int,
    exact: bool,
) -> _Descent:
    """One batched descent; with `exact=False` it ignores mctx's tie-break noise.

    The whole batch moves one level per iteration (no per-example vmap, so no
    select between a root and an interior branch); finished examples keep
    recomputing their last node, whose results land past their `length` and are
    never read. The traversed edges are recorded so that backpropagation needs
    no walk up the parent pointers.
    """
    tree = state.tree
    batch_size = tree.node_values.shape[0]
    root = jnp.full((batch_size,), Tree.ROOT_INDEX, jnp.int32)
    descent = _Descent(
        node=root,
        depth=jnp.asarray(0, jnp.int32),
        length=jnp.zeros((batch_size,), jnp.int32),
        continuing=jnp.ones((batch_size,), bool),
        path=jnp.zeros((batch_size, path_capacity, 2), jnp.int32),
        near_tie=jnp.zeros((batch_size,), bool),
        chain=_KeyChain(
            keys=jnp.zeros((), jnp.int32) if example_keys is None else example_keys,
            depth=jnp.asarray(0, jnp.int32),
        ),
    )

    def body(d: _Descent) -> _Descent:
        scores = _scores(state, scorer.score(tree, prepared, d.node), d.node)
        action, near_tie = _argmax_and_near_tie(_mask_root(tree, scores, d.depth))
        near_tie = jnp.logical_and(d.continuing, near_tie)
        chain = d.chain
        if exact:

            def with_noise(chain):
                noise, chain = _tie_break_noise(chain, d.depth, scores.shape[-1])
                noisy = _mask_root(tree, scores + noise, d.depth)
                return jnp.argmax(noisy, axis=-1).astype(jnp.int32), chain

            action, chain = jax.lax.cond(
                jnp.any(near_tie), with_noise, lambda c: (action, c), chain
            )
        child = _edges(tree.children_index, d.node, action)
        path = jax.lax.dynamic_update_index_in_dim(
            d.path, jnp.stack([d.node, action], axis=-1), d.depth, 1
        )
        depth = d.depth + 1
        continuing = d.continuing & (child != Tree.UNVISITED) & (depth < max_depth)
        return _Descent(
            node=jnp.where(continuing, child, d.node),
            depth=depth,
            length=d.length + d.continuing.astype(jnp.int32),
            continuing=continuing,
            path=path,
            near_tie=d.near_tie | near_tie,
            chain=chain,
        )

    return jax.lax.while_loop(lambda d: jnp.any(d.continuing), body, descent)


def _descend(
    state: _Search,
    simulate_key: chex.PRNGKey,
    scorer: _ValueScorer,
    max_depth: int,
) -> _Path:
    """Selects actions from the root until an unvisited edge or `max_depth`.

    mctx adds `1e-7 * uniform` noise to every score before its argmax, drawn
    from a per-example key chain (two threefry calls per depth, more than the
    rest of the descent costs on CPU). The noise can only matter in a near tie,
    so the descent first runs without it and is redone with the exact noise
    only if some selection was that close.
    """
    tree = state.tree
    num_nodes = tree.node_values.shape[1]
    # A leaf is at most `num_nodes - 1` edges below the root; backpropagation
    # reads the path in whole chunks.
    depth_limit = max(1, min(max_depth, num_nodes - 1))
    path_capacity = -(-depth_limit // _BACKUP_CHUNK) * _BACKUP_CHUNK
    prepared = scorer.prepare(state)

    batch_size = tree.node_values.shape[0]

    def descend(exact):
        # mctx's per-example keys; the fast pass never reads them.
        keys = jax.random.split(simulate_key, batch_size) if exact else None
        return _descend_once(state, keys, prepared, scorer, max_depth, path_capacity, exact)

    fast = descend(exact=False)
    descent = jax.lax.cond(
        jnp.any(fast.near_tie),
        lambda: descend(exact=True)._replace(chain=fast.chain),
        lambda: fast,
    )
    return _Path(nodes=descent.path[..., 0], actions=descent.path[..., 1], length=descent.length)


def _expand(
    params: Any,
    rng_key: chex.PRNGKey,
    state: _Search,
    recurrent_fn: mctx.RecurrentFn,
    parent: chex.Array,
    action: chex.Array,
    node: chex.Array,
    new_node: chex.Array | None,
    pb_c_init: chex.Numeric,
    pb_c_base: chex.Numeric,
) -> _Search:
    """Evaluates `(parent, action)` with the model and stores it at `node`.

    When the caller knows that every example expands the same fresh index
    (`new_node`, a scalar: no `max_depth` cut-off can revisit a node), the
    per-node fields are written as one column with `dynamic_update_slice`,
    which is several times cheaper on CPU than a batched scatter.
    """
    tree = state.tree
    batch_size, _, num_actions = tree.children_index.shape
    embedding = jax.tree.map(lambda x: _rows(x, parent), tree.embeddings)
    step, embedding = recurrent_fn(params, rng_key, action, embedding)
    chex.assert_shape(step.prior_logits, (batch_size, num_actions))
    chex.assert_shape([step.reward, step.discount, step.value], (batch_size,))
    everywhere = jnp.ones((batch_size,), bool)

    def write_edge(x, value):
        return _set_edges(x, parent, action, value, everywhere)

    if new_node is None:

        def write(x, value):
            return _set_rows(x, node, value, everywhere)

    else:

        def write(x, value):
            return jax.lax.dynamic_update_index_in_dim(x, value.astype(x.dtype), new_node, 1)

    # With max_depth an existing node can be evaluated again; mctx then
    # overwrites its value and adds one visit, and so do we.
    visits = _rows(tree.node_visits, node) + 1
    tree = tree.replace(
        children_prior_logits=write(tree.children_prior_logits, step.prior_logits),
        raw_values=write(tree.raw_values, step.value),
        node_values=write(tree.node_values, step.value),
        node_visits=write(tree.node_visits, visits),
        embeddings=jax.tree.map(write, tree.embeddings, embedding),
        children_index=write_edge(tree.children_index, node),
        children_rewards=write_edge(tree.children_rewards, step.reward),
        children_discounts=write_edge(tree.children_discounts, step.discount),
        parents=write(tree.parents, parent),
        action_from_parent=write(tree.action_from_parent, action),
    )
    return state._replace(
        tree=tree,
        prior_probs=write(state.prior_probs, jax.nn.softmax(step.prior_logits)),
        exploration=write(state.exploration, _exploration(visits, pb_c_init, pb_c_base)),
    )


# Path positions handled per iteration of the backpropagation loop.
_BACKUP_CHUNK = 8


class _Updates(NamedTuple):
    """What backpropagation writes for a block of path positions `[B, K]`."""

    nodes: chex.Array
    actions: chex.Array
    on_path: chex.Array
    node_values: chex.Array
    node_visits: chex.Array
    child_values: chex.Array
    child_visits: chex.Array
    child_q: chex.Array | None = None  # reward + discount * child_values, for edge_q_*


def _apply_updates(
    state: _Search, u: _Updates, pb_c_init: chex.Numeric, pb_c_base: chex.Numeric
) -> _Search:
    """Scatters a block of backpropagation updates; off-path positions are dropped."""
    tree = state.tree
    tree = tree.replace(
        node_values=_set_rows(tree.node_values, u.nodes, u.node_values, u.on_path),
        node_visits=_set_rows(tree.node_visits, u.nodes, u.node_visits, u.on_path),
        children_values=_set_edges(
            tree.children_values, u.nodes, u.actions, u.child_values, u.on_path
        ),
        children_visits=_set_edges(
            tree.children_visits, u.nodes, u.actions, u.child_visits, u.on_path
        ),
    )
    exploration = _set_rows(
        state.exploration, u.nodes, _exploration(u.node_visits, pb_c_init, pb_c_base), u.on_path
    )
    state = state._replace(tree=tree, exploration=exploration)
    if state.edge_q_min is not None:
        # The edge is visited now, so both caches hold its Q-value.
        state = state._replace(
            edge_q_min=_set_edges(state.edge_q_min, u.nodes, u.actions, u.child_q, u.on_path),
            edge_q_max=_set_edges(state.edge_q_max, u.nodes, u.actions, u.child_q, u.on_path),
        )
    return state


def _backpropagate(
    state: _Search,
    path: _Path,
    leaf: chex.Array,
    pb_c_init: chex.Numeric,
    pb_c_base: chex.Numeric,
) -> _Search:
    """Backs the leaf value up the recorded path with mctx's running-mean update.

    mctx walks the parent pointers with a vmapped while loop whose every
    iteration rewrites the whole tree. Here the path is processed from the leaf
    up in chunks of `_BACKUP_CHUNK` positions: one batched gather per field, the
    sequential discounted return `r + discount * value` unrolled over the chunk,
    and one batched scatter per field; positions past an example's path length
    go to an out-of-bounds row and are dropped. The nodes of a path are
    distinct, so a chunk never reads what a deeper chunk wrote.

    The path's edges are the only ones whose value or visit count changes, and
    expansion only rewrote the reward and discount of its last edge (read here
    after the expansion), so with `edge_q_*` caches their Q-values
    `reward + discount * child_value` are written along with the values.
    """
    chunk = _BACKUP_CHUNK
    length = path.length[:, None]
    leaf_value = _rows(state.tree.node_values, leaf)
    num_chunks = (jnp.max(path.length) + chunk - 1) // chunk

    def back_up_chunk(i, carry):
        state, value, value_below = carry
        tree = state.tree
        start = (num_chunks - 1 - i) * chunk
        nodes = jax.lax.dynamic_slice_in_dim(path.nodes, start, chunk, 1)
        actions = jax.lax.dynamic_slice_in_dim(path.actions, start, chunk, 1)
        position = start + jnp.arange(chunk)[None, :]
        on_path = position < length
        rewards = _edges(tree.children_rewards, nodes, actions)
        discounts = _edges(tree.children_discounts, nodes, actions)
        visits = _rows(tree.node_visits, nodes)
        returns = [None] * chunk
        for j in reversed(range(chunk)):
            value = jnp.where(on_path[:, j], rewards[:, j] + discounts[:, j] * value, value)
            returns[j] = value
        returns = jnp.stack(returns, axis=1)
        new_values = (_rows(tree.node_values, nodes) * visits + returns) / (visits + 1.0)
        # The child below position k is the node at position k + 1, or the leaf.
        below = jnp.concatenate([new_values[:, 1:], value_below[:, None]], axis=1)
        child_values = jnp.where(position == length - 1, leaf_value[:, None], below)
        block = _Updates(
            nodes=nodes,
            actions=actions,
            on_path=on_path,
            node_values=new_values,
            node_visits=visits + 1,
            child_values=child_values,
            child_visits=_edges(tree.children_visits, nodes, actions) + 1,
            child_q=None if state.edge_q_min is None else rewards + discounts * child_values,
        )
        state = _apply_updates(state, block, pb_c_init, pb_c_base)
        return state, value, new_values[:, 0]

    state, _, _ = jax.lax.fori_loop(0, num_chunks, back_up_chunk, (state, leaf_value, leaf_value))
    return state


def _initial_tree(
    root: mctx.RootFnOutput, num_simulations: int, invalid_actions: chex.Array
) -> Tree:
    """Allocates a tree with room for `num_simulations + 1` nodes and fills the root."""
    chex.assert_rank(root.prior_logits, 2)
    batch_size, num_actions = root.prior_logits.shape
    chex.assert_shape(root.value, (batch_size,))
    nodes = (batch_size, num_simulations + 1)
    edges = nodes + (num_actions,)
    dtype = root.value.dtype

    def embedding_storage(x):
        return jnp.zeros(nodes + x.shape[1:], x.dtype).at[:, Tree.ROOT_INDEX].set(x)

    return Tree(
        node_visits=jnp.zeros(nodes, jnp.int32).at[:, Tree.ROOT_INDEX].set(1),
        raw_values=jnp.zeros(nodes, dtype).at[:, Tree.ROOT_INDEX].set(root.value),
        node_values=jnp.zeros(nodes, dtype).at[:, Tree.ROOT_INDEX].set(root.value),
        parents=jnp.full(nodes, Tree.NO_PARENT, jnp.int32),
        action_from_parent=jnp.full(nodes, Tree.NO_PARENT, jnp.int32),
        children_index=jnp.full(edges, Tree.UNVISITED, jnp.int32),
        children_prior_logits=jnp.zeros(edges, root.prior_logits.dtype)
        .at[:, Tree.ROOT_INDEX]
        .set(root.prior_logits),
        children_values=jnp.zeros(edges, dtype),
        children_visits=jnp.zeros(edges, jnp.int32),
        children_rewards=jnp.zeros(edges, dtype),
        children_discounts=jnp.zeros(edges, dtype),
        embeddings=jax.tree.map(embedding_storage, root.embedding),
        root_invalid_actions=invalid_actions,
        extra_data=None,
    )


def _search(
    params: Any,
    rng_key: chex.PRNGKey,
    root: mctx.RootFnOutput,
    recurrent_fn: mctx.RecurrentFn,
    num_simulations: int,
    invalid_actions: chex.Array | None,
    max_depth: int | None,
    loop_fn: mctx.LoopFn,
    qtransform: QTransform,
    pb_c_init: chex.Numeric,
    pb_c_base: chex.Numeric,
) -> Tree:
    """Runs the simulations; the key schedule is the same as `mctx.search`'s."""
    if max_depth is None:
        max_depth = num_simulations
    if invalid_actions is None:
        invalid_actions = jnp.zeros_like(root.prior_logits)
    scorer = _make_value_scorer(qtransform)
    # A descent can only stop on an already expanded node when `max_depth` cuts
    # it short; the deepest node of simulation `sim` is at depth <= sim.
    revisits = max_depth < num_simulations

    # mctx splits `rng_key -> (rng_key, simulate_key, expand_key)` at the start
    # of every simulation; the chain does not depend on the search, so it is
    # drawn up front in one small loop.
    def next_keys(key, _):
        key, simulate_key, expand_key = jax.random.split(key, 3)
        return key, (simulate_key, expand_key)

    _, (simulate_keys, expand_keys) = jax.lax.scan(next_keys, rng_key, None, length=num_simulations)

    def body(sim, state):
        # The named scopes label the profile (see the module docstring).
        with jax.named_scope("puct_descend"):
            path = _descend(state, simulate_keys[sim], scorer, max_depth)
            last = path.length - 1
            parent = _rows(path.nodes, last)
            action = _rows(path.actions, last)
            # The node first expanded by simulation `sim` gets index `sim + 1`.
            node = _edges(state.tree.children_index, parent, action)
            node = jnp.where(node == Tree.UNVISITED, sim + 1, node)
        with jax.named_scope("puct_expand"):
            state = _expand(
                params,
                expand_keys[sim],
                state,
                recurrent_fn,
                parent,
                action,
                node,
                None if revisits else sim + 1,
                pb_c_init,
                pb_c_base,
            )
        with jax.named_scope("puct_backpropagate"):
            return _backpropagate(state, path, node, pb_c_init, pb_c_base)

    tree = _initial_tree(root, num_simulations, invalid_actions)
    root_probs = jax.nn.softmax(root.prior_logits)
    # No edge is visited yet, so these are all +inf and -inf.
    edge_q_min, edge_q_max = _visited_q(tree) if scorer.edge_q else (None, None)
    state = _Search(
        tree=tree,
        prior_probs=jnp.zeros(tree.children_prior_logits.shape, root_probs.dtype)
        .at[:, Tree.ROOT_INDEX]
        .set(root_probs),
        exploration=_exploration(tree.node_visits, pb_c_init, pb_c_base),
        edge_q_min=edge_q_min,
        edge_q_max=edge_q_max,
    )
    state = loop_fn(0, num_simulations, body, state)
    return state.tree


# ----------------------------------------------------------------------------
# Policies.
# ----------------------------------------------------------------------------


def _safe_log(probs: chex.Array) -> chex.Array:
    """`log(probs)` with zero probabilities mapped to the log of the tiniest float."""
    return jnp.log(jnp.maximum(probs, jnp.finfo(probs.dtype).tiny))


def _mask_logits(logits: chex.Array, invalid_actions: chex.Array | None) -> chex.Array:
    """Gives invalid actions the lowest finite logit (finite so softmax stays NaN-free)."""
    if invalid_actions is None:
        return logits
    chex.assert_equal_shape([logits, invalid_actions])
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    return jnp.where(invalid_actions, jnp.finfo(logits.dtype).min, logits)


def _root_prior_with_dirichlet(
    rng_key: chex.PRNGKey,
    prior_logits: chex.Array,
    fraction: chex.Numeric,
    alpha: chex.Numeric,
) -> chex.Array:
    """Mixes the root prior with Dirichlet noise and returns logits."""
    probs = jax.nn.softmax(prior_logits)
    batch_size, num_actions = probs.shape
    noise = jax.random.dirichlet(
        rng_key, alpha=jnp.full([num_actions], fill_value=alpha), shape=(batch_size,)
    )
    return _safe_log((1 - fraction) * probs + fraction * noise)


def _logits_at_temperature(logits: chex.Array, temperature: chex.Numeric) -> chex.Array:
    """`logits / temperature` with the max subtracted first; temperature 0 is greedy."""
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    return logits / jnp.maximum(jnp.finfo(logits.dtype).tiny, temperature)


def puct_policy(
    params: Any,
    rng_key: chex.PRNGKey,
    root: mctx.RootFnOutput,
    recurrent_fn: mctx.RecurrentFn,
    num_simulations: int,
    invalid_actions: chex.Array | None = None,
    max_depth: int | None = None,
    loop_fn: mctx.LoopFn = jax.lax.fori_loop,
    *,
    qtransform: QTransform = mctx.qtransform_by_parent_and_siblings,
    dirichlet_fraction: chex.Numeric = 0.25,
    dirichlet_alpha: chex.Numeric = 0.3,
    pb_c_init: chex.Numeric = 1.25,
    pb_c_base: chex.Numeric = 19652,
    temperature: chex.Numeric = 1.0,
) -> mctx.PolicyOutput[None]:
    """Runs MuZero's PUCT search; a drop-in, faster `mctx.muzero_policy`.

    Same arguments, defaults and outputs as `mctx.muzero_policy`: with the same
    `rng_key` (and a deterministic or identically seeded `recurrent_fn`) the
    returned `action`, `action_weights` and `search_tree` are identical to mctx's,
    tie-break noise included. Only the execution differs; see the module
    docstring for why this is faster.

    In the shape descriptions `B` is the batch size.

    Args:
        params: forwarded to `recurrent_fn`.
        rng_key: consumed; split exactly as `mctx.muzero_policy` splits it.
        root: `RootFnOutput` with `prior_logits [B, A]`, `value [B]` and an
            embedding pytree with leading dimension `B`.
        recurrent_fn: `(params, rng_key, action [B], embedding) ->
            (RecurrentFnOutput, embedding)`.
        num_simulations: number of simulations.
        invalid_actions: `[B, A]` mask, ones for invalid root actions.
        max_depth: maximum number of edges from the root to a leaf.
        loop_fn: loop over simulations, `jax.lax.fori_loop` or `hk.fori_loop`.
        qtransform: `(unbatched tree, node_index) -> [A]` value scores, e.g.
            `mctx.qtransform_by_parent_and_siblings` (default) or
            `qtransform_by_tree_min_max`.
        dirichlet_fraction: weight of the Dirichlet noise in the root prior.
        dirichlet_alpha: concentration of the Dirichlet noise.
        pb_c_init: PUCT constant `c1`.
        pb_c_base: PUCT constant `c2`.
        temperature: the action is sampled from `visit_counts ** (1/temperature)`.

    Returns:
        `mctx.PolicyOutput` with the sampled `action [B]`, the `action_weights
        [B, A]` (root visit frequencies) and the `search_tree`.
    """
    rng_key, dirichlet_key, search_key = jax.random.split(rng_key, 3)
    noisy_logits = _root_prior_with_dirichlet(
        dirichlet_key, root.prior_logits, dirichlet_fraction, dirichlet_alpha
    )
    root = root.replace(prior_logits=_mask_logits(noisy_logits, invalid_actions))
    tree = _search(
        params,
        search_key,
        root,
        recurrent_fn,
        num_simulations,
        invalid_actions,
        max_depth,
        loop_fn,
        qtransform,
        pb_c_init,
        pb_c_base,
    )
    action_weights = tree.summary().visit_probs
    action_logits = _logits_at_temperature(_safe_log(action_weights), temperature)
    action = jax.random.categorical(rng_key, action_logits)
    return mctx.PolicyOutput(action=action, action_weights=action_weights, search_tree=tree)


def muzero_paper_policy(
    params: Any,
    rng_key: chex.PRNGKey,
    root: mctx.RootFnOutput,
    recurrent_fn: mctx.RecurrentFn,
    num_simulations: int,
    invalid_actions: chex.Array | None = None,
    max_depth: int | None = None,
    loop_fn: mctx.LoopFn = jax.lax.fori_loop,
    *,
    qtransform: QTransform = qtransform_by_tree_min_max,
    dirichlet_fraction: chex.Numeric = 0.25,
    dirichlet_alpha: chex.Numeric = 0.3,
    pb_c_init: chex.Numeric = 1.25,
    pb_c_base: chex.Numeric = 19652,
    temperature: chex.Numeric = 1.0,
) -> mctx.PolicyOutput[None]:
    """`puct_policy` with the paper's tree-wide min-max value normalisation.

    Identical to `puct_policy` except that `qtransform` defaults to
    `qtransform_by_tree_min_max`; the result equals
    `mctx.muzero_policy(..., qtransform=qtransform_by_tree_min_max)`. See
    `puct_policy` for the arguments.
    """
    return puct_policy(
        params,
        rng_key,
        root,
        recurrent_fn,
        num_simulations,
        invalid_actions,
        max_depth,
        loop_fn,
        qtransform=qtransform,
        dirichlet_fraction=dirichlet_fraction,
        dirichlet_alpha=dirichlet_alpha,
        pb_c_init=pb_c_init,
        pb_c_base=pb_c_base,
        temperature=temperature,
    )
