"""Per-environment default configurations (tuned on a 2-core CPU).

`muzero-jax train --env NAME` starts from `preset(NAME)`; every field can be
overridden on the command line. The experiment scripts in `experiments/` use
the same presets and record what they reach.
"""

from __future__ import annotations

import dataclasses

from muzero_jax.config import Config
from muzero_jax.envs import ENV_NAMES
from muzero_jax.networks import MLPConfig

__all__ = ["PRESETS", "preset"]

PRESETS: dict[str, Config] = {
    # Catch: 9-step episodes, reward +-1 at the end.
    "catch": Config(
        env="catch",
        discount=1.0,
        value_loss_weight=1.0,
        num_simulations=8,
        replay_ratio=0.025,
        value_support_size=5,
        reward_support_size=5,
        max_env_steps=300_000,
        eval_every=5,
    ),
    # CartPole-v1: reward 1 per step up to 500 steps; values up to ~1/(1-gamma).
    "cartpole": Config(
        env="cartpole",
        discount=0.99,
        value_support_size=20,
        reward_support_size=5,
        mlp=MLPConfig(hidden_sizes=(64,), latent_size=64, head_hidden_sizes=(64,)),
        max_env_steps=1_000_000,
        replay_capacity=1000,
        eval_every=10,
    ),
}


def preset(env: str, **overrides) -> Config:
    """The default config for `env`, with `overrides` applied (validated)."""
    if env in PRESETS:
        base = PRESETS[env]
    elif env in ENV_NAMES:
        base = Config(env=env)
    else:
        raise ValueError(f"unknown environment {env!r}; known: {', '.join(ENV_NAMES)}")
    return dataclasses.replace(base, **overrides)
