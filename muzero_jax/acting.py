"""Self-play: batched search over a batch of environments, inside `lax.scan`.

One acting step builds the search root from the current observations with
`initial_inference`, runs the search (any `SearchFn`), picks actions from the
search policy with a temperature (0 is greedy), steps every environment, and
emits one `Trajectory` row per environment. `make_rollout` scans it over T steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx

from muzero_jax.envs.base import Environment, TimeStep
from muzero_jax.replay import Trajectory
from muzero_jax.search import RootFn, batch_search

__all__ = [
    "ActorState",
    "EpisodeStats",
    "init_actor",
    "make_act_step",
    "make_rollout",
    "select_actions",
    "temperature_at",
]


class ActorState(NamedTuple):
    """A batch of B environments mid-episode.

    Attributes:
      env_state: the environments' state (leaves `[B, ...]`).
      timestep: the current `TimeStep` (leaves `[B, ...]`).
      episode_return: `[B]` return so far in each episode (player 0's view
        for single-player tasks).
      episode_length: `[B]` steps so far in each episode.
    """

    env_state: Any
    timestep: TimeStep
    episode_return: chex.Array
    episode_length: chex.Array


class EpisodeStats(NamedTuple):
    """Episodes that ended during a rollout (sums, to average on the host).

    Attributes:
      return_sum: sum of the returns of finished episodes.
      length_sum: sum of their lengths.
      count: how many finished.
    """

    return_sum: chex.Array
    length_sum: chex.Array
    count: chex.Array


def init_actor(env: Environment, rng_key: chex.PRNGKey, num_envs: int) -> ActorState:
    """Resets `num_envs` environments (the key is consumed)."""
    env_state, timestep = jax.vmap(env.reset)(jax.random.split(rng_key, num_envs))
    zeros = jnp.zeros((num_envs,), jnp.float32)
    return ActorState(env_state, timestep, zeros, jnp.zeros((num_envs,), jnp.int32))


def temperature_at(schedule: tuple[tuple[float, float], ...], progress: chex.Array) -> chex.Array:
    """The temperature of a piecewise-constant schedule at `progress` in [0, 1].

    `schedule` is `((fraction, temperature), ...)`: `temperature` applies until
    `fraction` of training; the last entry applies after the end too.
    """
    temps = jnp.asarray([t for _, t in schedule], jnp.float32)
    bounds = jnp.asarray([f for f, _ in schedule], jnp.float32)
    index = jnp.minimum(jnp.sum(progress >= bounds), len(schedule) - 1)
    return temps[index]


def select_actions(
    rng_key: chex.PRNGKey,
    action_weights: chex.Array,
    legal_action_mask: chex.Array,
    temperature: chex.Array,
) -> chex.Array:
    """Samples `[B]` actions from `action_weights ** (1 / temperature)`.

    `temperature` is one scalar or one per row (`[B]`). Temperature 0 picks the
    most visited legal action (ties to the lowest index).
    """
    weights = jnp.where(legal_action_mask, action_weights, 0.0)
    greedy = jnp.argmax(jnp.where(legal_action_mask, weights, -1.0), axis=-1)
    temperature = jnp.broadcast_to(temperature, greedy.shape)
    safe_t = jnp.maximum(temperature, 1e-3)[:, None]
    logits = jnp.where(
        legal_action_mask & (weights > 0), jnp.log(jnp.maximum(weights, 1e-30)) / safe_t, -jnp.inf
    )
    # If no legal action has weight (degenerate search output), fall back to greedy.
    has_weight = jnp.any(jnp.isfinite(logits), axis=-1)
    sampled = jax.random.categorical(rng_key, jnp.where(has_weight[:, None], logits, 0.0))
    return jnp.where((temperature > 0) & has_weight, sampled, greedy).astype(jnp.int32)


def _random_moves(rng_key, action, legal_action_mask, prob):
    """`action` with each entry replaced, with probability `prob`, by a
    uniformly random legal action (kept where no action is legal)."""
    pick_key, coin_key = jax.random.split(rng_key)
    legal = legal_action_mask.astype(bool)
    random = jax.random.categorical(pick_key, jnp.where(legal, 0.0, -jnp.inf))
    take = (jax.random.uniform(coin_key, action.shape) < prob) & jnp.any(legal, axis=-1)
    return jnp.where(take, random, action).astype(jnp.int32)


def make_act_step(
    env: Environment,
    root_fn: RootFn,
    recurrent_fn: mctx.RecurrentFn,
    search_fn: Callable[..., mctx.PolicyOutput],
    *,
    num_simulations: int,
    use_search_action: bool = False,
    exploration_plies: int = 0,
    random_move_prob: float = 0.0,
    action_rewards: bool = False,
    action_threats: bool = False,
    reply_labels: bool = False,
    action_predictions: Callable[..., tuple[chex.Array, chex.Array]] | None = None,
    action_observations: bool = False,
):
    """Returns `act_step(params, actor, rng_key, temperature) -> (actor, row, stats)`.

    With `use_search_action`, a positive temperature takes the search's own
    `action` (its own exploration: Gumbel MuZero's sampled action, or
    `muzero_policy`'s visit-count sample), and temperature 0 is greedy.
    Otherwise actions are sampled from `action_weights ** (1 / temperature)`.
    With `exploration_plies > 0` the temperature applies only to the first
    `exploration_plies` steps of each episode; later steps are greedy.
    With `random_move_prob > 0`, each move is then replaced, with that
    probability, by a uniformly random legal move (at every ply, whatever
    the temperature); the row keeps the search's policy and value.
    With `action_rewards`, each row also carries the reward every action
    would have given (`Trajectory.action_rewards`): the environment is
    stepped from the same state once per action and those states dropped.
    With `action_threats` (two-player games), each row also carries
    `Trajectory.action_threats`: from each of those states the environment is
    stepped once more per reply, and an action is labelled with the best
    positive reward of a reply that ends the game (0 where there is none).
    With `reply_labels`, each row also carries, for every action, one reply
    and its reward (`Trajectory.action_replies`, `reply_rewards`): the reply
    with the highest positive reward, else a uniformly random legal one.
    With `action_predictions`, each row also carries the networks' value and
    policy on the observation every action leads to (`Trajectory.action_values`,
    `action_policies`), and with `action_observations` that observation itself
    (`Trajectory.action_observations`); both take it from one stepping of
    every action.

    `row` is the `Trajectory` row (leaves `[B, ...]`) of the current timestep:
    its observation, the search's policy and root value, the action taken.
    """
    batched_step = jax.vmap(env.step)
    search = batch_search(search_fn, root_fn, recurrent_fn, num_simulations=num_simulations)

    def reply_threat(state, a):
        """The best positive reward a game-ending reply to `a` gets its mover (else 0)."""
        after, ts_a = env.step(state, a)
        replies = jnp.arange(env.num_actions, dtype=jnp.int32)
        ts_b = jax.vmap(lambda b: env.step(after, b)[1])(replies)
        wins = ts_a.legal_action_mask & ts_b.last & (ts_b.reward > 0)
        return jnp.where(ts_a.last, 0.0, jnp.max(jnp.where(wins, ts_b.reward, 0.0)))

    every_action_threat = jax.vmap(jax.vmap(reply_threat, in_axes=(None, 0)), in_axes=(0, None))

    def one_reply(state, a, key):
        """`(reply, its reward)` after action `a`: the best positive-reward reply,
        else a random legal one; `(-1, 0)` where `a` ends the episode."""
        after, ts_a = env.step(state, a)
        replies = jnp.arange(env.num_actions, dtype=jnp.int32)
        reward = jax.vmap(lambda b: env.step(after, b)[1].reward)(replies)
        legal = ts_a.legal_action_mask
        best = jnp.argmax(jnp.where(legal, reward, -jnp.inf))
        random = jax.random.categorical(key, jnp.where(legal, 0.0, -jnp.inf))
        reply = jnp.where(reward[best] > 0, best, random).astype(jnp.int32)
        ok = ~ts_a.last & jnp.any(legal)
        return jnp.where(ok, reply, -1), jnp.where(ok, reward[reply], 0.0)

    # [B] states x [A] actions -> the timesteps every action leads to ([B, A, ...]).
    every_action_timestep = jax.vmap(
        jax.vmap(lambda state, a: env.step(state, a)[1], in_axes=(None, 0)), in_axes=(0, None))

    def every_action_prediction(params, after, ts):
        """`([B, A] values, [B, A, A] policies)` on the observation after each
        action (`after`: the timesteps every action leads to, `[B, A, ...]`)."""
        b, a = ts.legal_action_mask.shape
        flat = after.observation.reshape((b * a,) + after.observation.shape[2:])
        value, logits = action_predictions(params, flat)
        legal_after = after.legal_action_mask  # [B, A, A]
        policy = jax.nn.softmax(
            jnp.where(legal_after, logits.reshape(b, a, a), -jnp.inf), axis=-1)
        # Labelled: legal actions of a running episode that do not end it.
        ok = ts.legal_action_mask & ~ts.last[:, None] & ~after.last & jnp.any(legal_after, -1)
        value = jnp.where(ok, value.reshape(b, a), 0.0).astype(jnp.float32)
        policy = jnp.where(ok[..., None], policy, 0.0).astype(jnp.float32)
        return value, policy

    every_action_reply = jax.vmap(jax.vmap(one_reply, in_axes=(None, 0, 0)), in_axes=(0, None, 0))

    def act_step(params, actor: ActorState, rng_key, temperature):
        if reply_labels:  # only then: the other options' draws stay as they were
            rng_key, reply_key = jax.random.split(rng_key)
        if random_move_prob:  # likewise
            rng_key, random_key = jax.random.split(rng_key)
        search_key, action_key = jax.random.split(rng_key)
        ts = actor.timestep
        if exploration_plies:
            temperature = jnp.where(actor.episode_length < exploration_plies, temperature, 0.0)
        out = search(params, search_key, ts.observation, ts.legal_action_mask)
        action = select_actions(action_key, out.action_weights, ts.legal_action_mask, temperature)
        if use_search_action:
            action = jnp.where(temperature > 0, out.action.astype(jnp.int32), action)
        if random_move_prob:
            action = _random_moves(random_key, action, ts.legal_action_mask, random_move_prob)
        search_value = out.search_tree.node_values[:, mctx.Tree.ROOT_INDEX]
        row = Trajectory(
            observation=ts.observation,
            action=action,
            reward=ts.reward,
            first=ts.first,
            last=ts.last,
            terminated=ts.terminated,
            truncated=ts.truncated,
            legal_action_mask=ts.legal_action_mask,
            to_play=ts.to_play,
            search_policy=out.action_weights.astype(jnp.float32),
            search_value=search_value.astype(jnp.float32),
        )
        if action_rewards or action_predictions is not None or action_observations:
            # Every action stepped once from the same states (those states
            # are dropped); the rewards, predictions and observations read it.
            after = every_action_timestep(
                actor.env_state, jnp.arange(env.num_actions, dtype=jnp.int32))
        if action_rewards:
            legal = ts.legal_action_mask & ~ts.last[:, None]
            row = row._replace(
                action_rewards=jnp.where(legal, after.reward, 0.0).astype(jnp.float32))
        if action_threats:
            threats = every_action_threat(
                actor.env_state, jnp.arange(env.num_actions, dtype=jnp.int32))
            legal = ts.legal_action_mask & ~ts.last[:, None]
            row = row._replace(action_threats=jnp.where(legal, threats, 0.0).astype(jnp.float32))
        if reply_labels:
            b, a = ts.legal_action_mask.shape
            replies, reply_rewards = every_action_reply(
                actor.env_state, jnp.arange(a, dtype=jnp.int32),
                jax.random.split(reply_key, (b, a)))
            legal = ts.legal_action_mask & ~ts.last[:, None] & (replies >= 0)
            row = row._replace(
                action_replies=jnp.where(legal, replies, -1).astype(jnp.int32),
                reply_rewards=jnp.where(legal, reply_rewards, 0.0).astype(jnp.float32))
        if action_predictions is not None:
            values, policies = every_action_prediction(params, after, ts)
            row = row._replace(action_values=values, action_policies=policies)
        if action_observations:
            legal = ts.legal_action_mask & ~ts.last[:, None]
            legal = legal.reshape(legal.shape + (1,) * (after.observation.ndim - 2))
            row = row._replace(action_observations=jnp.where(
                legal, after.observation, 0.0).astype(jnp.float32))
        env_state, next_ts = batched_step(actor.env_state, action)
        # Returns from player 0's point of view: in two-player games the reward
        # is the mover's, i.e. player `to_play` of the previous timestep.
        sign = jnp.where(ts.to_play == 0, 1.0, -1.0)
        episode_return = jnp.where(ts.last, 0.0, actor.episode_return) + sign * next_ts.reward
        episode_length = jnp.where(ts.last, 0, actor.episode_length) + 1
        episode_return = jnp.where(next_ts.first, 0.0, episode_return)
        episode_length = jnp.where(next_ts.first, 0, episode_length)
        done = next_ts.last
        stats = EpisodeStats(
            return_sum=jnp.sum(jnp.where(done, episode_return, 0.0)),
            length_sum=jnp.sum(jnp.where(done, episode_length, 0)).astype(jnp.float32),
            count=jnp.sum(done).astype(jnp.float32),
        )
        actor = ActorState(env_state, next_ts, episode_return, episode_length)
        return actor, row, stats

    return act_step


def make_rollout(act_step, rollout_length: int):
    """Returns `rollout(params, actor, rng_key, temperature) -> (actor, traj, stats)`.

    `traj` has leaves `[B, T, ...]` (environment-major, as the replay adds it);
    `stats` sums the episodes that ended during the rollout.
    """

    def rollout(params, actor, rng_key, temperature):
        def body(actor, key):
            actor, row, stats = act_step(params, actor, key, temperature)
            return actor, (row, stats)

        keys = jax.random.split(rng_key, rollout_length)
        actor, (rows, stats) = jax.lax.scan(body, actor, keys)
        traj = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), rows)
        stats = jax.tree.map(lambda x: jnp.sum(x, axis=0), stats)
        return actor, traj, stats

    return rollout
