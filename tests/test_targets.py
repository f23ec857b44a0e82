"""Hand-computed n-step targets: episode ends, truncation, two-player signs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from muzero_jax.replay import Trajectory
from muzero_jax.targets import make_targets, n_step_values


def _seq(rewards, last=(), terminated=(), truncated=(), num_actions=2):
    length = len(rewards)
    flag = lambda idx: jnp.zeros(length, bool).at[jnp.asarray(idx, jnp.int32)].set(True) \
        if len(idx) else jnp.zeros(length, bool)
    policy = jnp.tile(jnp.arange(1, num_actions + 1, dtype=jnp.float32), (length, 1))
    policy = policy / policy.sum(-1, keepdims=True)
    return Trajectory(
        observation=jnp.arange(length, dtype=jnp.float32)[:, None],
        action=jnp.arange(length, dtype=jnp.int32) % num_actions,
        reward=jnp.asarray(rewards, jnp.float32),
        first=jnp.zeros(length, bool),
        last=flag(last),
        terminated=flag(terminated),
        truncated=flag(truncated),
        legal_action_mask=jnp.ones((length, num_actions), bool),
        to_play=jnp.zeros(length, jnp.int32),
        search_policy=policy,
        search_value=jnp.full((length,), 7.0),
    )


class TargetsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_no_episode_end(self):
        # K=2, n=3, gamma=0.5, L=6; rewards r_t on arriving at row t.
        seq = _seq([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        boot = jnp.asarray([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
        t = self.variant(lambda s, b: make_targets(s, b, num_unroll_steps=2, td_steps=3,
                                                    discount=0.5))(seq, boot)
        # z_0 = 1 + .5*2 + .25*3 + .125*40 = 7.75
        # z_1 = 2 + .5*3 + .25*4 + .125*50 = 10.75
        # z_2 = 3 + .5*4 + .25*5 + .125*60 = 13.75
        np.testing.assert_allclose(t.value, [7.75, 10.75, 13.75])
        np.testing.assert_allclose(t.reward, [0.0, 1.0, 2.0])
        np.testing.assert_array_equal(t.actions, [0, 1])
        np.testing.assert_array_equal(t.value_mask, 1.0)
        np.testing.assert_array_equal(t.reward_mask, [0.0, 1.0, 1.0])
        np.testing.assert_array_equal(t.policy_mask, 1.0)
        np.testing.assert_allclose(t.policy[0], [1 / 3, 2 / 3], rtol=1e-6)

    def test_termination_is_absorbing(self):
        # Episode terminates at row 2 (reward 1 on arriving there).
        seq = _seq([0.0, 0.0, 1.0, 0.0, 0.0, 0.0], last=[2], terminated=[2])
        boot = jnp.full((6,), 100.0)
        t = make_targets(seq, boot, num_unroll_steps=3, td_steps=2, discount=0.9)
        # z_0 = 0 + .9*1 + (row 2 terminal: no bootstrap) = 0.9; z_1 = 1; z_2 = 0; z_3 = 0.
        np.testing.assert_allclose(t.value, [0.9, 1.0, 0.0, 0.0], rtol=1e-6)
        np.testing.assert_allclose(t.reward, [0.0, 0.0, 1.0, 0.0])
        np.testing.assert_array_equal(t.value_mask, [1, 1, 1, 1])  # absorbing: trained to 0
        np.testing.assert_array_equal(t.reward_mask, [0, 1, 1, 1])
        np.testing.assert_array_equal(t.policy_mask, [1, 1, 0, 0])

    def test_truncation_bootstraps_and_masks_beyond(self):
        # Time limit at row 2: bootstrap from row 2's value; nothing known after.
        seq = _seq([0.0, 1.0, 1.0, 0.0, 1.0, 1.0], last=[2], truncated=[2])
        boot = jnp.asarray([0.0, 0.0, 50.0, 0.0, 0.0, 0.0])
        t = make_targets(seq, boot, num_unroll_steps=3, td_steps=2, discount=0.5)
        # z_0 = 1 + .5*1 + .25*50 = 14; z_1 = 1 + .5*50 = 26; z_2 = 50 (bootstrap).
        np.testing.assert_allclose(t.value[:3], [14.0, 26.0, 50.0])
        np.testing.assert_array_equal(t.value_mask, [1, 1, 1, 0])
        np.testing.assert_array_equal(t.reward_mask, [0, 1, 1, 0])
        np.testing.assert_array_equal(t.policy_mask, [1, 1, 0, 0])

    def test_two_player_signs_alternate(self):
        # Player to move alternates; rewards are the mover's. The final move at
        # row 2 wins (+1 to the player who moved at row 2, i.e. reward at row 3).
        seq = _seq([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], last=[3], terminated=[3])
        boot = jnp.zeros((7,))
        t = make_targets(seq, boot, num_unroll_steps=3, td_steps=3, discount=-1.0)
        # Row 2's mover wins: +1; row 1's mover loses: -1; row 0's mover wins: +1.
        np.testing.assert_allclose(t.value, [1.0, -1.0, 1.0, 0.0])

    def test_n_step_values_vmaps(self):
        rewards = jnp.ones((4, 6))
        boot = jnp.zeros((4, 6))
        term = jnp.zeros((4, 6), bool)
        ends = jnp.asarray([6, 3, 1, 0], jnp.int32)
        out = jax.vmap(lambda r, b, t, e: n_step_values(
            r, b, t, e, positions=2, td_steps=3, discount=1.0))(rewards, boot, term, ends)
        # steps m_j = min(3, end - j): rows past `end` are 0.
        np.testing.assert_allclose(out, [[3, 3], [3, 2], [1, 0], [0, 0]])
