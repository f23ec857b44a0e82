"""MuZero's three functions as Haiku modules sharing one parameter set.

The representation h maps an observation to a hidden state, the dynamics g maps
(hidden state, action) to (next hidden state, reward), and the prediction f maps
a hidden state to (policy, value) (Schrittwieser et al., 2020, Section 3).
`make_networks` builds them with `hk.multi_transform`, so that each is a pure
function of one shared `params` pytree, and exposes the paper's
`initial_inference` and `recurrent_inference`.

Two families are provided: an MLP for vector observations and the paper's
residual network for image observations (Appendix F). Hidden states are scaled
to [0, 1] per example with min-max normalisation (Appendix G). Normalisation
layers are LayerNorm rather than the paper's BatchNorm, so that the functions
stay stateless (no batch statistics to carry through search and acting).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "COMPUTE_DTYPES",
    "MLPConfig",
    "ResNetConfig",
    "NetworkOutput",
    "Networks",
    "in_dtype",
    "make_networks",
    "min_max_normalize",
    "same_conv",
]

Params = hk.Params


def min_max_normalize(hidden: chex.Array, eps: float = 1e-5) -> chex.Array:
    """Scales each example's hidden state to [0, 1] (Appendix G).

    Args:
      hidden: `[B, ...]` hidden states.
      eps: guards against a constant hidden state.

    Returns:
      `[B, ...]` with `(h - min) / (max - min)`, min and max over all but the
      batch axis, computed in float32 (a bfloat16 `hidden` comes back as
      bfloat16).
    """
    h = hidden.astype(jnp.float32)
    axes = tuple(range(1, hidden.ndim))
    low = jnp.min(h, axis=axes, keepdims=True)
    high = jnp.max(h, axis=axes, keepdims=True)
    return ((h - low) / jnp.maximum(high - low, eps)).astype(hidden.dtype)


def _layer_norm(x: chex.Array, axis, name: str | None = None) -> chex.Array:
    """`hk.LayerNorm(axis, True, True)` computed in float32 whatever `x`'s
    dtype (mixed precision keeps normalisation statistics in full precision)."""
    return hk.LayerNorm(axis, True, True, name=name)(x.astype(jnp.float32)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """Fully connected networks for vector observations.

    Attributes:
      hidden_sizes: widths of the hidden layers of each torso.
      latent_size: size of the hidden state.
      head_hidden_sizes: widths of the hidden layers of the reward, value and
        policy heads.
      activation: name of a `jax.nn` activation (e.g. "relu", "elu").
      layer_norm: apply LayerNorm after each hidden layer.
      reward_input: what the reward head reads: "torso", the dynamics torso's
        last hidden layer (default), or "latent", the next hidden state
        before its min-max scaling (muzero-general's fully connected layout;
        with `hidden_sizes` wider than `latent_size` a smaller head).
      conv_channels: when > 0, the representation starts with one
        `conv_kernel` x `conv_kernel` convolution (SAME padding, this many
        output planes, then the activation) over image observations `[B, H, W]`
        or `[B, H, W, C]`, flattened into the torso: a cheap local-pattern
        stem for board games (e.g. lines of four in Connect Four), leaving
        dynamics and prediction fully connected. 0: flatten the observation.
      conv_kernel: the stem's kernel size.
      conv_layers: how many convolutions the stem stacks: the first is
        `conv_kernel` x `conv_kernel` over the board, each further one 3 x 3
        over the previous one's planes (SAME padding, `conv_channels` planes,
        then the activation), so later planes combine the first layer's
        local patterns (e.g. a line of three and the empty cell that
        completes it). Needs `conv_channels` > 0 when above 1.
      per_action_outputs: the dynamics' two output layers (the next hidden
        state and the reward logits) hold one set of weights per action, and
        the action taken picks its set, so the action acts multiplicatively on
        the outputs as it does in a policy head, instead of only through the
        torso's input, as a way to learn per-move facts (this column wins);
        the output layers grow `num_actions`-fold, so it suits small action
        spaces (it did not help in a Connect Four screen; see the README).
    """

    hidden_sizes: tuple[int, ...] = (64,)
    latent_size: int = 64
    head_hidden_sizes: tuple[int, ...] = (64,)
    activation: str = "relu"
    layer_norm: bool = True
    reward_input: str = "torso"
    conv_channels: int = 0
    conv_kernel: int = 4
    conv_layers: int = 1
    per_action_outputs: bool = False

    def __post_init__(self):
        _check_positive("conv_channels", self.conv_channels, allow_zero=True)
        _check_positive("conv_kernel", self.conv_kernel)
        _check_positive("conv_layers", self.conv_layers)
        if self.conv_layers > 1 and not self.conv_channels:
            raise ValueError(
                f"conv_layers {self.conv_layers} needs conv_channels > 0 (the stem's planes)"
            )
        if self.reward_input not in ("torso", "latent"):
            raise ValueError(
                f"reward_input must be 'torso' or 'latent', got {self.reward_input!r}"
            )
        _check_sizes("hidden_sizes", self.hidden_sizes)
        _check_sizes("head_hidden_sizes", self.head_hidden_sizes, allow_empty=True)
        _check_positive("latent_size", self.latent_size)
        _check_activation(self.activation)
        if not isinstance(self.per_action_outputs, bool):
            raise ValueError(
                f"per_action_outputs must be true or false, got {self.per_action_outputs!r}"
            )


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """The paper's residual network for image observations (Appendix F).

    Defaults are the paper's Atari network: 256 planes, 16 residual blocks in
    each of the representation and dynamics towers, and a convolutional
    downsampling stem that reduces 96x96 frames 16-fold. Small boards (Catch,
    board games) use `downsample=False` and fewer, narrower blocks.

    Attributes:
      channels: planes of the residual towers.
      num_blocks: residual blocks in each of the representation and dynamics.
      num_prediction_blocks: residual blocks in the prediction function.
      downsample: use the paper's strided stem (conv s2, 2 blocks, conv s2,
        3 blocks, avg-pool s2, 3 blocks, avg-pool s2).
      head_channels: planes of the 1x1 convolution before each head.
      head_hidden_sizes: hidden layers of the fully connected heads.
      action_planes: how the dynamics sees the action. "constant": one
        constant plane per action, one-hot over planes (the paper's Atari
        encoding). "board": the action drawn on the board, as the paper does
        for board games; the hidden state's `H x W` decides the reading:
        `H*W` actions are cells (a one at the cell, e.g. TicTacToe), `H*W + 1`
        are cells plus a last "pass" action (Go; a second plane is all ones
        for pass), `W` actions are columns (Connect Four; the column is all
        ones). Needs `downsample=False`.
    """

    channels: int = 256
    num_blocks: int = 16
    num_prediction_blocks: int = 0
    downsample: bool = True
    head_channels: int = 16
    head_hidden_sizes: tuple[int, ...] = (256,)
    action_planes: Literal["constant", "board"] = "constant"

    def __post_init__(self):
        _check_positive("channels", self.channels)
        _check_positive("num_blocks", self.num_blocks, allow_zero=True)
        _check_positive("num_prediction_blocks", self.num_prediction_blocks, allow_zero=True)
        _check_positive("head_channels", self.head_channels)
        _check_sizes("head_hidden_sizes", self.head_hidden_sizes, allow_empty=True)
        if self.action_planes not in ("constant", "board"):
            raise ValueError(
                f"action_planes must be 'constant' or 'board', got {self.action_planes!r}"
            )
        if self.action_planes == "board" and self.downsample:
            raise ValueError(
                "action_planes='board' draws the action on the board, so it needs "
                "downsample=False (the downsampled hidden state is not the board)"
            )


def _check_positive(name: str, value: int, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_sizes(name: str, sizes: Sequence[int], allow_empty: bool = False) -> None:
    if not allow_empty and len(sizes) == 0:
        raise ValueError(f"{name} must name at least one layer width")
    for s in sizes:
        _check_positive(name, s)


def _check_activation(name: str) -> None:
    if not callable(getattr(jax.nn, name, None)):
        raise ValueError(f"activation {name!r} is not a function in jax.nn")


class NetworkOutput(NamedTuple):
    """The output of `initial_inference` / `recurrent_inference`.

    Attributes:
      hidden: `[B, ...]` hidden state (min-max normalised).
      reward_logits: `[B, reward_bins]` (zeros for `initial_inference`).
      policy_logits: `[B, num_actions]`.
      value_logits: `[B, value_bins]`.
    """

    hidden: chex.Array
    reward_logits: chex.Array
    policy_logits: chex.Array
    value_logits: chex.Array


class Networks(NamedTuple):
    """MuZero's functions, pure in one shared `params` pytree.

    Attributes:
      init: `init(rng_key, observation[B, *obs]) -> params`.
      representation: `(params, observation[B, *obs]) -> hidden[B, ...]`.
      dynamics: `(params, hidden, action[B]) -> (next_hidden, reward_logits)`.
      prediction: `(params, hidden) -> (policy_logits, value_logits)`.
      initial_inference: `(params, observation) -> NetworkOutput`.
      recurrent_inference: `(params, hidden, action) -> NetworkOutput`.
      num_actions: size of the action space.
      value_bins: categorical bins of the value head.
      reward_bins: categorical bins of the reward head.
      projection: with `projection_size > 0`, `(params, hidden) ->
        (projection[B, P], prediction[B, P])`: EfficientZero's projection of
        a hidden state and the predictor applied to it, for the
        self-supervised consistency loss; None otherwise.
      decoder: with `observation_shape`, `(params, hidden) -> [B, *obs]`: the
        observation a hidden state is decoded to, for the reconstruction
        loss; None otherwise.
    """

    init: Callable[..., Params]
    representation: Callable[..., chex.Array]
    dynamics: Callable[..., tuple[chex.Array, chex.Array]]
    prediction: Callable[..., tuple[chex.Array, chex.Array]]
    initial_inference: Callable[..., NetworkOutput]
    recurrent_inference: Callable[..., NetworkOutput]
    num_actions: int
    value_bins: int
    reward_bins: int
    projection: Callable[..., tuple[chex.Array, chex.Array]] | None = None
    decoder: Callable[..., chex.Array] | None = None


def _mlp(sizes: Sequence[int], activation, layer_norm: bool, name: str) -> Callable:
    def apply(x):
        for i, size in enumerate(sizes):
            x = hk.Linear(size, name=f"{name}_linear_{i}")(x)
            if layer_norm:
                x = _layer_norm(x, -1, name=f"{name}_norm_{i}")
            x = activation(x)
        return x

    return apply


def _head(sizes: Sequence[int], out: int, activation, layer_norm: bool, name: str):
    """Hidden layers, then a zero-initialised output layer (uniform at start)."""

    def apply(x):
        x = _mlp(sizes, activation, layer_norm, name)(x)
        return hk.Linear(out, w_init=jnp.zeros, name=f"{name}_out")(x)

    return apply


_CONV_DIMS = ("NHWC", "HWIO", "NHWC")


def _same_pads(kernel: int) -> tuple[int, int]:
    """XLA's SAME padding for stride 1: the odd extra row/column goes after."""
    return (kernel - 1) // 2, kernel - 1 - (kernel - 1) // 2


def _conv(x: chex.Array, w: chex.Array, pads: tuple[tuple[int, int], ...]) -> chex.Array:
    return jax.lax.conv_general_dilated(x, w, (1, 1), pads, dimension_numbers=_CONV_DIMS)


def _xla_same_conv(x: chex.Array, w: chex.Array) -> chex.Array:
    return _conv(x, w, tuple(_same_pads(k) for k in w.shape[:2]))


@jax.custom_vjp
def same_conv(x: chex.Array, w: chex.Array) -> chex.Array:
    """Stride-1 SAME convolution `[B, H, W, I] x [kh, kw, I, O] -> [B, H, W, O]`.

    The forward pass is `lax.conv_general_dilated`; the backward pass is
    written in canonical forms: the input gradient is a convolution of the
    output gradient with the flipped, transposed kernel, and the kernel
    gradient one matrix product of the input's patches with the output
    gradient. Autodiff's own transposed convolutions are correct but, inside
    a `lax.scan` (the learner's loop of updates), XLA:CPU runs them 7-17x
    slower than outside one (a 32-plane 6x7 ResNet's update: 4.5 s instead of
    0.5 s); these forms run at full speed in either place.
    """
    return _xla_same_conv(x, w)


def _same_conv_fwd(x, w):
    return same_conv(x, w), (x, w)


def _same_conv_bwd(residuals, grad):
    x, w = residuals
    kh, kw = w.shape[:2]
    (top, bottom), (left, right) = _same_pads(kh), _same_pads(kw)
    # Transposed SAME convolution: flipped kernel, I and O swapped, pads mirrored.
    flipped = jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2)
    grad_x = _conv(grad, flipped, ((bottom, top), (right, left)))
    padded = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    height, width = x.shape[1:3]
    patches = jnp.stack(
        [padded[:, i:i + height, j:j + width, :] for i in range(kh) for j in range(kw)],
        axis=3,
    )  # [B, H, W, kh * kw, I]
    grad_w = jnp.einsum("bhwki,bhwo->kio", patches, grad).reshape(w.shape)
    return grad_x, grad_w


same_conv.defvjp(_same_conv_fwd, _same_conv_bwd)


class _Conv2D(hk.Module):
    """`hk.Conv2D(channels, kernel)` (stride 1, SAME, bias) with the same parameter
    names, shapes and initialisation, so checkpoints and seeds carry over. On
    CPU the convolution is `same_conv`, whose backward pass stays fast inside
    `lax.scan`; on other backends it is XLA's convolution and its autodiff.
    """

    def __init__(self, channels: int, kernel: int, name: str | None = None):
        super().__init__(name=name or "conv2_d")
        self._channels = channels
        self._kernel = kernel

    def __call__(self, x: chex.Array) -> chex.Array:
        shape = (self._kernel, self._kernel, x.shape[-1], self._channels)
        init = hk.initializers.TruncatedNormal(stddev=1.0 / np.sqrt(np.prod(shape[:-1])))
        w = hk.get_parameter("w", shape, x.dtype, init=init)
        b = hk.get_parameter("b", (self._channels,), x.dtype, init=jnp.zeros)
        conv = same_conv if jax.default_backend() == "cpu" else _xla_same_conv
        return conv(x, w) + b


class _ResBlock(hk.Module):
    def __init__(self, channels: int, name: str | None = None):
        super().__init__(name=name)
        self._channels = channels

    def __call__(self, x):
        y = _layer_norm(x, (-3, -2, -1))
        y = jax.nn.relu(y)
        y = _Conv2D(self._channels, 3)(y)
        y = _layer_norm(y, (-3, -2, -1))
        y = jax.nn.relu(y)
        y = _Conv2D(self._channels, 3)(y)
        return x + y


def _tower(x, channels: int, num_blocks: int, name: str):
    for i in range(num_blocks):
        x = _ResBlock(channels, name=f"{name}_block_{i}")(x)
    return x


def _image_input(observation: chex.Array) -> chex.Array:
    """`[B, H, W]` or `[B, H, W, C]` -> `[B, H, W, C]`."""
    if observation.ndim == 3:
        return observation[..., None]
    if observation.ndim != 4:
        raise ValueError(
            f"the ResNet expects observations [B, H, W] or [B, H, W, C], got {observation.shape}"
        )
    return observation


def _build_mlp(cfg: MLPConfig, num_actions: int, value_bins: int, reward_bins: int):
    act = getattr(jax.nn, cfg.activation)

    def representation(obs):
        if cfg.conv_channels:
            x = _image_input(obs)
            # A constant plane marks the board inside the zero padding.
            x = jnp.concatenate([x, jnp.ones(x.shape[:3] + (1,), x.dtype)], axis=-1)
            obs = act(_Conv2D(cfg.conv_channels, cfg.conv_kernel, name="representation_conv")(x))
            for i in range(1, cfg.conv_layers):
                obs = act(_Conv2D(cfg.conv_channels, 3, name=f"representation_conv_{i}")(obs))
        x = obs.reshape(obs.shape[0], -1)
        x = _mlp(cfg.hidden_sizes, act, cfg.layer_norm, "representation")(x)
        x = hk.Linear(cfg.latent_size, name="representation_out")(x)
        return min_max_normalize(x)

    # With per-action outputs an output layer computes every action's result
    # and the taken action's is kept.
    copies = num_actions if cfg.per_action_outputs else 1

    def pick(out, action):
        if copies == 1:
            return out
        out = out.reshape(out.shape[0], copies, -1)
        return jnp.take_along_axis(out, action[:, None, None], axis=1)[:, 0]

    def dynamics(hidden, action):
        encoded = jax.nn.one_hot(action, num_actions, dtype=hidden.dtype)
        x = jnp.concatenate([hidden, encoded], axis=-1)
        x = _mlp(cfg.hidden_sizes, act, cfg.layer_norm, "dynamics")(x)
        raw = pick(hk.Linear(cfg.latent_size * copies, name="dynamics_out")(x), action)
        reward_in = x if cfg.reward_input == "torso" else raw
        reward = _head(cfg.head_hidden_sizes, reward_bins * copies, act, cfg.layer_norm,
                       "reward")(reward_in)
        return min_max_normalize(raw), pick(reward, action)

    def prediction(hidden):
        policy = _head(cfg.head_hidden_sizes, num_actions, act, cfg.layer_norm, "policy")(hidden)
        value = _head(cfg.head_hidden_sizes, value_bins, act, cfg.layer_norm, "value")(hidden)
        return policy, value

    return representation, dynamics, prediction


def _action_planes(kind: str, action: chex.Array, num_actions: int, shape) -> chex.Array:
    """`[B]` actions -> `[B, H, W, P]` planes for the ResNet dynamics (see `ResNetConfig`)."""
    batch, height, width = shape
    one_hot = jax.nn.one_hot(action, num_actions)
    if kind == "constant":
        return jnp.broadcast_to(one_hot[:, None, None, :], (batch, height, width, num_actions))
    cells = height * width
    if num_actions in (cells, cells + 1):
        board = one_hot[:, :cells].reshape(batch, height, width, 1)
        if num_actions == cells:
            return board
        passed = jnp.broadcast_to(one_hot[:, None, None, cells:], (batch, height, width, 1))
        return jnp.concatenate([board, passed], axis=-1)
    if num_actions == width:
        return jnp.broadcast_to(one_hot[:, None, :, None], (batch, height, width, 1))
    raise ValueError(
        f"action_planes='board' cannot draw {num_actions} actions on a {height}x{width} "
        f"board: it reads H*W ({cells}) actions as cells, H*W+1 as cells plus pass, "
        f"and W ({width}) as columns"
    )


def _build_resnet(cfg: ResNetConfig, num_actions: int, value_bins: int, reward_bins: int):
    c = cfg.channels

    def representation(obs):
        x = _image_input(obs)
        if cfg.downsample:
            x = hk.Conv2D(c // 2, 3, stride=2, name="stem_conv_0")(x)
            x = _tower(x, c // 2, 2, "stem_a")
            x = hk.Conv2D(c, 3, stride=2, name="stem_conv_1")(x)
            x = _tower(x, c, 3, "stem_b")
            # Full (H, W, C) window and strides: an int would make Haiku guess
            # which axes are spatial, wrongly for an unbatched board under vmap.
            x = hk.avg_pool(x, (3, 3, 1), (2, 2, 1), "SAME")
            x = _tower(x, c, 3, "stem_c")
            x = hk.avg_pool(x, (3, 3, 1), (2, 2, 1), "SAME")
        else:
            x = _Conv2D(c, 3, name="stem_conv")(x)
        x = _tower(x, c, cfg.num_blocks, "representation")
        return min_max_normalize(x)

    def dynamics(hidden, action):
        planes = _action_planes(cfg.action_planes, action, num_actions, hidden.shape[:3])
        x = jnp.concatenate([hidden, planes.astype(hidden.dtype)], axis=-1)
        x = _Conv2D(c, 3, name="dynamics_conv")(x)
        x = _tower(x, c, cfg.num_blocks, "dynamics")
        nxt = min_max_normalize(x)
        r = _Conv2D(cfg.head_channels, 1, name="reward_conv")(x)
        r = jax.nn.relu(r).reshape(r.shape[0], -1)
        reward = _head(cfg.head_hidden_sizes, reward_bins, jax.nn.relu, False, "reward")(r)
        return nxt, reward

    def prediction(hidden):
        x = _tower(hidden, c, cfg.num_prediction_blocks, "prediction")
        p = jax.nn.relu(_Conv2D(cfg.head_channels, 1, name="policy_conv")(x))
        v = jax.nn.relu(_Conv2D(cfg.head_channels, 1, name="value_conv")(x))
        p = p.reshape(p.shape[0], -1)
        v = v.reshape(v.shape[0], -1)
        policy = _head(cfg.head_hidden_sizes, num_actions, jax.nn.relu, False, "policy")(p)
        value = _head(cfg.head_hidden_sizes, value_bins, jax.nn.relu, False, "value")(v)
        return policy, value

    return representation, dynamics, prediction


def _projection(size: int):
    """EfficientZero's projection and predictor heads (SimSiam), as an MLP.

    The projection maps a flattened hidden state through `size` units,
    LayerNorm and ReLU to `size` outputs; the predictor adds one more ReLU
    layer of `size` units and a linear output. Returns both.
    """

    def apply(hidden):
        x = hidden.reshape(hidden.shape[0], -1)
        x = hk.Linear(size, name="projection_linear_0")(x)
        x = jax.nn.relu(_layer_norm(x, -1, name="projection_norm_0"))
        z = hk.Linear(size, name="projection_out")(x)
        y = jax.nn.relu(hk.Linear(size, name="predictor_linear_0")(z))
        return z, hk.Linear(size, name="predictor_out")(y)

    return apply


def _decoder(observation_shape: tuple[int, ...], hidden_sizes: Sequence[int]):
    """Decodes a flattened hidden state to an observation: the network's head
    layers (LayerNorm, ReLU) and a linear output of the observation's size."""
    size = int(np.prod(observation_shape))

    def apply(hidden):
        x = hidden.reshape(hidden.shape[0], -1)
        x = _mlp(hidden_sizes, jax.nn.relu, True, "decoder")(x)
        x = hk.Linear(size, name="decoder_out")(x)
        return x.reshape((x.shape[0],) + tuple(observation_shape))

    return apply


COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
"""The dtypes the networks can compute in (`make_networks(compute_dtype=)`)."""


def in_dtype(fn: Callable[..., Any], dtype: str) -> Callable[..., Any]:
    """`fn(params, *args)` computing in `dtype`: floating parameters and
    arguments cast to it, floating outputs cast back to float32 (integer
    arguments, e.g. actions, pass unchanged). `fn` itself for float32."""
    if dtype == "float32":
        return fn
    target = jnp.dtype(dtype)

    def cast(tree, to):
        return jax.tree.map(
            lambda x: x.astype(to) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x,
            tree)

    @functools.wraps(fn)
    def wrapped(params, *args):
        return cast(fn(cast(params, target), *cast(args, target)), jnp.float32)

    return wrapped


def make_networks(
    config: MLPConfig | ResNetConfig,
    *,
    num_actions: int,
    value_bins: int,
    reward_bins: int,
    projection_size: int = 0,
    observation_shape: Sequence[int] | None = None,
    compute_dtype: str = "float32",
) -> Networks:
    """Builds MuZero's networks as pure functions of one parameter set.

    Args:
      config: `MLPConfig` (vector observations) or `ResNetConfig` (images).
      num_actions: size of the discrete action space.
      value_bins: categorical bins of the value head.
      reward_bins: categorical bins of the reward head.
      projection_size: when > 0, also builds `Networks.projection`, the
        projection and predictor heads of the consistency loss, this wide.
      observation_shape: when given, also builds `Networks.decoder`, which
        maps a hidden state to an observation of this shape (the
        reconstruction loss), through the config's `head_hidden_sizes`.
      compute_dtype: `"float32"`, or `"bfloat16"` for mixed precision: each
        function casts its floating inputs and the parameters to bfloat16,
        computes in it (the matrix units' fast path on GPUs and TPUs) and
        returns float32. Parameters, optimiser state, gradients (through
        the casts) and everything outside the networks stay float32.

    Returns:
      A `Networks` bundle; `init(rng_key, observation[B, *obs])` makes params.
    """
    _check_positive("num_actions", num_actions)
    _check_positive("value_bins", value_bins)
    _check_positive("reward_bins", reward_bins)
    _check_positive("projection_size", projection_size, allow_zero=True)
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, "
                         f"got {compute_dtype!r}")
    if observation_shape is not None:
        observation_shape = tuple(int(d) for d in observation_shape)
        if not observation_shape or any(d < 1 for d in observation_shape):
            raise ValueError(f"observation_shape must be positive sizes, got {observation_shape}")
    if isinstance(config, MLPConfig):
        build = _build_mlp
    elif isinstance(config, ResNetConfig):
        build = _build_resnet
    else:
        raise TypeError(f"config must be MLPConfig or ResNetConfig, got {type(config).__name__}")

    def forward():
        representation, dynamics, prediction = build(config, num_actions, value_bins, reward_bins)

        project = _projection(projection_size) if projection_size else None
        decode = (_decoder(observation_shape, config.head_hidden_sizes)
                  if observation_shape is not None else None)

        def init(obs):
            hidden = representation(obs)
            nxt, _ = dynamics(hidden, jnp.zeros(obs.shape[0], jnp.int32))
            if project is not None:
                project(nxt)
            out = prediction(nxt)
            if decode is not None:  # last: the other parameters' draws stay as they were
                decode(nxt)
            return out

        functions = (representation, dynamics, prediction)
        extra = tuple(f for f in (project, decode) if f is not None)
        return init, functions + extra

    transformed = hk.without_apply_rng(hk.multi_transform(forward))
    applies = [in_dtype(fn, compute_dtype) for fn in transformed.apply]
    representation_fn, dynamics_fn, prediction_fn = applies[:3]
    extra_fns = applies[3:]
    projection_fn = extra_fns.pop(0) if projection_size else None
    decoder_fn = extra_fns.pop(0) if observation_shape is not None else None

    def initial_inference(params: Params, observation: chex.Array) -> NetworkOutput:
        hidden = representation_fn(params, observation)
        policy_logits, value_logits = prediction_fn(params, hidden)
        reward_logits = jnp.zeros((hidden.shape[0], reward_bins), policy_logits.dtype)
        return NetworkOutput(hidden, reward_logits, policy_logits, value_logits)

    def recurrent_inference(params: Params, hidden: chex.Array, action: chex.Array):
        next_hidden, reward_logits = dynamics_fn(params, hidden, action)
        policy_logits, value_logits = prediction_fn(params, next_hidden)
        return NetworkOutput(next_hidden, reward_logits, policy_logits, value_logits)

    return Networks(
        init=transformed.init,
        representation=representation_fn,
        dynamics=dynamics_fn,
        prediction=prediction_fn,
        initial_inference=initial_inference,
        recurrent_inference=recurrent_inference,
        num_actions=num_actions,
        value_bins=value_bins,
        reward_bins=reward_bins,
        projection=projection_fn,
        decoder=decoder_fn,
    )
