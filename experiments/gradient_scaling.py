"""What MuZero's two gradient scalings do, measured on Catch and CartPole.

The MuZero pseudocode (Schrittwieser et al., 2020, Appendix G) halves the
gradient of the hidden state after every recurrent step
(`scale_gradient(h, 0.5)`) and scales every recurrent step's loss by 1/K
(`scale_gradient(l, 1 / K)`). This script compares four ways of training the
same networks on the same data:

* `paper`: both scalings, exactly as `muzero_jax.loss.unrolled_loss`;
* `no_half`: no 0.5 on the hidden state (1/K kept);
* `no_1/K`: no 1/K on the recurrent losses (0.5 kept);
* `clip`: neither scaling, global gradient-norm clipping instead.

The forward loss is the same number for all four (`scale_gradient` is the
identity in the forward pass); only the gradients differ, so the variants do not
descend the same objective (the paper's gradient weighs each recurrent step's
loss by 1/K). For each unroll step k = 0..K it measures the gradient that the
step-k loss alone sends into the initial hidden state h_0, into the
representation parameters and into the dynamics parameters, under each
variant's rules at the same parameters (those of the `paper` model after the
first `--log-every` updates, "early", and at the end, "final"; at
initialisation the zero-initialised output layers of the heads send nothing
back) and for each variant's own parameters over training; the total gradient
of each function as the unroll length K varies; and held-out loss curves.
Data come from a fixed policy in the built-in environments (a noisy
heuristic whose action probabilities stand in for search policies; value
targets are Monte Carlo returns, i.e. n-step returns with n past the episode's
end, as there is no value network to bootstrap from). Seeds and variants are
trained together under `jax.vmap`.

Run from the repository root (the default takes a few minutes on 2 CPU cores):

    python experiments/gradient_scaling.py --seeds 4 --updates 400 \
        --out experiments/results/gradient_scaling

It writes `results.json` and PNG plots to `--out`; `docs/scale_gradient.md`
shows them.

`--curves` instead trains the full agent (`muzero_jax.train.train`: search,
replay, target network) once per variant, all seeds of a variant in one program
(`muzero_jax.train.train_seeds`: the seeds are vmapped, each computing what its
separate run computes), with the variant's loss passed to
`muzero_jax.learning.make_train(loss_fn=...)`.
`paper`, `no_half` and `no_1/K` keep the preset's `max_grad_norm` (5.0); `clip`
uses neither scaling and `max_grad_norm=--curve-clip`. It merges the curves into
`results.json` (key `learning_curves` for Catch, `learning_curves_cartpole` for
CartPole) and plots `learning_curves_<env>.png`:

    python experiments/gradient_scaling.py --curves --curve-env catch \
        --curve-seeds 3 --curve-steps 60000 --curve-eval-every 5 --curve-clip 1.0
    python experiments/gradient_scaling.py --curves --curve-env cartpole \
        --curve-seeds 4 --curve-steps 150000 --curve-eval-every 10 --curve-clip 1.0
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from muzero_jax.envs import make_env
from muzero_jax.gradients import scale_gradient
from muzero_jax.loss import LossBatch
from muzero_jax.networks import MLPConfig, NetworkOutput, Networks, make_networks
from muzero_jax.value_transforms import DiscreteSupport, make_support

VARIANTS: dict[str, dict[str, Any]] = {
    # hidden_scale: gradient scale on the hidden state after each recurrent step.
    # step_scale: "1/K" or a number, the gradient scale of each recurrent loss.
    # clip: global-norm clipping threshold of the total gradient (None: off).
    "paper": {"hidden_scale": 0.5, "step_scale": "1/K", "clip": None},
    "no_half": {"hidden_scale": 1.0, "step_scale": "1/K", "clip": None},
    "no_1/K": {"hidden_scale": 0.5, "step_scale": 1.0, "clip": None},
    "clip": {"hidden_scale": 1.0, "step_scale": 1.0, "clip": "clip_norm"},
}
VALUE_LOSS_WEIGHT = 0.25
"""Weight of the value cross-entropy (the library's default)."""
GROUPS = ("representation", "dynamics", "reward", "prediction")
"""Parameter groups, by Haiku module-name prefix (see `param_group`)."""


# --------------------------------------------------------------------------------------------
# The loss with switches.
# --------------------------------------------------------------------------------------------


def variant_loss(
    params: Any,
    batch: LossBatch,
    *,
    networks: Networks,
    value_support: DiscreteSupport,
    reward_support: DiscreteSupport,
    hidden_scale: float | chex.Array = 0.5,
    step_scale: float | chex.Array | None = None,
    value_loss_weight: float = 0.25,
    step_weights: chex.Array | None = None,
    hidden_offset: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """`muzero_jax.loss.unrolled_loss` with its two gradient scales as switches.

    With the defaults (`hidden_scale=0.5`, `step_scale=None` meaning 1/K) it
    computes the same value and gradient as `unrolled_loss` (checked in
    `tests/test_gradient_scaling.py`); the step structure, masks, weights and
    batch mean are the same.

    Args:
      params: network parameters.
      batch: a `LossBatch` with K = `batch.actions.shape[1]` >= 1.
      networks: the `Networks` bundle.
      value_support: categorical support of the value head.
      reward_support: categorical support of the reward head.
      hidden_scale: gradient scale applied to the hidden state leaving every
        recurrent step (0.5 in the paper; 1 switches it off). May be traced.
      step_scale: gradient scale of each recurrent step's loss; None for the
        paper's 1/K. May be traced.
      value_loss_weight: weight of the value cross-entropy.
      step_weights: optional `[K+1]` forward weights of the step losses; a
        one-hot vector isolates the gradient that one step's loss sends back.
      hidden_offset: optional `[B, *hidden]` array added to the initial hidden
        state (pass zeros and differentiate to get the gradient into h_0).

    Returns:
      `(loss, terms)`: the scalar loss and a dict of `[K+1]` batch-mean
      cross-entropies `value`, `reward`, `policy` per step (forward values).
    """
    num_steps = batch.actions.shape[1]
    if step_scale is None:
        step_scale = 1.0 / num_steps
    if step_weights is None:
        step_weights = jnp.ones((num_steps + 1,), jnp.float32)
    targets = jax.lax.stop_gradient(
        (batch.target_value, batch.target_reward, batch.target_policy)
    )
    target_value, target_reward, target_policy = targets
    value_probs = value_support.scalar_to_probs(target_value)
    reward_probs = reward_support.scalar_to_probs(target_reward)
    masks = jax.lax.stop_gradient(
        (batch.value_mask, batch.reward_mask, batch.policy_mask, batch.importance_weight)
    )
    value_mask, reward_mask, policy_mask, weight = (m.astype(jnp.float32) for m in masks)

    def step_terms(out, k):
        v = optax.softmax_cross_entropy(out.value_logits, value_probs[:, k]) * value_mask[:, k]
        p = optax.softmax_cross_entropy(out.policy_logits, target_policy[:, k])
        p = p * policy_mask[:, k]
        r = optax.softmax_cross_entropy(out.reward_logits, reward_probs[:, k])
        return v, r * reward_mask[:, k], p

    hidden0 = networks.representation(params, batch.observation)
    if hidden_offset is not None:
        hidden0 = hidden0 + hidden_offset
    policy0, value0 = networks.prediction(params, hidden0)
    zeros = jnp.zeros((hidden0.shape[0], networks.reward_bins), policy0.dtype)
    v0, _, p0 = step_terms(NetworkOutput(hidden0, zeros, policy0, value0), 0)
    loss0 = (value_loss_weight * v0 + p0) * step_weights[0]

    def body(hidden, k):
        action = jax.lax.dynamic_index_in_dim(batch.actions, k - 1, axis=1, keepdims=False)
        out = networks.recurrent_inference(params, hidden, action)
        v, r, p = step_terms(out, k)
        l_k = (value_loss_weight * v + r + p) * step_weights[k]
        l_k = scale_gradient(l_k, step_scale)
        hidden = scale_gradient(out.hidden, hidden_scale)
        return hidden, (l_k, v, r, p)

    _, (l_steps, v_steps, r_steps, p_steps) = jax.lax.scan(
        body, hidden0, jnp.arange(1, num_steps + 1)
    )
    loss = jnp.mean((loss0 + jnp.sum(l_steps, axis=0)) * weight)
    terms = {
        "value": jnp.concatenate([jnp.mean(v0)[None], jnp.mean(v_steps, axis=1)]),
        "reward": jnp.concatenate([jnp.zeros((1,)), jnp.mean(r_steps, axis=1)]),
        "policy": jnp.concatenate([jnp.mean(p0)[None], jnp.mean(p_steps, axis=1)]),
    }
    return loss, terms


# --------------------------------------------------------------------------------------------
# Data: a noisy heuristic policy in the built-in environments, Monte Carlo targets.
# --------------------------------------------------------------------------------------------


def heuristic_policy(env_name: str, epsilon: float) -> Callable[[chex.Array], chex.Array]:
    """A simple stochastic policy: `epsilon` uniform, else a hand-written rule.

    Catch moves the paddle towards the ball's column; CartPole pushes the cart
    the way the pole is falling (`theta + theta_dot`).

    Args:
      env_name: "catch" or "cartpole".
      epsilon: probability mass spread uniformly over the actions.

    Returns:
      `policy(observation) -> [num_actions]` action probabilities.
    """
    if env_name == "catch":

        def rule(obs):
            ball = jnp.argmax(jnp.sum(obs[:-1], axis=0))
            paddle = jnp.argmax(obs[-1])
            return (1 + jnp.sign(ball - paddle)).astype(jnp.int32), 3

    elif env_name == "cartpole":

        def rule(obs):
            return (obs[2] + obs[3] > 0).astype(jnp.int32), 2

    else:
        raise ValueError(f"no heuristic policy for {env_name!r}")

    def policy(obs):
        action, num_actions = rule(obs)
        return epsilon / num_actions + (1 - epsilon) * jax.nn.one_hot(action, num_actions)

    return policy


def collect(env_name: str, key: chex.PRNGKey, num_envs: int, num_steps: int, epsilon: float):
    """Runs the heuristic policy in `num_envs` environments for `num_steps` steps.

    Args:
      env_name: "catch" or "cartpole".
      key: random key.
      num_envs: parallel environments.
      num_steps: steps per environment.
      epsilon: the policy's uniform mixing weight.

    Returns:
      A dict of numpy arrays `[num_envs, num_steps + 1, ...]`: `observation`,
      `reward`, `first`, `last`, `terminated`, `action` and `policy` (the last
      two are those chosen at each row; the final row's are unused).
    """
    env = make_env(env_name)
    policy = jax.vmap(heuristic_policy(env_name, epsilon))
    reset_key, act_key = jax.random.split(key)
    state, ts = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))

    def step(carry, k):
        state, ts = carry
        probs = policy(ts.observation)
        action = jax.random.categorical(k, jnp.log(probs))
        state, next_ts = jax.vmap(env.step)(state, action)
        return (state, next_ts), (ts, action, probs)

    (_, last_ts), (tss, actions, probs) = jax.jit(
        lambda c, ks: jax.lax.scan(step, c, ks)
    )((state, ts), jax.random.split(act_key, num_steps))
    rows = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), tss, last_ts)
    actions = jnp.concatenate([actions, jnp.zeros_like(actions[:1])])
    probs = jnp.concatenate([probs, jnp.zeros_like(probs[:1])])
    out = {
        "observation": rows.observation, "reward": rows.reward, "first": rows.first,
        "last": rows.last, "terminated": rows.terminated, "action": actions, "policy": probs,
    }
    return {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in out.items()}


def episode_targets(obs, actions, rewards, policies, *, num_unroll_steps, discount, rng):
    """Unroll targets for every position of one terminated episode.

    The episode has observations `o_0..o_L` (`o_L` terminal), actions and
    policies at `0..L-1` and `rewards[i]` received on arriving at `o_i`. For a
    position t and step k (u = t + k), as in the pseudocode's `make_target`:
    value `sum_j discount**j rewards[u+1+j]` (0 from the terminal state on),
    reward `rewards[u]` (0 past the end), policy `policies[u]` while u < L
    (masked after), and the actions `actions[u]` (uniformly random past the end).

    Args:
      obs: `[L+1, *obs]`.
      actions: `[L]` int.
      rewards: `[L+1]` (index 0 unused).
      policies: `[L, A]`.
      num_unroll_steps: K.
      discount: gamma.
      rng: a numpy Generator for the actions past the end.

    Returns:
      A dict of `[L, ...]` numpy arrays with the `LossBatch` fields.
    """
    length = actions.shape[0]
    k = num_unroll_steps
    num_actions = policies.shape[1]
    returns = np.zeros(length + 1, np.float32)
    for i in range(length - 1, -1, -1):
        returns[i] = rewards[i + 1] + discount * returns[i + 1]
    u = np.arange(length)[:, None] + np.arange(k + 1)[None, :]  # [L, K+1]
    inside = u < length
    value = np.where(inside, returns[np.minimum(u, length)], 0.0)
    reward = np.where(u <= length, rewards[np.minimum(u, length)], 0.0)
    reward[:, 0] = 0.0
    policy = np.where(
        inside[..., None], policies[np.minimum(u, length - 1)], 1.0 / num_actions
    )
    act = np.where(
        inside[:, :k], actions[np.minimum(u[:, :k], length - 1)],
        rng.integers(0, num_actions, size=(length, k)),
    )
    return {
        "observation": obs[:length].astype(np.float32),
        "actions": act.astype(np.int32),
        "target_value": value.astype(np.float32),
        "target_reward": reward.astype(np.float32),
        "target_policy": policy.astype(np.float32),
        "value_mask": np.ones((length, k + 1), np.float32),
        "reward_mask": np.ones((length, k + 1), np.float32),
        "policy_mask": inside.astype(np.float32),
        "importance_weight": np.ones((length,), np.float32),
    }


def make_dataset(env_name: str, *, seed: int, num_envs: int, num_steps: int, epsilon: float,
                 num_unroll_steps: int, discount: float, test_fraction: float = 0.2):
    """Collects episodes and builds train and test `LossBatch`es (numpy).

    Only episodes that start and terminate inside the collection window are
    kept (a truncated episode would need a bootstrap value); episodes are split
    between train and test.

    Args:
      env_name: "catch" or "cartpole".
      seed: data seed.
      num_envs: parallel environments.
      num_steps: steps per environment.
      epsilon: the heuristic policy's uniform mixing weight.
      num_unroll_steps: the largest K the targets are built for.
      discount: gamma.
      test_fraction: fraction of episodes held out.

    Returns:
      `(train, test, stats)`: two `LossBatch`es of numpy arrays and a dict of
      episode statistics.
    """
    data = collect(env_name, jax.random.key(seed), num_envs, num_steps, epsilon)
    rng = np.random.default_rng(seed)
    episodes = []
    lengths, returns = [], []
    for e in range(num_envs):
        firsts = np.flatnonzero(data["first"][e])
        for s in firsts:
            ends = np.flatnonzero(data["last"][e, s:])
            if len(ends) == 0:
                continue
            t = s + ends[0]
            if not data["terminated"][e, t] or t == s:
                continue
            sl = slice(s, t + 1)
            episodes.append(episode_targets(
                data["observation"][e, sl], data["action"][e, s:t], data["reward"][e, sl],
                data["policy"][e, s:t], num_unroll_steps=num_unroll_steps,
                discount=discount, rng=rng,
            ))
            lengths.append(t - s)
            returns.append(float(np.sum(data["reward"][e, s + 1:t + 1])))
    order = rng.permutation(len(episodes))
    num_test = max(1, int(round(test_fraction * len(episodes))))
    split = [order[num_test:], order[:num_test]]
    train, test = (
        LossBatch(**{f: np.concatenate([episodes[i][f] for i in idx]) for f in episodes[0]})
        for idx in split
    )
    stats = {
        "episodes": len(episodes), "mean_length": float(np.mean(lengths)),
        "mean_return": float(np.mean(returns)),
        "train_positions": int(train.actions.shape[0]),
        "test_positions": int(test.actions.shape[0]),
    }
    return train, test, stats


def slice_unroll(batch: LossBatch, k: int) -> LossBatch:
    """The first K = `k` unroll steps of a batch built for more."""
    return batch._replace(
        actions=batch.actions[:, :k],
        target_value=batch.target_value[:, : k + 1],
        target_reward=batch.target_reward[:, : k + 1],
        target_policy=batch.target_policy[:, : k + 1],
        value_mask=batch.value_mask[:, : k + 1],
        reward_mask=batch.reward_mask[:, : k + 1],
        policy_mask=batch.policy_mask[:, : k + 1],
    )


# --------------------------------------------------------------------------------------------
# Measurement and training, vmapped over variants and seeds.
# --------------------------------------------------------------------------------------------


def param_group(module_name: str) -> str:
    """The function a Haiku module belongs to: one of `GROUPS`.

    `dynamics` is the dynamics torso and its next-state layer (the path the
    hidden state takes through g); the reward head, also part of g in the
    paper, is reported apart as `reward`; `prediction` is the policy and value
    heads of f.
    """
    for group in ("representation", "dynamics", "reward"):
        if module_name.startswith(group):
            return group
    if module_name.startswith(("policy", "value")):
        return "prediction"
    raise ValueError(f"unknown module {module_name!r}")


def group_norms(grads: Any) -> dict[str, chex.Array]:
    """L2 norm of the gradient of each parameter group."""
    squares = {g: jnp.zeros(()) for g in GROUPS}
    for module, leaves in grads.items():
        group = param_group(module)
        squares[group] = squares[group] + sum(jnp.sum(x**2) for x in jax.tree.leaves(leaves))
    return {g: jnp.sqrt(s) for g, s in squares.items()}


class Variants(NamedTuple):
    """Per-variant switches as arrays `[V]` (vmapped over)."""

    hidden_scale: chex.Array
    step_scale: chex.Array
    clip: chex.Array  # inf: no clipping.


def variant_arrays(names, num_steps: int, clip_norm: float) -> Variants:
    """The switches of the named `VARIANTS` for unroll length `num_steps`."""
    rows = []
    for name in names:
        v = VARIANTS[name]
        step = 1.0 / num_steps if v["step_scale"] == "1/K" else float(v["step_scale"])
        clip = clip_norm if v["clip"] == "clip_norm" else math.inf
        rows.append((v["hidden_scale"], step, clip))
    return Variants(*(jnp.asarray(c, jnp.float32) for c in zip(*rows)))


class Experiment:
    """Networks, supports, optimiser and the jitted programs for one environment.

    Every program takes params with leading axes `[V, S]` (variants, seeds)
    and the `Variants` switches `[V]`.
    """

    def __init__(self, networks: Networks, value_support, reward_support, optimizer):
        self.networks = networks
        self.value_support = value_support
        self.reward_support = reward_support
        self.optimizer = optimizer
        self.measure = jax.jit(self._vmap2(self._measure))
        self.totals = jax.jit(jax.vmap(
            jax.vmap(self._totals, in_axes=(0, None, None, None)), in_axes=(0, 0, None, None)
        ))
        self.evaluate = jax.jit(self._vmap2(self._evaluate))

    @staticmethod
    def _vmap2(fn):
        """vmap over variants (params, switches) and then over seeds (params)."""
        inner = jax.vmap(fn, in_axes=(0, None, None))
        return jax.vmap(inner, in_axes=(0, 0, None))

    def loss(self, params, batch, switches: Variants, **kwargs):
        """`variant_loss` under the given switches."""
        return variant_loss(
            params, batch, networks=self.networks, value_support=self.value_support,
            reward_support=self.reward_support, hidden_scale=switches.hidden_scale,
            step_scale=switches.step_scale, **kwargs,
        )

    def _clip_factor(self, grads, switches):
        norm = optax.tree.norm(grads)
        return norm, jnp.minimum(1.0, switches.clip / jnp.maximum(norm, 1e-12))

    def _measure(self, params, switches, batch):
        """Per-step gradient norms: each `[K+1]`, after the variant's clipping.

        `h0` is the root-mean-square over examples of the norm of the gradient
        that the step-k loss sends into the initial hidden state of that example;
        the groups are norms of the step-k loss's gradient of each group.
        """
        num_steps = batch.actions.shape[1]
        batch_size = batch.actions.shape[0]
        offset = jnp.zeros((batch_size, self.networks.representation(
            params, batch.observation[:1]).shape[-1]))

        def one_step(w):
            g_params, g_hidden = jax.grad(
                lambda p, o: self.loss(p, batch, switches, step_weights=w, hidden_offset=o)[0],
                argnums=(0, 1),
            )(params, offset)
            norms = group_norms(g_params)
            norms["h0"] = jnp.sqrt(batch_size) * jnp.linalg.norm(g_hidden)
            return norms

        per_step = jax.lax.map(one_step, jnp.eye(num_steps + 1))
        total = jax.grad(lambda p: self.loss(p, batch, switches)[0])(params)
        norm, factor = self._clip_factor(total, switches)
        per_step = {k: v * factor for k, v in per_step.items()}
        return per_step, norm, factor

    def _totals(self, params, switches, batch, step_weights):
        """Norm of each group's total gradient (all steps) for several K at once.

        `batch` is built for the largest K; `step_weights` `[n, K_max+1]` keeps
        the first K + 1 steps of each of the n unroll lengths (the steps after K
        then send back exactly nothing), and `switches.step_scale` is `[n]`, the
        step scale at each K. Returns norms `[n]` after the variant's clipping.
        """

        def one_k(inputs):
            weights, step_scale = inputs
            sw = switches._replace(step_scale=step_scale)
            total = jax.grad(lambda p: self.loss(p, batch, sw, step_weights=weights)[0])(params)
            _, factor = self._clip_factor(total, sw)
            return {k: v * factor for k, v in group_norms(total).items()}

        return jax.lax.map(one_k, (step_weights, switches.step_scale))

    def _evaluate(self, params, switches, batch):
        """Forward loss and its per-step cross-entropies on `batch`."""
        loss, terms = self.loss(params, batch, switches)
        return loss, terms

    def make_train_chunk(self, batch_size: int, num_updates: int):
        """A jitted `chunk(params, opt_state, keys, switches, train)` of updates.

        Runs `num_updates` updates on uniform minibatches of the `LossBatch`
        `train` (shared by all variants and seeds); `keys` are `[V, S]`. Returns
        the new params and optimiser state, and per model the mean pre-clip
        gradient norm and the fraction of clipped updates.
        """

        def update(carry, key, switches, train):
            params, opt_state = carry
            idx = jax.random.randint(key, (batch_size,), 0, train.actions.shape[0])
            batch = jax.tree.map(lambda x: x[idx], train)
            grads = jax.grad(lambda p: self.loss(p, batch, switches)[0])(params)
            norm, factor = self._clip_factor(grads, switches)
            grads = jax.tree.map(lambda g: g * factor, grads)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), (norm, factor < 1)

        def chunk(params, opt_state, key, switches, train):
            keys = jax.random.split(key, num_updates)
            (params, opt_state), (norms, clipped) = jax.lax.scan(
                lambda c, k: update(c, k, switches, train), (params, opt_state), keys
            )
            return params, opt_state, jnp.mean(norms), jnp.mean(clipped)

        inner = jax.vmap(chunk, in_axes=(0, 0, 0, None, None))
        return jax.jit(jax.vmap(inner, in_axes=(0, 0, 0, 0, None)))


# --------------------------------------------------------------------------------------------
# One environment.
# --------------------------------------------------------------------------------------------

ENV_SETTINGS = {
    # epsilon of the heuristic policy, data-collection size.
    "catch": {"epsilon": 0.5, "num_envs": 64, "num_steps": 200},
    "cartpole": {"epsilon": 0.5, "num_envs": 64, "num_steps": 400},
}


def _take(batch: LossBatch, idx) -> LossBatch:
    return jax.tree.map(lambda x: jnp.asarray(x[idx]), batch)


def _stack(params, num_variants: int):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_variants,) + x.shape), params)


def _np(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def make_optimizer(name: str, learning_rate: float) -> optax.GradientTransformation:
    """SGD with momentum 0.9 (the paper's optimiser) or Adam."""
    if name == "sgd":
        return optax.sgd(learning_rate, momentum=0.9)
    if name == "adam":
        return optax.adam(learning_rate)
    raise ValueError(f"unknown optimizer {name!r}")


def run_env(env_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Trains the four variants on one environment and measures them.

    Args:
      env_name: "catch" or "cartpole".
      args: the command-line options.

    Returns:
      A dict with `names` (the variants), `stats` (of the data), `history`
      (per log point: held-out loss and per-step cross-entropies, per-step
      gradient norms of each model's own params, pre-clip gradient norm and
      clipped fraction; arrays `[T, V, S, ...]`), `snapshots` (`early` and
      `final`: per-step gradient norms for own and for the `paper` model's
      params, and the K sweep), `k_sweep` and `seconds`.
    """
    names = list(VARIANTS)
    num_variants, num_seeds, k = len(names), args.seeds, args.unroll
    k_sweep = sorted(set(args.k_sweep) | {k})
    settings = ENV_SETTINGS[env_name]
    t0 = time.time()
    train_all, test_all, stats = make_dataset(
        env_name, seed=args.data_seed, num_envs=settings["num_envs"],
        num_steps=settings["num_steps"], epsilon=settings["epsilon"],
        num_unroll_steps=max(k_sweep), discount=args.discount,
    )
    value_support = make_support(args.value_support)
    reward_support = make_support(args.reward_support)
    value_support.check_range(float(np.max(np.abs(train_all.target_value))), "value")
    env = make_env(env_name)
    networks = make_networks(
        MLPConfig(), num_actions=env.num_actions, value_bins=value_support.num_bins,
        reward_bins=reward_support.num_bins,
    )
    exp = Experiment(networks, value_support, reward_support,
                     make_optimizer(args.optimizer, args.learning_rate))
    switches = variant_arrays(names, k, args.clip_norm)
    rng = np.random.default_rng(args.data_seed)
    num_train = train_all.actions.shape[0]
    measure_all = _take(train_all, rng.choice(num_train, args.measure_batch, replace=False))
    measure = slice_unroll(measure_all, k)
    num_test = test_all.actions.shape[0]
    test = _take(slice_unroll(test_all, k), rng.choice(num_test, min(num_test, 2048), False))
    train = jax.tree.map(jnp.asarray, slice_unroll(train_all, k))

    init_keys = jax.random.split(jax.random.key(args.seed), num_seeds)
    params = jax.vmap(networks.init, in_axes=(0, None))(init_keys, measure.observation[:1])
    params = _stack(params, num_variants)
    opt_state = jax.vmap(jax.vmap(exp.optimizer.init))(params)
    chunk = exp.make_train_chunk(args.batch_size, args.log_every)
    num_chunks = max(1, args.updates // args.log_every)
    keys = jax.random.split(jax.random.key(args.seed + 1), (num_chunks, num_variants, num_seeds))

    k_max = max(k_sweep)
    sweep_weights = jnp.asarray(
        [[1.0 if j <= kk else 0.0 for j in range(k_max + 1)] for kk in k_sweep]
    )
    per_k = [variant_arrays(names, kk, args.clip_norm) for kk in k_sweep]
    sweep_switches = per_k[0]._replace(
        step_scale=jnp.stack([sw.step_scale for sw in per_k], axis=1)
    )

    paper = names.index("paper")

    def paper_params(p):  # The `paper` model's params, given to every variant.
        return _stack(jax.tree.map(lambda x: x[paper], p), num_variants)

    def snapshot(p):
        per_step, _, factor = exp.measure(p, switches, measure)
        same_step, _, same_factor = exp.measure(paper_params(p), switches, measure)
        totals = exp.totals(paper_params(p), sweep_switches, measure_all, sweep_weights)
        return _np({"own": per_step, "own_clip_factor": factor, "same": same_step,
                    "same_clip_factor": same_factor, "k_sweep": totals})

    history = {"update": [], "test_loss": [], "test_terms": [], "grad_norm": [],
               "clipped": [], "per_step": []}
    snapshots = {}
    for i in range(num_chunks + 1):
        if i > 0:
            params, opt_state, gnorm, clipped = chunk(
                params, opt_state, keys[i - 1], switches, train
            )
            history["grad_norm"].append(np.asarray(gnorm))
            history["clipped"].append(np.asarray(clipped))
        loss, terms = exp.evaluate(params, switches, test)
        per_step, _, _ = exp.measure(params, switches, measure)
        history["update"].append(i * args.log_every)
        history["test_loss"].append(np.asarray(loss))
        history["test_terms"].append(_np(terms))
        history["per_step"].append(_np(per_step))
        if i == 1:
            snapshots["early"] = snapshot(params)
        print(f"  {env_name} update {i * args.log_every:4d}: test loss "
              + " ".join(f"{n}={float(np.mean(loss[v])):.3f}" for v, n in enumerate(names))
              + f"  ({time.time() - t0:.0f}s)", flush=True)
    snapshots["final"] = snapshot(params)
    stack = lambda xs: jax.tree.map(lambda *a: np.stack(a), *xs)
    history = {key: (stack(val) if val else val) for key, val in history.items()}
    return {"names": names, "stats": stats, "history": history, "snapshots": snapshots,
            "k_sweep": k_sweep, "seconds": time.time() - t0}


# --------------------------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    """The command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default="catch,cartpole", help="comma-separated env names")
    parser.add_argument("--seeds", type=int, default=4, help="network seeds (vmapped)")
    parser.add_argument("--updates", type=int, default=400,
                        help="updates per model (rounded down to a multiple of --log-every)")
    parser.add_argument("--out", default="experiments/results/gradient_scaling")
    parser.add_argument("--unroll", type=int, default=5, help="K, the unroll length")
    parser.add_argument("--k-sweep", default="1,2,3,5,8,10",
                        help="unroll lengths for the total-gradient sweep")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--measure-batch", type=int, default=256)
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--clip-norm", type=float, default=1.0,
                        help="global-norm threshold of the `clip` variant")
    parser.add_argument("--discount", type=float, default=0.97)
    parser.add_argument("--value-support", type=int, default=10)
    parser.add_argument("--reward-support", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--curves", action="store_true",
                        help="only train the full agent per variant (learning curves)")
    parser.add_argument("--curve-env", default="catch", help="preset for --curves")
    parser.add_argument("--curve-seeds", type=int, default=3, help="seeds (vmapped, >= 2)")
    parser.add_argument("--curve-steps", type=int, default=60_000, help="max_env_steps per run")
    parser.add_argument("--curve-eval-every", type=int, default=5, help="iterations")
    parser.add_argument("--curve-clip", type=float, default=1.0,
                        help="max_grad_norm of the `clip` variant in --curves")
    args = parser.parse_args(argv)
    args.k_sweep = [int(x) for x in args.k_sweep.split(",")]
    args.envs = args.envs.split(",")
    return args


def _round(x: Any, digits: int = 4) -> Any:
    """Rounds floats (in nested lists) to `digits` significant digits for JSON."""
    if isinstance(x, list | tuple):
        return [_round(v, digits) for v in x]
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def _per_variant(names, array, axis=0):
    """`{variant: {"mean": ..., "std": ...}}` over seeds of a `[V, S, ...]` array."""
    return {
        n: {"mean": _round(np.mean(array[v], axis=axis).tolist()),
            "std": _round(np.std(array[v], axis=axis).tolist())}
        for v, n in enumerate(names)
    }


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON-ready summary of one environment's `run_env` result."""
    names = result["names"]
    hist = result["history"]
    out: dict[str, Any] = {"stats": result["stats"], "seconds": round(result["seconds"], 1),
                           "variants": names, "per_step": {}, "k_sweep": {}}
    for when, snap in result["snapshots"].items():
        out["per_step"][when] = {
            kind: {q: _per_variant(names, snap[kind][q]) for q in ("h0", "representation",
                                                                    "dynamics", "reward")}
            for kind in ("same", "own")
        }
        out["per_step"][when]["clip_factor"] = _per_variant(names, snap["same_clip_factor"])
        out["k_sweep"][when] = {"K": result["k_sweep"]} | {
            q: _per_variant(names, snap["k_sweep"][q]) for q in ("representation", "dynamics")
        }
    terms = hist["test_terms"]  # each [T, V, S, K+1]
    curves = {"update": hist["update"].astype(int).tolist(),
              "test_loss": _per_variant(names, np.moveaxis(hist["test_loss"], 0, -1))}
    for q in ("value", "reward", "policy"):
        curves[f"test_{q}_ce"] = _per_variant(names, np.moveaxis(terms[q].sum(-1), 0, -1))
    # l_k = 0.25 CE(value) + CE(reward) + CE(policy) at each step (forward values).
    step_loss = VALUE_LOSS_WEIGHT * terms["value"] + terms["reward"] + terms["policy"]
    curves["test_step0_loss"] = _per_variant(names, np.moveaxis(step_loss[..., 0], 0, -1))
    curves["test_recurrent_loss"] = _per_variant(
        names, np.moveaxis(step_loss[..., 1:].mean(-1), 0, -1)
    )
    for q in ("h0", "representation", "dynamics"):
        per = hist["per_step"][q]  # [T, V, S, K+1]
        curves[f"per_step_{q}"] = {
            n: _round(np.mean(per[:, v], axis=1).tolist(), 3) for v, n in enumerate(names)
        }
    curves["grad_norm"] = _per_variant(names, np.moveaxis(hist["grad_norm"], 0, -1))
    curves["clipped_fraction"] = _per_variant(names, np.moveaxis(hist["clipped"], 0, -1))
    out["curves"] = curves
    out["final_test"] = {
        "loss": _per_variant(names, hist["test_loss"][-1]),
        "step0_loss": _per_variant(names, step_loss[-1, ..., 0]),
        "recurrent_loss": _per_variant(names, step_loss[-1, ..., 1:].mean(-1)),
        **{f"{q}_ce_per_step": _per_variant(names, terms[q][-1]) for q in terms},
    }
    return out


COLORS = {"paper": "C0", "no_half": "C1", "no_1/K": "C2", "clip": "C3"}


def plot(summary: dict[str, Any], out_dir: str) -> list[str]:
    """Writes the PNG plots; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    envs = list(summary["envs"])
    titles = {"h0": "into h_0", "representation": "representation params",
              "dynamics": "dynamics params (torso + next state)"}
    for env in envs:
        res = summary["envs"][env]
        fig, axes = plt.subplots(2, 3, figsize=(11, 5.6), sharex=True)
        for row, when in enumerate(("early", "final")):
            for col, q in enumerate(titles):
                ax = axes[row, col]
                for n in res["variants"]:
                    m = np.asarray(res["per_step"][when]["same"][q][n]["mean"])
                    k = np.arange(len(m))
                    keep = m > 0
                    ax.semilogy(k[keep], m[keep], "o-", color=COLORS[n], label=n, ms=3)
                ax.set_title(f"{titles[q]}, {when}", fontsize=9)
                ax.grid(alpha=0.3)
                if row == 1:
                    ax.set_xlabel("unroll step k of the loss term")
            axes[row, 0].set_ylabel("gradient norm from step k")
        axes[0, 0].legend(fontsize=8)
        fig.suptitle(f"{env}: gradient sent back by each step's loss (same params, "
                     f"mean of {summary['args']['seeds']} seeds)", fontsize=10)
        fig.tight_layout()
        name = f"per_step_{env}.png"
        _save(fig, os.path.join(out_dir, name))
        files.append(name)

    fig, axes = plt.subplots(len(envs), 2, figsize=(8, 3.2 * len(envs)), squeeze=False)
    for r, env in enumerate(envs):
        res = summary["envs"][env]["k_sweep"]["final"]
        for c, q in enumerate(("representation", "dynamics")):
            ax = axes[r, c]
            for n in summary["envs"][env]["variants"]:
                ax.plot(res["K"], res[q][n]["mean"], "o-", color=COLORS[n], label=n, ms=3)
            ax.set_title(f"{env}: total gradient norm, {q}", fontsize=9)
            ax.set_xlabel("unroll length K")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, os.path.join(out_dir, "k_sweep.png"))
    files.append("k_sweep.png")

    keys = [("test_step0_loss", "held-out l_0 (initial step)"),
            ("test_recurrent_loss", "held-out mean of l_1..l_K"),
            ("test_value_ce", "value CE (sum over k)"),
            ("test_reward_ce", "reward CE (sum over k)")]
    fig, axes = plt.subplots(len(envs), 4, figsize=(13, 3 * len(envs)), squeeze=False)
    for r, env in enumerate(envs):
        curves = summary["envs"][env]["curves"]
        x = np.asarray(curves["update"])
        for c, (key, title) in enumerate(keys):
            ax = axes[r, c]
            for n in summary["envs"][env]["variants"]:
                m = np.asarray(curves[key][n]["mean"])
                s = np.asarray(curves[key][n]["std"])
                ax.plot(x[1:], m[1:], color=COLORS[n], label=n)
                ax.fill_between(x[1:], (m - s)[1:], (m + s)[1:], color=COLORS[n], alpha=0.15)
            ax.set_title(f"{env}: {title}", fontsize=9)
            ax.set_xlabel("update")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, os.path.join(out_dir, "loss_curves.png"))
    files.append("loss_curves.png")

    # Per-step gradient into h_0 over training, each variant with its own params.
    names = summary["envs"][envs[0]]["variants"]
    fig, axes = plt.subplots(len(envs), len(names), figsize=(3.2 * len(names), 2.8 * len(envs)),
                             squeeze=False, sharey="row")
    for r, env in enumerate(envs):
        res = summary["envs"][env]
        x = np.asarray(res["curves"]["update"])
        for c, n in enumerate(names):
            ax = axes[r, c]
            per = np.asarray(res["curves"]["per_step_h0"][n])  # [T, K+1]
            for k in range(per.shape[1]):
                ax.semilogy(x[1:], per[1:, k], color=plt.cm.viridis(k / (per.shape[1] - 1)),
                            label=f"k={k}")
            ax.set_title(f"{env}, {n}: into h_0 from step k", fontsize=9)
            ax.set_xlabel("update")
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    _save(fig, os.path.join(out_dir, "per_step_training.png"))
    files.append("per_step_training.png")
    return files


def _save(fig, path: str) -> None:
    """Saves a figure as a small palette PNG (64 colours)."""
    import matplotlib.pyplot as plt
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=64)
    plt.close(fig)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=64)
    image.save(path, optimize=True)


def markdown_tables(summary: dict[str, Any]) -> str:
    """The tables `docs/scale_gradient.md` shows, as Markdown."""
    lines = []
    for env, res in summary["envs"].items():
        names = res["variants"]
        for q in ("h0", "dynamics"):
            per = res["per_step"]["final"]["same"][q]
            k = len(per[names[0]]["mean"])
            where = "into h_0" if q == "h0" else "to the dynamics params"
            lines.append(f"\n{env}, gradient norm from step k's loss {where} "
                         "(trained `paper` params):\n")
            lines.append("| variant | " + " | ".join(f"k={i}" for i in range(k)) + " |")
            lines.append("|---" * (k + 1) + "|")
            for n in names:
                lines.append(f"| {n} | " + " | ".join(f"{v:.3g}" for v in per[n]["mean"]) + " |")
        sweep = res["k_sweep"]["final"]
        lines.append(f"\n{env}, total gradient norm vs unroll length K (trained `paper` params):\n")
        lines.append("| variant | group | " + " | ".join(f"K={x}" for x in sweep["K"]) + " |")
        lines.append("|---" * (len(sweep["K"]) + 2) + "|")
        for n in names:
            for q in ("representation", "dynamics"):
                lines.append(f"| {n} | {q} | "
                             + " | ".join(f"{v:.3g}" for v in sweep[q][n]["mean"]) + " |")
        fin = res["final_test"]
        curves = res["curves"]
        lines.append(f"\n{env}, held-out losses after {curves['update'][-1]} updates "
                     "(mean ± std over seeds; CE summed over steps):\n")
        lines.append("| variant | l_0 | mean l_1..l_K | value CE | reward CE | policy CE "
                     "| grad norm (last) | clipped |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for n in names:
            ce = [np.sum(fin[f"{q}_ce_per_step"][n]["mean"]) for q in ("value", "reward",
                                                                        "policy")]
            l0, lk = (f"{fin[key][n]['mean']:.3f} ± {fin[key][n]['std']:.3f}"
                      for key in ("step0_loss", "recurrent_loss"))
            lines.append(
                f"| {n} | {l0} | {lk} | "
                + " | ".join(f"{c:.3f}" for c in ce)
                + f" | {curves['grad_norm'][n]['mean'][-1]:.3g} "
                f"| {curves['clipped_fraction'][n]['mean'][-1]:.0%} |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Learning curves of the full agent (`--curves`): search, replay, target network.
# --------------------------------------------------------------------------------------------


def make_curve_loss(hidden_scale: float, step_scale: float | None) -> Callable[..., Any]:
    """A drop-in for `muzero_jax.loss.unrolled_loss` with the two scales as switches.

    Same steps, masks, weights, batch mean and `LossMetrics` as `unrolled_loss`;
    `hidden_scale` is the gradient scale on the hidden state leaving every
    recurrent step (paper: 0.5) and `step_scale` that of each recurrent step's
    loss (None: the paper's 1/K). Self-contained, so the `paper` variant does not
    depend on the library's loss staying as it is.
    """
    from muzero_jax.loss import LossMetrics

    def loss_fn(params, batch, *, networks, value_support, reward_support,
                value_loss_weight=0.25):
        num_steps = batch.actions.shape[1]
        scale = 1.0 / num_steps if step_scale is None else step_scale
        target_value, target_reward, target_policy = jax.lax.stop_gradient(
            (batch.target_value, batch.target_reward, batch.target_policy)
        )
        value_probs = value_support.scalar_to_probs(target_value)
        reward_probs = reward_support.scalar_to_probs(target_reward)
        masks = jax.lax.stop_gradient(
            (batch.value_mask, batch.reward_mask, batch.policy_mask, batch.importance_weight)
        )
        value_mask, reward_mask, policy_mask, weight = (m.astype(jnp.float32) for m in masks)
        ce = optax.softmax_cross_entropy

        def terms(out, k):
            v = ce(out.value_logits, value_probs[:, k]) * value_mask[:, k]
            p = ce(out.policy_logits, target_policy[:, k]) * policy_mask[:, k]
            r = ce(out.reward_logits, reward_probs[:, k]) * reward_mask[:, k]
            value = value_support.logits_to_scalar(out.value_logits)
            reward = reward_support.logits_to_scalar(out.reward_logits)
            v_err = jnp.abs(value - target_value[:, k]) * value_mask[:, k]
            r_err = jnp.abs(reward - target_reward[:, k]) * reward_mask[:, k]
            return v, r, p, v_err, r_err, value

        out0 = networks.initial_inference(params, batch.observation)
        v0, _, p0, v_err0, _, value0 = terms(out0, 0)
        loss0 = value_loss_weight * v0 + p0

        def body(hidden, k):
            action = jax.lax.dynamic_index_in_dim(batch.actions, k - 1, axis=1, keepdims=False)
            out = networks.recurrent_inference(params, hidden, action)
            v, r, p, v_err, r_err, _ = terms(out, k)
            l_k = scale_gradient(value_loss_weight * v + r + p, scale)
            return scale_gradient(out.hidden, hidden_scale), (l_k, v, r, p, v_err, r_err)

        _, (l_steps, v_steps, r_steps, p_steps, v_errs, r_errs) = jax.lax.scan(
            body, out0.hidden, jnp.arange(1, num_steps + 1)
        )
        loss = jnp.mean((loss0 + jnp.sum(l_steps, axis=0)) * weight)
        log_probs = jax.nn.log_softmax(out0.policy_logits)
        metrics = LossMetrics(
            loss=loss,
            value_loss=jnp.mean(v0 + jnp.sum(v_steps, axis=0)),
            reward_loss=jnp.mean(jnp.sum(r_steps, axis=0)),
            policy_loss=jnp.mean(p0 + jnp.sum(p_steps, axis=0)),
            value_error=jnp.concatenate([jnp.mean(v_err0)[None], jnp.mean(v_errs, axis=1)]),
            reward_error=jnp.concatenate([jnp.zeros((1,)), jnp.mean(r_errs, axis=1)]),
            policy_entropy=jnp.mean(-jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)),
            predicted_value=jax.lax.stop_gradient(value0),
        )
        return loss, metrics

    return loss_fn


#: Return that counts as "learned" in the learning-curve table, per environment.
CURVE_THRESHOLDS = {"catch": 0.9, "cartpole": 475.0}


def run_curves(args: argparse.Namespace) -> dict[str, Any]:
    """Trains the full agent once per (variant, seed) with the variant's loss.

    `paper`, `no_half` and `no_1/K` keep the preset's `max_grad_norm`; `clip`
    drops both scalings and sets `max_grad_norm` to `--curve-clip`.

    Returns:
      A dict with the settings and, per variant, per seed: the final evaluation
      return, the env steps of the first evaluation >= 0.9 (None if never), and
      the (env_steps, eval_return) points.
    """
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset
    from muzero_jax.train import train_seeds

    threshold = CURVE_THRESHOLDS.get(args.curve_env, 0.9)
    key = f"steps_to_{threshold:g}"
    out: dict[str, Any] = {"env": args.curve_env, "steps": args.curve_steps,
                           "seeds": args.curve_seeds, "clip": args.curve_clip,
                           "threshold": threshold, "vmapped_seeds": True, "runs": {}}
    for name, spec in VARIANTS.items():
        step_scale = None if spec["step_scale"] == "1/K" else float(spec["step_scale"])
        overrides = {"max_env_steps": args.curve_steps, "eval_every": args.curve_eval_every}
        if spec["clip"] is not None:
            overrides["max_grad_norm"] = args.curve_clip
        loss_fn = make_curve_loss(spec["hidden_scale"], step_scale)
        # All seeds of a variant in one program (jax.vmap): seed k is what a
        # separate run with seed k computes (tests/test_seeds.py).
        config = preset(args.curve_env, seed=0, **overrides)
        t0 = time.time()
        result = train_seeds(config, args.curve_seeds, trainer=make_train(
            config, loss_fn=loss_fn, num_seeds=args.curve_seeds))
        seconds = round(time.time() - t0, 1)
        runs = []
        for seed, hist in zip(result.seeds, result.histories):
            points = [[int(r["env_steps"]), round(float(r["eval_return"]), 3)]
                      for r in hist if "eval_return" in r]
            first = next((s for s, ret in points if ret >= threshold), None)
            runs.append({"seed": seed, "final": points[-1][1] if points else None,
                         key: first, "curve": points})
            print(f"  {name} seed {seed}: final {runs[-1]['final']} first>={threshold:g} at "
                  f"{first}", flush=True)
        out["runs"][name] = runs
        out.setdefault("seconds_per_variant", {})[name] = seconds
    return out


def plot_curves(curves: dict[str, Any], path: str) -> None:
    """Mean and min-max band over seeds of the evaluation return vs env steps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, runs in curves["runs"].items():
        n = min(len(r["curve"]) for r in runs)
        steps = np.array([p[0] for p in runs[0]["curve"][:n]])
        ret = np.array([[p[1] for p in r["curve"][:n]] for r in runs])
        ax.plot(steps, ret.mean(0), label=f"{name} (mean of {len(runs)})")
        ax.fill_between(steps, ret.min(0), ret.max(0), alpha=0.2)
    ax.axhline(curves.get("threshold", 0.9), color="grey", lw=0.8, ls=":")
    ax.set_xlabel("env steps")
    ax.set_ylabel("greedy eval return")
    ax.set_title(f"{curves['env']}: full agent, min-max band over seeds")
    ax.legend(fontsize=8)
    _save(fig, path)


def curves_main(args: argparse.Namespace) -> None:
    """`--curves`: runs `run_curves`, merges it into `results.json`, plots it."""
    t0 = time.time()
    curves = run_curves(args)
    curves["seconds"] = round(time.time() - t0, 1)
    curves["command"] = args.command
    path = os.path.join(args.out, "results.json")
    summary = {}
    if os.path.exists(path):
        with open(path) as f:
            summary = json.load(f)
    if args.curve_env == "catch":
        summary["learning_curves"] = curves  # the key the doc has always read
    else:
        summary[f"learning_curves_{args.curve_env}"] = curves
    _write_json(summary, path)
    if not args.no_plots:
        plot_curves(curves, os.path.join(args.out, f"learning_curves_{args.curve_env}.png"))
    threshold = curves["threshold"]
    print(f"| variant | final eval return per seed | env steps to first >= {threshold:g} |")
    print("|---|---|---|")
    for name, runs in curves["runs"].items():
        finals = ", ".join(f"{r['final']:.2f}" for r in runs)
        firsts = ", ".join(str(r[f"steps_to_{threshold:g}"]) for r in runs)
        print(f"| {name} | {finals} | {firsts} |")
    print(f"curves in {curves['seconds']:.0f}s")


def _write_json(summary: dict[str, Any], path: str) -> None:
    text = json.dumps(summary, indent=1)
    # One line per list of numbers, to keep the file small and readable.
    text = re.sub(r"\[[-0-9.,\se+\[\]]*\]", lambda m: re.sub(r"\s+", "", m.group(0)), text)
    with open(path, "w") as f:
        f.write(text + "\n")


def learning_loop_status() -> str:
    """Whether `muzero_jax.learning.make_train` can train with another loss.

    Learning curves of the full agent (acting with search, replay, targets)
    need the training loop to accept the variant loss; this reports whether it
    does, so the results say why they are missing rather than faking them.
    """
    try:
        from muzero_jax import learning
    except ImportError:
        return "pending: muzero_jax.learning does not exist yet"
    if not hasattr(learning, "make_train"):
        return "pending: muzero_jax.learning has no make_train yet"
    params = inspect.signature(learning.make_train).parameters
    if not any("loss" in name for name in params):
        return ("pending: muzero_jax.learning.make_train exists but takes no loss argument "
                f"(its parameters: {', '.join(params)}), so the variants cannot be swapped in")
    return "available: make_train takes a loss; run this script with --curves"


def main(argv=None) -> None:
    """Runs the experiment and writes `results.json` and the plots to `--out`."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.curves:
        args.command = "python experiments/gradient_scaling.py " + " ".join(
            argv if argv is not None else __import__("sys").argv[1:]
        )
        curves_main(args)
        return
    t0 = time.time()
    summary: dict[str, Any] = {
        "command": "python experiments/gradient_scaling.py " + " ".join(
            argv if argv is not None else __import__("sys").argv[1:]
        ),
        "args": vars(args),
        "variants": VARIANTS,
        "devices": [str(d) for d in jax.devices()],
        "envs": {},
    }
    for env in args.envs:
        print(f"{env}:", flush=True)
        summary["envs"][env] = summarise(run_env(env, args))
    summary["learning_curves"] = learning_loop_status()
    path = os.path.join(args.out, "results.json")
    if os.path.exists(path):  # Keep the curves of an earlier `--curves` run.
        with open(path) as f:
            previous = json.load(f).get("learning_curves")
        if isinstance(previous, dict):
            summary["learning_curves"] = previous
    summary["seconds"] = round(time.time() - t0, 1)
    _write_json(summary, path)
    if not args.no_plots:
        summary["plots"] = plot(summary, args.out)
    print(markdown_tables(summary))
    print(f"\nlearning curves: {summary['learning_curves']}")
    print(f"wrote {args.out} in {summary['seconds']:.0f}s")


if __name__ == "__main__":
    main()
