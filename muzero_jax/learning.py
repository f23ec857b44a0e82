"""The learner and the whole training iteration, as one SPMD program.

`make_train(config)` returns a `Trainer` of pure functions. One `iteration`
acts T steps in B environments with batched search, adds the trajectories to
the on-device replay (re-searching a sweep of stored rows when
`reanalyse_rows` is set), and runs U learner updates (`lax.scan`): sample
sequences, build targets outside autodiff with a target network, take the
gradient of the unrolled loss, average it across devices (`lax.pmean`) and
apply Optax. Nothing returns to Python inside an iteration.

Data parallelism is pmap-style SPMD written with `jax.shard_map` over one mesh
axis, `"devices"`: params, target params, optimiser state and counters are
replicated; each device has its own environments, replay shard and rng stream.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from muzero_jax.acting import (
    ActorState,
    EpisodeStats,
    init_actor,
    make_act_step,
    make_rollout,
    temperature_at,
)
from muzero_jax.config import Config
from muzero_jax.distributed import place_on_mesh
from muzero_jax.envs import Environment, make_env
from muzero_jax.loss import LossBatch, unrolled_loss
from muzero_jax.networks import Networks, make_networks
from muzero_jax.reanalyse import make_reanalyse
from muzero_jax.replay import ReplayState, Trajectory, make_replay_buffer
from muzero_jax.search import (
    BUILTIN_SEARCHES,
    check_decoded_model,
    check_search_fn,
    check_win_lookahead,
    make_decoded_recurrent_fn,
    make_recurrent_fn,
    make_root_fn,
    resolve_search,
    with_win_lookahead,
)
from muzero_jax.symmetries import (
    augment_batch,
    check_symmetries,
    check_symmetry_ensemble,
    ensemble_networks,
)
from muzero_jax.targets import make_targets
from muzero_jax.value_transforms import DiscreteSupport, make_support

__all__ = [
    "AXIS",
    "Counters",
    "IterationMetrics",
    "TrainState",
    "Trainer",
    "make_bootstrap_values",
    "make_learner_step",
    "make_mesh",
    "make_optimizer",
    "make_train",
]

AXIS = "devices"
"""The name of the data-parallel mesh axis."""


class Counters(NamedTuple):
    """Progress counters (replicated; int32 scalars)."""

    env_steps: chex.Array
    updates: chex.Array
    iterations: chex.Array


class TrainState(NamedTuple):
    """Everything that changes during training.

    Replicated over devices: `params`, `target_params`, `opt_state`,
    `counters`. Per device (leading axis `[D]`, sharded over the mesh):
    `replay`, `actor`, `rng_key`.
    """

    params: Any
    target_params: Any
    opt_state: Any
    replay: ReplayState
    actor: ActorState
    rng_key: chex.PRNGKey
    counters: Counters


class IterationMetrics(NamedTuple):
    """What the host sees once per iteration (averaged over devices)."""

    loss: chex.Array
    value_loss: chex.Array
    reward_loss: chex.Array
    policy_loss: chex.Array
    value_error: chex.Array
    policy_entropy: chex.Array
    grad_norm: chex.Array
    consistency_loss: chex.Array
    action_reward_loss: chex.Array
    threat_value_loss: chex.Array
    reply_reward_loss: chex.Array
    action_prediction_loss: chex.Array
    reconstruction_loss: chex.Array
    action_reconstruction_loss: chex.Array
    learning_rate: chex.Array
    temperature: chex.Array
    learned: chex.Array
    episode_return_sum: chex.Array
    episode_length_sum: chex.Array
    episode_count: chex.Array
    finite: chex.Array


class Trainer(NamedTuple):
    """The pieces of a training run, as pure functions.

    Attributes:
      init: `init(rng_key) -> TrainState` (placed on the mesh).
      iteration: jitted `iteration(state) -> (state, IterationMetrics)`; the
        state is donated.
      evaluate: jitted `evaluate(params, rng_key) -> [eval_episodes]` greedy
        episode returns.
      mesh: the device mesh.
      env: the environment.
      networks: the networks.
      value_support: value support.
      reward_support: reward support.
      search_fn: the search in use (self-play's).
      config: the config the trainer was built from (never passed to jit).
      num_seeds: seeds batched in one program (1: a plain run).
      state_shapes: `state_shapes(rng_key) -> TrainState` of
        `jax.ShapeDtypeStruct`s with the shardings `init` places the state on:
        what `iteration.lower(...)` needs to compile before (or while) `init`
        runs. Nothing is compiled or run.
      eval_search_fn: the search of `evaluate` (`config.eval_search`; the same
        as `search_fn` unless set).
    """

    init: Callable[[chex.PRNGKey], TrainState]
    iteration: Callable[[TrainState], tuple[TrainState, IterationMetrics]]
    evaluate: Callable[[Any, chex.PRNGKey], chex.Array]
    mesh: Mesh
    env: Environment
    networks: Networks
    value_support: DiscreteSupport
    reward_support: DiscreteSupport
    search_fn: Callable[..., mctx.PolicyOutput]
    config: Config
    num_seeds: int = 1
    state_shapes: Callable[[chex.PRNGKey], TrainState] | None = None
    eval_search_fn: Callable[..., mctx.PolicyOutput] | None = None


def make_mesh(num_devices: int = 0) -> Mesh:
    """A one-axis mesh (`"devices"`) over the first `num_devices` devices (0: all)."""
    devices = jax.devices()
    if num_devices > len(devices):
        raise ValueError(
            f"num_devices={num_devices} but JAX sees only {len(devices)} device(s): {devices}"
        )
    count = num_devices or len(devices)
    return Mesh(np.asarray(devices[:count]), (AXIS,))


CONSISTENCY_HEADS = ("projection_", "predictor_")
"""Name prefixes of the consistency loss's Haiku modules (no weight decay)."""


def decayed(params: Any) -> Any:
    """Weight decay's mask: True for every leaf of `params` except those under
    a module named with a `CONSISTENCY_HEADS` prefix."""

    def keep(path, _):
        names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        return not any(isinstance(n, str) and n.startswith(CONSISTENCY_HEADS) for n in names)

    return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(config: Config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Gradient clipping, L2 weight decay, Adam or SGD+momentum, LR schedule.

    Weight decay is added to the gradient before the optimiser
    (`optax.add_decayed_weights`), which for SGD is the pseudocode's
    `weight_decay * l2_loss(w)` term. It skips the consistency loss's
    projection and predictor heads (`CONSISTENCY_HEADS`). That loss is a
    cosine, blind to their scale, so decay is the only pull on their size:
    where the cosine's gradient fades, Adam's normalised steps take every
    weight toward zero at about the learning rate per update, and once the
    projections are below the cosine's epsilon no gradient comes back. One
    seed of the Connect Four preset ended with those heads at ~1e-33, the term
    0 from somewhere between 1.0 M and 1.5 M env steps on (README, Board
    games).
    """
    peak = config.learning_rate
    if config.lr_decay == "constant":
        decay = optax.constant_schedule(peak)
    elif config.lr_decay == "cosine":
        decay = optax.cosine_decay_schedule(peak, config.lr_decay_updates)
    else:
        decay = optax.exponential_decay(peak, config.lr_decay_updates, config.lr_decay_rate)
    if config.lr_warmup_updates > 0:
        warmup = optax.linear_schedule(0.0, peak, config.lr_warmup_updates)
        schedule = optax.join_schedules([warmup, decay], [config.lr_warmup_updates])
    else:
        schedule = decay
    parts = []
    if config.max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(config.max_grad_norm))
    if config.weight_decay > 0:
        parts.append(optax.add_decayed_weights(config.weight_decay, mask=decayed))
    if config.optimizer == "adam":
        parts.append(optax.scale_by_adam())
    else:
        parts.append(optax.trace(decay=config.momentum))
    parts.append(optax.scale_by_learning_rate(schedule))
    return optax.chain(*parts), schedule


def default_compiler_options() -> dict[str, Any]:
    """XLA options that shorten compilation where it dominates short runs.

    On CPU, LLVM optimisation level 1 instead of XLA's default 2 cuts the
    compile time of the training iteration by about a fifth (16 s instead of
    20.5 s of CPU time for the Catch preset on a 2-core machine) with no
    measurable change in its run time (the learner's matrix products run in
    library kernels either way). Level 0 would halve compile time but makes an
    iteration 2-3x slower, and with jax 0.10.2 on CPU it changed a search's
    result: PUCT over Connect Four itself, from a position with a winning move,
    put 58 of 64 visits on the win at levels 1 and 2 and 26 at level 0 (same
    inputs, same rewards at the root's children;
    benchmarks/results/xla_cpu_level0_search_20261201.log). Other backends
    keep XLA's defaults, and so does a process whose XLA_FLAGS choose a level
    themselves (`--xla_backend_optimization_level=N`): that choice then holds
    for these programs as for every other one (the test suite's set 1 for all
    of its programs).
    """
    if "--xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return {}
    if jax.default_backend() == "cpu":
        return {"xla_backend_optimization_level": 1}
    return {}


def _check_compiler_options(options: Any) -> None:
    if not isinstance(options, dict) or not all(
        isinstance(k, str) and isinstance(v, bool | int | float | str) for k, v in options.items()
    ):
        raise ValueError(
            "compiler_options must be a dict of XLA option names to bool/int/float/str "
            f"values, e.g. {{'xla_backend_optimization_level': 1}}; got {options!r}"
        )


def make_learner_step(
    loss_fn: Callable[[Any, LossBatch], tuple[chex.Array, Any]],
    optimizer: optax.GradientTransformation,
    *,
    axis_name: str = AXIS,
) -> Callable[[Any, Any, LossBatch], tuple[Any, Any, chex.Array, Any]]:
    """The data-parallel learner step, to run inside `shard_map` over `axis_name`.

    `step(params, opt_state, batch) -> (params, opt_state, grad_norm, metrics)`:
    the gradient of `loss_fn` on this device's share of the batch, averaged
    over devices (`lax.pmean`), then one Optax update. With equal shares and a
    loss that is a mean over examples, D devices with B/D examples each take
    the same step as one device with all B.
    """

    def step(params, opt_state, batch: LossBatch):
        grads, metrics = jax.grad(loss_fn, has_aux=True)(params, batch)
        grads = jax.lax.pmean(grads, axis_name)
        grad_norm = optax.tree.norm(grads)
        deltas, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, deltas), opt_state, grad_norm, metrics

    return step


def _check_supports(config: Config, env: Environment, value_support, reward_support) -> None:
    max_reward = max(abs(r) for r in env.reward_range)
    reward_support.check_range(max_reward, name="reward")
    if env.terminal_rewards_only:
        # One reward per episode, discounted by at most 1 (its sign flipped
        # between plies in two-player games): no return exceeds it.
        horizon = 1.0
    elif config.discount < 1.0:
        horizon = 1.0 / (1.0 - config.discount)
        if env.max_episode_steps is not None:
            horizon = min(horizon, float(env.max_episode_steps))
    elif env.max_episode_steps is not None:
        horizon = float(env.max_episode_steps)
    else:
        horizon = math.inf
    if math.isfinite(horizon):
        value_support.check_range(max_reward * horizon, name="value")


def _check_accepts(fn: Callable[..., Any], name: str) -> None:
    """Raises ValueError when `fn` cannot take the keyword argument `name`."""
    off = inspect.signature(unrolled_loss).parameters[name].default
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (e.g. some builtins): let it run
        return
    if not any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        # The loss weights are off at 0; the two settings below are passed
        # only with the config fields named.
        leave = {"action_reward_steps": "leave action_reward_loss_weight at 0",
                 "action_reward_batch": "leave action_reward_batch_size at 0",
                 "consistency_batch": "leave consistency_batch_size at 0"}.get(name)
        leave = leave or f"leave the weight at {off:g}"
        raise ValueError(
            f"the config passes {name}= to the loss, but the custom loss_fn "
            f"{getattr(fn, '__name__', fn)!r} does not accept {name}=; add the argument or "
            f"{leave}"
        )


def make_bootstrap_values(
    initial_inference: Callable[[Any, chex.Array], Any],
    value_support: Any,
    *,
    value_target: str,
    num_unroll_steps: int,
    td_steps: int,
) -> Callable[[Any, Trajectory], chex.Array]:
    """Returns `bootstrap_values(target_params, sequences) -> [b, L]` values.

    The values that `targets.make_targets` bootstraps from: the stored search
    values (`value_target="search"`), or the target network's value at the one
    row each of the K + 1 returns bootstraps from, `min(j + n, e)` with e the
    episode's last row in the window (other rows are 0 and never read).

    A return that bootstraps from a terminal row reads no value (it is 0
    there). When no return of the batch needs one, e.g. board games trained on
    final outcomes (`td_steps` at least the game's length), the target network
    is not run at all: a `lax.cond` on the batch skips its K + 1 forward passes
    per example (on the 2-core CPU, 1.2-1.35x the env steps/s of Catch's
    preset and of a small Go 9x9 network; benchmarks/RESULTS.md). The targets
    are the same either way.

    Args:
      initial_inference: `(params, observation[N, ...]) -> outputs` with
        `value_logits` (the networks' `initial_inference`).
      value_support: turns value logits into scalars (`logits_to_scalar`).
      value_target: `"target_network"` or `"search"`.
      num_unroll_steps: K.
      td_steps: n.
    """
    k, n = num_unroll_steps, td_steps

    def bootstrap_values(target_params, sequences: Trajectory) -> chex.Array:
        if value_target == "search":
            return sequences.search_value
        length = sequences.last.shape[1]
        end = jnp.min(jnp.where(sequences.last, jnp.arange(length), length), axis=1)
        rows = jnp.minimum(jnp.arange(k + 1)[None, :] + n, end[:, None])  # [b, K+1]
        zeros = jnp.zeros(sequences.last.shape, jnp.float32)

        def target_network_values():
            obs = jnp.take_along_axis(
                sequences.observation,
                rows.reshape(rows.shape + (1,) * (sequences.observation.ndim - 2)),
                axis=1,
            )
            out = initial_inference(target_params, obs.reshape((-1,) + obs.shape[2:]))
            values = value_support.logits_to_scalar(out.value_logits).reshape(rows.shape)
            batch_index = jnp.arange(rows.shape[0])[:, None]
            return zeros.at[batch_index, rows].set(values)

        needed = jnp.any(~jnp.take_along_axis(sequences.terminated, rows, axis=1))
        return jax.lax.cond(needed, target_network_values, lambda: zeros)

    return bootstrap_values


def make_train(
    config: Config,
    *,
    search_fn: Callable[..., mctx.PolicyOutput] | None = None,
    env: Environment | None = None,
    loss_fn: Callable[..., tuple[chex.Array, Any]] | None = None,
    compiler_options: dict[str, Any] | None = None,
    num_seeds: int = 1,
) -> Trainer:
    """Builds the training functions for `config`.

    Args:
      config: the run's configuration.
      search_fn: a search with mctx's policy signature, overriding
        `config.search` (e.g. a user-written search from Python).
      env: an environment overriding `config.env`.
      loss_fn: a replacement for `unrolled_loss` with the same signature
        (`(params, batch, *, networks, value_support, reward_support,
        value_loss_weight) -> (loss, LossMetrics)`), e.g. for ablations;
        with `config.reward_loss_weight != 1` it also gets
        `reward_loss_weight=`, and with `config.consistency_loss_weight > 0`
        `consistency_loss_weight=` (its batch then has `next_observation`;
        with `config.consistency_batch_size > 0` also `consistency_batch=`,
        the per-device count), and with `config.action_reward_loss_weight > 0`
        `action_reward_loss_weight=` and `action_reward_steps=` (its batch then has
        `target_action_reward` and `action_reward_mask`; with
        `config.action_reward_batch_size > 0` also `action_reward_batch=`, the
        per-device count), and with
        `config.threat_value_loss_weight > 0` `threat_value_loss_weight=` (and
        `target_action_threat`), and with `config.reply_reward_loss_weight > 0`
        `reply_reward_loss_weight=` (and `target_reply`, `target_reply_reward`),
        and with `config.action_prediction_loss_weight > 0`
        `action_prediction_loss_weight=` (and `target_action_value`,
        `target_action_policy`), and with `config.reconstruction_loss_weight > 0`
        `reconstruction_loss_weight=` (its batch then has `next_observation`),
        and with `config.action_reconstruction_loss_weight > 0`
        `action_reconstruction_loss_weight=` (and `target_action_observation`).
      compiler_options: XLA options for compiling `iteration` and `evaluate`
        (default: `default_compiler_options()`).
      num_seeds: S > 1 runs S independent seeds in one program (`jax.vmap`
        over the whole iteration): `init` then takes `[S]` keys, and every
        leaf of the state, the metrics and `evaluate`'s params, keys and
        returns has a leading `[S]` axis. Seed s with key `k_s` computes what
        a single run initialised with `k_s` computes.

    Returns:
      A `Trainer`.

    Raises:
      ValueError: on anything inconsistent (devices, divisibility, supports,
        the search's signature), before anything is compiled.
    """
    if isinstance(num_seeds, bool) or not isinstance(num_seeds, int) or num_seeds < 1:
        raise ValueError(f"num_seeds must be an integer >= 1, got {num_seeds!r}")
    if env is None:
        try:
            env = make_env(config.env, **config.parsed_env_kwargs())
        except TypeError as e:  # a keyword the environment's factory does not take
            raise ValueError(f"env_kwargs {config.env_kwargs} do not fit {config.env!r}: {e}") \
                from e
    if compiler_options is None:
        compiler_options = default_compiler_options()
    _check_compiler_options(compiler_options)
    consistency = config.consistency_loss_weight > 0
    action_reward = config.action_reward_loss_weight > 0
    threat = config.threat_value_loss_weight > 0
    reply = config.reply_reward_loss_weight > 0
    predict = config.action_prediction_loss_weight > 0
    reconstruct = config.reconstruction_loss_weight > 0
    reconstruct_actions = config.action_reconstruction_loss_weight > 0
    if threat and env.num_players != 2:
        raise ValueError(f"threat_value_loss_weight needs a two-player game; {env.name!r} has "
                         f"{env.num_players} player(s)")
    # Loss weights beyond the paper's, passed only when set, so that custom
    # loss functions written to the documented signature keep working.
    extra_loss_kwargs = {}
    if config.reward_loss_weight != 1.0:
        extra_loss_kwargs["reward_loss_weight"] = config.reward_loss_weight
    if consistency:
        extra_loss_kwargs["consistency_loss_weight"] = config.consistency_loss_weight
    if action_reward:
        extra_loss_kwargs["action_reward_loss_weight"] = config.action_reward_loss_weight
        extra_loss_kwargs["action_reward_steps"] = config.action_reward_steps
    if threat:
        extra_loss_kwargs["threat_value_loss_weight"] = config.threat_value_loss_weight
    if reply:
        extra_loss_kwargs["reply_reward_loss_weight"] = config.reply_reward_loss_weight
    if predict:
        extra_loss_kwargs["action_prediction_loss_weight"] = (
            config.action_prediction_loss_weight)
    if reconstruct:
        extra_loss_kwargs["reconstruction_loss_weight"] = config.reconstruction_loss_weight
    if reconstruct_actions:
        extra_loss_kwargs["action_reconstruction_loss_weight"] = (
            config.action_reconstruction_loss_weight)
    if loss_fn is not None:
        for name in extra_loss_kwargs:
            _check_accepts(loss_fn, name)
    mesh = make_mesh(config.num_devices)
    num_devices = mesh.devices.size
    for name in ("num_envs", "batch_size"):
        if getattr(config, name) % num_devices:
            raise ValueError(
                f"{name}={getattr(config, name)} does not split evenly across "
                f"{num_devices} devices"
            )
    local_envs = config.num_envs // num_devices
    local_batch = config.batch_size // num_devices
    if consistency and config.consistency_batch_size:
        if config.consistency_batch_size % num_devices:
            raise ValueError(
                f"consistency_batch_size={config.consistency_batch_size} does not split "
                f"evenly across {num_devices} devices")
        # Per device: the first M / D of its B / D sampled sequences.
        extra_loss_kwargs["consistency_batch"] = config.consistency_batch_size // num_devices
        if loss_fn is not None:
            _check_accepts(loss_fn, "consistency_batch")
    if action_reward and config.action_reward_batch_size:
        if config.action_reward_batch_size % num_devices:
            raise ValueError(
                f"action_reward_batch_size={config.action_reward_batch_size} does not split "
                f"evenly across {num_devices} devices")
        # Per device: the first M / D of its B / D sampled sequences.
        extra_loss_kwargs["action_reward_batch"] = (
            config.action_reward_batch_size // num_devices)
        if loss_fn is not None:
            _check_accepts(loss_fn, "action_reward_batch")
    if config.augment_symmetries:
        if env.symmetries is None:
            raise ValueError(
                f"augment_symmetries is set, but the environment {env.name!r} has no "
                "symmetries (the pgx board games have them)")
        check_symmetries(env.symmetries, env.observation_shape, env.num_actions)
    for name, check in (("eval_symmetry_ensemble", check_symmetry_ensemble),
                        ("act_symmetry_ensemble", check_symmetry_ensemble),
                        ("eval_win_lookahead", check_win_lookahead),
                        ("act_win_lookahead", check_win_lookahead)):
        if getattr(config, name):
            try:
                check(env)
            except ValueError as e:
                raise ValueError(f"{name} is set, but {e}") from None
    two_player = env.num_players == 2
    signed_discount = -config.discount if two_player else config.discount

    value_support = make_support(config.value_support_size,
                                 use_transform=config.support_transform)
    reward_support = make_support(config.reward_support_size,
                                  use_transform=config.support_transform)
    _check_supports(config, env, value_support, reward_support)
    net_cfg = config.mlp if config.network == "mlp" else config.resnet
    networks = make_networks(
        net_cfg,
        num_actions=env.num_actions,
        value_bins=value_support.num_bins,
        reward_bins=reward_support.num_bins,
        projection_size=config.consistency_projection_size if consistency else 0,
        observation_shape=(env.observation_shape if reconstruct or reconstruct_actions
                           else None),
        compute_dtype=config.compute_dtype,
    )
    root_fn = make_root_fn(networks, value_support)

    def predict_observations(params, observation):
        out = networks.initial_inference(params, observation)
        return value_support.logits_to_scalar(out.value_logits), out.policy_logits
    if config.search_model == "decoded":
        check_decoded_model(networks, env, config.reconstruction_loss_weight)
        make_model = make_decoded_recurrent_fn
    else:
        make_model = make_recurrent_fn
    recurrent_fn = make_model(
        networks, value_support, reward_support, discount=config.discount, two_player=two_player
    )
    ensemble_root_fn = ensemble_recurrent_fn = None
    if config.eval_symmetry_ensemble or config.act_symmetry_ensemble:
        # The same search on the networks averaged over the board's symmetries.
        ensemble = ensemble_networks(networks, env.symmetries)
        ensemble_root_fn = make_root_fn(ensemble, value_support)
        ensemble_recurrent_fn = make_model(ensemble, value_support, reward_support,
                                           discount=config.discount, two_player=two_player)
    act_root_fn, act_recurrent_fn = root_fn, recurrent_fn
    if config.act_symmetry_ensemble:
        act_root_fn, act_recurrent_fn = ensemble_root_fn, ensemble_recurrent_fn
    if config.act_win_lookahead:
        act_recurrent_fn = with_win_lookahead(
            act_recurrent_fn, ensemble if config.act_symmetry_ensemble else networks,
            reward_support)
    # A built-in search without search_kwargs is known to fit; anything else
    # (a user's search, or kwargs that may not bind) is checked once with
    # abstract shapes before anything is compiled. Tracing mctx's search for
    # the check costs about a second of a cold start.
    trusted = search_fn is None and _known_to_fit(config.search, config.parsed_search_kwargs())
    given_search_fn = search_fn
    if search_fn is None:
        search_fn = resolve_search(config.search, config.parsed_search_kwargs())
    elif config.parsed_search_kwargs():
        search_fn = resolve_search(search_fn, config.parsed_search_kwargs())

    obs_spec = jax.ShapeDtypeStruct((local_envs,) + env.observation_shape, jnp.float32)
    mask_spec = jax.ShapeDtypeStruct((local_envs, env.num_actions), jnp.bool_)
    # Abstract parameters for the search checks, traced at most once.
    params_spec = functools.cache(
        lambda: jax.eval_shape(networks.init, jax.random.key(0), obs_spec))
    if not trusted:
        check_search_fn(  # with the functions self-play's search will be given
            search_fn, act_root_fn, act_recurrent_fn, params_spec(), obs_spec, mask_spec,
            num_simulations=config.num_simulations,
        )
    eval_root_fn, eval_recurrent_fn = root_fn, recurrent_fn
    if config.eval_symmetry_ensemble:
        eval_root_fn, eval_recurrent_fn = ensemble_root_fn, ensemble_recurrent_fn
    if config.eval_win_lookahead:
        eval_recurrent_fn = with_win_lookahead(
            eval_recurrent_fn, ensemble if config.eval_symmetry_ensemble else networks,
            reward_support)
    eval_search_fn = _evaluation_search_fn(
        config, search_fn, given_search_fn, eval_root_fn, eval_recurrent_fn,
        params_spec, obs_spec, mask_spec)

    buffer = make_replay_buffer(
        num_envs=local_envs,
        capacity=config.replay_capacity,
        sequence_length=config.sequence_length,
        batch_size=local_batch,
        prioritized=config.prioritized_replay,
        alpha=config.priority_alpha,
    )
    optimizer, lr_schedule = make_optimizer(config)
    act_step = make_act_step(
        env, act_root_fn, act_recurrent_fn, search_fn, num_simulations=config.num_simulations,
        use_search_action=config.act_with_search_action,
        exploration_plies=config.exploration_plies,
        random_move_prob=config.random_move_prob,
        action_rewards=action_reward,
        action_threats=threat,
        reply_labels=reply,
        action_predictions=predict_observations if predict else None,
        action_observations=reconstruct_actions,
    )
    rollout = make_rollout(act_step, config.rollout_length)
    reanalyse = None
    if config.reanalyse_rows:
        # The search self-play acts with, on stored rows (MuZero Reanalyze).
        reanalyse = make_reanalyse(act_root_fn, act_recurrent_fn, search_fn,
                                   num_simulations=config.num_simulations,
                                   rows=config.reanalyse_rows)
    loss_fn = functools.partial(
        loss_fn or unrolled_loss,
        networks=networks,
        value_support=value_support,
        reward_support=reward_support,
        value_loss_weight=config.value_loss_weight,
        **extra_loss_kwargs,
    )
    learner_step = make_learner_step(loss_fn, optimizer)
    num_updates = config.updates_per_iteration
    max_env_steps = float(config.max_env_steps)
    schedule = config.temperature_schedule
    k, n = config.num_unroll_steps, config.td_steps
    seq_len = config.sequence_length

    bootstrap_values = make_bootstrap_values(
        networks.initial_inference, value_support, value_target=config.value_target,
        num_unroll_steps=k, td_steps=n)

    def update(carry, rng_key, progress):
        params, target_params, opt_state, replay, updates = carry
        beta = config.priority_beta_start + progress * (
            config.priority_beta_end - config.priority_beta_start
        )
        sample_key = rng_key  # split only when augmenting: other runs stay bit-identical
        if config.augment_symmetries:
            sample_key, augment_key = jax.random.split(rng_key)
        sample = buffer.sample(replay, sample_key, beta)
        seqs = sample.sequences
        boot = jax.lax.stop_gradient(bootstrap_values(target_params, seqs))
        targets = jax.vmap(
            functools.partial(make_targets, num_unroll_steps=k, td_steps=n,
                              discount=signed_discount,
                              search_value_mix=float(config.search_value_mix))
        )(seqs, boot)
        batch = LossBatch(
            observation=seqs.observation[:, 0],
            actions=targets.actions,
            target_value=targets.value,
            target_reward=targets.reward,
            target_policy=targets.policy,
            value_mask=targets.value_mask,
            reward_mask=targets.reward_mask,
            policy_mask=targets.policy_mask,
            importance_weight=sample.weights,
            next_observation=(seqs.observation[:, 1:k + 1] if consistency or reconstruct
                              else None),
        )
        if action_reward:
            # Labels of the positions the K actions are taken from (rows 0..K-1),
            # where the episode still runs and the action is legal.
            batch = batch._replace(
                target_action_reward=seqs.action_rewards[:, :k],
                action_reward_mask=(targets.policy_mask[:, :k, None]
                                    * seqs.legal_action_mask[:, :k].astype(jnp.float32)))
        if threat:
            batch = batch._replace(target_action_threat=seqs.action_threats[:, :k])
        if reply:
            batch = batch._replace(target_reply=seqs.action_replies[:, :k],
                                   target_reply_reward=seqs.reply_rewards[:, :k])
        if predict:
            batch = batch._replace(target_action_value=seqs.action_values[:, :k],
                                   target_action_policy=seqs.action_policies[:, :k])
        if reconstruct_actions:
            batch = batch._replace(target_action_observation=seqs.action_observations[:, :k])
        if config.augment_symmetries:
            batch = augment_batch(batch, env.symmetries, augment_key)
        params, opt_state, grad_norm, metrics = learner_step(params, opt_state, batch)
        updates = updates + 1
        if config.target_ema > 0:
            target_params = optax.incremental_update(params, target_params, config.target_ema)
        else:
            refresh = updates % config.target_update_period == 0
            target_params = jax.tree.map(
                lambda p, t: jnp.where(refresh, p, t), params, target_params
            )
        # The paper's priority: |search value - n-step target| at the start row.
        priorities = jnp.abs(seqs.search_value[:, 0] - targets.value[:, 0])
        replay = buffer.set_priorities(replay, sample.env_index, sample.time_index, priorities)
        out = (
            metrics.loss, metrics.value_loss, metrics.reward_loss, metrics.policy_loss,
            jnp.mean(metrics.value_error), metrics.policy_entropy, grad_norm,
            jnp.asarray(metrics.consistency_loss, jnp.float32),
            jnp.asarray(metrics.action_reward_loss, jnp.float32),
            jnp.asarray(metrics.threat_value_loss, jnp.float32),
            jnp.asarray(metrics.reply_reward_loss, jnp.float32),
            jnp.asarray(metrics.action_prediction_loss, jnp.float32),
            jnp.asarray(metrics.reconstruction_loss, jnp.float32),
            jnp.asarray(metrics.action_reconstruction_loss, jnp.float32),
        )
        return (params, target_params, opt_state, replay, updates), out

    def device_iteration(state: TrainState) -> tuple[TrainState, IterationMetrics]:
        # Per-device parts arrive with a leading axis of size 1.
        replay, actor, rng_key = jax.tree.map(
            lambda x: x[0], (state.replay, state.actor, state.rng_key)
        )
        counters = state.counters
        progress = jnp.minimum(counters.env_steps.astype(jnp.float32) / max_env_steps, 1.0)
        temperature = temperature_at(schedule, progress)
        rng_key, act_key, learn_key = jax.random.split(rng_key, 3)
        act_params = state.target_params if config.act_weights == "target" else state.params
        actor, traj, stats = rollout(act_params, actor, act_key, temperature)
        replay = buffer.add(replay, traj)
        if reanalyse is not None:  # split only then: other runs stay bit-identical
            learn_key, reanalyse_key = jax.random.split(learn_key)
            replay = reanalyse(act_params, replay, reanalyse_key, counters.iterations)
        can_learn = (replay.num_added >= max(config.min_replay_steps, seq_len)) & (
            buffer.can_sample(replay)
        )
        # Every device sees the same num_added, so all take the same branch.
        can_learn = jax.lax.pmin(can_learn.astype(jnp.int32), AXIS) > 0

        def learn(operand):
            params, target_params, opt_state, replay, updates = operand
            keys = jax.random.split(learn_key, num_updates)
            carry, outs = jax.lax.scan(
                lambda c, key: update(c, key, progress),
                (params, target_params, opt_state, replay, updates),
                keys,
            )
            return carry, tuple(jnp.mean(o) for o in outs)

        def skip(operand):
            zero = jnp.zeros((), jnp.float32)
            return operand, (zero,) * 14

        operand = (state.params, state.target_params, state.opt_state, replay,
                   counters.updates)
        (params, target_params, opt_state, replay, updates), outs = jax.lax.cond(
            can_learn, learn, skip, operand
        )
        finite = jnp.all(jnp.asarray(
            [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(params)] + [jnp.isfinite(outs[0])]
        ))
        (loss, v_loss, r_loss, p_loss, v_err, entropy, grad_norm, c_loss, ar_loss, tv_loss,
         rr_loss, ap_loss, o_loss, ao_loss) = (jax.lax.pmean(o, AXIS) for o in outs)
        ep = jax.tree.map(lambda x: jax.lax.psum(x, AXIS), stats)
        metrics = IterationMetrics(
            loss=loss, value_loss=v_loss, reward_loss=r_loss, policy_loss=p_loss,
            value_error=v_err, policy_entropy=entropy, grad_norm=grad_norm,
            consistency_loss=c_loss,
            action_reward_loss=ar_loss,
            threat_value_loss=tv_loss,
            reply_reward_loss=rr_loss,
            action_prediction_loss=ap_loss,
            reconstruction_loss=o_loss,
            action_reconstruction_loss=ao_loss,
            learning_rate=jnp.asarray(lr_schedule(jnp.maximum(updates - 1, 0)), jnp.float32),
            temperature=temperature,
            learned=can_learn.astype(jnp.float32),
            episode_return_sum=ep.return_sum,
            episode_length_sum=ep.length_sum,
            episode_count=ep.count,
            finite=jax.lax.pmin(finite.astype(jnp.int32), AXIS) > 0,
        )
        counters = Counters(
            env_steps=counters.env_steps + config.env_steps_per_iteration,
            updates=updates,
            iterations=counters.iterations + 1,
        )
        new_state = TrainState(
            params=params,
            target_params=target_params,
            opt_state=opt_state,
            replay=jax.tree.map(lambda x: x[None], replay),
            actor=jax.tree.map(lambda x: x[None], actor),
            rng_key=rng_key[None],
            counters=counters,
        )
        return new_state, metrics

    specs = TrainState(
        params=P(), target_params=P(), opt_state=P(), replay=P(AXIS), actor=P(AXIS),
        rng_key=P(AXIS), counters=P(),
    )
    sharded = jax.shard_map(
        device_iteration, mesh=mesh, in_specs=(specs,), out_specs=(specs, P()),
        check_vma=False,
    )
    if num_seeds > 1:
        # Independent runs side by side in one program (purejaxrl style): every
        # leaf gets a leading [S] axis; the per-device parts stay sharded.
        iteration = jax.jit(jax.vmap(sharded), donate_argnums=0,
                            compiler_options=compiler_options)
        specs_out = jax.tree.map(lambda spec: P(None, *spec), specs,
                                 is_leaf=lambda x: isinstance(x, P))
    else:
        iteration = jax.jit(sharded, donate_argnums=0, compiler_options=compiler_options)
        specs_out = specs

    def build_state(rng_key: chex.PRNGKey) -> TrainState:
        # One small compiled program (jitted below): run eagerly, the many little ops of
        # network, optimiser, replay and environment initialisation would each
        # compile on their own (tens of seconds on a 2-core CPU).
        param_key, device_key = jax.random.split(rng_key)
        example = jnp.zeros((1,) + env.observation_shape, jnp.float32)
        params = networks.init(param_key, example)
        opt_state = optimizer.init(params)

        def local_init(key):
            actor_key, rng = jax.random.split(key)
            actor = init_actor(env, actor_key, local_envs)
            row = _example_row(env, action_reward, threat, reply, predict,
                               reconstruct_actions)
            return buffer.init(row), actor, rng

        replay, actor, rngs = jax.vmap(local_init)(jax.random.split(device_key, num_devices))
        state = TrainState(
            params=params,
            target_params=jax.tree.map(jnp.copy, params),
            opt_state=opt_state,
            replay=replay,
            actor=actor,
            rng_key=rngs,
            counters=Counters(*(jnp.zeros((), jnp.int32) for _ in range(3))),
        )
        return state

    build_one = jax.jit(build_state, compiler_options=compiler_options)
    build_many = jax.jit(jax.vmap(build_state), compiler_options=compiler_options)
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs_out,
                             is_leaf=lambda x: isinstance(x, P))

    def init(rng_key: chex.PRNGKey) -> TrainState:
        if num_seeds > 1:
            if rng_key.shape != (num_seeds,):
                raise ValueError(f"init of {num_seeds} seeds needs {num_seeds} keys, got "
                                 f"shape {rng_key.shape}")
            build = build_many
        else:
            build = build_one
        if isinstance(rng_key, jax.core.Tracer):
            # Traced (e.g. `jax.eval_shape(init, key)`): a nested jit may not
            # carry compiler options, and nothing is compiled here anyway.
            build = jax.vmap(build_state) if num_seeds > 1 else build_state
        return place_on_mesh(build(rng_key), shardings)

    def state_shapes(rng_key: chex.PRNGKey) -> TrainState:
        shapes = (build_many if num_seeds > 1 else build_one).eval_shape(rng_key)
        return jax.tree.map(
            lambda sharding, sub: jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), sub),
            shardings, shapes, is_leaf=lambda x: isinstance(x, NamedSharding),
        )

    evaluate = make_evaluate(
        env, eval_root_fn, eval_recurrent_fn, eval_search_fn,
        num_simulations=config.eval_num_simulations or config.num_simulations,
        num_episodes=config.eval_episodes,
        compiler_options=None if num_seeds > 1 else compiler_options,
    )
    if num_seeds > 1:
        evaluate = jax.jit(jax.vmap(evaluate), compiler_options=compiler_options)
    return Trainer(
        init=init, iteration=iteration, evaluate=evaluate, mesh=mesh, env=env,
        networks=networks, value_support=value_support, reward_support=reward_support,
        search_fn=search_fn, config=config, num_seeds=num_seeds, state_shapes=state_shapes,
        eval_search_fn=eval_search_fn,
    )


def _known_to_fit(spec, kwargs) -> bool:
    """Whether a search needs no check: a built-in name without kwargs."""
    return isinstance(spec, str) and spec in BUILTIN_SEARCHES and not kwargs


def _evaluation_search_fn(config, search_fn, given_search_fn, root_fn, recurrent_fn,
                          params_spec, obs_spec, mask_spec):
    """The search of evaluation: self-play's, or `config.eval_search` with its
    keyword arguments (`Config.evaluation_search`), resolved and checked
    against the functions evaluation gives it (`params_spec()`: the abstract
    parameters), before anything compiles."""
    if not (config.eval_search.strip() or config.eval_search_kwargs.strip()):
        return search_fn
    name, _ = config.evaluation_search()
    kwargs = config.parsed_eval_search_kwargs()
    # Without eval_search, a search given from Python stays evaluation's.
    spec = given_search_fn if given_search_fn is not None and not config.eval_search.strip() \
        else name
    try:
        fn = resolve_search(spec, kwargs)
        if not _known_to_fit(spec, kwargs):
            check_search_fn(fn, root_fn, recurrent_fn, params_spec(), obs_spec, mask_spec,
                            num_simulations=config.eval_num_simulations or config.num_simulations)
    except ValueError as e:
        raise ValueError(f"eval_search {name!r}: {e}") from None
    return fn


def _example_row(env: Environment, action_rewards: bool = False,
                 action_threats: bool = False, reply_labels: bool = False,
                 action_predictions: bool = False,
                 action_observations: bool = False) -> Trajectory:
    a = env.num_actions
    return Trajectory(
        observation=jnp.zeros(env.observation_shape, jnp.float32),
        action=jnp.zeros((), jnp.int32),
        reward=jnp.zeros((), jnp.float32),
        first=jnp.zeros((), jnp.bool_),
        last=jnp.zeros((), jnp.bool_),
        terminated=jnp.zeros((), jnp.bool_),
        truncated=jnp.zeros((), jnp.bool_),
        legal_action_mask=jnp.zeros((a,), jnp.bool_),
        to_play=jnp.zeros((), jnp.int32),
        search_policy=jnp.zeros((a,), jnp.float32),
        search_value=jnp.zeros((), jnp.float32),
        action_rewards=jnp.zeros((a,), jnp.float32) if action_rewards else None,
        action_threats=jnp.zeros((a,), jnp.float32) if action_threats else None,
        action_replies=jnp.zeros((a,), jnp.int32) if reply_labels else None,
        reply_rewards=jnp.zeros((a,), jnp.float32) if reply_labels else None,
        action_values=jnp.zeros((a,), jnp.float32) if action_predictions else None,
        action_policies=jnp.zeros((a, a), jnp.float32) if action_predictions else None,
        action_observations=(jnp.zeros((a,) + env.observation_shape, jnp.float32)
                             if action_observations else None),
    )


def make_evaluate(
    env: Environment,
    root_fn,
    recurrent_fn,
    search_fn,
    *,
    num_simulations: int,
    num_episodes: int,
    max_steps: int | None = None,
    compiler_options: dict[str, Any] | None = None,
) -> Callable[[Any, chex.PRNGKey], chex.Array]:
    """Returns jitted `evaluate(params, rng_key) -> [num_episodes]` greedy returns.

    Each of `num_episodes` fresh environments plays one episode with
    temperature 0 (the most visited action); the return is player 0's.
    """
    steps = max_steps or env.max_episode_steps
    if steps is None:
        raise ValueError(f"environment {env.name!r} has no max_episode_steps; pass max_steps")
    act_step = make_act_step(env, root_fn, recurrent_fn, search_fn,
                             num_simulations=num_simulations)

    @functools.partial(jax.jit, compiler_options=compiler_options)
    def evaluate(params, rng_key):
        reset_key, run_key = jax.random.split(rng_key)
        actor = init_actor(env, reset_key, num_episodes)

        def body(carry, key):
            actor, total, done = carry
            actor, _, _ = act_step(params, actor, key, jnp.float32(0.0))
            ts = actor.timestep
            sign = jnp.where(ts.to_play == 0, -1.0, 1.0) if env.num_players == 2 else 1.0
            total = total + jnp.where(done, 0.0, sign * ts.reward)
            done = done | ts.last
            return (actor, total, done), None

        init = (actor, jnp.zeros((num_episodes,)), jnp.zeros((num_episodes,), bool))
        (_, total, _), _ = jax.lax.scan(body, init, jax.random.split(run_key, steps))
        return total

    return evaluate


__all__ += ["make_evaluate", "EpisodeStats", "default_compiler_options"]
