"""Pure JAX environments and a registry to build them by name.

Every environment is an `Environment` (see `base`): pure, jittable `reset` and
`step` functions with dm_env-style auto-reset, so a batch runs under `jax.vmap`
and a rollout under `jax.lax.scan`. To add one, write a factory returning an
`Environment` and add it to `_FACTORIES`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from muzero_jax.envs.base import Environment, TimeStep, make_timestep
from muzero_jax.envs.cartpole import make_cartpole
from muzero_jax.envs.catch import make_catch
from muzero_jax.envs.pgx import PGX_GAMES, make_pgx

_FACTORIES: dict[str, Callable[..., Environment]] = {
    "catch": make_catch,
    "cartpole": make_cartpole,
    # Two-player board games from pgx (pgx is imported when one is built).
    **{game: functools.partial(make_pgx, game) for game in PGX_GAMES},
}

ENV_NAMES: tuple[str, ...] = tuple(_FACTORIES)
"""The names `make_env` accepts."""


def make_env(name: str, **kwargs) -> Environment:
    """Builds the environment registered as `name`.

    Args:
      name: one of `ENV_NAMES`.
      **kwargs: passed to the environment's factory, e.g. `rows=6` for `"catch"`
        or `max_episode_steps=200` for `"cartpole"`.

    Returns:
      The environment.

    Raises:
      ValueError: for an unknown name (the message lists the known ones).
    """
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(ENV_NAMES)}") from None
    return factory(**kwargs)


__all__ = [
    "ENV_NAMES",
    "Environment",
    "TimeStep",
    "make_cartpole",
    "make_catch",
    "make_env",
    "make_pgx",
    "make_timestep",
]
