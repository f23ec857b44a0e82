"""Gradient scaling, as in the MuZero pseudocode."""

from __future__ import annotations

from typing import Any

import chex
import jax

__all__ = ["scale_gradient"]


def scale_gradient(x: Any, scale: float | chex.Array) -> Any:
    """Returns `x` unchanged, but scales the gradient flowing back through it.

    Computes `x * scale + stop_gradient(x) * (1 - scale)`: the two terms add up
    to `x` in the forward pass, while only the first carries a derivative, so
    the backward pass multiplies the incoming gradient by `scale` (and so are
    all higher derivatives). It is neither clipping nor norm rescaling: the
    gradient keeps its direction and is scaled by a fixed factor, whatever its
    size. This is the `tf.scale_gradient` of the MuZero pseudocode (Schrittwieser
    et al., 2020, Appendix G), which exists in no TensorFlow release.

    MuZero uses it twice in the unrolled loss: the hidden state is passed through
    `scale_gradient(h, 0.5)` at every unroll step, so that the gradient reaching
    the representation and dynamics from later steps does not grow with the
    unroll length K; and each recurrent step's loss is passed through
    `scale_gradient(l, 1 / K)`, so that the K recurrent steps together weigh
    about as much as the initial step.

    Args:
      x: an array or a pytree of arrays (floating point).
      scale: a Python float or an array broadcastable to each leaf (may be traced).

    Returns:
      A pytree equal to `x` whose gradient is `scale` times the gradient of `x`.
    """
    return jax.tree.map(lambda t: t * scale + jax.lax.stop_gradient(t) * (1 - scale), x)
