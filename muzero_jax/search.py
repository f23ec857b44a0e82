"""The bridge between MuZero's networks and mctx's batched search.

A search is a function value with mctx's policy signature (`SearchFn`), e.g.
`mctx.gumbel_muzero_policy`. `make_root_fn` and `make_recurrent_fn` turn the
networks into the `RootFnOutput` and `recurrent_fn` that every such search
consumes. `resolve_search` turns a name from the command line (`"muzero"`,
`"gumbel_muzero"`, ...) or a `"package.module:attr"` spec into a `SearchFn`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import chex
import jax
import jax.numpy as jnp
import mctx

from muzero_jax.networks import Networks, Params
from muzero_jax.value_transforms import DiscreteSupport

__all__ = [
    "SearchFn",
    "RootFn",
    "BUILTIN_SEARCHES",
    "make_root_fn",
    "make_recurrent_fn",
    "resolve_search",
]


class SearchFn(Protocol):
    """mctx's policy signature: what every search plugged into muzero-jax has.

    `search_fn(params, rng_key, root, recurrent_fn, *, num_simulations,
    invalid_actions, **hyperparameters) -> mctx.PolicyOutput`; the rng key is
    consumed; `root` is an `mctx.RootFnOutput` with a batch dimension.
    """

    def __call__(
        self,
        params: Any,
        rng_key: chex.PRNGKey,
        root: mctx.RootFnOutput,
        recurrent_fn: mctx.RecurrentFn,
        *,
        num_simulations: int,
        invalid_actions: chex.Array | None = None,
        **kwargs: Any,
    ) -> mctx.PolicyOutput: ...


RootFn = Callable[[Params, chex.Array], mctx.RootFnOutput]


def _builtin_searches() -> dict[str, Callable[..., mctx.PolicyOutput]]:
    searches: dict[str, Callable[..., mctx.PolicyOutput]] = {
        "muzero": mctx.muzero_policy,
        "gumbel_muzero": mctx.gumbel_muzero_policy,
    }
    try:  # The fast PUCT and the paper's tree-wide min-max normalisation.
        from muzero_jax import puct
    except ImportError:  # pragma: no cover - only while the module is absent
        return searches
    for name, attr in (("puct", "puct_policy"), ("muzero_paper", "muzero_paper_policy")):
        if hasattr(puct, attr):
            searches[name] = getattr(puct, attr)
    return searches


BUILTIN_SEARCHES: Mapping[str, Callable[..., mctx.PolicyOutput]] = _builtin_searches()
"""Built-in searches by name (function values; the CLI resolves names here)."""


def make_root_fn(networks: Networks, value_support: DiscreteSupport) -> RootFn:
    """Returns `root_fn(params, observation[B, *obs]) -> mctx.RootFnOutput`.

    The root's prior logits and scalar value come from `initial_inference`;
    its embedding is the hidden state. Illegal actions at the root are masked
    by the search through its `invalid_actions` argument.
    """

    def root_fn(params: Params, observation: chex.Array) -> mctx.RootFnOutput:
        out = networks.initial_inference(params, observation)
        return mctx.RootFnOutput(
            prior_logits=out.policy_logits,
            value=value_support.logits_to_scalar(out.value_logits),
            embedding=out.hidden,
        )

    return root_fn


def make_recurrent_fn(
    networks: Networks,
    value_support: DiscreteSupport,
    reward_support: DiscreteSupport,
    *,
    discount: float,
    two_player: bool = False,
) -> mctx.RecurrentFn:
    """Returns mctx's `recurrent_fn(params, rng_key, action, embedding)`.

    Args:
      networks: the networks.
      value_support: support of the value head (logits -> scalar).
      reward_support: support of the reward head.
      discount: the environment's discount gamma, in [0, 1].
      two_player: players alternate each ply (zero-sum): the discount becomes
        `-discount`, mctx's convention for negating the value between plies;
        rewards and values are from the point of view of the player to move.

    Returns:
      A recurrent function returning `(mctx.RecurrentFnOutput, next_embedding)`.
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount!r}")
    signed_discount = -discount if two_player else discount

    def recurrent_fn(params: Params, rng_key: chex.PRNGKey, action, embedding):
        del rng_key
        out = networks.recurrent_inference(params, embedding, action)
        batch = action.shape[0]
        output = mctx.RecurrentFnOutput(
            reward=reward_support.logits_to_scalar(out.reward_logits),
            discount=jnp.full((batch,), signed_discount, jnp.float32),
            prior_logits=out.policy_logits,
            value=value_support.logits_to_scalar(out.value_logits),
        )
        return output, out.hidden

    return recurrent_fn


def resolve_search(
    spec: str | Callable[..., mctx.PolicyOutput],
    search_kwargs: Mapping[str, Any] | None = None,
) -> Callable[..., mctx.PolicyOutput]:
    """Turns a search name, a `"module:attr"` spec or a callable into a SearchFn.

    Args:
      spec: a built-in name (see `BUILTIN_SEARCHES`), `"package.module:attr"`
        naming a callable with mctx's policy signature, or such a callable.
      search_kwargs: keyword hyper-parameters bound to the search (e.g.
        `{"max_num_considered_actions": 8}`).

    Returns:
      The search function, with `search_kwargs` bound via `functools.partial`.

    Raises:
      ValueError: unknown name, malformed spec, a module that does not import,
        or an attribute that is missing or not callable.
    """
    if callable(spec):
        fn = spec
    elif not isinstance(spec, str) or not spec:
        raise ValueError(f"search must be a name, 'module:attr' or a callable, got {spec!r}")
    elif ":" in spec:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise ValueError(f"search spec {spec!r} must look like 'package.module:attr'")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # noqa: BLE001 - report any import failure clearly
            raise ValueError(
                f"search spec {spec!r}: module {module_name!r} does not import "
                f"({type(e).__name__}: {e})"
            ) from e
        fn = module
        for part in attr.split("."):
            if not hasattr(fn, part):
                raise ValueError(f"search spec {spec!r}: {module_name!r} has no attribute {attr!r}")
            fn = getattr(fn, part)
        if not callable(fn):
            raise ValueError(
                f"search spec {spec!r}: {attr!r} is a {type(fn).__name__}, not a callable"
            )
    elif spec in BUILTIN_SEARCHES:
        fn = BUILTIN_SEARCHES[spec]
    else:
        raise ValueError(
            f"unknown search {spec!r}; built-in searches: {', '.join(sorted(BUILTIN_SEARCHES))}, "
            "or give 'package.module:attr'"
        )
    if search_kwargs:
        fn = functools.partial(fn, **dict(search_kwargs))
    return fn


def batch_search(
    search_fn: Callable[..., mctx.PolicyOutput],
    root_fn: RootFn,
    recurrent_fn: mctx.RecurrentFn,
    *,
    num_simulations: int,
) -> Callable[..., mctx.PolicyOutput]:
    """Returns `run(params, rng_key, observation, legal_action_mask)`.

    A convenience for acting: builds the root from observations and calls the
    search with illegal actions masked (`invalid_actions = ~legal`).
    """

    def run(params, rng_key, observation, legal_action_mask):
        root = root_fn(params, observation)
        return search_fn(
            params,
            rng_key,
            root,
            recurrent_fn,
            num_simulations=num_simulations,
            invalid_actions=jnp.logical_not(legal_action_mask),
        )

    return run


def check_search_fn(
    search_fn: Callable[..., mctx.PolicyOutput],
    root_fn: RootFn,
    recurrent_fn: mctx.RecurrentFn,
    params: Params,
    observation: chex.Array,
    legal_action_mask: chex.Array,
    *,
    num_simulations: int,
) -> None:
    """Traces a search once with abstract shapes and checks its output.

    Raises:
      ValueError: naming what is wrong (signature, output type or shapes),
        before anything is compiled.
    """
    run = batch_search(search_fn, root_fn, recurrent_fn, num_simulations=num_simulations)
    name = getattr(search_fn, "__name__", repr(search_fn))
    try:
        out = jax.eval_shape(run, params, jax.random.key(0), observation, legal_action_mask)
    except TypeError as e:
        raise ValueError(
            f"search {name} cannot be called with mctx's policy signature "
            f"(params, rng_key, root, recurrent_fn, *, num_simulations, invalid_actions): {e}"
        ) from e
    batch, num_actions = legal_action_mask.shape
    if not isinstance(out, mctx.PolicyOutput):
        raise ValueError(f"search {name} must return mctx.PolicyOutput, got {type(out).__name__}")
    if tuple(out.action.shape) != (batch,):
        raise ValueError(f"search {name}: action has shape {out.action.shape}, expected ({batch},)")
    if tuple(out.action_weights.shape) != (batch, num_actions):
        raise ValueError(
            f"search {name}: action_weights has shape {out.action_weights.shape}, "
            f"expected ({batch}, {num_actions})"
        )
