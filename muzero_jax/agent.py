"""A trained agent, loaded from a run directory, for use from Python.

    agent = muzero_jax.load_agent("runs/catch-20261123-120000")
    actions = agent.act(observations)                 # [B] greedy actions
    out = agent.search(observations, legal_mask)      # action, value, policy

`act` and `search` run the same search as training (the run's `search`
function and network), jitted once per simulation count. With
`load_agent(..., model="env")` the search plans in the environment's own
dynamics instead of the learned model (AlphaZero-style; `search.make_env_recurrent_fn`),
and `act`/`search` then need the environments' states too. With
`model="decoded"` it plans in the learned model re-grounded in its own decoded
observations at every step (`search.make_decoded_recurrent_fn`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np

from muzero_jax.acting import init_actor
from muzero_jax.arena import match_env
from muzero_jax.checkpoint import Checkpointer, find_checkpoint_dir
from muzero_jax.config import Config, config_from_dict
from muzero_jax.envs import Environment
from muzero_jax.learning import Trainer, make_train
from muzero_jax.search import (
    check_decoded_model,
    check_win_lookahead,
    make_decoded_recurrent_fn,
    make_env_recurrent_fn,
    make_env_root_fn,
    make_recurrent_fn,
    make_root_fn,
    with_win_lookahead,
)
from muzero_jax.symmetries import check_symmetry_ensemble, ensemble_networks

__all__ = ["Agent", "AgentOutput", "MODELS", "WEIGHTS", "load_agent"]

MODELS = ("learned", "env", "decoded")
"""What an agent's search plans in: MuZero's learned model, the environment's
own dynamics (`search.make_env_recurrent_fn`), or the learned model
re-grounded in its own decoded observations at every step
(`search.make_decoded_recurrent_fn`; runs trained with a decoder)."""


WEIGHTS = ("online", "target")
"""Which of a checkpoint's parameters `load_agent` reads: the online network's
(trained by the optimiser) or the target network's (an exponential moving
average of the online weights when the run trained with `target_ema` > 0,
else a copy refreshed every `target_update_period` updates)."""


class AgentOutput(NamedTuple):
    """One search per observation.

    Attributes:
      action: `[B]` int32, the most visited legal action (ties broken by the
        search's action weights).
      value: `[B]` float32, the root's search value from the point of view of
        the player to move.
      policy: `[B, A]` float32, the search's action weights (visit
        distribution for `muzero`, improved policy for `gumbel_muzero`).
    """

    action: chex.Array
    value: chex.Array
    policy: chex.Array


class Agent:
    """A trained MuZero agent.

    Attributes:
      config: the run's `Config`.
      env: the run's `Environment`.
      params: the network parameters.
      trainer: the `learning.Trainer` built from `config` (networks, supports,
        search function: the agent searches with its evaluation search,
        `eval_search_fn`).
      step: the checkpoint step (iteration) the parameters come from.
      model: what the search plans in, one of `MODELS`: "learned" (MuZero's
        dynamics), "env" (the environment's step; the networks still give
        every node's prior and value, from the real observation) or
        "decoded" (the dynamics, each next hidden state decoded to an
        observation, rounded and encoded again). Default (`model=None`): the
        run's `config.search_model`, what it trained with.
      weights: which of the checkpoint's weights `params` are, one of
        `WEIGHTS` (a label that `load_agent` sets; "online" by default).
      symmetry_ensemble: every network evaluation of the search is the mean
        over the board's symmetries (`symmetries.ensemble_networks`; games
        with `env.symmetries`, e.g. Connect Four's mirror): S times the
        network cost, the same parameters. Default (None): the run's
        `config.eval_symmetry_ensemble`.
      win_lookahead: the search reads the learned model's predicted rewards
        as wins (`search.with_win_lookahead`: a node where the player to move
        has a move predicted to win is worth at least that reward, and a
        predicted win ends the game in the search); two-player games
        rewarded only at their end. Default (None): the run's
        `config.eval_win_lookahead`, for the learned and decoded models (the
        game's own ends are exact with `model="env"`, which refuses it).
    """

    def __init__(self, config: Config, trainer: Trainer, params: Any, *, step: int = 0,
                 model: str | None = None, weights: str = "online",
                 symmetry_ensemble: bool | None = None, win_lookahead: bool | None = None):
        if symmetry_ensemble is None:
            symmetry_ensemble = config.eval_symmetry_ensemble
        if model is None:
            model = config.search_model
        if model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
        if win_lookahead is None:
            win_lookahead = config.eval_win_lookahead and model != "env"
        elif not isinstance(win_lookahead, bool):
            raise ValueError(f"win_lookahead must be True, False or None, got {win_lookahead!r}")
        elif win_lookahead and model == "env":
            raise ValueError("the win lookahead reads a learned model's rewards; with "
                             "model='env' the search plans in the game, whose ends are exact")
        if win_lookahead:
            check_win_lookahead(trainer.env)
        networks = trainer.networks
        if symmetry_ensemble:
            check_symmetry_ensemble(trainer.env)
            networks = ensemble_networks(networks, trainer.env.symmetries)
        self.config = config
        self.trainer = trainer
        self.env: Environment = trainer.env
        self.params = params
        self.step = step
        self.model = model
        self.weights = weights
        self.symmetry_ensemble = bool(symmetry_ensemble)
        self.win_lookahead = win_lookahead
        if model == "env":
            # The game the matches are played in: a run's self-play options
            # (`env_kwargs`, e.g. Go's `min_plies_before_pass`) shape only
            # its self-play, so the real game planned in is the standard one.
            self._root_fn = make_env_root_fn(networks, trainer.value_support)
            self._recurrent_fn = make_env_recurrent_fn(
                match_env(self), networks, trainer.value_support, discount=config.discount)
        else:
            if model == "decoded":
                check_decoded_model(trainer.networks, self.env,
                                    config.reconstruction_loss_weight)
                make_fn = make_decoded_recurrent_fn
            else:
                make_fn = make_recurrent_fn
            root_fn = make_root_fn(networks, trainer.value_support)
            self._root_fn = lambda params, observation, env_state: root_fn(params, observation)
            self._recurrent_fn = make_fn(
                networks, trainer.value_support, trainer.reward_support,
                discount=config.discount, two_player=self.env.num_players == 2,
            )
            if win_lookahead:
                self._recurrent_fn = with_win_lookahead(self._recurrent_fn, networks,
                                                        trainer.reward_support)
        self._rng = jax.random.key(config.seed)
        self._compiled: dict[int, Callable[..., AgentOutput]] = {}

    def _num_simulations(self, num_simulations: int | None) -> int:
        n = num_simulations or self.config.eval_num_simulations or self.config.num_simulations
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"num_simulations must be a positive integer, got {n!r}")
        return int(n)

    def _search_fn(self, num_simulations: int) -> Callable[..., AgentOutput]:
        if num_simulations not in self._compiled:
            self._compiled[num_simulations] = jax.jit(
                functools.partial(self._search_batch, num_simulations=num_simulations))
        return self._compiled[num_simulations]

    def _search_batch(self, params, rng_key, observation, legal_action_mask, env_state=None, *,
                      num_simulations: int) -> AgentOutput:
        root = self._root_fn(params, observation, env_state)
        search_fn = self.trainer.eval_search_fn or self.trainer.search_fn
        out = search_fn(
            params, rng_key, root, self._recurrent_fn, num_simulations=num_simulations,
            invalid_actions=jnp.logical_not(legal_action_mask),
        )
        visits = out.search_tree.summary().visit_counts.astype(jnp.float32)
        weights = out.action_weights.astype(jnp.float32)
        # Visit counts are whole numbers and weights lie in [0, 1]: visits decide,
        # weights only break ties.
        score = jnp.where(legal_action_mask, visits + 0.5 * weights, -1.0)
        value = out.search_tree.node_values[:, mctx.Tree.ROOT_INDEX]
        return AgentOutput(action=jnp.argmax(score, axis=-1).astype(jnp.int32),
                           value=value.astype(jnp.float32), policy=weights)

    def search(self, observation, legal_action_mask=None, *, num_simulations: int | None = None,
               rng: chex.PRNGKey | None = None, env_state: Any = None) -> AgentOutput:
        """Runs the search from a batch of observations.

        Args:
          observation: `[B, *observation_shape]` (or one unbatched observation:
            the outputs then have no batch axis).
          legal_action_mask: `[B, A]` bool (default: every action legal).
          num_simulations: simulations per search (default: the run's
            evaluation setting).
          rng: a key for the search's own randomness (consumed); default: the
            agent's internal key, split at every call.
          env_state: the environments' states (leaves `[B, ...]`, as
            `jax.vmap(env.reset)` gives them), which the observations are
            of; needed with `model="env"`, ignored otherwise.

        Returns:
          An `AgentOutput`.
        """
        if self.model == "env" and env_state is None:
            raise ValueError("an agent with model='env' searches from the environments' "
                             "states: pass env_state=")
        obs = jnp.asarray(observation, jnp.float32)
        shape = tuple(self.env.observation_shape)
        unbatched = obs.shape == shape
        if unbatched:
            obs = obs[None]
        if obs.ndim != len(shape) + 1 or tuple(obs.shape[1:]) != shape:
            raise ValueError(f"observation must have shape [B, {', '.join(map(str, shape))}], "
                             f"got {list(np.shape(observation))}")
        a = self.env.num_actions
        if legal_action_mask is None:
            mask = jnp.ones((obs.shape[0], a), bool)
        else:
            mask = jnp.asarray(legal_action_mask, bool)
            if unbatched and mask.shape == (a,):
                mask = mask[None]
            if mask.shape != (obs.shape[0], a):
                raise ValueError(f"legal_action_mask must have shape [{obs.shape[0]}, {a}], "
                                 f"got {list(mask.shape)}")
        if rng is None:
            self._rng, rng = jax.random.split(self._rng)
        if self.model != "env":
            env_state = None  # not read: keep one compiled function
        elif unbatched:
            env_state = jax.tree.map(lambda x: jnp.asarray(x)[None], env_state)
        out = self._search_fn(self._num_simulations(num_simulations))(
            self.params, rng, obs, mask, env_state)
        if unbatched:
            out = jax.tree.map(lambda x: x[0], out)
        return out

    def act(self, observation, legal_action_mask=None, *, num_simulations: int | None = None,
            rng: chex.PRNGKey | None = None, env_state: Any = None) -> chex.Array:
        """Greedy actions `[B]` (the most visited action of each search)."""
        return self.search(observation, legal_action_mask, num_simulations=num_simulations,
                           rng=rng, env_state=env_state).action

    def evaluate(self, num_episodes: int, rng_key: chex.PRNGKey, *,
                 num_simulations: int | None = None) -> np.ndarray:
        """Plays `num_episodes` greedy episodes at once; returns `[E]` returns.

        Episodes start from fresh environments and end at their first `last`
        timestep (or `max_episode_steps`); returns are player 0's.
        """
        if num_episodes < 1:
            raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
        steps = self.env.max_episode_steps
        if steps is None:
            raise ValueError(f"environment {self.env.name!r} has no max_episode_steps")
        n = self._num_simulations(num_simulations)
        run = _make_episodes(self.env, functools.partial(self._search_batch, num_simulations=n),
                             num_episodes, steps)
        return np.asarray(run(self.params, rng_key))


def _make_episodes(env: Environment, search_batch, num_episodes: int, steps: int):
    batched_step = jax.vmap(env.step)

    @jax.jit
    def run(params, rng_key):
        reset_key, run_key = jax.random.split(rng_key)
        actor = init_actor(env, reset_key, num_episodes)

        def body(carry, key):
            env_state, ts, total, done = carry
            out = search_batch(params, key, ts.observation, ts.legal_action_mask, env_state)
            env_state, ts_next = batched_step(env_state, out.action)
            sign = jnp.where(ts.to_play == 0, 1.0, -1.0)  # reward belongs to the mover
            total = total + jnp.where(done, 0.0, sign * ts_next.reward)
            return (env_state, ts_next, total, done | ts_next.last), None

        init = (actor.env_state, actor.timestep, jnp.zeros((num_episodes,)),
                jnp.zeros((num_episodes,), bool))
        (_, _, total, _), _ = jax.lax.scan(body, init, jax.random.split(run_key, steps))
        return total

    return run


def load_agent(logdir_or_checkpoint: str | os.PathLike, *, step: int | None = None,
               search: str | None = None, search_kwargs: str | None = None,
               model: str | None = None, weights: str | None = None,
               symmetry_ensemble: bool | None = None,
               win_lookahead: bool | None = None) -> Agent:
    """Loads a trained agent from a run directory or a checkpoint directory.

    Args:
      logdir_or_checkpoint: a run directory (`runs/catch-...`), its
        `checkpoints/` directory, or one step directory inside it.
      step: the checkpoint step (default: the latest, or the step directory
        given).
      search: search with another search than the run's: a built-in name
        (`muzero_jax.search.BUILTIN_SEARCHES`) or "package.module:function"
        (default: the run's evaluation search, `Config.evaluation_search`:
        its `eval_search`, else self-play's `search`). The networks and
        parameters are the same.
      search_kwargs: JSON object of that search's keyword hyper-parameters
        (default: the run's own for a search the run used, its evaluation
        search's for that one and self-play's for self-play's; none for
        another, whose signature the run's may not fit).
      model: what the search plans in (`MODELS`; default: the run's
        `search_model`, "learned" unless it trained otherwise): "learned" (MuZero's
        dynamics), "env" (the environment's own step, with
        the networks' prior and value at every node: AlphaZero's planning,
        to tell how much the learned model costs) or "decoded" (the learned
        model re-grounded at every step: each next hidden state decoded to
        an observation, rounded onto 0/1 and encoded again; needs a run
        trained with `reconstruction_loss_weight` > 0 and binary
        observations).
      weights: which parameters (`WEIGHTS`; default: the run's
        `eval_weights`, "online" unless it trained otherwise): "online" or
        "target", the target network's: with `target_ema` > 0 in training,
        the exponential moving average of the online weights (Polyak
        averaging), which smooths the last updates' noise.
      symmetry_ensemble: average every network evaluation of the search over
        the board's symmetries (`Agent.symmetry_ensemble`; games that have
        them, e.g. Connect Four's mirror, TicTacToe's and Go's eight).
        Default (None): the run's `eval_symmetry_ensemble`.
      win_lookahead: read the learned model's predicted rewards as wins in
        the search (`Agent.win_lookahead`; two-player games rewarded only at
        their end). Default (None): the run's `eval_win_lookahead`, for the
        learned and decoded models.

    Returns:
      An `Agent` with the parameters of that checkpoint.

    Raises:
      checkpoint.CheckpointError: no checkpoint there, or it is unreadable.
      ValueError: a `search` or `search_kwargs` that does not resolve, parse
        or fit the search's signature, an unknown `model` or `weights`, or
        "decoded" for a run without a decoder or binary observations, or
        `symmetry_ensemble` for a game without symmetries, or `win_lookahead`
        for a game it does not fit or with `model="env"` (checked before
        anything is compiled).
    """
    if model is not None and model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    if weights is not None and weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    directory, given_step = find_checkpoint_dir(logdir_or_checkpoint)
    checkpointer = Checkpointer(directory, create=False)
    try:
        meta, step = checkpointer.read_meta(step if step is not None else given_step)
        run_config = config = config_from_dict(meta["config"])
        eval_name, eval_kwargs = config.evaluation_search()
        if (search is not None or search_kwargs is not None
                or (eval_name, eval_kwargs) != (config.search, config.search_kwargs)):
            name = eval_name if search is None else search
            if search_kwargs is None:  # the run's own for a search it used, else none
                search_kwargs = (eval_kwargs if name == eval_name else config.search_kwargs
                                 if name == config.search else "{}")
            # The agent's search becomes the config's `search` (and evaluation's).
            config = dataclasses.replace(config, search=name, search_kwargs=search_kwargs,
                                         eval_search="", eval_search_kwargs="")
        trainer = make_train(config)  # checks the search before anything is read
        # The parameters are checked against the run's own config.
        run_trainer = trainer if config == run_config else make_train(run_config)
        if weights is None:
            weights = run_config.eval_weights
        restored = checkpointer.restore(
            run_trainer, step, params_only=True,
            params_item="params" if weights == "online" else "target_params")
    finally:
        checkpointer.close()
    return Agent(config, trainer, restored.params, step=step, model=model, weights=weights,
                 symmetry_ensemble=symmetry_ensemble, win_lookahead=win_lookahead)


def standard_error(values: np.ndarray) -> float:
    """Standard error of the mean (0 for a single value)."""
    values = np.asarray(values, np.float64)
    if values.size < 2:
        return 0.0
    return float(values.std(ddof=1) / math.sqrt(values.size))
