"""Hand-computed n-step targets: episode ends, truncation, two-player signs."""

import types

import chex
import jax
import jax.numpy as jnp
import numpy as np

from muzero_jax.learning import make_bootstrap_values
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

    def test_search_value_mix_averages_outcome_and_stored_search_value(self):
        # The game of test_two_player_signs_alternate, with the search values
        # stored at each row: w = 0.25 gives 0.75 z_j + 0.25 q_j before the
        # end; the terminal row's target stays 0 (its stored 0.3 is not read).
        seq = _seq([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], last=[3], terminated=[3])
        seq = seq._replace(search_value=jnp.asarray([0.5, -0.2, 0.8, 0.3, 9.0, 9.0, 9.0]))
        boot = jnp.zeros((7,))
        t = make_targets(seq, boot, num_unroll_steps=3, td_steps=3, discount=-1.0,
                         search_value_mix=0.25)
        # z = [1, -1, 1, 0]: 0.75 + 0.125, -0.75 - 0.05, 0.75 + 0.2, 0.
        np.testing.assert_allclose(t.value, [0.875, -0.8, 0.95, 0.0], rtol=1e-6)
        full = make_targets(seq, boot, num_unroll_steps=3, td_steps=3, discount=-1.0,
                            search_value_mix=1.0)
        np.testing.assert_allclose(full.value, [0.5, -0.2, 0.8, 0.0], rtol=1e-6)

    def test_n_step_values_vmaps(self):
        rewards = jnp.ones((4, 6))
        boot = jnp.zeros((4, 6))
        term = jnp.zeros((4, 6), bool)
        ends = jnp.asarray([6, 3, 1, 0], jnp.int32)
        out = jax.vmap(lambda r, b, t, e: n_step_values(
            r, b, t, e, positions=2, td_steps=3, discount=1.0))(rewards, boot, term, ends)
        # steps m_j = min(3, end - j): rows past `end` are 0.
        np.testing.assert_allclose(out, [[3, 3], [3, 2], [1, 0], [0, 0]])


def _counting_inference(calls):
    """A stand-in `initial_inference`: value `10 * observation + params`,
    recording each time it runs (not when a `lax.cond` skips it)."""

    def initial_inference(params, observation):
        jax.debug.callback(lambda: calls.append(observation.shape[0]))
        return types.SimpleNamespace(value_logits=10.0 * observation[:, 0] + params)

    return initial_inference


_IDENTITY_SUPPORT = types.SimpleNamespace(logits_to_scalar=lambda x: x)


def _batch(*seqs):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *seqs)


def test_bootstrap_values_run_the_target_network_only_when_a_return_needs_it():
    # K=2, n=3, L=6: return j bootstraps from row min(j + 3, e).
    calls = []
    fn = jax.jit(make_bootstrap_values(_counting_inference(calls), _IDENTITY_SUPPORT,
                                       value_target="target_network",
                                       num_unroll_steps=2, td_steps=3))
    short = _seq([0.0] * 6, last=[2], terminated=[2])        # rows 2, 2, 2: terminal
    longer = _seq([0.0] * 6, last=[4], terminated=[4])       # rows 3, 4, 4: row 3 is not
    truncated = _seq([0.0] * 6, last=[2], truncated=[2])     # rows 2, 2, 2: bootstrap there

    # Every return ends at a terminal row: no forward pass, all zeros.
    out = fn(jnp.float32(0.5), _batch(short, short))
    jax.effects_barrier()
    assert calls == []
    np.testing.assert_array_equal(out, np.zeros((2, 6)))

    # One return bootstraps from a running row: the whole batch's K + 1 rows are
    # evaluated, each at the row its returns read (value 10 * row + 0.5).
    out = fn(jnp.float32(0.5), _batch(short, longer))
    jax.effects_barrier()
    assert calls == [2 * 3]
    expected = np.zeros((2, 6), np.float32)
    expected[0, 2] = 20.5
    expected[1, 3], expected[1, 4] = 30.5, 40.5
    np.testing.assert_allclose(out, expected)

    # A time limit is not a terminal state: its final row is bootstrapped from.
    calls.clear()
    out = fn(jnp.float32(0.5), _batch(truncated, short))
    jax.effects_barrier()
    assert calls == [2 * 3]
    np.testing.assert_allclose(out[0], [0.0, 0.0, 20.5, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(out[1], [0.0, 0.0, 20.5, 0.0, 0.0, 0.0])

    # Stored search values need no network.
    calls.clear()
    search = make_bootstrap_values(_counting_inference(calls), _IDENTITY_SUPPORT,
                                   value_target="search", num_unroll_steps=2, td_steps=3)
    np.testing.assert_array_equal(search(0.5, _batch(short, longer)), np.full((2, 6), 7.0))
    jax.effects_barrier()
    assert calls == []


def test_skipping_the_target_network_leaves_the_targets_unchanged():
    # The values a skipped pass would have given sit at terminal rows, which
    # the returns read as 0: the targets equal those built from the full pass.
    # Rewards 1, 2 on arriving at rows 1, 2; the game ends at row 2; gamma -1.
    seq = _seq([0.0, 1.0, 2.0, 0.0, 0.0, 0.0], last=[2], terminated=[2])
    skipped = make_bootstrap_values(_counting_inference([]), _IDENTITY_SUPPORT,
                                    value_target="target_network",
                                    num_unroll_steps=2, td_steps=3)(0.5, _batch(seq))[0]
    full = jnp.zeros(6).at[2].set(20.5)  # what the network would have written
    kw = dict(num_unroll_steps=2, td_steps=3, discount=-1.0)
    a, b = make_targets(seq, skipped, **kw), make_targets(seq, full, **kw)
    # Hand-computed: z_0 = 1 - 2 = -1, z_1 = 2, z_2 = 0 (terminal).
    np.testing.assert_allclose(a.value, [-1.0, 2.0, 0.0])
    chex.assert_trees_all_equal(a, b)
