"""Board symmetries: against numpy's rotations, against the games' own rules
(a moved game is the moved game), and the batch augmentation built on them."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax.envs import make_env
from muzero_jax.loss import LossBatch
from muzero_jax.symmetries import (
    Symmetries,
    augment_batch,
    board_symmetries,
    check_symmetries,
    check_symmetry_ensemble,
    ensemble_networks,
    inverse_actions,
)


def _move(obs, symmetries, s):
    return np.asarray(obs).reshape(-1)[list(symmetries.observation_index[s])].reshape(
        np.shape(obs))


def test_square_symmetries_are_numpys_rotations_and_flips():
    sym = board_symmetries(3, 3, 2, dihedral=True, actions="cells")
    obs = np.random.default_rng(0).normal(size=(3, 3, 2))
    expected = [np.rot90(obs, k) for k in range(4)] + [np.rot90(obs[:, ::-1], k)
                                                         for k in range(4)]
    assert len(sym.observation_index) == 8
    for s in range(8):
        np.testing.assert_array_equal(_move(obs, sym, s), expected[s])
    np.testing.assert_array_equal(sym.action_index[0], np.arange(9))  # identity first


@pytest.mark.parametrize("shape,kwargs,num_actions", [
    ((3, 3, 2), dict(dihedral=True, actions="cells"), 9),
    ((9, 9, 17), dict(dihedral=True, actions="cells", pass_action=True), 82),
    ((6, 7, 2), dict(dihedral=False, actions="columns"), 7),
])
def test_an_action_moves_where_its_stone_moves(shape, kwargs, num_actions):
    """A stone put by action `a` (bottom row for columns) lands, after the
    symmetry, where the moved action puts it; policies move by the same map."""
    h, w, c = shape
    sym = board_symmetries(h, w, c, **kwargs)
    to_image = inverse_actions(sym)
    for s in range(len(sym.action_index)):
        assert sorted(sym.action_index[s]) == list(range(num_actions))
        for a in range(h * w if kwargs["actions"] == "cells" else w):
            def stone(action):
                board = np.zeros(shape)
                cell = divmod(action, w) if kwargs["actions"] == "cells" else (h - 1, action)
                board[cell + (c - 1,)] = 1.0
                return board
            np.testing.assert_array_equal(_move(stone(a), sym, s), stone(to_image[s, a]))
            policy = np.eye(num_actions)[a]
            moved = policy[list(sym.action_index[s])]
            assert moved[to_image[s, a]] == 1.0
        if kwargs.get("pass_action"):
            assert to_image[s, num_actions - 1] == num_actions - 1


def test_refusals():
    with pytest.raises(ValueError, match="square"):
        board_symmetries(6, 7, 2, dihedral=True, actions="cells")
    with pytest.raises(ValueError, match="cells"):
        board_symmetries(3, 3, 2, dihedral=True, actions="rows")
    with pytest.raises(ValueError, match="mirror"):
        board_symmetries(6, 7, 2, dihedral=False, actions="columns", pass_action=True)


@pytest.mark.parametrize("game,plies", [("tic_tac_toe", 9), ("connect_four", 42),
                                        ("go_9x9", 40)])
def test_a_moved_game_is_the_game_of_the_moved_moves(game, plies):
    """Playing the moved actions from the same start gives the moved
    observations and masks and the same rewards, at every ply, for each symmetry:
    the pgx rules themselves confirm the symmetries."""
    env = make_env(game)
    sym = env.symmetries
    to_image = jnp.asarray(inverse_actions(sym))
    num = len(sym.action_index)

    @jax.jit
    def games(key):
        key, reset_key = jax.random.split(key)
        state, ts = env.reset(reset_key)
        states = jax.tree.map(lambda x: jnp.stack([x] * num), state)
        tss = jax.tree.map(lambda x: jnp.stack([x] * num), ts)

        def body(carry, k):
            states, tss = carry
            mask = tss.legal_action_mask[0]  # the identity's game picks the move
            a = jax.random.choice(k, env.num_actions, p=mask / mask.sum())
            states, tss = jax.vmap(env.step)(states, to_image[:, a])
            return (states, tss), tss

        _, out = jax.lax.scan(body, (states, tss), jax.random.split(key, plies))
        return out

    out = jax.device_get(games(jax.random.key(3)))
    for s in range(num):
        for t in range(plies):
            np.testing.assert_array_equal(out.observation[t, s],
                                          _move(out.observation[t, 0], sym, s))
            np.testing.assert_array_equal(out.legal_action_mask[t, s],
                                          out.legal_action_mask[t, 0][list(sym.action_index[s])])
        np.testing.assert_array_equal(out.reward[:, s], out.reward[:, 0])
        np.testing.assert_array_equal(out.last[:, s], out.last[:, 0])
    if game != "go_9x9":  # the games got to an end (and the auto-reset), not only openings
        assert out.last.any() and np.abs(out.reward).sum() > 0


def test_augment_batch_moves_each_example_as_one():
    """Connect Four: each example is either unchanged or mirrored whole
    (observations, next observations, actions 6 - a, policies reversed)."""
    env = make_env("connect_four")
    rng = np.random.default_rng(1)
    b, k = 64, 3
    policy = rng.dirichlet(np.ones(7), size=(b, k + 1)).astype(np.float32)
    batch = LossBatch(
        observation=jnp.asarray(rng.normal(size=(b, 6, 7, 2)), jnp.float32),
        actions=jnp.asarray(rng.integers(0, 7, size=(b, k)), jnp.int32),
        target_value=jnp.asarray(rng.normal(size=(b, k + 1)), jnp.float32),
        target_reward=jnp.asarray(rng.normal(size=(b, k + 1)), jnp.float32),
        target_policy=jnp.asarray(policy),
        value_mask=jnp.ones((b, k + 1)), reward_mask=jnp.ones((b, k + 1)),
        policy_mask=jnp.ones((b, k + 1)), importance_weight=jnp.ones((b,)),
        next_observation=jnp.asarray(rng.normal(size=(b, k, 6, 7, 2)), jnp.float32),
    )
    out = jax.device_get(jax.jit(augment_batch, static_argnums=1)(
        batch, env.symmetries, jax.random.key(0)))
    mirrored = 0
    for i in range(b):
        flip = not np.array_equal(out.observation[i], batch.observation[i])
        mirrored += flip
        if flip:
            np.testing.assert_array_equal(out.observation[i], batch.observation[i][:, ::-1])
            np.testing.assert_array_equal(out.next_observation[i],
                                          batch.next_observation[i][:, :, ::-1])
            np.testing.assert_array_equal(out.actions[i], 6 - batch.actions[i])
            np.testing.assert_array_equal(out.target_policy[i], batch.target_policy[i][:, ::-1])
        else:
            np.testing.assert_array_equal(out.next_observation[i], batch.next_observation[i])
            np.testing.assert_array_equal(out.actions[i], batch.actions[i])
            np.testing.assert_array_equal(out.target_policy[i], batch.target_policy[i])
    assert 16 < mirrored < 48  # about half of 64 (fixed key: 0 or 64 would mean no draw)
    for name in ("target_value", "target_reward", "value_mask", "importance_weight"):
        np.testing.assert_array_equal(getattr(out, name), getattr(batch, name))


def _tiny_tic_tac_toe(**overrides):
    from muzero_jax.networks import MLPConfig
    from muzero_jax.presets import preset

    return dataclasses.replace(
        preset("tic_tac_toe"), num_envs=8, rollout_length=4, batch_size=8, replay_ratio=0.25,
        num_simulations=4, num_unroll_steps=2, td_steps=9, replay_capacity=32,
        min_replay_steps=12, mlp=MLPConfig(hidden_sizes=(16,), latent_size=8,
                                          head_hidden_sizes=(8,)), **overrides)


def test_augmented_training_runs_and_changes_the_update():
    from muzero_jax.learning import make_train

    def params_after(augment):
        trainer = make_train(_tiny_tic_tac_toe(augment_symmetries=augment))
        state = trainer.init(jax.random.key(0))
        for _ in range(3):
            state, metrics = trainer.iteration(state)
        assert bool(metrics.finite) and bool(metrics.learned)
        return state.params

    plain, augmented = params_after(False), params_after(True)
    diff = jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))),
                                        plain, augmented))
    assert max(diff) > 0  # same seed, same self-play start: only the augmentation differs


def test_augmentation_needs_symmetries_and_a_bool():
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset

    with pytest.raises(ValueError, match="no symmetries"):
        make_train(preset("catch", augment_symmetries=True))
    with pytest.raises(ValueError, match="augment_symmetries"):
        preset("tic_tac_toe", augment_symmetries="yes")


def test_augmented_actions_and_policies_follow_the_moved_board():
    """TicTacToe: an example whose board holds one stone at the cell of its
    action and of its policy's mass keeps all three on one cell after any of
    the eight symmetries (rotations are not their own inverses, so a swapped
    map would show here)."""
    env = make_env("tic_tac_toe")
    b = 64
    cells = np.random.default_rng(2).integers(0, 9, size=b)
    obs = np.zeros((b, 9, 2), np.float32)
    obs[np.arange(b), cells, 0] = 1.0
    policy = np.repeat(np.eye(9, dtype=np.float32)[cells][:, None], 3, axis=1)
    batch = LossBatch(
        observation=jnp.asarray(obs.reshape(b, 3, 3, 2)),
        actions=jnp.asarray(np.stack([cells, cells], 1), jnp.int32),
        target_value=jnp.zeros((b, 3)), target_reward=jnp.zeros((b, 3)),
        target_policy=jnp.asarray(policy), value_mask=jnp.ones((b, 3)),
        reward_mask=jnp.ones((b, 3)), policy_mask=jnp.ones((b, 3)),
        importance_weight=jnp.ones((b,)),
    )
    out = jax.device_get(augment_batch(batch, env.symmetries, jax.random.key(5)))
    stone = out.observation[..., 0].reshape(b, 9).argmax(axis=1)
    np.testing.assert_array_equal(out.actions, np.stack([stone, stone], 1))
    np.testing.assert_array_equal(out.target_policy.argmax(axis=2), np.stack([stone] * 3, 1))
    moved = [i for i in range(b) if stone[i] != cells[i]]
    assert len(moved) > b // 2  # most draws move a stone (only the centre never moves)


def test_symmetries_that_do_not_fit_the_environment_are_refused_before_compiling():
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset

    good = board_symmetries(3, 3, 2, dihedral=True, actions="cells")
    check_symmetries(make_env("go_9x9").symmetries, (9, 9, 17), 82)  # the games' own fit
    check_symmetries(make_env("connect_four").symmetries, (6, 7, 2), 7)
    cases = [
        (Symmetries(good.observation_index, good.action_index[:4]), "as many"),
        (Symmetries(good.observation_index, tuple(a[:8] for a in good.action_index)),
         "action_index"),
        (Symmetries(tuple((0,) * 18 for _ in range(8)), good.action_index),
         "observation_index"),
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            check_symmetries(bad, (3, 3, 2), 9)
    env = dataclasses.replace(make_env("tic_tac_toe"), symmetries=cases[1][0])
    with pytest.raises(ValueError, match="permutation of range.9."):
        make_train(preset("tic_tac_toe", augment_symmetries=True), env=env)


def _random_networks(game, seed=0):
    """Untrained networks with a decoder for `game`'s shapes, and random params
    (every weight drawn, the zero-initialised heads too: far from symmetric,
    so the ensemble's averaging shows)."""
    from muzero_jax.networks import MLPConfig, make_networks

    env = make_env(game)
    networks = make_networks(
        MLPConfig(hidden_sizes=(32,), latent_size=16, head_hidden_sizes=(16,)),
        num_actions=env.num_actions, value_bins=5, reward_bins=3,
        observation_shape=env.observation_shape)
    obs = jax.random.bernoulli(jax.random.key(seed), 0.3, (6,) + env.observation_shape)
    obs = obs.astype(jnp.float32)
    params = _perturbed(networks.init(jax.random.key(seed + 1), obs), seed + 2)
    return env, networks, params, obs


def _perturbed(params, seed):
    """`params` plus 0.5 x a standard normal draw per weight."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [x + 0.5 * jax.random.normal(k, x.shape)
                                     for x, k in zip(leaves, keys)])


def _probs(logits):
    return np.asarray(jax.nn.softmax(logits, axis=-1))


@pytest.mark.parametrize("game", ["connect_four", "tic_tac_toe"])
def test_the_symmetry_ensemble_is_the_mean_over_the_moved_boards(game):
    """Root and one step of the model, against the average computed by hand:
    each symmetry's board (and action) through the plain networks, its policy
    and decoding read back in the original frame, the distributions averaged."""
    env, networks, params, obs = _random_networks(game)
    sym = env.symmetries
    ens = ensemble_networks(networks, sym)
    act_map = inverse_actions(sym)
    b, num = obs.shape[0], len(sym.observation_index)
    action = jnp.asarray(np.arange(b) % env.num_actions, jnp.int32)

    root = ens.initial_inference(params, obs)
    step = ens.recurrent_inference(params, root.hidden, action)
    decoded = np.asarray(ens.decoder(params, step.hidden))
    want = {"root_policy": 0, "root_value": 0, "policy": 0, "value": 0, "reward": 0,
            "decoded": 0}
    for s in range(num):
        moved = jnp.stack([jnp.asarray(_move(o, sym, s)) for o in np.asarray(obs)])
        out = networks.initial_inference(params, moved)
        nxt = networks.recurrent_inference(params, out.hidden, jnp.asarray(act_map[s])[action])
        back = [list(sym.action_index[s]).index(a) for a in range(env.num_actions)]
        assert back == list(act_map[s])  # entry a of the original is the moved's entry at s(a)
        want["root_policy"] += _probs(out.policy_logits)[:, act_map[s]] / num
        want["root_value"] += _probs(out.value_logits) / num
        want["policy"] += _probs(nxt.policy_logits)[:, act_map[s]] / num
        want["value"] += _probs(nxt.value_logits) / num
        want["reward"] += _probs(nxt.reward_logits) / num
        dec = np.asarray(networks.decoder(params, nxt.hidden)).reshape(b, -1)
        unmoved = np.empty_like(dec)
        unmoved[:, list(sym.observation_index[s])] = dec  # moved cell i is original cell idx[i]
        want["decoded"] += unmoved.reshape(decoded.shape) / num
    np.testing.assert_allclose(_probs(root.policy_logits), want["root_policy"], atol=1e-5)
    np.testing.assert_allclose(_probs(root.value_logits), want["root_value"], atol=1e-5)
    np.testing.assert_allclose(_probs(step.policy_logits), want["policy"], atol=1e-5)
    np.testing.assert_allclose(_probs(step.value_logits), want["value"], atol=1e-5)
    np.testing.assert_allclose(_probs(step.reward_logits), want["reward"], atol=1e-5)
    np.testing.assert_allclose(decoded, want["decoded"], atol=1e-5)
    # The mixture's logits are log-probabilities: exp sums to one.
    np.testing.assert_allclose(np.exp(np.asarray(step.policy_logits)).sum(-1), 1.0, atol=1e-5)
    # Unlike the plain networks, the ensemble differs from them (weights are random).
    plain = networks.initial_inference(params, obs)
    assert np.abs(_probs(plain.policy_logits) - _probs(root.policy_logits)).max() > 1e-3


def test_the_symmetry_ensemble_is_equivariant():
    """Connect Four: the ensemble of a mirrored board and mirrored action is
    the mirror of the ensemble's output (policy, decoding), with the same value
    and reward, as the game is; the plain random networks are not."""
    env, networks, params, obs = _random_networks("connect_four", seed=3)
    sym = env.symmetries
    ens = ensemble_networks(networks, sym)
    mirror = jnp.stack([jnp.asarray(_move(o, sym, 1)) for o in np.asarray(obs)])
    action = jnp.asarray([0, 1, 2, 3, 4, 6], jnp.int32)
    flip = inverse_actions(sym)[1]
    a = ens.recurrent_inference(params, ens.representation(params, obs), action)
    m = ens.recurrent_inference(params, ens.representation(params, mirror),
                                jnp.asarray(flip)[action])
    np.testing.assert_allclose(_probs(m.policy_logits), _probs(a.policy_logits)[:, flip],
                               atol=1e-5)
    np.testing.assert_allclose(_probs(m.value_logits), _probs(a.value_logits), atol=1e-5)
    np.testing.assert_allclose(_probs(m.reward_logits), _probs(a.reward_logits), atol=1e-5)
    dec_a = np.asarray(ens.decoder(params, a.hidden))
    dec_m = np.asarray(ens.decoder(params, m.hidden))
    np.testing.assert_allclose(dec_m, np.stack([_move(d, sym, 1) for d in dec_a]), atol=1e-5)
    pa = networks.recurrent_inference(params, networks.representation(params, obs), action)
    pm = networks.recurrent_inference(params, networks.representation(params, mirror),
                                      jnp.asarray(flip)[action])
    assert np.abs(_probs(pm.policy_logits) - _probs(pa.policy_logits)[:, flip]).max() > 1e-3


def test_the_symmetry_ensemble_needs_symmetries():
    with pytest.raises(ValueError, match="symmetry ensemble needs a game with board symmetries"):
        check_symmetry_ensemble(make_env("catch"))
    check_symmetry_ensemble(make_env("connect_four"))  # the games' own fit


def test_the_trainers_evaluations_use_the_symmetry_ensemble(monkeypatch):
    """`eval_symmetry_ensemble`: `Trainer.evaluate` is built over the
    symmetry-averaged networks (its root and model give what `ensemble_networks`
    gives, one hidden state per symmetry), while self-play's networks stay the
    plain ones."""
    import muzero_jax.learning as learning
    from muzero_jax.search import make_recurrent_fn, make_root_fn

    built = {}
    make_evaluate = learning.make_evaluate

    def spy(env, root_fn, recurrent_fn, search_fn, **kwargs):
        built.update(root_fn=root_fn, recurrent_fn=recurrent_fn)
        return make_evaluate(env, root_fn, recurrent_fn, search_fn, **kwargs)

    monkeypatch.setattr(learning, "make_evaluate", spy)
    config = _tiny_tic_tac_toe(eval_symmetry_ensemble=True, eval_episodes=2)
    trainer = learning.make_train(config)
    params = _perturbed(trainer.init(jax.random.key(0)).params, 4)
    env = trainer.env
    _, ts = jax.vmap(env.reset)(jax.random.split(jax.random.key(1), 3))
    _, ts = jax.vmap(env.step)(_, jnp.asarray([0, 1, 5], jnp.int32))
    ens = ensemble_networks(trainer.networks, env.symmetries)
    want_root = make_root_fn(ens, trainer.value_support)(params, ts.observation)
    got_root = built["root_fn"](params, ts.observation)
    assert got_root.embedding.shape[1] == 8  # one hidden state per symmetry of the square
    action = jnp.asarray([2, 3, 4], jnp.int32)
    want_step, _ = make_recurrent_fn(ens, trainer.value_support, trainer.reward_support,
                                     discount=1.0, two_player=True)(
        params, None, action, want_root.embedding)
    got_step, _ = built["recurrent_fn"](params, None, action, got_root.embedding)
    for got, want in ((got_root.prior_logits, want_root.prior_logits),
                      (got_root.value, want_root.value), (got_step.value, want_step.value),
                      (got_step.prior_logits, want_step.prior_logits)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    plain = make_root_fn(trainer.networks, trainer.value_support)(params, ts.observation)
    assert np.abs(np.asarray(plain.value) - np.asarray(got_root.value)).max() > 1e-3
    # Self-play's (the trainer's) networks give one hidden state per board, not S.
    assert trainer.networks.representation(params, ts.observation).ndim == 2
    assert trainer.evaluate(params, jax.random.key(1)).shape == (2,)


@pytest.mark.parametrize("act_ensemble", [True, False])
def test_self_play_searches_the_symmetry_ensemble_only_when_asked(monkeypatch, act_ensemble):
    """`act_symmetry_ensemble`: self-play's search (the first `make_act_step`
    that `make_train` builds; the evaluation's comes later) runs over the
    symmetry-averaged networks, so its stored search values and policies are
    the ensemble's; without it, over the plain networks."""
    import muzero_jax.learning as learning
    from muzero_jax.search import make_recurrent_fn, make_root_fn

    calls = []
    make_act_step = learning.make_act_step

    def spy(env, root_fn, recurrent_fn, search_fn, **kwargs):
        calls.append((root_fn, recurrent_fn))
        return make_act_step(env, root_fn, recurrent_fn, search_fn, **kwargs)

    monkeypatch.setattr(learning, "make_act_step", spy)
    config = _tiny_tic_tac_toe(act_symmetry_ensemble=act_ensemble)
    trainer = learning.make_train(config)
    params = _perturbed(trainer.init(jax.random.key(0)).params, 5)
    env = trainer.env
    _, ts = jax.vmap(env.reset)(jax.random.split(jax.random.key(2), 3))
    _, ts = jax.vmap(env.step)(_, jnp.asarray([4, 0, 8], jnp.int32))
    nets = ensemble_networks(trainer.networks, env.symmetries) if act_ensemble \
        else trainer.networks
    want_root = make_root_fn(nets, trainer.value_support)(params, ts.observation)
    root_fn, recurrent_fn = calls[0]
    got_root = root_fn(params, ts.observation)
    action = jnp.asarray([1, 2, 3], jnp.int32)
    want_step, _ = make_recurrent_fn(nets, trainer.value_support, trainer.reward_support,
                                     discount=1.0, two_player=True)(
        params, None, action, want_root.embedding)
    got_step, _ = recurrent_fn(params, None, action, got_root.embedding)
    for got, want in ((got_root.prior_logits, want_root.prior_logits),
                      (got_root.value, want_root.value), (got_step.value, want_step.value),
                      (got_step.reward, want_step.reward),
                      (got_step.prior_logits, want_step.prior_logits)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    other = trainer.networks if act_ensemble else ensemble_networks(trainer.networks,
                                                                    env.symmetries)
    other_root = make_root_fn(other, trainer.value_support)(params, ts.observation)
    assert np.abs(np.asarray(other_root.value) - np.asarray(got_root.value)).max() > 1e-3
    # One training iteration runs with it (acting, storing, learning).
    state = trainer.init(jax.random.key(3))
    for _ in range(3):
        state, metrics = trainer.iteration(state)
    assert bool(metrics.finite) and bool(metrics.learned)


def test_act_symmetry_ensemble_is_refused_without_symmetries():
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset

    with pytest.raises(ValueError, match="act_symmetry_ensemble is set, but .*'catch' has none"):
        make_train(preset("catch", act_symmetry_ensemble=True))
