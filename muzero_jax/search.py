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
import inspect
import os
import sys
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
    "make_decoded_recurrent_fn",
    "check_decoded_model",
    "every_move_step",
    "with_win_lookahead",
    "check_win_lookahead",
    "WIN_LOOKAHEAD_THRESHOLD",
    "make_env_root_fn",
    "make_env_recurrent_fn",
    "resolve_search",
    "resolve_qtransform",
    "batch_search",
    "check_search_fn",
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


def _signed_discount(discount: float, two_player: bool) -> float:
    """Checks gamma and gives mctx's per-ply discount (negated when players alternate)."""
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount!r}")
    return -discount if two_player else discount


def _model_step_output(reward_logits, policy_logits, value_logits, *, signed_discount: float,
                       value_support: DiscreteSupport,
                       reward_support: DiscreteSupport) -> mctx.RecurrentFnOutput:
    """One expansion of a learned model: its reward, the per-ply discount, prior and value."""
    return mctx.RecurrentFnOutput(
        reward=reward_support.logits_to_scalar(reward_logits),
        discount=jnp.full(reward_logits.shape[:1], signed_discount, jnp.float32),
        prior_logits=policy_logits,
        value=value_support.logits_to_scalar(value_logits),
    )


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
    signed_discount = _signed_discount(discount, two_player)

    def recurrent_fn(params: Params, rng_key: chex.PRNGKey, action, embedding):
        del rng_key
        out = networks.recurrent_inference(params, embedding, action)
        output = _model_step_output(out.reward_logits, out.policy_logits, out.value_logits,
                                    signed_discount=signed_discount,
                                    value_support=value_support, reward_support=reward_support)
        return output, out.hidden

    return recurrent_fn


def make_decoded_recurrent_fn(
    networks: Networks,
    value_support: DiscreteSupport,
    reward_support: DiscreteSupport,
    *,
    discount: float,
    two_player: bool = False,
    threshold: float = 0.5,
) -> mctx.RecurrentFn:
    """Returns mctx's `recurrent_fn` for the learned model re-grounded in its
    own decoded observations.

    Each expansion runs the dynamics on the node's hidden state (reward and
    next hidden state, as in `make_recurrent_fn`), decodes that hidden state
    to an observation with `networks.decoder` (trained by the reconstruction
    loss), rounds it onto {0, 1} (`decoded >= threshold`), and encodes the
    rounded observation again with the representation; the prior and value
    are the prediction's of that state, which is also the node's embedding.
    The whole model is still learned (no rule of the game is used), but
    small errors of the latent dynamics are rounded away at every step
    instead of compounding, and the prediction heads always read a hidden
    state of the kind they were trained on (the representation's). It is
    meant for observations whose elements are 0 or 1 (the pgx board planes,
    Catch); `load_agent(..., model="decoded")`.

    Args:
      networks: the networks; `networks.decoder` must exist (a run trained
        with `reconstruction_loss_weight` > 0).
      value_support: support of the value head.
      reward_support: support of the reward head.
      discount: the environment's discount gamma, in [0, 1].
      two_player: negate the discount between plies, as in `make_recurrent_fn`.
      threshold: decoded elements at or above it become 1, the rest 0.

    Raises:
      ValueError: no decoder, or a discount outside [0, 1].
    """
    if networks.decoder is None:
        raise ValueError("the decoded model needs networks with a decoder (a run trained with "
                         "reconstruction_loss_weight > 0)")
    signed_discount = _signed_discount(discount, two_player)

    def recurrent_fn(params: Params, rng_key: chex.PRNGKey, action, embedding):
        del rng_key
        next_hidden, reward_logits = networks.dynamics(params, embedding, action)
        decoded = networks.decoder(params, next_hidden)
        observation = (decoded >= threshold).astype(jnp.float32)
        out = networks.initial_inference(params, observation)
        output = _model_step_output(reward_logits, out.policy_logits, out.value_logits,
                                    signed_discount=signed_discount,
                                    value_support=value_support, reward_support=reward_support)
        return output, out.hidden

    return recurrent_fn


def check_decoded_model(networks: Networks, env: Any, reconstruction_loss_weight: float) -> None:
    """Raises one clear `ValueError` where the decoded model cannot be used:
    `networks` without a decoder (a run trained with no reconstruction loss),
    or an `env` whose observations are not 0/1 (`binary_observation`)."""
    if networks.decoder is None:
        raise ValueError(
            "the decoded model needs a run trained with a decoder (reconstruction_loss_weight "
            f"> 0); this one has reconstruction_loss_weight {reconstruction_loss_weight}")
    if not getattr(env, "binary_observation", False):
        raise ValueError(
            f"the decoded model rounds decoded observations onto 0 and 1, but "
            f"{env.name!r}'s observations are not binary")


def every_move_step(networks: Networks, params: Params, reward_support: DiscreteSupport,
                    hidden: chex.Array) -> tuple[chex.Array, chex.Array]:
    """`(next hidden [N * A, ...], predicted reward [N, A])`: the dynamics' step
    for every move from each hidden state of `hidden` `[N, ...]`, in one
    batched call on `N * A` rows (row `i * A + a` is move `a` from state `i`)."""
    n, num_actions = hidden.shape[0], networks.num_actions
    moves = jnp.tile(jnp.arange(num_actions, dtype=jnp.int32), n)
    after, logits = networks.dynamics(params, jnp.repeat(hidden, num_actions, axis=0), moves)
    return after, reward_support.logits_to_scalar(logits).reshape(n, num_actions)


WIN_LOOKAHEAD_THRESHOLD = 0.5
"""A predicted reward above this, for the player who moves, is a win (the
games' winning reward is +1, a draw's 0)."""


def with_win_lookahead(
    recurrent_fn: mctx.RecurrentFn,
    networks: Networks,
    reward_support: DiscreteSupport,
    *,
    threshold: float = WIN_LOOKAHEAD_THRESHOLD,
    end_at_win: bool = True,
    forced_loss: bool = False,
) -> mctx.RecurrentFn:
    """Wraps a learned model's `recurrent_fn` (`make_recurrent_fn` or
    `make_decoded_recurrent_fn`) with two readings of its own predicted
    rewards (a third with `forced_loss`), for two-player games whose only
    reward is the final outcome (`check_win_lookahead`):

    - every node it expands also gets the dynamics' reward for each move from
      there (`every_move_step`: one batched dynamics call over the `A`
      moves), and where the best of them is above `threshold`, the node's
      value becomes at least that reward: the player to move can win at
      once, and nothing follows a win.
      A move that lets the opponent win at once is so refuted on its first
      visit, whatever prior the winning reply has;
    - a step whose own predicted reward is above `threshold` ends the game in
      the search (its discount becomes 0), so what the model imagines after
      a win does not count.

    With `forced_loss`, a third reading, one ply deeper: where the player to
    move cannot win at once but, after every one of its moves, the opponent
    has a reply predicted above `threshold`, the node's value becomes at most
    minus the least of those replies' rewards (a double threat: whatever is
    blocked, the other line wins). It costs `A` more dynamics evaluations
    per move per expansion (`A * A` in all), from the dynamics' own next
    states (not re-grounded in a decoded board). An illegal move counts as
    one of the mover's moves too: what the model predicts after it can hide
    a double threat (the reading then stays silent) or, rarely, show one.

    Only the learned model's predictions are read, no rule of the game; the
    rewards of illegal moves are read too (the model does not know which are
    illegal). The first two readings cost one dynamics evaluation per move
    per expansion.

    Args:
      recurrent_fn: mctx's `recurrent_fn` whose embedding is the networks'
        hidden state.
      networks: the networks the search evaluates (the symmetry ensemble's
        when the search uses it).
      reward_support: support of the reward head.
      threshold: predicted rewards above it are wins.
      end_at_win: also end the game in the search after a predicted win (the
        second reading above; False keeps only the first).
      forced_loss: add the third reading (a predicted double threat; it did
        not move the Connect Four preset, so it is off by default).

    Returns:
      The wrapped `recurrent_fn`.
    """
    def wrapped(params: Params, rng_key: chex.PRNGKey, action, embedding):
        output, hidden = recurrent_fn(params, rng_key, action, embedding)
        after, rewards = every_move_step(networks, params, reward_support, hidden)
        best = rewards.max(-1)
        value = jnp.where(best > threshold, jnp.maximum(output.value, best), output.value)
        if forced_loss:
            # [B, A]: the opponent's best reply reward after each move.
            reply = every_move_step(networks, params, reward_support, after)[1].max(-1)
            reply = reply.reshape(rewards.shape)
            loses = (best <= threshold) & (reply > threshold).all(-1)
            value = jnp.where(loses, jnp.minimum(value, -reply.min(-1)), value)
        discount = output.discount
        if end_at_win:
            discount = jnp.where(output.reward > threshold, 0.0, discount)
        return output.replace(value=value, discount=discount), hidden

    return wrapped


def check_win_lookahead(env: Any) -> None:
    """Raises one clear `ValueError` unless `env` is a two-player game whose
    only reward is the final outcome (`terminal_rewards_only`), where a
    predicted winning reward means the game ended (`with_win_lookahead`)."""
    if env.num_players != 2 or not getattr(env, "terminal_rewards_only", False):
        raise ValueError(
            f"the win lookahead reads a predicted reward as a won and ended game, which holds "
            f"for two-player games rewarded only at their end (the pgx board games); "
            f"{env.name!r} is not one")


def make_env_root_fn(networks: Networks, value_support: DiscreteSupport):
    """Returns `root_fn(params, observation[B, *obs], env_state) -> mctx.RootFnOutput`
    for a search in the environment's own dynamics (`make_env_recurrent_fn`).

    The prior and value are the networks' (`initial_inference`), as for the
    learned model; the embedding is `(env_state, done[B] = False)`.
    """

    def root_fn(params: Params, observation: chex.Array, env_state) -> mctx.RootFnOutput:
        out = networks.initial_inference(params, observation)
        done = jnp.zeros(observation.shape[:1], jnp.bool_)
        return mctx.RootFnOutput(
            prior_logits=out.policy_logits,
            value=value_support.logits_to_scalar(out.value_logits),
            embedding=(env_state, done),
        )

    return root_fn


def make_env_recurrent_fn(
    env: Any,
    networks: Networks,
    value_support: DiscreteSupport,
    *,
    discount: float,
) -> mctx.RecurrentFn:
    """Returns mctx's `recurrent_fn` searching in the environment itself.

    AlphaZero's planning with MuZero's networks: a node's embedding is
    `(env_state, done)`; expanding it steps the (auto-resetting) environment,
    takes the reward it gives (the mover's in two-player games), and asks the
    networks' `initial_inference` for the prior and value of the *real*
    observation reached. Past the end of an episode the value is 0 and the
    discount 0, so nothing beyond a terminal state counts; illegal actions
    of interior nodes get prior logit -1e9 (the root's are masked by the
    search's `invalid_actions`). It is exact where the environment's step
    is deterministic given its state (the pgx board games); it tells how
    much of an agent's strength its learned model costs (`load_agent(...,
    model="env")`, `muzero-jax eval --model env`).

    Args:
      env: the `Environment` whose `step` the search calls.
      networks: the networks (only `initial_inference` is used).
      value_support: support of the value head.
      discount: the environment's discount gamma, in [0, 1]; negated between
        plies in two-player games, as in `make_recurrent_fn`.
    """
    signed_discount = _signed_discount(discount, env.num_players == 2)
    batched_step = jax.vmap(env.step)

    def recurrent_fn(params: Params, rng_key: chex.PRNGKey, action, embedding):
        del rng_key
        env_state, done = embedding
        env_state, ts = batched_step(env_state, action)
        out = networks.initial_inference(params, ts.observation)
        ended = done | ts.last
        output = mctx.RecurrentFnOutput(
            reward=jnp.where(done, 0.0, ts.reward).astype(jnp.float32),
            discount=jnp.where(ended, 0.0, signed_discount).astype(jnp.float32),
            prior_logits=jnp.where(ts.legal_action_mask, out.policy_logits, -1e9),
            value=jnp.where(ended, 0.0, value_support.logits_to_scalar(out.value_logits)),
        )
        return output, (env_state, ended)

    return recurrent_fn


def _import_module(module_name: str) -> Any:
    """Imports `module_name`, falling back to the current directory.

    A console script (`muzero-jax`) does not put the working directory on
    `sys.path`, unlike `python -m`; so when the top-level package is not found,
    the working directory is appended (lowest priority) and the import retried.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        if e.name != module_name.split(".")[0] or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module_name)


def resolve_search(
    spec: str | Callable[..., mctx.PolicyOutput],
    search_kwargs: Mapping[str, Any] | None = None,
) -> Callable[..., mctx.PolicyOutput]:
    """Turns a search name, a `"module:attr"` spec or a callable into a SearchFn.

    Args:
      spec: a built-in name (see `BUILTIN_SEARCHES`), `"package.module:attr"`
        naming a callable with mctx's policy signature (importable from
        `sys.path` or the working directory), or such a callable.
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
            module = _import_module(module_name)
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
        kwargs = dict(search_kwargs)
        if "qtransform" in kwargs and not callable(kwargs["qtransform"]):
            kwargs["qtransform"] = resolve_qtransform(fn, kwargs["qtransform"])
        fn = functools.partial(fn, **kwargs)
    return fn


def _qtransform_by_name(name: str) -> Callable[..., chex.Array]:
    """A qtransform from mctx, from `muzero_jax.puct`, or `"package.module:attr"`."""
    if ":" in name:
        return resolve_search(name)  # the same import rules and errors
    from muzero_jax import puct

    attr = name if name.startswith("qtransform_") else f"qtransform_{name}"
    for module in (mctx, puct):
        if callable(getattr(module, attr, None)):
            return getattr(module, attr)
    known = sorted(a for a in dir(mctx) if a.startswith("qtransform_"))
    raise ValueError(
        f"unknown qtransform {name!r}; mctx's: {', '.join(known)}, "
        "muzero_jax.puct's qtransform_by_tree_min_max, or give 'package.module:attr'"
    )


def resolve_qtransform(
    search_fn: Callable[..., mctx.PolicyOutput], spec: str | Mapping[str, Any]
) -> Callable[..., chex.Array]:
    """Turns a JSON-able qtransform spec into the `qtransform` a search is given.

    So that a qtransform's hyper-parameters can be set from the command line
    (`--search-kwargs '{"qtransform": {"value_scale": 0.2}}'`), where JSON
    cannot hold a function:

    * a mapping: keyword arguments bound to the search's own default
      qtransform (for `mctx.gumbel_muzero_policy`,
      `qtransform_completed_by_mix_value`: `value_scale`, `maxvisit_init`,
      `rescale_values`, `use_mixed_value`, `epsilon`), or, with a `"name"`
      key, to the qtransform so named;
    * a string: a qtransform by name (`"qtransform_by_min_max"`, or without
      the `qtransform_` prefix), from mctx or `muzero_jax.puct`, or a
      `"package.module:attr"` spec.

    Raises:
      ValueError: the search takes no `qtransform`, an unknown name, or
        keyword arguments that the qtransform does not take.
    """
    if isinstance(spec, str):
        return _qtransform_by_name(spec)
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"qtransform must be a name or a JSON object of its keyword arguments, got {spec!r}"
        )
    kwargs = dict(spec)
    name = kwargs.pop("name", None)
    if name is not None:
        base = _qtransform_by_name(str(name))
    else:
        inner = _unwrapped(search_fn)
        try:
            parameter = inspect.signature(inner).parameters.get("qtransform")
        except (TypeError, ValueError):
            parameter = None
        if parameter is None or not callable(parameter.default):
            raise ValueError(
                f"search {getattr(inner, '__name__', inner)!r} has no default qtransform to "
                'configure; name one: {"qtransform": {"name": ..., ...}}'
            )
        base = parameter.default
    try:
        inspect.signature(base).bind_partial(None, None, **kwargs)
    except TypeError as e:
        raise ValueError(
            f"qtransform {getattr(base, '__name__', base)!r} does not take {sorted(kwargs)}: {e}"
        ) from None
    return functools.partial(base, **kwargs) if kwargs else base


def batch_search(
    search_fn: Callable[..., mctx.PolicyOutput],
    root_fn: RootFn,
    recurrent_fn: mctx.RecurrentFn,
    *,
    num_simulations: int,
) -> Callable[..., mctx.PolicyOutput]:
    """Returns `run(params, rng_key, observation, legal_action_mask)`.

    Builds the root from observations and calls the search with illegal
    actions masked (`invalid_actions = ~legal`): how self-play
    (`acting.make_act_step`), reanalyse and `check_search_fn` all search.
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


_POSITIONAL = ("params", "rng_key", "root", "recurrent_fn")
_KEYWORDS = ("num_simulations", "invalid_actions")
_SIGNATURE = "(params, rng_key, root, recurrent_fn, *, num_simulations, invalid_actions, ...)"


def _unwrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function inside any nesting of `functools.partial`."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _search_name(search_fn: Callable[..., Any]) -> str:
    """A readable name for error messages (unwraps `functools.partial`)."""
    fn = _unwrapped(search_fn)
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        return repr(search_fn)
    return f"{module}.{name}" if module else name


def _check_signature(search_fn: Callable[..., Any], name: str) -> None:
    """Checks that mctx's policy call `fn(p, k, root, rec, num_simulations=, invalid_actions=)`
    binds, and names what does not."""
    if not callable(search_fn):
        raise ValueError(f"search {search_fn!r} is a {type(search_fn).__name__}, not a callable")
    base = _unwrapped(search_fn)
    try:
        base_signature = inspect.signature(base)
    except (TypeError, ValueError):  # e.g. a C callable: tracing will tell
        return
    base_params = base_signature.parameters
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in base_params.values())
    if isinstance(search_fn, functools.partial) and not takes_any_keyword:
        unknown = sorted(
            key
            for key in search_fn.keywords
            if key not in base_params or base_params[key].kind is inspect.Parameter.POSITIONAL_ONLY
        )
        if unknown:
            raise ValueError(
                f"search {name} does not take the keyword argument(s) {', '.join(unknown)} "
                f"bound by search_kwargs; it takes: {', '.join(base_params)}"
            )
    try:
        signature = inspect.signature(search_fn)
    except (TypeError, ValueError) as e:
        raise ValueError(f"search {name}: its arguments do not bind ({e})") from e
    params = signature.parameters
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    missing = [
        key
        for key in _KEYWORDS
        if (key not in params or params[key].kind is inspect.Parameter.POSITIONAL_ONLY)
        and not takes_any_keyword
    ]
    if missing:
        raise ValueError(
            f"search {name} does not accept the keyword argument(s) {', '.join(missing)}: "
            f"mctx's policy signature is {_SIGNATURE}"
        )
    positional = [
        p
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _KEYWORDS
    ]
    takes_any_positional = any(p.kind is p.VAR_POSITIONAL for p in params.values())
    if len(positional) < len(_POSITIONAL) and not takes_any_positional:
        raise ValueError(
            f"search {name} takes {len(positional)} positional argument(s) "
            f"({', '.join(p.name for p in positional) or 'none'}) but is called with 4 "
            f"(params, rng_key, root, recurrent_fn): mctx's policy signature is {_SIGNATURE}"
        )
    try:
        signature.bind(*_POSITIONAL, num_simulations=1, invalid_actions=None)
    except TypeError as e:
        raise ValueError(
            f"search {name} cannot be called as {_SIGNATURE}: {e} "
            "(bind extra required arguments with search_kwargs)"
        ) from e


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
    """Checks a search's signature, then traces it once with abstract shapes.

    The search is called exactly as acting calls it (`batch_search`), under
    `jax.eval_shape`: nothing is compiled or run. Every argument may be a
    `jax.ShapeDtypeStruct`.

    Args:
      search_fn: the search to check.
      root_fn: builds the root from observations.
      recurrent_fn: mctx's recurrent function.
      params: network parameters (or their shapes).
      observation: `[B, *obs]` observations (or their shape).
      legal_action_mask: `[B, A]` booleans (or their shape).
      num_simulations: the simulation budget acting will use.

    Raises:
      ValueError: one message naming what is wrong: the signature (too few
        positional arguments, a missing keyword argument, a `search_kwargs` key
        it does not take), an error raised while tracing it, the output type,
        or the shape/dtype of `action [B]`, `action_weights [B, A]` or the
        root value `search_tree.node_values[:, 0]` that acting reads.
    """
    name = _search_name(search_fn)
    _check_signature(search_fn, name)
    run = batch_search(search_fn, root_fn, recurrent_fn, num_simulations=num_simulations)
    try:
        out = jax.eval_shape(run, params, jax.random.key(0), observation, legal_action_mask)
    except Exception as e:  # noqa: BLE001 - any failure while tracing the user's code
        raise ValueError(
            f"search {name} failed when traced with abstract inputs (root.prior_logits "
            f"{tuple(legal_action_mask.shape)}, num_simulations={num_simulations}): "
            f"{type(e).__name__}: {e}"
        ) from e
    batch, num_actions = legal_action_mask.shape
    if not isinstance(out, mctx.PolicyOutput):
        raise ValueError(f"search {name} must return mctx.PolicyOutput, got {type(out).__name__}")
    action = getattr(out.action, "shape", None)
    if action is None or tuple(action) != (batch,):
        raise ValueError(f"search {name}: action has shape {action}, expected ({batch},)")
    if not jnp.issubdtype(out.action.dtype, jnp.integer):
        raise ValueError(f"search {name}: action has dtype {out.action.dtype}, expected integers")
    weights = getattr(out.action_weights, "shape", None)
    if weights is None or tuple(weights) != (batch, num_actions):
        raise ValueError(
            f"search {name}: action_weights has shape {weights}, expected ({batch}, {num_actions})"
        )
    if not jnp.issubdtype(out.action_weights.dtype, jnp.floating):
        raise ValueError(
            f"search {name}: action_weights has dtype {out.action_weights.dtype}, expected floats"
        )
    node_values = getattr(out.search_tree, "node_values", None)
    shape = getattr(node_values, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != batch or shape[1] < 1:
        raise ValueError(
            f"search {name}: search_tree must be an mctx.Tree whose node_values has shape "
            f"({batch}, num_nodes) (acting reads the root value node_values[:, 0]), got "
            f"{type(out.search_tree).__name__} with node_values shape {shape}"
        )
