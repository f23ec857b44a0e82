"""Categorical value and reward supports with MuZero's invertible transform.

MuZero represents scalars (values, rewards) as categorical distributions over an
integer support after squashing them with h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x
(Schrittwieser et al., 2020, Appendix F; Pohlen et al., 2018). This module is a
thin, validated layer over rlax's `muzero_pair`, which composes
`signed_hyperbolic` with a 2-hot projection.
"""

from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import rlax

__all__ = ["DiscreteSupport", "make_support", "h_transform", "h_inverse"]


def h_transform(x: chex.Array, eps: float = 1e-3) -> chex.Array:
    """MuZero's squashing function h(x) = sign(x)(sqrt(|x|+1)-1) + eps x."""
    return rlax.signed_hyperbolic(x, eps)


def h_inverse(x: chex.Array, eps: float = 1e-3) -> chex.Array:
    """The exact inverse of `h_transform`."""
    return rlax.signed_parabolic(x, eps)


def _h_float(x: float, eps: float) -> float:
    """`h_transform` of a Python float, in float64 (no device op at build time)."""
    return math.copysign(math.sqrt(abs(x) + 1.0) - 1.0, x) + eps * x


def _h_inverse_float(x: float, eps: float) -> float:
    """`h_inverse` of a Python float, in float64 (no device op at build time)."""
    if eps == 0.0:
        return math.copysign((abs(x) + 1.0) ** 2 - 1.0, x)
    root = (math.sqrt(1.0 + 4.0 * eps * (abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return math.copysign(root * root - 1.0, x)


@dataclasses.dataclass(frozen=True)
class DiscreteSupport:
    """A categorical support over [-max_value, max_value] in transformed space.

    The support has `2 * support_size + 1` bins at the integers
    `-support_size..support_size` of the transformed space (the paper uses
    `support_size = 300`, i.e. 601 bins, for Atari). A scalar x is representable
    without clipping when |h(x)| <= support_size.

    Attributes:
      support_size: half-width of the support in transformed space.
      eps: the epsilon of the h transform.
      use_transform: apply h before projecting (the paper's choice); without it
        the support is linear in the raw scalar.
    """

    support_size: int
    eps: float = 1e-3
    use_transform: bool = True

    def __post_init__(self):
        if not isinstance(self.support_size, int) or self.support_size < 1:
            raise ValueError(
                f"support_size must be a positive integer, got {self.support_size!r}"
            )
        if self.eps < 0:
            raise ValueError(f"eps must be >= 0, got {self.eps!r}")

    @property
    def num_bins(self) -> int:
        """The number of categorical bins, `2 * support_size + 1`."""
        return 2 * self.support_size + 1

    @property
    def max_value(self) -> float:
        """The largest |scalar| representable without clipping."""
        if not self.use_transform:
            return float(self.support_size)
        return _h_inverse_float(float(self.support_size), self.eps)

    def _pair(self) -> rlax.TxPair:
        tx = rlax.SIGNED_HYPERBOLIC_PAIR if self.use_transform else rlax.IDENTITY_PAIR
        if self.use_transform and self.eps != 1e-3:
            tx = rlax.TxPair(
                lambda v: rlax.signed_hyperbolic(v, self.eps),
                lambda v: rlax.signed_parabolic(v, self.eps),
            )
        return rlax.muzero_pair(
            -float(self.support_size), float(self.support_size), self.num_bins, tx
        )

    def scalar_to_probs(self, x: chex.Array) -> chex.Array:
        """Projects scalars `[...]` to 2-hot probabilities `[..., num_bins]`."""
        return self._pair().apply(jnp.asarray(x, jnp.float32))

    def probs_to_scalar(self, probs: chex.Array) -> chex.Array:
        """Expected scalar `[...]` of probabilities `[..., num_bins]`."""
        chex.assert_axis_dimension(probs, -1, self.num_bins)
        return self._pair().apply_inv(probs)

    def logits_to_scalar(self, logits: chex.Array) -> chex.Array:
        """Expected scalar `[...]` of logits `[..., num_bins]`."""
        return self.probs_to_scalar(jax.nn.softmax(logits, axis=-1))

    def check_range(self, max_abs_value: float, name: str = "value") -> None:
        """Raises ValueError when `max_abs_value` does not fit the support."""
        if not math.isfinite(max_abs_value) or max_abs_value > self.max_value * (1 + 1e-6):
            needed = math.ceil(_h_float(float(max_abs_value), self.eps))
            if not self.use_transform:
                needed = math.ceil(max_abs_value)
            raise ValueError(
                f"{name} support_size={self.support_size} covers |{name}| <= "
                f"{self.max_value:.3g}, but {name}s up to {max_abs_value:.3g} are possible; "
                f"use support_size >= {needed}"
            )


def make_support(support_size: int, *, eps: float = 1e-3, use_transform: bool = True):
    """Returns a validated `DiscreteSupport`."""
    return DiscreteSupport(support_size=support_size, eps=eps, use_transform=use_transform)
