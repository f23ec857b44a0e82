"""The whole training iteration: bookkeeping, devices, reproducibility, learning."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax.learning import make_train
from muzero_jax.presets import preset
from muzero_jax.train import train

TINY = dict(
    num_envs=8, rollout_length=4, batch_size=8, replay_ratio=1 / 32, num_simulations=4,
    replay_capacity=40, min_replay_steps=16, eval_every=0, eval_episodes=4,
)


def test_iteration_bookkeeping_and_reproducibility():
    config = preset("catch", seed=1, **TINY)
    trainer = make_train(config)

    def run():
        state = trainer.init(jax.random.key(config.seed))
        rows = []
        for _ in range(6):
            state, m = trainer.iteration(state)
            rows.append(jax.device_get(m))
        return state, rows

    state, rows = run()
    counters = jax.device_get(state.counters)
    assert int(counters.env_steps) == 6 * config.env_steps_per_iteration
    assert int(counters.iterations) == 6
    # Learning starts once 16 rows per environment exist: iterations 4, 5, 6.
    assert [bool(r.learned) for r in rows] == [False] * 3 + [True] * 3
    assert int(counters.updates) == 3 * config.updates_per_iteration
    assert int(jax.device_get(state.replay.num_added)[0]) == 24
    assert all(bool(r.finite) for r in rows)
    # Same seed, same device count: the same result, bit for bit.
    state2, rows2 = run()
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(state2.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [float(r.loss) for r in rows] == [float(r.loss) for r in rows2]


def test_target_network_tracks_params_as_an_exponential_moving_average():
    # target_ema s: after each update, target <- s * params + (1 - s) * target
    # (what `load_agent(..., weights="target")` evaluates); one update per
    # learning iteration here, so each iteration's target is hand-computable.
    # No warm-up and a large step, so that each update moves the weights visibly.
    config = preset("catch", seed=2, target_ema=0.25, lr_warmup_updates=0, learning_rate=0.05,
                    **TINY)
    assert config.updates_per_iteration == 1
    trainer = make_train(config)
    state = trainer.init(jax.random.key(config.seed))
    for _ in range(3):  # learning starts at iteration 4
        state, _ = trainer.iteration(state)
    expected = jax.device_get(state.target_params)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(jax.device_get(state.params))):
        np.testing.assert_array_equal(a, b)
    for _ in range(2):
        state, metrics = trainer.iteration(state)
        assert bool(metrics.learned)
        params = jax.device_get(state.params)
        expected = jax.tree.map(lambda p, t: 0.25 * p + 0.75 * t, params, expected)
        for got, want in zip(jax.tree.leaves(jax.device_get(state.target_params)),
                             jax.tree.leaves(expected)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        # The target lags the online weights (by more than the tolerance above).
        gaps = [np.max(np.abs(t - p)) for t, p in zip(jax.tree.leaves(expected),
                                                       jax.tree.leaves(params))]
        assert max(gaps) > 1e-2, gaps


def test_search_value_mix_reaches_the_value_targets_of_training():
    # The replay priority of a sampled start is |stored search value - value
    # target| at row 0 (+ epsilon 1e-6), and row 0 never ends an episode. With
    # search_value_mix 1 that target is the stored search value itself, so every
    # start the first update sampled gets priority epsilon exactly; with the
    # paper's target (mix 0) the same starts get |q - z| + epsilon instead. Both
    # runs act and sample identically up to the first update (same seed, all
    # priorities still max_priority = 1), so they touch the same starts.
    def first_update_priorities(mix):
        config = preset("catch", seed=4, search_value_mix=mix, **TINY)
        assert config.updates_per_iteration == 1
        trainer = make_train(config)
        state = trainer.init(jax.random.key(config.seed))
        for i in range(4):  # learning starts at iteration 4
            state, metrics = trainer.iteration(state)
            assert bool(metrics.learned) == (i == 3)
        return np.asarray(jax.device_get(state.replay.priorities)).reshape(
            TINY["num_envs"], -1), float(jax.device_get(state.replay.max_priority).max())

    paper, paper_max = first_update_priorities(0.0)
    mixed, mixed_max = first_update_priorities(1.0)
    touched = (paper != 0.0) & (paper != 1.0)
    assert 1 <= touched.sum() <= TINY["batch_size"]
    assert np.all(paper[touched] > 1e-4), paper[touched]  # |q - z| is not 0 here
    np.testing.assert_array_equal(mixed[touched], np.float32(1e-6))
    np.testing.assert_array_equal(mixed[~touched], paper[~touched])  # 0 or max_priority 1
    assert mixed_max == 1.0  # epsilon never raises max_priority


@pytest.mark.parametrize("eval_weights", ["online", "target"])
def test_evaluations_use_the_weights_eval_weights_names(eval_weights):
    # eval_weights="target": the trainer evaluates the moving average of the
    # weights (target_params), not the online ones; they differ after learning.
    config = preset("catch", seed=4, target_ema=0.25, lr_warmup_updates=0,
                    learning_rate=0.05, eval_weights=eval_weights, **dict(TINY, eval_every=5))
    trainer = make_train(config)
    seen = []

    class Spy:  # the compiled evaluation, recording the weights it is called with
        lower = staticmethod(trainer.evaluate.lower)

        def __call__(self, params, key):
            seen.append(jax.device_get(params))
            return trainer.evaluate(params, key)

    result = train(config, trainer=trainer._replace(evaluate=Spy()), max_iterations=5,
                   stop_threshold=None)
    assert len(seen) == 1 and "eval_return" in result.history[-1]
    state = jax.device_get(result.state)
    want = state.target_params if eval_weights == "target" else state.params
    other = state.params if eval_weights == "target" else state.target_params
    for got, w in zip(jax.tree.leaves(seen[0]), jax.tree.leaves(want)):
        np.testing.assert_array_equal(got, w)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(seen[0]),
                                                         jax.tree.leaves(other)))


def test_self_play_acts_with_the_weights_act_weights_names():
    # act_weights="target": the iteration's self-play searches with
    # target_params. One iteration from a state whose target weights are
    # another initialisation's stores the very rows that acting with those
    # weights as the online ones stores; acting with the online weights
    # stores other rows.
    base = dict(TINY, target_ema=0.25)
    # Random weights everywhere (the initial output layers are zeros, whose
    # searches would not depend on the rest).
    trainers = {w: make_train(preset("catch", seed=5, act_weights=w, **base))
                for w in ("target", "online")}  # one compile per value
    params = trainers["online"].init(jax.random.key(7)).params
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(8), len(leaves))
    other = jax.tree.unflatten(treedef, [0.3 * jax.random.normal(k, x.shape, x.dtype)
                                         for k, x in zip(keys, leaves)])
    rows = {}
    for name, act_weights, swap in [("target", "target", "target_params"),
                                    ("online_other", "online", "params"),
                                    ("online", "online", "target_params")]:
        trainer = trainers[act_weights]
        state = trainer.init(jax.random.key(5))
        # A copy (the iteration donates its input), placed as init placed the
        # weights it replaces: the same input shardings in every call, so each
        # trainer's iteration compiles once.
        state = state._replace(**{swap: jax.tree.map(
            lambda o, p: jax.device_put(jnp.copy(o), p.sharding), other, getattr(state, swap))})
        state, metrics = trainer.iteration(state)
        assert not bool(metrics.learned)  # only acting: the weights stay put
        rows[name] = jax.device_get(state.replay.data)
    for a, b in zip(jax.tree.leaves(rows["target"]), jax.tree.leaves(rows["online_other"])):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(rows["target"]),
                                                         jax.tree.leaves(rows["online"])))


def test_evaluate_is_greedy_and_counts_episodes():
    config = preset("catch", **TINY)
    trainer = make_train(config)
    state = trainer.init(jax.random.key(0))
    returns = np.asarray(trainer.evaluate(state.params, jax.random.key(3)))
    assert returns.shape == (config.eval_episodes,)
    assert set(np.unique(returns)) <= {-1.0, 1.0}  # one full Catch episode each


def test_default_compiler_options_and_bad_ones(monkeypatch):
    from muzero_jax.learning import default_compiler_options

    # On CPU the iteration compiles at LLVM level 1 (faster compile, same speed),
    # unless XLA_FLAGS set a level for every program (as this test session's do).
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")
    assert default_compiler_options() == {"xla_backend_optimization_level": 1}
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    assert default_compiler_options() == {}
    monkeypatch.delenv("XLA_FLAGS")
    assert default_compiler_options() == {"xla_backend_optimization_level": 1}
    for bad in (["xla_backend_optimization_level", 1], {"xla_backend_optimization_level": None},
                {1: 1}):
        with pytest.raises(ValueError, match="compiler_options must be a dict"):
            make_train(preset("catch", **TINY), compiler_options=bad)


def test_bad_device_counts():
    with pytest.raises(ValueError, match="JAX sees only"):
        make_train(preset("catch", num_devices=64))


_MULTI_DEVICE = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset
    tiny = json.loads(sys.argv[1])
    out = {}
    for d in (1, 2, 4):
        config = preset("catch", num_devices=d, **tiny)
        trainer = make_train(config)
        state = trainer.init(jax.random.key(0))
        for i in range(8):
            state, m = trainer.iteration(state)
            if i % 4 == 3:
                jax.block_until_ready(m)  # fake-device collectives: sync often
        spread = 0.0
        for leaf in jax.tree.leaves(state.params):
            shards = [np.asarray(s.data) for s in leaf.addressable_shards]
            assert len(shards) == d
            spread = max(spread, max(float(np.max(np.abs(s - shards[0]))) for s in shards))
        out[d] = dict(spread=spread, updates=int(state.counters.updates),
                      learned=bool(m.learned), finite=bool(m.finite))
    try:
        make_train(preset("catch", num_devices=4, **dict(tiny, batch_size=6)))
    except ValueError as e:
        out["error"] = str(e)
    print(json.dumps(out))
    """
)


# Slow (a 4-device subprocess compiling three programs): the default run keeps
# the same property through test_multihost.py (2 processes x 2 devices match
# 1 x 4; 4 devices take the same learner step as 1).
@pytest.mark.slow
def test_params_stay_identical_across_fake_devices():
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    env = dict(os.environ, XLA_FLAGS=flags,
               PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-c", _MULTI_DEVICE, json.dumps(TINY)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for d in ("1", "2", "4"):
        assert out[d]["spread"] == 0.0, out
        assert out[d]["learned"] and out[d]["finite"]
        assert out[d]["updates"] == out["1"]["updates"] > 0
    assert "batch_size=6 does not split evenly across 4 devices" in out["error"]


# Bounded, seeded Catch run: random play scores about -0.6; this must learn.
LEARN = dict(eval_every=0, max_env_steps=64_000, eval_episodes=64)


def _prior_policy_return(trainer, params, num_episodes=64):
    """Greedy returns of the raw policy head (no search): argmax of the prior."""
    env = trainer.env
    state, ts = jax.vmap(env.reset)(jax.random.split(jax.random.key(7), num_episodes))
    total = np.zeros(num_episodes)
    step = jax.jit(jax.vmap(env.step))
    infer = jax.jit(trainer.networks.initial_inference)
    for _ in range(env.max_episode_steps):
        action = jnp.argmax(infer(params, ts.observation).policy_logits, axis=-1)
        state, ts = step(state, action)
        total += np.asarray(ts.reward)
    return float(total.mean())


# bfloat16 is slow (a second 64k-step run); tests/test_networks.py checks in the
# default run that the networks compute in bfloat16 and keep float32 parameters.
@pytest.mark.parametrize("compute_dtype", [
    "float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_catch_learns(compute_dtype):
    config = preset("catch", seed=0, compute_dtype=compute_dtype, **LEARN)
    result = train(config)
    # Mixed precision keeps the parameters float32.
    assert {p.dtype for p in jax.tree.leaves(result.state.params)} == {jnp.dtype("float32")}
    params = result.state.params
    returns = np.asarray(result.trainer.evaluate(params, jax.random.key(123)))
    late = [r["episode_return"] for r in result.history[-10:] if r["episode_return"] is not None]
    assert float(np.mean(late)) > 0.0, late
    assert float(returns.mean()) > 0.0, returns.mean()
    # The search can partly make up for a bad policy head; the head itself must learn too
    # (this fails if, e.g., the policy targets are zeroed).
    assert _prior_policy_return(result.trainer, params) > 0.0


@pytest.mark.slow
def test_catch_learns_planning_in_its_decoded_model():
    """`search_model="decoded"`: self-play and evaluation search the learned
    model re-grounded in its decoded observations, and Catch still learns
    (slow: a 64k-step run; what the evaluation searches is checked in the
    default run below)."""
    config = preset("catch", seed=0, reconstruction_loss_weight=1.0, search_model="decoded",
                    **LEARN)
    result = train(config)
    returns = np.asarray(result.trainer.evaluate(result.state.params, jax.random.key(123)))
    assert float(returns.mean()) > 0.0, returns.mean()


def test_decoded_model_evaluation_searches_the_decoded_boards():
    """`search_model="decoded"`: the trainer's evaluation is the search over
    `make_decoded_recurrent_fn` (on random weights, the same returns as an
    evaluation built by hand over it), which reads the decoder (the plain
    learned model's does not); an `Agent` defaults to it, and an environment
    without 0/1 observations is refused before compiling."""
    from muzero_jax.agent import Agent
    from muzero_jax.learning import make_evaluate
    from muzero_jax.search import make_decoded_recurrent_fn, make_root_fn

    config = preset("catch", seed=0, reconstruction_loss_weight=1.0, search_model="decoded",
                    **dict(TINY, eval_episodes=32))
    trainer = make_train(config)
    # Random weights everywhere (the initialisation zeroes the output layers).
    leaves, treedef = jax.tree.flatten(trainer.init(jax.random.key(0)).params)
    params = jax.tree.unflatten(treedef, [
        0.5 * jax.random.normal(k, x.shape, x.dtype)
        for k, x in zip(jax.random.split(jax.random.key(1), len(leaves)), leaves)])
    assert Agent(config, trainer, params).model == "decoded"
    # With the decoder's output pinned to an empty board the returns change,
    # and they equal an evaluation built by hand over make_decoded_recurrent_fn.
    blind = {**params, "decoder_out": {**params["decoder_out"],
                                       "b": jnp.full_like(params["decoder_out"]["b"], -10.0)}}
    by_hand = make_evaluate(
        trainer.env, make_root_fn(trainer.networks, trainer.value_support),
        make_decoded_recurrent_fn(trainer.networks, trainer.value_support,
                                  trainer.reward_support, discount=config.discount),
        trainer.search_fn, num_simulations=config.num_simulations,
        num_episodes=config.eval_episodes)
    plain = make_train(dataclasses.replace(config, search_model="learned"))
    key = jax.random.key(5)
    by_trainer = np.asarray(trainer.evaluate(blind, key))
    np.testing.assert_array_equal(np.asarray(by_hand(blind, key)), by_trainer)
    assert not np.array_equal(by_trainer, np.asarray(trainer.evaluate(params, key)))
    np.testing.assert_array_equal(np.asarray(plain.evaluate(blind, key)),
                                  np.asarray(plain.evaluate(params, key)))
    with pytest.raises(ValueError, match="not binary"):
        make_train(preset("cartpole", reconstruction_loss_weight=1.0, search_model="decoded"))


def test_value_support_sized_by_terminal_rewards_and_linear_on_request():
    from muzero_jax.envs import make_env
    from muzero_jax.learning import _check_supports
    from muzero_jax.value_transforms import make_support

    # Connect Four rewards only a game's end, so a value never exceeds 1 and a
    # linear support of half-width 1 (win / draw / loss) is enough.
    config = preset("connect_four", support_transform=False, value_support_size=1,
                    reward_support_size=1)
    trainer = make_train(config)
    for support in (trainer.value_support, trainer.reward_support):
        assert support.num_bins == 3 and not support.use_transform
    logits = jnp.log(jnp.array([0.1, 0.2, 0.7]))
    np.testing.assert_allclose(trainer.value_support.logits_to_scalar(logits), 0.6, atol=1e-5)
    # Without that promise the bound is the reward times the 42-ply horizon:
    # h(42) = sqrt(43) - 1 + 0.042 ~ 5.6 bins transformed, 42 linear.
    env = dataclasses.replace(make_env("connect_four"), terminal_rewards_only=False)
    for transform, needed in ((True, 6), (False, 42)):
        with pytest.raises(ValueError, match=f"use support_size >= {needed}$"):
            _check_supports(config, env, make_support(needed - 1, use_transform=transform),
                            make_support(1, use_transform=transform))
        _check_supports(config, env, make_support(needed, use_transform=transform),
                        make_support(1, use_transform=transform))
    # Catch keeps the horizon bound (no promise made): one bin is refused
    # before anything is built.
    with pytest.raises(ValueError, match="value support_size=1 covers"):
        make_train(preset("catch", support_transform=False, value_support_size=1))


def test_train_compiles_iteration_and_evaluation_once(caplog):
    # train() compiles the iteration and the evaluation in background threads
    # from the state's shapes while init runs; the first calls must find those
    # executables (a second compile of either would double a cold start).
    config = preset("catch", seed=3, **dict(TINY, eval_every=1))
    trainer = make_train(config)
    jax.config.update("jax_log_compiles", True)  # global: the compiles run in threads
    try:
        with caplog.at_level("WARNING"):
            result = train(config, trainer=trainer, max_iterations=2)
    finally:
        jax.config.update("jax_log_compiles", False)
    finished = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("Finished XLA compilation")]
    assert sum("jit(device_iteration)" in m for m in finished) == 1, finished
    assert sum("jit(evaluate)" in m for m in finished) == 1, finished
    assert [r["iteration"] for r in result.history] == [1, 2]
    assert all("eval_return" in r for r in result.history)
    # Same seed, same state as a run that builds and compiles in the plain order.
    state = trainer.init(jax.random.split(jax.random.key(3))[0])
    for _ in range(2):
        state, _ = trainer.iteration(state)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(result.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_reward_loss_weight_reaches_the_loss_and_custom_losses_are_checked():
    from muzero_jax.loss import unrolled_loss

    seen = {}

    def recording_loss(params, batch, **kwargs):
        seen.update(kwargs)
        return unrolled_loss(params, batch, **kwargs)

    def old_style_loss(params, batch, *, networks, value_support, reward_support,
                       value_loss_weight):
        return unrolled_loss(params, batch, networks=networks, value_support=value_support,
                             reward_support=reward_support, value_loss_weight=value_loss_weight)

    config = preset("catch", reward_loss_weight=2.0, num_envs=4, batch_size=4,
                    num_simulations=2, min_replay_steps=12)
    with pytest.raises(ValueError, match="does not accept reward_loss_weight"):
        make_train(config, loss_fn=old_style_loss)
    make_train(preset("catch"), loss_fn=old_style_loss)  # weight 1: the old signature is fine
    trainer = make_train(config, loss_fn=recording_loss)
    state = trainer.init(jax.random.key(0))
    for _ in range(4):
        state, metrics = trainer.iteration(state)
    assert seen["reward_loss_weight"] == 2.0
    assert "consistency_loss_weight" not in seen and float(metrics.consistency_loss) == 0.0
    with pytest.raises(ValueError, match="reward_loss_weight"):
        preset("catch", reward_loss_weight=-1.0)


def test_consistency_loss_gets_the_observations_reached():
    from muzero_jax.loss import unrolled_loss

    seen, captured = {}, []

    def recording_loss(params, batch, **kwargs):
        seen.update(kwargs)
        jax.debug.callback(lambda *a: captured.append([np.asarray(x) for x in a]),
                           batch.observation, batch.next_observation, batch.policy_mask)
        return unrolled_loss(params, batch, **kwargs)

    def old_style_loss(params, batch, *, networks, value_support, reward_support,
                       value_loss_weight):
        raise AssertionError("not called")

    config = preset("catch", consistency_loss_weight=2.0, consistency_projection_size=8,
                    num_envs=4, batch_size=4, num_simulations=2, min_replay_steps=12)
    with pytest.raises(ValueError, match="does not accept consistency_loss_weight"):
        make_train(config, loss_fn=old_style_loss)

    def no_batch_loss(params, batch, *, networks, value_support, reward_support,
                      value_loss_weight, consistency_loss_weight=0.0):
        raise AssertionError("not called")

    make_train(config, loss_fn=no_batch_loss)  # consistency_batch_size 0: not passed
    with pytest.raises(ValueError, match="does not accept consistency_batch=; add the "
                                         "argument or leave consistency_batch_size at 0"):
        make_train(dataclasses.replace(config, consistency_batch_size=2), loss_fn=no_batch_loss)
    for bad in (-1, 5, True, 2.5):  # batch_size is 4
        with pytest.raises(ValueError, match="consistency_batch_size must be an integer"):
            dataclasses.replace(config, consistency_batch_size=bad)
    trainer = make_train(config, loss_fn=recording_loss)
    assert trainer.networks.projection is not None
    state = trainer.init(jax.random.key(0))
    for _ in range(4):
        state, metrics = trainer.iteration(state)
    assert seen["consistency_loss_weight"] == 2.0
    assert float(metrics.learned) > 0 and captured
    # Summed over K steps of -cos, masked: within [-K, K], and on.
    assert 0 < abs(float(metrics.consistency_loss)) <= config.num_unroll_steps
    # Catch's ball falls one row per step in a fixed column: each observation
    # reached is the one before with the ball a row lower, while the episode
    # runs and the ball is above the paddle's row.
    rows = captured[0][0].shape[1]

    def ball(board):
        r, c = np.nonzero(board[:rows - 1])
        return (int(r[0]), int(c[0])) if len(r) else None

    checked = 0
    for observation, reached, policy_mask in captured:
        assert reached.shape == (4, config.num_unroll_steps) + observation.shape[1:]
        for b in range(observation.shape[0]):
            before = observation[b]
            for j in range(config.num_unroll_steps):
                if not policy_mask[b, j]:
                    break
                if ball(before) is not None and ball(before)[0] < rows - 2:
                    assert ball(reached[b, j]) == (ball(before)[0] + 1, ball(before)[1])
                    checked += 1
                before = reached[b, j]
    assert checked > 20
    with pytest.raises(ValueError, match="consistency_loss_weight"):
        preset("catch", consistency_loss_weight=-1.0)


def test_reconstruction_loss_gets_the_observations_reached_and_learns_to_decode():
    from muzero_jax.loss import unrolled_loss

    seen, captured = {}, []

    def recording_loss(params, batch, **kwargs):
        seen.update(kwargs)
        jax.debug.callback(lambda *a: captured.append([np.asarray(x) for x in a]),
                           batch.observation, batch.next_observation)
        return unrolled_loss(params, batch, **kwargs)

    def old_style_loss(params, batch, *, networks, value_support, reward_support,
                       value_loss_weight):
        raise AssertionError("not called")

    config = preset("catch", reconstruction_loss_weight=1.0, num_envs=4, batch_size=4,
                    num_simulations=2, min_replay_steps=12)
    with pytest.raises(ValueError, match="does not accept reconstruction_loss_weight"):
        make_train(config, loss_fn=old_style_loss)
    trainer = make_train(config, loss_fn=recording_loss)
    assert trainer.networks.decoder is not None and trainer.networks.projection is None
    state = trainer.init(jax.random.key(0))
    losses = []
    for i in range(40):
        state, metrics = trainer.iteration(state)
        if float(metrics.learned):
            losses.append(float(metrics.reconstruction_loss))
        if i % 10 == 9:
            jax.block_until_ready(state.params)
    assert seen["reconstruction_loss_weight"] == 1.0 and "consistency_loss_weight" not in seen
    observation, reached = captured[0]
    assert reached.shape == (4, config.num_unroll_steps) + observation.shape[1:]
    # Catch's boards have two lit cells (ball and paddle), so an untrained
    # decoder is off by about that much per step; training decodes them.
    assert len(losses) > 20 and losses[0] > 1.0
    assert np.mean(losses[-5:]) < 0.5 * losses[0]
    decoded = trainer.networks.decoder(
        state.params, trainer.networks.representation(state.params, observation))
    assert decoded.shape == observation.shape
    with pytest.raises(ValueError, match="reconstruction_loss_weight"):
        preset("catch", reconstruction_loss_weight=-1.0)


def test_weight_decay_spares_only_the_consistency_heads():
    import optax

    from muzero_jax.config import MLPConfig
    from muzero_jax.learning import make_optimizer
    from muzero_jax.networks import make_networks

    nets = make_networks(MLPConfig(hidden_sizes=(8,), latent_size=4, head_hidden_sizes=(4,)),
                         num_actions=3, value_bins=5, reward_bins=5, projection_size=4)
    params = nets.init(jax.random.key(0), jnp.ones((1, 6)))
    heads = {m for m in params if m.startswith(("projection", "predictor"))}
    assert heads == {"projection_linear_0", "projection_norm_0", "projection_out",
                     "predictor_linear_0", "predictor_out"}
    for optimizer_name in ("adam", "sgd"):
        optimizer, _ = make_optimizer(preset("catch", weight_decay=0.5, optimizer=optimizer_name,
                                                  lr_warmup_updates=0, lr_decay="constant"))
        zeros = jax.tree.map(jnp.zeros_like, params)
        updates, _ = optimizer.update(zeros, optimizer.init(params), params)
        new = optax.apply_updates(params, updates)
        for module, leaves in params.items():
            for name, value in leaves.items():
                moved = float(jnp.max(jnp.abs(new[module][name] - value)))
                if module in heads:  # only decay acts on a zero gradient: none here
                    assert moved == 0.0, (optimizer_name, module, name)
                elif float(jnp.max(jnp.abs(value))) > 0:  # decay pulls toward zero
                    assert moved > 0.0, (optimizer_name, module, name)
                    assert float(jnp.sum(jnp.abs(new[module][name]))) < float(
                        jnp.sum(jnp.abs(value)))


def test_learner_step_reports_the_global_gradient_norm_of_the_step_it_takes():
    """`make_learner_step` on one device: the reported norm is the L2 norm over
    every leaf of the gradient, and SGD moves the parameters by -lr times it
    (a least-squares loss whose gradient is written out by hand in numpy)."""
    import optax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from muzero_jax.learning import AXIS, make_learner_step

    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    params = {"w": np.array([1.0, -2.0, 3.0], np.float32), "b": np.float32(0.5)}

    def loss_fn(p, batch):
        return jnp.mean((batch @ p["w"] + p["b"]) ** 2), {}

    step = make_learner_step(loss_fn, optax.sgd(0.1))
    run = jax.jit(jax.shard_map(lambda p, o, b: step(p, o, b)[:3],
                                mesh=Mesh(np.asarray(jax.devices()[:1]), (AXIS,)),
                                in_specs=(P(), P(), P(AXIS)), out_specs=(P(), P(), P()),
                                check_vma=False))
    new, _, norm = run(params, optax.sgd(0.1).init(params), x)
    residual = x.astype(np.float64) @ params["w"] + params["b"]
    grad_w, grad_b = 2 * (residual[:, None] * x).mean(0), 2 * residual.mean()
    np.testing.assert_allclose(float(norm), np.sqrt(np.sum(grad_w ** 2) + grad_b ** 2),
                               rtol=1e-5)
    np.testing.assert_allclose(new["w"], params["w"] - 0.1 * grad_w, rtol=1e-5)
    np.testing.assert_allclose(float(new["b"]), params["b"] - 0.1 * grad_b, rtol=1e-5)
