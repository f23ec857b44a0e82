"""Tests for the built-in environments (Catch, CartPole) and the registry.

Catch is checked against hand-worked episodes; CartPole against gymnasium's
`CartPoleEnv` stepped from identical states. Both are run batched under
`jax.jit(jax.vmap(step))` inside `lax.scan` to check the auto-reset bookkeeping.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from muzero_jax.envs import ENV_NAMES, Environment, TimeStep, make_cartpole, make_catch, make_env
from muzero_jax.envs.cartpole import THETA_THRESHOLD, X_THRESHOLD, CartPoleState
from muzero_jax.envs.catch import CatchState

LEFT, STAY, RIGHT = 0, 1, 2
ROWS, COLUMNS = 10, 5
# Shared, so that their jitted functions compile once for all tests.
CATCH = make_catch(ROWS, COLUMNS)
CARTPOLE = make_cartpole()


def _replace_inner(state, inner):
    """Swaps the inner state of an auto-reset state `(inner, last, rng_key)`."""
    _, last, rng_key = state
    return (inner, last, rng_key)


def _catch_board(rows: int, columns: int, ball_row: int, ball_col: int, paddle_col: int):
    board = np.zeros((rows, columns), np.float32)
    board[ball_row, ball_col] = 1.0
    board[rows - 1, paddle_col] = 1.0
    return board


def _rollout(env: Environment, rng_key: chex.PRNGKey, num_envs: int, num_steps: int):
    """Runs `num_envs` environments for `num_steps` random actions in one program.

    Returns:
      `(reset_timestep, timesteps)` as numpy arrays, `timesteps` with leading
      axes `[num_steps, num_envs]`.
    """
    batched_step = jax.vmap(env.step)

    @jax.jit
    def run(rng_key):
        reset_key, action_key = jax.random.split(rng_key)
        state, ts0 = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))
        actions = jax.random.randint(action_key, (num_steps, num_envs), 0, env.num_actions)
        _, timesteps = jax.lax.scan(lambda s, a: batched_step(s, a), state, actions)
        return ts0, timesteps

    return jax.tree.map(np.asarray, run(rng_key))


def _check_episode_boundaries(ts0: TimeStep, timesteps: TimeStep) -> None:
    """Invariants of dm_env auto-reset shared by every environment."""
    assert ts0.first.all() and not ts0.last.any()
    previous_last = np.concatenate([ts0.last[None], timesteps.last[:-1]])
    np.testing.assert_array_equal(timesteps.first, previous_last)
    np.testing.assert_array_equal(timesteps.reward[timesteps.first], 0.0)
    np.testing.assert_array_equal(timesteps.last, timesteps.terminated | timesteps.truncated)
    assert not (timesteps.terminated & timesteps.truncated).any()
    assert not (timesteps.first & timesteps.last).any()
    assert timesteps.legal_action_mask.all()
    np.testing.assert_array_equal(timesteps.to_play, 0)


def _episode_step_counts(timesteps: TimeStep) -> np.ndarray:
    """`[num_steps, num_envs]`: steps taken in the current episode (0 at `first`)."""
    counts = np.zeros(timesteps.first.shape, np.int64)
    count = np.zeros(timesteps.first.shape[1:], np.int64)
    for t in range(timesteps.first.shape[0]):
        count = np.where(timesteps.first[t], 0, count + 1)
        counts[t] = count
    return counts


class CatchTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        ("caught_clipped_right", 4, [RIGHT] * 9, [3, 4, 4, 4, 4, 4, 4, 4, 4], 1.0),
        ("caught_clipped_left", 0, [LEFT] * 9, [1, 0, 0, 0, 0, 0, 0, 0, 0], 1.0),
        ("missed_staying", 0, [STAY] * 9, [2] * 9, -1.0),
        ("caught_zigzag", 3, [RIGHT, RIGHT, LEFT] + [STAY] * 6, [3, 4, 3, 3, 3, 3, 3, 3, 3], 1.0),
        ("caught_on_last_move", 3, [STAY] * 8 + [RIGHT], [2] * 8 + [3], 1.0),
        ("missed_on_last_move", 2, [STAY] * 8 + [LEFT], [2] * 8 + [1], -1.0),
    )
    def test_hand_checked_episode(self, ball_col, actions, paddle_cols, final_reward):
        rows, columns = ROWS, COLUMNS
        step = self.variant(CATCH.step)
        state, _ = CATCH.reset(jax.random.key(0))
        inner = CatchState(jnp.int32(0), jnp.int32(ball_col), jnp.int32(columns // 2))
        state = _replace_inner(state, inner)

        for t, (action, paddle_col) in enumerate(zip(actions, paddle_cols, strict=True)):
            state, ts = step(state, jnp.int32(action))
            is_last = t == rows - 2
            expected = _catch_board(rows, columns, t + 1, ball_col, paddle_col)
            np.testing.assert_array_equal(ts.observation, expected)
            self.assertEqual(ts.observation.dtype, jnp.float32)
            self.assertEqual(float(ts.reward), final_reward if is_last else 0.0)
            self.assertEqual(bool(ts.last), is_last)
            self.assertEqual(bool(ts.terminated), is_last)
            self.assertFalse(bool(ts.truncated))
            self.assertFalse(bool(ts.first))
            self.assertEqual(int(ts.to_play), 0)
            np.testing.assert_array_equal(ts.legal_action_mask, [True, True, True])

        # The step after `last` starts a new episode and ignores its action.
        state_left, ts_left = step(state, jnp.int32(LEFT))
        state_right, ts_right = step(state, jnp.int32(RIGHT))
        chex.assert_trees_all_equal(ts_left, ts_right)
        chex.assert_trees_all_equal(state_left, state_right)
        self.assertTrue(bool(ts_left.first))
        self.assertFalse(bool(ts_left.last))
        self.assertEqual(float(ts_left.reward), 0.0)
        new_inner = state_left[0]
        self.assertEqual(int(new_inner.ball_row), 0)
        self.assertEqual(int(new_inner.paddle_col), columns // 2)
        expected = _catch_board(rows, columns, 0, int(new_inner.ball_col), columns // 2)
        np.testing.assert_array_equal(ts_left.observation, expected)

    def test_reset_distribution(self):
        rows, columns = ROWS, COLUMNS
        reset = jax.jit(jax.vmap(CATCH.reset))
        state, ts = reset(jax.random.split(jax.random.key(1), 2000))
        inner, last, _ = state
        np.testing.assert_array_equal(inner.ball_row, 0)
        np.testing.assert_array_equal(inner.paddle_col, columns // 2)
        assert not np.asarray(last).any()
        counts = np.bincount(np.asarray(inner.ball_col), minlength=columns)
        self.assertEqual(len(counts), columns)
        assert (counts > 300).all() and (counts < 500).all(), counts  # 400 expected each.
        assert np.asarray(ts.first).all() and not np.asarray(ts.last).any()
        np.testing.assert_array_equal(ts.reward, 0.0)
        np.testing.assert_array_equal(ts.observation.sum(axis=(1, 2)), 2.0)
        np.testing.assert_array_equal(ts.observation[:, 0].argmax(-1), inner.ball_col)
        np.testing.assert_array_equal(ts.observation[:, rows - 1].argmax(-1), columns // 2)

    @parameterized.parameters((ROWS, COLUMNS), (2, 3), (6, 1))
    def test_batched_scan_episode_length(self, rows, columns):
        env = CATCH if (rows, columns) == (ROWS, COLUMNS) else make_catch(rows, columns)
        self.assertEqual(env.max_episode_steps, rows - 1)
        num_steps = 3 * rows + 2
        ts0, timesteps = _rollout(env, jax.random.key(rows * columns), 64, num_steps)
        _check_episode_boundaries(ts0, timesteps)

        # Every episode lasts exactly rows - 1 steps, then one reset step.
        t = np.arange(num_steps)
        expected_last = (t % rows) == rows - 2
        np.testing.assert_array_equal(
            timesteps.last, np.broadcast_to(expected_last[:, None], (num_steps, 64))
        )
        np.testing.assert_array_equal(timesteps.terminated, timesteps.last)
        assert not timesteps.truncated.any()
        # Rewards are +-1 exactly at the end: +1 iff the ball landed on the paddle,
        # i.e. the final board shows a single lit cell.
        np.testing.assert_array_equal(timesteps.reward[~timesteps.last], 0.0)
        final_cells = timesteps.observation.sum(axis=(2, 3))[timesteps.last]
        np.testing.assert_array_equal(
            timesteps.reward[timesteps.last], np.where(final_cells == 1, 1.0, -1.0)
        )
        if columns == 1:
            np.testing.assert_array_equal(timesteps.reward[timesteps.last], 1.0)
        elif rows > 2:
            assert (timesteps.reward == 1).any() and (timesteps.reward == -1).any()

    def test_spec(self):
        env = make_catch(6, 4)
        self.assertEqual(env.name, "catch")
        self.assertEqual(env.observation_shape, (6, 4))
        self.assertEqual(env.num_actions, 3)
        self.assertEqual(env.num_players, 1)
        self.assertEqual(env.max_episode_steps, 5)
        self.assertEqual(env.reward_range, (-1.0, 1.0))
        _, ts = env.reset(jax.random.key(0))
        self.assertEqual(ts.observation.shape, env.observation_shape)
        with pytest.raises(ValueError, match="rows >= 2"):
            make_catch(rows=1)


def _gym_step(gym_env: CartPoleEnv, state: np.ndarray, action: int):
    gym_env.state = np.asarray(state, np.float64)
    gym_env.steps_beyond_terminated = None
    obs, reward, terminated, truncated, _ = gym_env.step(int(action))
    return obs, reward, terminated, truncated, np.array(gym_env.state, np.float64)


def _cartpole_states(rng: np.random.Generator, n: int) -> np.ndarray:
    """`[n, 4]` float32 states: a broad spread, plus ones that step onto a threshold."""
    broad = rng.uniform(
        [-X_THRESHOLD, -3.0, -THETA_THRESHOLD, -3.5],
        [X_THRESHOLD, 3.0, THETA_THRESHOLD, 3.5],
        (n, 4),
    )
    # After one Euler step x' = x + tau * x_dot (likewise theta): aim x' (or theta')
    # within +-2e-3 of the threshold, on both sides and for both signs.
    near_x = rng.uniform([0.0, -3.0, -0.1, -2.0], [0.0, 3.0, 0.1, 2.0], (n, 4))
    sign = rng.choice([-1.0, 1.0], n)
    near_x[:, 0] = sign * X_THRESHOLD - 0.02 * near_x[:, 1] + rng.uniform(-2e-3, 2e-3, n)
    near_theta = rng.uniform([-1.0, -2.0, 0.0, -3.0], [1.0, 2.0, 0.0, 3.0], (n, 4))
    sign = rng.choice([-1.0, 1.0], n)
    near_theta[:, 2] = (
        sign * THETA_THRESHOLD - 0.02 * near_theta[:, 3] + rng.uniform(-2e-3, 2e-3, n)
    )
    return np.concatenate([broad, near_x, near_theta]).astype(np.float32)


class CartPoleTest(chex.TestCase):
    def test_matches_gymnasium_transitions(self):
        rng = np.random.default_rng(0)
        states = _cartpole_states(rng, 1000)
        n = len(states)
        actions = rng.integers(0, 2, n)
        env = CARTPOLE

        inner = CartPoleState(*jnp.asarray(states.T), steps=jnp.zeros((n,), jnp.int32))
        state = (inner, jnp.zeros((n,), jnp.bool_), jax.random.split(jax.random.key(0), n))
        _, ts = jax.jit(jax.vmap(env.step))(state, jnp.asarray(actions, jnp.int32))
        ts = jax.tree.map(np.asarray, ts)

        gym_env = CartPoleEnv()
        gym_env.reset(seed=0)
        gym = [_gym_step(gym_env, s, a) for s, a in zip(states, actions, strict=True)]
        gym_obs = np.stack([g[0] for g in gym])
        gym_terminated = np.array([g[2] for g in gym])
        gym_next = np.stack([g[4] for g in gym])

        self.assertEqual(ts.observation.dtype, np.float32)
        np.testing.assert_allclose(ts.observation, gym_obs, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(ts.reward, [g[1] for g in gym])  # 1.0, also on termination.
        np.testing.assert_array_equal(ts.reward, 1.0)
        assert not ts.first.any() and not ts.truncated.any()
        assert not any(g[3] for g in gym)
        # Termination agrees except where float32 and float64 may round to
        # opposite sides of a threshold.
        margin = np.minimum(
            np.abs(np.abs(gym_next[:, 0]) - X_THRESHOLD),
            np.abs(np.abs(gym_next[:, 2]) - THETA_THRESHOLD),
        )
        clear = margin > 1e-5
        assert clear.mean() > 0.99, clear.mean()
        np.testing.assert_array_equal(ts.terminated[clear], gym_terminated[clear])
        np.testing.assert_array_equal(ts.last, ts.terminated)
        # The near-threshold states exercise both outcomes, for x and for theta.
        for part in (slice(1000, 2000), slice(2000, 3000)):
            self.assertGreater(gym_terminated[part].sum(), 300)
            self.assertGreater((~gym_terminated[part]).sum(), 300)

    def test_rollout_tracks_gymnasium(self):
        """Open loop from a gymnasium reset: float32 drift stays small over an episode."""
        step = jax.jit(CARTPOLE.step)
        gym_env = CartPoleEnv()
        rng = np.random.default_rng(1)
        for seed in range(3):
            gym_obs, _ = gym_env.reset(seed=seed)
            inner = CartPoleState(*jnp.asarray(gym_obs), steps=jnp.int32(0))
            state = (inner, jnp.bool_(False), jax.random.key(seed))
            for _ in range(200):
                action = int(rng.integers(0, 2))
                state, ts = step(state, jnp.int32(action))
                gym_obs, _, gym_terminated, _, _ = gym_env.step(action)
                np.testing.assert_allclose(ts.observation, gym_obs, rtol=1e-4, atol=1e-4)
                self.assertEqual(bool(ts.terminated), gym_terminated)
                if gym_terminated:
                    break

    @chex.variants(with_jit=True, without_jit=True)
    def test_truncation_then_auto_reset(self):
        env = make_cartpole(max_episode_steps=5)
        self.assertEqual(env.max_episode_steps, 5)
        step = self.variant(env.step)
        state, ts = env.reset(jax.random.key(3))
        self.assertTrue(bool(ts.first))
        self.assertTrue(bool((jnp.abs(ts.observation) <= 0.05).all()))
        zero = jnp.float32(0.0)
        state = _replace_inner(state, CartPoleState(zero, zero, zero, zero, jnp.int32(0)))
        for t in range(5):
            state, ts = step(state, jnp.int32(t % 2))  # Alternate pushes: stays upright.
            self.assertEqual(float(ts.reward), 1.0)
            self.assertFalse(bool(ts.first))
            self.assertFalse(bool(ts.terminated))
            self.assertEqual(bool(ts.truncated), t == 4)
            self.assertEqual(bool(ts.last), t == 4)
        self.assertLess(float(jnp.abs(ts.observation[jnp.array([0, 2])]).max()), 0.05)

        state, ts = step(state, jnp.int32(1))
        self.assertTrue(bool(ts.first))
        self.assertFalse(bool(ts.last))
        self.assertEqual(float(ts.reward), 0.0)
        self.assertTrue(bool((jnp.abs(ts.observation) <= 0.05).all()))
        self.assertEqual(int(state[0].steps), 0)
        state, ts = step(state, jnp.int32(1))
        self.assertEqual(int(state[0].steps), 1)
        self.assertFalse(bool(ts.first))

    @chex.variants(with_jit=True, without_jit=True)
    def test_termination_then_auto_reset(self):
        step = self.variant(CARTPOLE.step)
        state, _ = CARTPOLE.reset(jax.random.key(4))
        # Falling right fast: theta crosses 12 degrees within a step.
        f = jnp.float32
        state = _replace_inner(state, CartPoleState(f(0.0), f(0.0), f(0.2), f(2.0), jnp.int32(7)))
        state, ts = step(state, jnp.int32(0))
        self.assertTrue(bool(ts.terminated) and bool(ts.last))
        self.assertFalse(bool(ts.truncated))
        self.assertEqual(float(ts.reward), 1.0)
        self.assertGreater(float(ts.observation[2]), THETA_THRESHOLD)
        state_a, ts_a = step(state, jnp.int32(0))
        state_b, ts_b = step(state, jnp.int32(1))
        chex.assert_trees_all_equal((state_a, ts_a), (state_b, ts_b))
        self.assertTrue(bool(ts_a.first))
        self.assertEqual(float(ts_a.reward), 0.0)
        self.assertEqual(int(state_a[0].steps), 0)

    def test_batched_scan(self):
        max_steps = 20
        env = make_cartpole(max_episode_steps=max_steps)
        ts0, timesteps = _rollout(env, jax.random.key(5), 64, 300)
        _check_episode_boundaries(ts0, timesteps)
        assert np.isfinite(timesteps.observation).all()
        np.testing.assert_array_equal(timesteps.reward[~timesteps.first], 1.0)

        obs = timesteps.observation
        out = (np.abs(obs[..., 0]) > X_THRESHOLD) | (np.abs(obs[..., 2]) > THETA_THRESHOLD)
        np.testing.assert_array_equal(timesteps.terminated, out)
        counts = _episode_step_counts(timesteps)
        assert counts.max() <= max_steps
        np.testing.assert_array_equal(timesteps.truncated, (counts == max_steps) & ~out)
        # A random policy both drops the pole and survives to the limit.
        self.assertGreater(timesteps.terminated.sum(), 50)
        self.assertGreater(timesteps.truncated.sum(), 10)

    def test_spec(self):
        env = make_cartpole()
        self.assertEqual(env.name, "cartpole")
        self.assertEqual(env.observation_shape, (4,))
        self.assertEqual(env.num_actions, 2)
        self.assertEqual(env.num_players, 1)
        self.assertEqual(env.max_episode_steps, 500)
        self.assertEqual(env.reward_range, (0.0, 1.0))
        with pytest.raises(ValueError, match="max_episode_steps"):
            make_cartpole(max_episode_steps=0)


def test_registry():
    assert ENV_NAMES == ("catch", "cartpole", "tic_tac_toe", "connect_four", "go_9x9")
    for name in ENV_NAMES:
        env = make_env(name)
        assert isinstance(env, Environment)
        assert env.name == name
    assert make_env("catch", rows=6, columns=3).observation_shape == (6, 3)
    assert make_env("cartpole", max_episode_steps=50).max_episode_steps == 50


def test_make_env_unknown_name():
    with pytest.raises(ValueError, match=r"unknown environment 'foo'; known: catch, cartpole"):
        make_env("foo")
