"""Gymnasium's CartPole-v1 as a pure JAX environment.

A pole is hinged on a cart that moves along a frictionless track; each step the
agent pushes the cart left or right with a fixed force. The dynamics, the
termination rule (|x| > 2.4 or |theta| > 12 degrees), the reset distribution
(uniform in [-0.05, 0.05]^4) and the reward (1.0 on every step, the terminating
one included) are those of `gymnasium.envs.classic_control.CartPoleEnv` with its
default explicit Euler integrator. The 500-step limit of CartPole-v1 is a
truncation (the state is not terminal, so value targets bootstrap from it), not
a termination.

Gymnasium keeps the state in float64 and casts the observation to float32; here
the whole state is float32 (what accelerators are fast at), so trajectories
agree with gymnasium's step by step to float32 precision and drift apart only
slowly over long rollouts, as any two implementations of a chaotic system do.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from muzero_jax.envs.base import Environment, TimeStep, auto_reset, make_timestep, wrap_reset

NUM_ACTIONS = 2
"""Actions: 0 pushes the cart left, 1 pushes it right."""

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
LENGTH = 0.5  # Half the pole's length, as in gymnasium.
POLE_MASS_LENGTH = MASS_POLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # Seconds between state updates.
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_BOUND = 0.05


class CartPoleState(NamedTuple):
    """The inner state of one CartPole episode.

    Attributes:
      x: `[]` float32, cart position.
      x_dot: `[]` float32, cart velocity.
      theta: `[]` float32, pole angle from vertical (radians).
      theta_dot: `[]` float32, pole angular velocity.
      steps: `[]` int32, steps taken in this episode (for truncation).
    """

    x: chex.Array
    x_dot: chex.Array
    theta: chex.Array
    theta_dot: chex.Array
    steps: chex.Array


def _observe(state: CartPoleState) -> chex.Array:
    return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot]).astype(jnp.float32)


def make_cartpole(max_episode_steps: int = 500) -> Environment:
    """Builds CartPole-v1 with a time limit of `max_episode_steps`.

    Args:
      max_episode_steps: episodes that survive this many steps are truncated
        (`truncated=True`, `terminated=False`); 500 as in CartPole-v1.

    Returns:
      An auto-resetting `Environment` named `"cartpole"` whose observation is
      the float32 `[x, x_dot, theta, theta_dot]`. Its state is
      `(CartPoleState, last, rng_key)` (see `base.wrap_reset`).

    Raises:
      ValueError: if `max_episode_steps` is not positive.
    """
    if max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be positive, got {max_episode_steps}")

    legal_action_mask = jnp.ones((NUM_ACTIONS,), jnp.bool_)

    def reset(rng_key: chex.PRNGKey) -> tuple[CartPoleState, TimeStep]:
        x, x_dot, theta, theta_dot = jax.random.uniform(
            rng_key, (4,), jnp.float32, minval=-RESET_BOUND, maxval=RESET_BOUND
        )
        state = CartPoleState(x, x_dot, theta, theta_dot, steps=jnp.zeros((), jnp.int32))
        timestep = make_timestep(_observe(state), first=True, legal_action_mask=legal_action_mask)
        return state, timestep

    def step(state: CartPoleState, action: chex.Array) -> tuple[CartPoleState, TimeStep]:
        force = jnp.where(action == 1, FORCE_MAG, -FORCE_MAG).astype(jnp.float32)
        cos_theta = jnp.cos(state.theta)
        sin_theta = jnp.sin(state.theta)
        temp = (force + POLE_MASS_LENGTH * jnp.square(state.theta_dot) * sin_theta) / TOTAL_MASS
        theta_acc = (GRAVITY * sin_theta - cos_theta * temp) / (
            LENGTH * (4.0 / 3.0 - MASS_POLE * jnp.square(cos_theta) / TOTAL_MASS)
        )
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos_theta / TOTAL_MASS
        # Explicit Euler: positions advance with the old velocities.
        state = CartPoleState(
            x=state.x + TAU * state.x_dot,
            x_dot=state.x_dot + TAU * x_acc,
            theta=state.theta + TAU * state.theta_dot,
            theta_dot=state.theta_dot + TAU * theta_acc,
            steps=state.steps + 1,
        )
        terminated = (jnp.abs(state.x) > X_THRESHOLD) | (jnp.abs(state.theta) > THETA_THRESHOLD)
        timestep = make_timestep(
            _observe(state),
            reward=1.0,
            terminated=terminated,
            truncated=state.steps >= max_episode_steps,  # make_timestep masks it by ~terminated.
            legal_action_mask=legal_action_mask,
        )
        return state, timestep

    return Environment(
        name="cartpole",
        observation_shape=(4,),
        num_actions=NUM_ACTIONS,
        num_players=1,
        max_episode_steps=max_episode_steps,
        reset=wrap_reset(reset),
        step=auto_reset(reset, step),
        reward_range=(0.0, 1.0),
    )
