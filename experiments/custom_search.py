"""A user-written search plugged into muzero-jax: `ucb_policy`.

This file is the worked example of docs/search.md. It builds a search on
`mctx.search` with its own two action-selection functions and returns an
`mctx.PolicyOutput`, so it has mctx's policy signature and can replace the
built-in searches everywhere muzero-jax searches (acting and evaluation):

* from Python: `make_train(config, search_fn=ucb_policy)`;
* from a config or the CLI:
  `muzero-jax train --env catch --search experiments.custom_search:ucb_policy
  --search-kwargs c_uct=0.5` (run from the repository root, so that
  `experiments` imports).

The search:

* **root**: every legal root action is tried once first, in order of its prior
  (so the root always has a value estimate for every legal move), then UCB1 on
  the paper's tree-wide min-max normalised Q-values with a prior bonus:
  `q(a) + c_uct * sqrt(log N / n(a)) + c_prior * p(a) / (1 + n(a))`;
* **interior**: the same UCB rule without the "try everything first" phase,
  so unvisited children rank by their prior bonus (and, unlike plain UCB1, a
  large action space is not swept exhaustively below the root);
* **output**: `action_weights` are the root visit frequencies; `action` is
  sampled from them (temperature 1) for exploration when acting, or the most
  visited action when `greedy=True`.
"""

from __future__ import annotations

import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp
import mctx

from muzero_jax.puct import qtransform_by_tree_min_max

__all__ = ["ucb_policy", "ucb_scores"]


def ucb_scores(
    tree: mctx.Tree, node_index: chex.Numeric, c_uct: float, c_prior: float
) -> chex.Array:
    """UCB scores `[A]` of one node's children in an unbatched tree.

    `q + c_uct * sqrt(log(N) / n) + c_prior * prior / (1 + n)`, with `q` the
    tree-wide min-max normalised Q-value (0 for unvisited children), `N` the
    node's visits and `n` the child's; an unvisited child's UCB1 term is 0 (it
    is ranked by its prior bonus alone).
    """
    visits = tree.children_visits[node_index].astype(jnp.float32)
    parent_visits = tree.node_visits[node_index].astype(jnp.float32)
    prior = jax.nn.softmax(tree.children_prior_logits[node_index])
    q = qtransform_by_tree_min_max(tree, node_index)
    uct = jnp.where(
        visits > 0, jnp.sqrt(jnp.log(jnp.maximum(parent_visits, 1.0)) / jnp.maximum(visits, 1.0)), 0
    )
    return q + c_uct * uct + c_prior * prior / (1.0 + visits)


def _root_selection(
    rng_key: chex.PRNGKey, tree: mctx.Tree, node_index: chex.Numeric, *, c_uct, c_prior
) -> chex.Array:
    """Tries every legal root action once (highest prior first), then UCB."""
    del rng_key
    valid = jnp.logical_not(tree.root_invalid_actions.astype(bool))
    visits = tree.children_visits[node_index]
    untried = valid & (visits == 0)
    prior_logits = tree.children_prior_logits[node_index]
    first = jnp.argmax(jnp.where(untried, prior_logits, -jnp.inf))
    scores = jnp.where(valid, ucb_scores(tree, node_index, c_uct, c_prior), -jnp.inf)
    return jnp.where(jnp.any(untried), first, jnp.argmax(scores)).astype(jnp.int32)


def _interior_selection(
    rng_key: chex.PRNGKey,
    tree: mctx.Tree,
    node_index: chex.Numeric,
    depth: chex.Numeric,
    *,
    c_uct,
    c_prior,
) -> chex.Array:
    """UCB below the root (no legal-action mask: mctx only masks the root)."""
    del rng_key, depth
    return jnp.argmax(ucb_scores(tree, node_index, c_uct, c_prior)).astype(jnp.int32)


def ucb_policy(
    params: Any,
    rng_key: chex.PRNGKey,
    root: mctx.RootFnOutput,
    recurrent_fn: mctx.RecurrentFn,
    *,
    num_simulations: int,
    invalid_actions: chex.Array | None = None,
    max_depth: int | None = None,
    c_uct: float = 1.0,
    c_prior: float = 1.0,
    greedy: bool = False,
) -> mctx.PolicyOutput[None]:
    """UCB search with a try-every-root-action-first phase (see the module doc).

    Args:
      params: forwarded to `recurrent_fn`.
      rng_key: consumed (the search itself is deterministic; the key samples
        the returned action).
      root: `RootFnOutput` with `prior_logits [B, A]`, `value [B]`, embedding
        `[B, ...]`.
      recurrent_fn: mctx's recurrent function.
      num_simulations: simulations per search.
      invalid_actions: `[B, A]`, nonzero for illegal root actions.
      max_depth: maximum depth of a simulation (default: `num_simulations`).
      c_uct: weight of the UCB1 exploration term.
      c_prior: weight of the prior bonus.
      greedy: return the most visited action instead of sampling one.

    Returns:
      `mctx.PolicyOutput` with `action [B]`, `action_weights [B, A]` (root visit
      frequencies) and the search tree.
    """
    search_key, action_key = jax.random.split(rng_key)
    if invalid_actions is not None:  # illegal moves get no prior mass at the root
        root = root.replace(
            prior_logits=jnp.where(
                invalid_actions.astype(bool),
                jnp.finfo(root.prior_logits.dtype).min,
                root.prior_logits,
            )
        )
    tree = mctx.search(
        params,
        search_key,
        root=root,
        recurrent_fn=recurrent_fn,
        root_action_selection_fn=functools.partial(_root_selection, c_uct=c_uct, c_prior=c_prior),
        interior_action_selection_fn=functools.partial(
            _interior_selection, c_uct=c_uct, c_prior=c_prior
        ),
        num_simulations=num_simulations,
        max_depth=max_depth,
        invalid_actions=invalid_actions,
    )
    action_weights = tree.summary().visit_probs
    if greedy:
        action = jnp.argmax(action_weights, axis=-1)
    else:
        logits = jnp.log(jnp.maximum(action_weights, jnp.finfo(action_weights.dtype).tiny))
        action = jax.random.categorical(action_key, logits)
    return mctx.PolicyOutput(
        action=action.astype(jnp.int32), action_weights=action_weights, search_tree=tree
    )
