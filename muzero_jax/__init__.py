"""muzero-jax: MuZero in JAX and Haiku, with on-device acting, replay and learning.

The public API is re-exported here; implementation lives in the submodules.
"""

from muzero_jax.gradients import scale_gradient
from muzero_jax.loss import LossBatch, LossMetrics, unrolled_loss
from muzero_jax.networks import (
    MLPConfig,
    NetworkOutput,
    Networks,
    ResNetConfig,
    make_networks,
    min_max_normalize,
)
from muzero_jax.search import (
    BUILTIN_SEARCHES,
    SearchFn,
    make_decoded_recurrent_fn,
    make_env_recurrent_fn,
    make_env_root_fn,
    make_recurrent_fn,
    make_root_fn,
    resolve_search,
    with_win_lookahead,
)
from muzero_jax.symmetries import Symmetries, augment_batch, board_symmetries
from muzero_jax.value_transforms import DiscreteSupport, h_inverse, h_transform, make_support

__version__ = "0.1.0"

_LAZY = {"Agent": "muzero_jax.agent", "AgentOutput": "muzero_jax.agent",
         "load_agent": "muzero_jax.agent"}


def __getattr__(name: str):
    # Deployment names pull in the learner and orbax: imported on first use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'muzero_jax' has no attribute {name!r}")

__all__ = [
    "Agent",
    "AgentOutput",
    "BUILTIN_SEARCHES",
    "DiscreteSupport",
    "LossBatch",
    "LossMetrics",
    "MLPConfig",
    "NetworkOutput",
    "Networks",
    "ResNetConfig",
    "SearchFn",
    "Symmetries",
    "augment_batch",
    "board_symmetries",
    "h_inverse",
    "h_transform",
    "load_agent",
    "make_decoded_recurrent_fn",
    "make_env_recurrent_fn",
    "make_env_root_fn",
    "make_networks",
    "make_recurrent_fn",
    "make_root_fn",
    "make_support",
    "min_max_normalize",
    "resolve_search",
    "scale_gradient",
    "unrolled_loss",
    "with_win_lookahead",
]
