"""Tests of the Haiku networks: shapes, shared params, min-max normalisation."""

import dataclasses

import chex
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax import MLPConfig, ResNetConfig, make_networks, min_max_normalize


def test_min_max_normalize_hand_values():
    h = jnp.array([[1.0, 3.0, 2.0], [-1.0, -1.0, -1.0]])
    out = min_max_normalize(h)
    np.testing.assert_allclose(out[0], [0.0, 1.0, 0.5])
    np.testing.assert_allclose(out[1], [0.0, 0.0, 0.0])  # constant state: no NaN


@pytest.mark.parametrize(
    "cfg,obs_shape,hidden_shape",
    [
        (MLPConfig(hidden_sizes=(32,), latent_size=16), (10, 5), (16,)),
        (ResNetConfig(channels=8, num_blocks=1, downsample=False), (10, 5), (10, 5, 8)),
        (ResNetConfig(channels=8, num_blocks=1, downsample=True), (96, 96, 3), (6, 6, 8)),
    ],
)
def test_shapes_and_normalisation(cfg, obs_shape, hidden_shape):
    nets = make_networks(cfg, num_actions=4, value_bins=11, reward_bins=7)
    obs = jax.random.normal(jax.random.key(0), (2,) + obs_shape)
    params = nets.init(jax.random.key(1), obs)
    out = jax.jit(nets.initial_inference)(params, obs)
    chex.assert_shape(out.hidden, (2,) + hidden_shape)
    chex.assert_shape(out.policy_logits, (2, 4))
    chex.assert_shape(out.value_logits, (2, 11))
    chex.assert_shape(out.reward_logits, (2, 7))
    np.testing.assert_array_equal(out.reward_logits, 0.0)
    nxt = jax.jit(nets.recurrent_inference)(params, out.hidden, jnp.array([0, 3]))
    chex.assert_shape(nxt.hidden, (2,) + hidden_shape)
    chex.assert_shape(nxt.reward_logits, (2, 7))
    for h in (out.hidden, nxt.hidden):
        flat = h.reshape(2, -1)
        np.testing.assert_allclose(flat.min(-1), 0.0, atol=1e-6)
        np.testing.assert_allclose(flat.max(-1), 1.0, atol=1e-5)


def test_one_parameter_set_and_action_matters():
    nets = make_networks(MLPConfig(), num_actions=3, value_bins=5, reward_bins=5)
    obs = jnp.ones((1, 4))
    params = nets.init(jax.random.key(0), obs)
    names = set(params)
    assert any(n.startswith("representation") for n in names)
    assert any(n.startswith("dynamics") for n in names)
    assert any(n.startswith("value") for n in names)
    h = nets.representation(params, obs)
    a0, _ = nets.dynamics(params, h, jnp.array([0]))
    a1, _ = nets.dynamics(params, h, jnp.array([1]))
    assert float(jnp.abs(a0 - a1).max()) > 0


def test_heads_start_uniform():
    nets = make_networks(MLPConfig(), num_actions=3, value_bins=5, reward_bins=5)
    params = nets.init(jax.random.key(0), jnp.ones((1, 4)))
    out = nets.initial_inference(params, jnp.ones((1, 4)))
    np.testing.assert_array_equal(out.policy_logits, 0.0)
    np.testing.assert_array_equal(out.value_logits, 0.0)


def test_bad_configs():
    with pytest.raises(ValueError, match="latent_size"):
        MLPConfig(latent_size=0)
    with pytest.raises(ValueError, match="activation"):
        MLPConfig(activation="nope")
    with pytest.raises(ValueError, match="channels"):
        ResNetConfig(channels=0)
    with pytest.raises(ValueError, match="num_actions"):
        make_networks(MLPConfig(), num_actions=0, value_bins=5, reward_bins=5)
    with pytest.raises(TypeError, match="MLPConfig or ResNetConfig"):
        make_networks({"kind": "mlp"}, num_actions=2, value_bins=5, reward_bins=5)


def test_reward_head_reading_the_latent():
    # muzero-general's fully connected net (observation 16 -> 128 -> latent 64,
    # heads through 128, 21 bins, A=2): the reward head reads the next latent,
    # 57,900 parameters by hand:
    #   representation 16*128+128 + 128*64+64 = 10,432
    #   dynamics (64+2)*128+128 + 128*64+64 = 16,768
    #   reward 64*128+128 + 128*21+21 = 11,085
    #   value 11,085; policy 64*128+128 + 128*2+2 = 8,578
    cfg = MLPConfig(hidden_sizes=(128,), latent_size=64, head_hidden_sizes=(128,),
                    activation="elu", layer_norm=False, reward_input="latent")
    nets = make_networks(cfg, num_actions=2, value_bins=21, reward_bins=21)
    obs = jax.random.normal(jax.random.key(0), (3, 16))
    params = nets.init(jax.random.key(1), obs)
    assert sum(x.size for x in jax.tree.leaves(params)) == 57_900
    assert params["reward_linear_0"]["w"].shape == (64, 128)
    torso = make_networks(
        MLPConfig(hidden_sizes=(128,), latent_size=64, head_hidden_sizes=(128,),
                  activation="elu", layer_norm=False),
        num_actions=2, value_bins=21, reward_bins=21)
    torso_params = torso.init(jax.random.key(1), obs)
    assert sum(x.size for x in jax.tree.leaves(torso_params)) == 57_900 + 8_192
    # The reward is the head applied to the unscaled dynamics output (random
    # parameters: the output layers start at zero).
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    params = jax.tree.unflatten(
        tree, [jax.random.normal(k, x.shape) * 0.3 for k, x in zip(keys, leaves)])
    hidden = nets.initial_inference(params, obs).hidden
    action = jnp.array([0, 1, 1])
    x = jnp.concatenate([hidden, jax.nn.one_hot(action, 2)], axis=-1)
    x = jax.nn.elu(x @ params["dynamics_linear_0"]["w"] + params["dynamics_linear_0"]["b"])
    raw = x @ params["dynamics_out"]["w"] + params["dynamics_out"]["b"]
    r = jax.nn.elu(raw @ params["reward_linear_0"]["w"] + params["reward_linear_0"]["b"])
    r = r @ params["reward_out"]["w"] + params["reward_out"]["b"]
    out = nets.recurrent_inference(params, hidden, action)
    np.testing.assert_allclose(out.reward_logits, r, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.hidden, min_max_normalize(raw), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="reward_input"):
        MLPConfig(reward_input="hidden")


def test_mlp_conv_stem_by_hand():
    # conv_channels 3, kernel 2 over a [3, 4, 2] board plus a constant plane:
    #   conv 2*2*3*3 + 3 = 39; torso (3*4*3)*8 + 8 = 296; latent 8*4 + 4 = 36.
    cfg = MLPConfig(hidden_sizes=(8,), latent_size=4, head_hidden_sizes=(),
                    layer_norm=False, conv_channels=3, conv_kernel=2)
    nets = make_networks(cfg, num_actions=2, value_bins=3, reward_bins=3)
    obs = jax.random.bernoulli(jax.random.key(0), 0.4, (2, 3, 4, 2)).astype(jnp.float32)
    params = nets.init(jax.random.key(1), obs)
    assert params["representation_conv"]["w"].shape == (2, 2, 3, 3)
    assert params["representation_linear_0"]["w"].shape == (36, 8)
    flat = make_networks(MLPConfig(hidden_sizes=(8,), latent_size=4, head_hidden_sizes=(),
                                   layer_norm=False), num_actions=2, value_bins=3, reward_bins=3)
    extra = (sum(x.size for x in jax.tree.leaves(params))
             - sum(x.size for x in jax.tree.leaves(flat.init(jax.random.key(1), obs))))
    assert extra == 39 + (36 - 24) * 8  # the conv, and a wider first layer
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    params = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    x = jnp.concatenate([obs, jnp.ones((2, 3, 4, 1))], axis=-1)
    conv = params["representation_conv"]
    y = jax.lax.conv_general_dilated(x, conv["w"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y + conv["b"]).reshape(2, -1)
    lin0, out = params["representation_linear_0"], params["representation_out"]
    y = jax.nn.relu(y @ lin0["w"] + lin0["b"]) @ out["w"] + out["b"]
    np.testing.assert_allclose(nets.representation(params, obs), min_max_normalize(y),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="conv_channels"):
        MLPConfig(conv_channels=-1)
    with pytest.raises(ValueError, match="conv_kernel"):
        MLPConfig(conv_kernel=0)


def test_mlp_two_layer_conv_stem_by_hand():
    # conv_layers 2: a 2 x 2 convolution (2 planes) over a [3, 4, 1] board and
    # its constant plane, then a 3 x 3 one over those 2 planes, each with ReLU;
    #   conv 2*2*2*2 + 2 = 18; conv_1 3*3*2*2 + 2 = 38.
    cfg = MLPConfig(hidden_sizes=(5,), latent_size=3, head_hidden_sizes=(),
                    layer_norm=False, conv_channels=2, conv_kernel=2, conv_layers=2)
    nets = make_networks(cfg, num_actions=2, value_bins=3, reward_bins=3)
    obs = jax.random.bernoulli(jax.random.key(3), 0.5, (2, 3, 4)).astype(jnp.float32)
    params = nets.init(jax.random.key(4), obs)
    assert params["representation_conv"]["w"].shape == (2, 2, 2, 2)
    assert params["representation_conv_1"]["w"].shape == (3, 3, 2, 2)
    assert "representation_conv_2" not in params
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(5), len(leaves))
    params = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    board = np.stack([np.asarray(obs), np.ones((2, 3, 4))], axis=-1)

    def conv_by_hand(x, w, b):
        # SAME for stride 1: kernel k pads (k - 1) // 2 before, k // 2 after.
        k = w.shape[0]
        lo, hi = (k - 1) // 2, k // 2
        x = np.pad(x, ((0, 0), (lo, hi), (lo, hi), (0, 0)))
        out = np.zeros((2, 3, 4, w.shape[-1]))
        for i in range(3):
            for j in range(4):
                out[:, i, j] = np.einsum("bhwc,hwco->bo", x[:, i:i + k, j:j + k], w)
        return np.maximum(out + b, 0.0)

    p = {k: {n: np.asarray(v, np.float64) for n, v in d.items()} for k, d in params.items()}
    y = conv_by_hand(board, p["representation_conv"]["w"], p["representation_conv"]["b"])
    y = conv_by_hand(y, p["representation_conv_1"]["w"], p["representation_conv_1"]["b"])
    lin0, out = p["representation_linear_0"], p["representation_out"]
    y = np.maximum(y.reshape(2, -1) @ lin0["w"] + lin0["b"], 0.0) @ out["w"] + out["b"]
    np.testing.assert_allclose(nets.representation(params, obs),
                               min_max_normalize(jnp.asarray(y, jnp.float32)),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="conv_layers"):
        MLPConfig(conv_channels=2, conv_layers=0)
    with pytest.raises(ValueError, match="conv_channels > 0"):
        MLPConfig(conv_layers=2)


def test_per_action_outputs_by_hand():
    # A=3, latent 4, torso (6,), no head hidden layers, reward bins 2: the
    # output layers have 3 column blocks, one per action.
    #   dynamics_out 6*(4*3) + 12 = 84 instead of 6*4 + 4 = 28;
    #   reward_out   6*(2*3) + 6 = 42 instead of 6*2 + 2 = 14.
    cfg = MLPConfig(hidden_sizes=(6,), latent_size=4, head_hidden_sizes=(),
                    layer_norm=False, per_action_outputs=True)
    nets = make_networks(cfg, num_actions=3, value_bins=3, reward_bins=2)
    obs = jax.random.normal(jax.random.key(0), (4, 5))
    params = nets.init(jax.random.key(1), obs)
    assert params["dynamics_out"]["w"].shape == (6, 12)
    assert params["reward_out"]["w"].shape == (6, 6)
    shared = make_networks(MLPConfig(hidden_sizes=(6,), latent_size=4, head_hidden_sizes=(),
                                     layer_norm=False),
                           num_actions=3, value_bins=3, reward_bins=2)
    extra = (sum(x.size for x in jax.tree.leaves(params))
             - sum(x.size for x in jax.tree.leaves(shared.init(jax.random.key(1), obs))))
    assert extra == (84 - 28) + (42 - 14)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    params = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    hidden = nets.representation(params, obs)
    action = np.array([2, 0, 1, 2])
    lin0 = params["dynamics_linear_0"]
    x = np.asarray(jax.nn.relu(
        jnp.concatenate([hidden, jax.nn.one_hot(action, 3)], -1) @ lin0["w"] + lin0["b"]))
    w_out, b_out = np.asarray(params["dynamics_out"]["w"]), np.asarray(params["dynamics_out"]["b"])
    w_rew, b_rew = np.asarray(params["reward_out"]["w"]), np.asarray(params["reward_out"]["b"])
    # Row i uses columns [a*4, a*4+4) of the next-state layer and [a*2, a*2+2)
    # of the reward layer for its action a.
    raw = np.stack([x[i] @ w_out[:, a * 4:a * 4 + 4] + b_out[a * 4:a * 4 + 4]
                    for i, a in enumerate(action)])
    reward = np.stack([x[i] @ w_rew[:, a * 2:a * 2 + 2] + b_rew[a * 2:a * 2 + 2]
                       for i, a in enumerate(action)])
    nxt, reward_logits = nets.dynamics(params, hidden, jnp.asarray(action))
    np.testing.assert_allclose(reward_logits, reward, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nxt, min_max_normalize(jnp.asarray(raw)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="per_action_outputs"):
        MLPConfig(per_action_outputs=1)


@pytest.mark.parametrize(
    "board,num_actions,action,expected",
    [
        # Connect Four: 7 columns on 6x7; the column played is all ones.
        ((6, 7), 7, 3, {(0, r, 3): 1.0 for r in range(6)}),
        # TicTacToe: 9 cells on 3x3; a one at the cell (row-major).
        ((3, 3), 9, 5, {(0, 1, 2): 1.0}),
        # Go 9x9: 81 cells + pass; a point, then pass as a second all-ones plane.
        ((9, 9), 82, 10, {(0, 1, 1): 1.0}),
        ((9, 9), 82, 81, {(1, r, c): 1.0 for r in range(9) for c in range(9)}),
    ],
)
def test_board_action_planes_by_hand(board, num_actions, action, expected):
    """The dynamics sees the action drawn on the board (the paper's board-game encoding).

    With no residual blocks and a 3x3 kernel that copies each action plane to
    one output plane (centre tap 1, everything else 0), the min-max normalised
    next hidden state is exactly the action planes, which are written out here.
    """
    channels = 4
    cfg = ResNetConfig(channels=channels, num_blocks=0, downsample=False, action_planes="board")
    nets = make_networks(cfg, num_actions=num_actions, value_bins=5, reward_bins=3)
    obs = jax.random.normal(jax.random.key(0), (1,) + board + (2,))
    params = nets.init(jax.random.key(1), obs)
    w = np.zeros(params["dynamics_conv"]["w"].shape, np.float32)
    num_planes = w.shape[2] - channels
    assert num_planes == (2 if num_actions == board[0] * board[1] + 1 else 1)
    for p in range(num_planes):
        w[1, 1, channels + p, p] = 1.0
    params = {**params, "dynamics_conv": {"w": jnp.asarray(w),
                                          "b": jnp.zeros_like(params["dynamics_conv"]["b"])}}
    hidden = nets.representation(params, obs)
    nxt, _ = nets.dynamics(params, hidden, jnp.array([action]))
    want = np.zeros(board + (channels,), np.float32)
    for (p, r, c), v in expected.items():
        want[r, c, p] = v
    np.testing.assert_allclose(nxt[0], want, atol=1e-6)
    # The default encoding differs: one constant plane per action.
    const = make_networks(dataclasses.replace(cfg, action_planes="constant"),
                          num_actions=num_actions, value_bins=5, reward_bins=3)
    const_w = const.init(jax.random.key(1), obs)["dynamics_conv"]["w"]
    assert const_w.shape[2] == channels + num_actions


def test_board_action_planes_refusals():
    with pytest.raises(ValueError, match="downsample=False"):
        ResNetConfig(downsample=True, action_planes="board")
    with pytest.raises(ValueError, match="'constant' or 'board'"):
        ResNetConfig(downsample=False, action_planes="cells")
    cfg = ResNetConfig(channels=4, num_blocks=0, downsample=False, action_planes="board")
    nets = make_networks(cfg, num_actions=5, value_bins=5, reward_bins=3)
    with pytest.raises(ValueError, match="cannot draw 5 actions on a 3x3 board"):
        nets.init(jax.random.key(0), jnp.zeros((1, 3, 3, 2)))


@pytest.mark.parametrize("kernel", [1, 3, 4])
def test_same_conv_matches_xla_convolution_and_its_gradient(kernel):
    from muzero_jax.networks import same_conv

    kx, kw, kt = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (3, 6, 7, 5))
    w = jax.random.normal(kw, (kernel, kernel, 5, 4))
    probe = jax.random.normal(kt, (3, 6, 7, 4))

    def xla(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    np.testing.assert_allclose(same_conv(x, w), xla(x, w), rtol=1e-5, atol=1e-5)
    # The hand-written backward pass against autodiff of XLA's convolution
    # (an even kernel pads one more row/column after than before).
    want = jax.grad(lambda x, w: jnp.sum(xla(x, w) * probe), (0, 1))(x, w)
    got = jax.grad(lambda x, w: jnp.sum(same_conv(x, w) * probe), (0, 1))(x, w)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def test_conv_module_has_haiku_conv2d_parameters_and_outputs():
    from muzero_jax.networks import _Conv2D

    x = jax.random.normal(jax.random.key(1), (2, 6, 7, 3))
    ours = hk.transform(lambda x: _Conv2D(8, 3)(_Conv2D(8, 3)(x)))
    theirs = hk.transform(lambda x: hk.Conv2D(8, 3)(hk.Conv2D(8, 3)(x)))
    p_ours = ours.init(jax.random.key(0), x)
    p_theirs = theirs.init(jax.random.key(0), x)
    # Same names, shapes and initial values: old checkpoints and seeds carry over.
    chex.assert_trees_all_equal(p_ours, p_theirs)
    np.testing.assert_allclose(ours.apply(p_ours, None, x), theirs.apply(p_theirs, None, x),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("network", ["mlp", "resnet"])
def test_bfloat16_networks_compute_in_bfloat16_and_keep_float32_parameters(network):
    if network == "mlp":
        cfg, obs = MLPConfig(hidden_sizes=(32,), latent_size=16, head_hidden_sizes=(16,)), (5,)
    else:
        cfg = ResNetConfig(channels=8, num_blocks=1, downsample=False, head_hidden_sizes=(16,))
        obs = (6, 7, 2)
    kw = dict(num_actions=3, value_bins=5, reward_bins=5)
    full = make_networks(cfg, **kw)
    half = make_networks(cfg, compute_dtype="bfloat16", **kw)
    x = jax.random.normal(jax.random.key(0), (4,) + obs)
    # (Jitted where values need not match eager bit for bit: it is several
    # times faster than running the networks op by op.)
    params = jax.jit(full.init)(jax.random.key(1), x)
    half_params = jax.jit(half.init)(jax.random.key(1), x)
    # The same parameters: the dtype is a way of computing, not a different net.
    chex.assert_trees_all_equal_structs(params, half_params)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(half_params))
    # Non-zero heads, so that the comparison below is not of zeros.
    params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(2), p.shape),
                          params)
    action = jnp.array([0, 1, 2, 1])

    def outputs(nets, p):
        first = nets.initial_inference(p, x)
        return first, nets.recurrent_inference(p, first.hidden, action)

    want, got = outputs(full, params), outputs(half, params)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        assert g.dtype == jnp.float32  # cast back for the losses and the search
        np.testing.assert_allclose(g, w, rtol=0.05, atol=0.05)
    # ...computed in bfloat16: not bit-equal to float32, and equal to the same
    # function run on bfloat16-rounded parameters and inputs.
    assert any(not np.array_equal(w, g) for w, g in
               zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True))
    rounded = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    direct = full.representation(rounded, x.astype(jnp.bfloat16))
    assert direct.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got[0].hidden, direct.astype(jnp.float32))
    # Nothing inside promotes back to float32 (e.g. the action's encoding).
    nxt, reward = full.dynamics(rounded, direct, action)
    policy, value = full.prediction(rounded, nxt)
    assert {a.dtype for a in (nxt, reward, policy, value)} == {jnp.dtype(jnp.bfloat16)}

    # Gradients reach the float32 parameters in float32, close to float32's.
    def loss(p, nets):
        first, nxt = outputs(nets, p)
        return (jnp.sum(first.value_logits ** 2) + jnp.sum(nxt.reward_logits * nxt.value_logits)
                + jnp.sum(jnp.sin(nxt.policy_logits)))

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    g_full, g_half = grad(params, full), grad(params, half)
    flat_full = jnp.concatenate([g.ravel() for g in jax.tree.leaves(g_full)])
    flat_half = jnp.concatenate([g.ravel() for g in jax.tree.leaves(g_half)])
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(g_half))
    cosine = flat_full @ flat_half / jnp.linalg.norm(flat_full) / jnp.linalg.norm(flat_half)
    assert cosine > 0.99, cosine


def test_compute_dtype_refusals():
    from muzero_jax.config import Config
    with pytest.raises(ValueError, match="compute_dtype must be one of float32, bfloat16"):
        make_networks(MLPConfig(), num_actions=2, value_bins=3, reward_bins=3,
                      compute_dtype="float16")
    with pytest.raises(ValueError, match="compute_dtype must be 'float32' or 'bfloat16'"):
        Config(compute_dtype="half")
