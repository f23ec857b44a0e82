"""Model FLOPs of a JAX function (matmuls and convolutions) and device peaks.

`bench unroll` reports the achieved fraction of a device's peak (MFU) from
these counts. XLA's `cost_analysis` counts the body of a loop once (so the
learner step's FLOPs hardly change with the unroll length K); this module
walks the function's jaxpr instead and multiplies a `lax.scan` body by its
length. As in the usual definition of MFU, only the matrix products count
(`dot_general`, `conv_general_dilated`: 2 FLOPs per multiply-add); the
elementwise work (activations, normalisation, the optimiser) does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
from jax.extend import core as jax_core

__all__ = ["PEAK_TFLOPS", "PEAK_TFLOPS_BF16", "matmul_flops", "peak_flops"]


def _dot_flops(eqn) -> float:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    contracted = math.prod(lhs[d] for d in lhs_contract)
    return 2.0 * math.prod(eqn.outvars[0].aval.shape) * contracted


def _conv_flops(eqn) -> float:
    rhs = eqn.invars[1].aval.shape
    spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature, in feature, *spatial)
    kernel = math.prod(rhs[d] for d in spec[1:])  # in features per group x window
    return 2.0 * math.prod(eqn.outvars[0].aval.shape) * kernel


def _sub_jaxprs(value: Any):
    """The jaxprs held in one equation parameter (a jaxpr, or a tuple of them)."""
    if isinstance(value, jax_core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jax_core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _sub_jaxprs(v)


def _jaxpr_flops(jaxpr) -> float:
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "conv_general_dilated":
            total += _conv_flops(eqn)
        elif name == "cond":  # one branch runs: count the most expensive
            total += max((_jaxpr_flops(j) for j in _sub_jaxprs(eqn.params["branches"])),
                         default=0.0)
        else:
            inner = sum(_jaxpr_flops(j) for v in eqn.params.values() for j in _sub_jaxprs(v))
            # A scan runs its body `length` times; a while loop's trip count is
            # unknown at trace time, so its body counts once (a lower bound).
            total += inner * (eqn.params["length"] if name == "scan" else 1)
    return total


def matmul_flops(fn: Callable[..., Any], *args, **kwargs) -> float:
    """FLOPs of the matrix products `fn(*args, **kwargs)` performs.

    Traces `fn` (nothing is compiled or run) and sums `2 * output size *
    contracted size` over its `dot_general` and `conv_general_dilated`
    operations, through nested jits, custom derivatives, checkpointing and
    `lax.scan` (body times length); of a `lax.cond` the costliest branch.
    Apply it to the gradient step to count the backward pass too.
    """
    return _jaxpr_flops(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)


# TPUs: their listed peaks are bf16 ones, which is also how they run float32
# matmuls by default.
_TPU_PEAKS: tuple[tuple[str, float], ...] = (
    ("TPU v4", 275.0),
    ("TPU v5 lite", 197.0),
    ("TPU v5e", 197.0),
    ("TPU v5p", 459.0),
    ("TPU v5", 459.0),
    ("TPU v6 lite", 918.0),
    ("TPU v6e", 918.0),
)

# Dense peak FLOP/s (in TFLOP/s) of the matrix units for the precision that a
# float32 matmul runs at by default under JAX: TF32 tensor cores on NVIDIA
# Ampere and later, one bf16 pass on TPU. From the vendors' data sheets
# (without structured sparsity). Matched in order against `device_kind`, so
# the more specific names come first. Other devices: pass `--peak-tflops`.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 378.0),
    ("H100", 494.7),  # SXM
    ("H200", 494.7),
    ("GH200", 494.7),
    ("A100", 156.0),
    ("L4", 60.0),
) + _TPU_PEAKS


# The same for bfloat16 matmuls (dense; the TPUs' listed peaks are bf16 already).
PEAK_TFLOPS_BF16: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.4),  # SXM
    ("H200", 989.4),
    ("GH200", 989.4),
    ("A100", 312.0),
    ("L4", 121.0),
) + _TPU_PEAKS

_PEAKS = {"float32": PEAK_TFLOPS, "bfloat16": PEAK_TFLOPS_BF16}


def peak_flops(device_kind: str, dtype: str = "float32") -> float | None:
    """Peak FLOP/s of a device for `dtype` ("float32": `PEAK_TFLOPS`, "bfloat16":
    `PEAK_TFLOPS_BF16`), or None when not listed (CPUs)."""
    if dtype not in _PEAKS:
        raise ValueError(f"no peak table for dtype {dtype!r}; known: {', '.join(_PEAKS)}")
    for name, tflops in _PEAKS[dtype]:
        if name.lower() in device_kind.lower():
            return tflops * 1e12
    return None
