"""Tests for muzero_jax.replay: layout, valid starts, sampling statistics.

Compilation dominates the run time on CPU, so the tests share a few buffer
configurations whose jitted functions are built once (`buffers`) and add
chunks of only a few distinct lengths.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax import replay
from muzero_jax.replay import (
    ReplayBuffer,
    ReplayState,
    Trajectory,
    make_replay_buffer,
    valid_start_mask,
)

NUM_ACTIONS = 3
EPS = 1e-6

# Two environments of 8 rows, sequences of 3: small enough to reason by hand.
SMALL = dict(num_envs=2, capacity=8, sequence_length=3, batch_size=16)
# For statistics: 27 rows is 4 cache blocks of 8 (the last one partial).
STATS = dict(num_envs=3, capacity=27, sequence_length=4, batch_size=512)


@dataclasses.dataclass(frozen=True)
class Jitted:
    num_envs: int
    buffer: ReplayBuffer
    add: Callable
    sample: Callable
    set_priorities: Callable
    can_sample: Callable
    valid: Callable


# These tests check values, not speed: compile with little LLVM optimisation (~3x faster).
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@functools.cache
def _buffers(items: tuple) -> Jitted:
    kwargs = dict(items)
    buffer = make_replay_buffer(**kwargs)
    length = kwargs["sequence_length"]
    return Jitted(
        num_envs=kwargs["num_envs"],
        buffer=buffer,
        add=jit(buffer.add),
        sample=jit(buffer.sample),
        set_priorities=jit(buffer.set_priorities),
        can_sample=jit(buffer.can_sample),
        valid=jit(functools.partial(valid_start_mask, sequence_length=length)),
    )


def buffers(config: dict, **overrides) -> Jitted:
    """The (cached) buffer for `config` with jitted functions."""
    return _buffers(tuple(sorted({**config, **overrides}.items())))


def example_row(obs_shape=(2,)) -> Trajectory:
    return Trajectory(
        observation=np.zeros(obs_shape, np.float32),
        action=np.zeros((), np.int32),
        reward=np.zeros((), np.float32),
        first=np.zeros((), bool),
        last=np.zeros((), bool),
        terminated=np.zeros((), bool),
        truncated=np.zeros((), bool),
        legal_action_mask=np.ones((NUM_ACTIONS,), bool),
        to_play=np.zeros((), np.int32),
        search_policy=np.zeros((NUM_ACTIONS,), np.float32),
        search_value=np.zeros((), np.float32),
    )


def chunk(num_envs: int, start: int, length: int, last_times=(), obs_shape=(2,)) -> Trajectory:
    """Rows for times `start .. start + length - 1` of every environment.

    `observation[..., 0]` is the time counter and `observation[..., 1]` the
    environment index (other observation entries are zero); `action`, `reward`
    and `search_value` repeat the time counter. `last_times` holds `(env,
    time)` pairs, or times (then for all environments).
    """
    shape = (num_envs, length)
    times = np.broadcast_to(np.arange(start, start + length), shape)
    obs = np.zeros(shape + (int(np.prod(obs_shape)),), np.float32)
    obs[..., 0] = times
    obs[..., 1] = np.arange(num_envs)[:, None]
    last = np.zeros(shape, bool)
    for item in last_times:
        env, time = item if isinstance(item, tuple) else (slice(None), item)
        if start <= time < start + length:
            last[env, time - start] = True
    return Trajectory(
        observation=obs.reshape(shape + obs_shape),
        action=times.astype(np.int32),
        reward=times.astype(np.float32),
        first=np.zeros(shape, bool),
        last=last,
        terminated=last,
        truncated=np.zeros(shape, bool),
        legal_action_mask=np.ones(shape + (NUM_ACTIONS,), bool),
        to_play=np.zeros(shape, np.int32),
        search_policy=np.full(shape + (NUM_ACTIONS,), 1.0 / NUM_ACTIONS, np.float32),
        search_value=times.astype(np.float32),
    )


def fill(jitted: Jitted, lengths, last_times=(), start=0, state=None) -> ReplayState:
    """Adds consecutive chunks of the given lengths (times from `start`)."""
    if state is None:
        state = jitted.buffer.init(example_row())
    for length in lengths:
        state = jitted.add(state, chunk(jitted.num_envs, start, length, last_times))
        start += length
    return state


def set_all(jitted: Jitted, state: ReplayState, priorities) -> ReplayState:
    """Sets the priority of every row from a `[B, N]` array."""
    num_envs, capacity = state.priorities.shape
    envs, times = np.meshgrid(np.arange(num_envs), np.arange(capacity), indexing="ij")
    return jitted.set_priorities(state, envs, times, np.asarray(priorities, np.float32))


def time_counter(state: ReplayState) -> np.ndarray:
    return np.asarray(state.data.observation[..., 0])


def expected_block_stats(state, sequence_length, alpha, prioritized):
    """Per-block (weight sum, valid count), recomputed from scratch in numpy."""
    valid = np.asarray(jit(valid_start_mask, static_argnums=1)(state, sequence_length))
    prio = np.asarray(state.priorities, np.float64)
    weight = np.where(valid, prio**alpha if prioritized else 1.0, 0.0)
    num_envs, capacity = valid.shape
    block = replay._default_block_size(capacity)
    num_blocks = -(-capacity // block)
    pad = ((0, 0), (0, num_blocks * block - capacity))
    weight = np.pad(weight, pad).reshape(num_envs, num_blocks, block)
    valid = np.pad(valid, pad).reshape(num_envs, num_blocks, block)
    return weight.sum(-1), valid.sum(-1)


def draw(jitted: Jitted, state, num_batches, beta=1.0, seed=0):
    """Concatenated (env, time, probabilities, weights) over many batches."""
    keys = jax.random.split(jax.random.PRNGKey(seed), num_batches)
    out = [jitted.sample(state, key, beta) for key in keys]
    return tuple(
        np.concatenate([np.asarray(getattr(s, name)) for s in out])
        for name in ("env_index", "time_index", "probabilities", "weights")
    )


def assert_frequencies(env, time, probabilities: np.ndarray):
    """Sample counts per row match `probabilities` ([B, N], summing to 1)."""
    counts = np.zeros(probabilities.shape)
    np.add.at(counts, (env, time), 1)
    support = probabilities > 0
    assert np.all(counts[~support] == 0), "sampled a row outside the support"
    expected = env.size * probabilities[support]
    stat = np.sum((counts[support] - expected) ** 2 / expected)
    dof = support.sum() - 1
    # Far in the chi-square tail (~6 sigma); the seeds are fixed anyway.
    assert stat < dof + 6.0 * np.sqrt(2.0 * dof) + 10.0, (stat, dof)


# ---------------------------------------------------------------------------
# Layout.


def test_init_shapes_and_dtypes():
    buffer = buffers(SMALL).buffer
    state = buffer.init(example_row((4, 5)))
    assert state.data.observation.shape == (2, 8, 4, 5)
    assert state.data.observation.dtype == jnp.float32
    assert state.data.legal_action_mask.shape == (2, 8, NUM_ACTIONS)
    assert state.data.legal_action_mask.dtype == jnp.bool_
    assert state.data.action.dtype == jnp.int32
    assert state.priorities.shape == (2, 8) and state.priorities.dtype == jnp.float32
    np.testing.assert_array_equal(state.priorities, 0.0)
    assert state.insert_index.dtype == jnp.int32 and int(state.insert_index) == 0
    assert state.num_added.dtype == jnp.int32 and int(state.num_added) == 0
    assert state.max_priority.dtype == jnp.float32 and float(state.max_priority) == 1.0
    assert not bool(buffer.can_sample(state))


def test_add_wraps_along_time():
    jitted = buffers(SMALL)
    state = fill(jitted, [5])
    np.testing.assert_array_equal(time_counter(state), [[0, 1, 2, 3, 4, 0, 0, 0]] * 2)
    np.testing.assert_array_equal(state.priorities, [[1, 1, 1, 1, 1, 0, 0, 0]] * 2)
    assert int(state.insert_index) == 5 and int(state.num_added) == 5

    state = fill(jitted, [5], start=5, state=state)  # Times 5..7 -> rows 5..7, 8, 9 -> 0, 1.
    np.testing.assert_array_equal(time_counter(state), [[8, 9, 2, 3, 4, 5, 6, 7]] * 2)
    np.testing.assert_array_equal(state.data.observation[..., 1], [[0] * 8, [1] * 8])
    np.testing.assert_array_equal(state.data.reward, [[8, 9, 2, 3, 4, 5, 6, 7]] * 2)
    np.testing.assert_array_equal(state.priorities, 1.0)
    assert int(state.insert_index) == 2 and int(state.num_added) == 10

    state = fill(jitted, [8], start=10, state=state)  # T == N: every row, from row 2.
    np.testing.assert_array_equal(time_counter(state), [[16, 17, 10, 11, 12, 13, 14, 15]] * 2)
    assert int(state.insert_index) == 2 and int(state.num_added) == 18


def test_num_added_saturates():
    jitted = buffers(SMALL)
    state = fill(jitted, [5, 5])
    state = state._replace(num_added=jnp.int32(2**31 - 3))
    state = fill(jitted, [5], start=10, state=state)
    assert int(state.num_added) == 2**31 - 1
    assert int(state.insert_index) == 7
    # Rows hold times [8, ..., 14, 7]; row 7 is the oldest and 13, 14 the newest.
    np.testing.assert_array_equal(time_counter(state)[0], [8, 9, 10, 11, 12, 13, 14, 7])
    np.testing.assert_array_equal(jitted.valid(state)[0], [1, 1, 1, 1, 1, 0, 0, 1])


def test_new_rows_get_max_priority():
    jitted = buffers(SMALL)
    state = fill(jitted, [5])
    state = jitted.set_priorities(state, np.array([0, 1]), np.array([1, 2]), np.array([5.0, -7.0]))
    assert float(state.max_priority) == pytest.approx(7.0 + EPS)
    state = jitted.set_priorities(state, np.array([0, 1]), np.array([0, 0]), np.array([2.0, 0.5]))
    assert float(state.max_priority) == pytest.approx(7.0 + EPS)  # Never decreases.
    state = fill(jitted, [2], start=5, state=state)
    top = 7 + EPS
    expected = [[2 + EPS, 5 + EPS, 1, 1, 1, top, top, 0], [0.5 + EPS, 1, top, 1, 1, top, top, 0]]
    np.testing.assert_allclose(state.priorities, expected, rtol=1e-6)


# ---------------------------------------------------------------------------
# Valid starts.


def test_valid_starts_need_sequence_length_rows():
    jitted = buffers(SMALL)
    state = fill(jitted, [2])
    assert not np.any(jitted.valid(state)) and not bool(jitted.can_sample(state))
    state = fill(jitted, [1], start=2, state=state)
    np.testing.assert_array_equal(jitted.valid(state)[1], [1, 0, 0, 0, 0, 0, 0, 0])
    assert bool(jitted.can_sample(state))
    state = fill(jitted, [2], start=3, state=state)
    np.testing.assert_array_equal(jitted.valid(state)[1], [1, 1, 1, 0, 0, 0, 0, 0])
    state = fill(jitted, [1, 2], start=5, state=state)  # Full: rows 0..7 hold times 0..7.
    np.testing.assert_array_equal(jitted.valid(state)[1], [1, 1, 1, 1, 1, 1, 0, 0])


def test_valid_starts_do_not_cross_from_newest_to_oldest():
    jitted = buffers(SMALL)
    state = fill(jitted, [5, 5])
    np.testing.assert_array_equal(time_counter(state)[0], [8, 9, 2, 3, 4, 5, 6, 7])
    # Row 7 (times 7, 8, 9) wraps around the buffer but is contiguous in time;
    # rows 0 and 1 would run from time 9 (the newest) into time 2 (the oldest).
    np.testing.assert_array_equal(jitted.valid(state)[0], [0, 0, 1, 1, 1, 1, 1, 1])


def test_valid_starts_skip_last_rows_only():
    jitted = buffers(SMALL)
    state = fill(jitted, [5, 5], last_times=[(0, 4), (1, 8), (1, 9)])
    # Rows hold times [8, 9, 2, 3, 4, 5, 6, 7].
    expected = [
        [0, 0, 1, 1, 0, 1, 1, 1],  # Time 4 ends an episode: row 4 cannot start, 3 can.
        [0, 0, 1, 1, 1, 1, 1, 1],  # Times 8, 9 end episodes in rows invalid anyway.
    ]
    np.testing.assert_array_equal(jitted.valid(state), np.asarray(expected, bool))
    assert int(state.block_counts.sum()) == 11


@pytest.mark.parametrize("prioritized, alpha", [(True, 0.6), (False, 1.0)])
def test_cached_block_stats_match_full_recompute(prioritized, alpha):
    jitted = buffers(STATS, prioritized=prioritized, alpha=alpha)
    rng = np.random.default_rng(0)
    last_times = [(int(rng.integers(3)), int(t)) for t in rng.integers(0, 100, 20)]
    state, start = jitted.buffer.init(example_row()), 0
    # T = 1 recomputes only the blocks it touches; T = 9 recomputes all 4.
    for step, length in enumerate([9, 1, 1, 1, 9, 1, 9, 9, 1, 1, 9, 1]):
        state = fill(jitted, [length], last_times, start, state)
        start += length
        if step % 2 and bool(jitted.can_sample(state)):
            sample = jitted.sample(state, jax.random.PRNGKey(step), 1.0)
            new = rng.uniform(0.0, 3.0, size=sample.env_index.shape)
            state = jitted.set_priorities(state, sample.env_index, sample.time_index, new)
        weights, counts = expected_block_stats(state, STATS["sequence_length"], alpha, prioritized)
        np.testing.assert_array_equal(state.block_counts, counts)
        np.testing.assert_allclose(state.block_weights, weights, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Sampled contents.


def test_sequences_equal_added_rows():
    jitted = buffers(STATS)
    capacity, length = STATS["capacity"], STATS["sequence_length"]
    state = fill(jitted, [9, 9, 9, 9])  # 36 rows: wrapped.
    sample = jitted.sample(state, jax.random.PRNGKey(0), 1.0)
    env, start = np.asarray(sample.env_index), np.asarray(sample.time_index)
    seq = sample.sequences
    chex.assert_shape(seq.observation, (512, length, 2))
    chex.assert_shape(seq.legal_action_mask, (512, length, NUM_ACTIONS))
    times = np.asarray(seq.observation[..., 0])
    # Consecutive time counters, from the right environment and buffer rows.
    np.testing.assert_array_equal(np.diff(times, axis=1), 1.0)
    np.testing.assert_array_equal(seq.observation[..., 1], np.repeat(env[:, None], length, 1))
    rows = (start[:, None] + np.arange(length)) % capacity
    np.testing.assert_array_equal(times, time_counter(state)[env[:, None], rows])
    np.testing.assert_array_equal(seq.action, times.astype(np.int32))
    np.testing.assert_array_equal(seq.search_value, times)
    assert np.any(start > capacity - length), "no wrapping sequence was drawn"


def test_sequence_wraps_around_the_buffer_end():
    jitted = buffers(SMALL)
    state = fill(jitted, [5, 5])  # Rows hold times [8, 9, 2, 3, 4, 5, 6, 7].
    priorities = np.zeros((2, 8))
    priorities[0, 7] = 1e6  # Everything else gets EPS.
    sample = jitted.sample(set_all(jitted, state, priorities), jax.random.PRNGKey(0), 1.0)
    np.testing.assert_array_equal(sample.env_index, 0)
    np.testing.assert_array_equal(sample.time_index, 7)
    np.testing.assert_allclose(sample.probabilities, 1.0, rtol=1e-6)
    np.testing.assert_array_equal(sample.sequences.observation[..., 0], [[7, 8, 9]] * 16)


def test_sequence_length_equal_to_capacity():
    jitted = buffers(SMALL, sequence_length=8)
    state = fill(jitted, [5, 5])  # Rows hold times [8, 9, 2, ..., 7]: one valid start.
    np.testing.assert_array_equal(jitted.valid(state)[0], [0, 0, 1, 0, 0, 0, 0, 0])
    sample = jitted.sample(state, jax.random.PRNGKey(0), 1.0)
    np.testing.assert_array_equal(sample.sequences.observation[..., 0], [list(range(2, 10))] * 16)


# ---------------------------------------------------------------------------
# Sampling statistics.


def test_uniform_sampling_matches_valid_starts():
    jitted = buffers(STATS, prioritized=False)
    state = fill(jitted, [9, 9, 9, 9], last_times=[(0, 15), (1, 34), (2, 10), (2, 30)])
    state = set_all(jitted, state, np.arange(81.0).reshape(3, 27))  # Ignored when uniform.
    # Rows 0..8 hold times 27..35 and rows 9..26 times 9..26: the 3 rows before
    # insert_index 9 cannot start 4 rows. Times 15, 10, 30 end episodes in
    # (env, row) (0, 15), (2, 10), (2, 3); time 34 sits in invalid row 7.
    valid = np.ones((3, 27), bool)
    valid[:, 6:9] = False
    valid[0, 15] = valid[2, 10] = valid[2, 3] = False
    np.testing.assert_array_equal(jitted.valid(state), valid)
    assert valid.sum() == 69

    env, time, probabilities, weights = draw(jitted, state, 30, beta=0.7)
    assert_frequencies(env, time, valid / valid.sum())
    counts = np.zeros((3, 27))
    np.add.at(counts, (env, time), 1)
    assert np.all(counts[valid] > 0)
    np.testing.assert_allclose(probabilities, 1.0 / 69, rtol=1e-6)
    np.testing.assert_array_equal(weights, 1.0)


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_prioritized_sampling_matches_priorities(alpha):
    jitted = buffers(STATS, alpha=alpha)
    state = fill(jitted, [9, 9, 9, 9], last_times=[(1, 20), (2, 28)])
    given = np.random.default_rng(1).uniform(0.05, 2.0, size=(3, 27)).astype(np.float32)
    state = set_all(jitted, state, given)

    valid = np.asarray(jitted.valid(state))
    assert valid.sum() == 3 * 24 - 2
    target = np.where(valid, (given.astype(np.float64) + EPS) ** alpha, 0.0)
    target /= target.sum()

    env, time, probabilities, _ = draw(jitted, state, 40, seed=int(10 * alpha))
    np.testing.assert_allclose(probabilities, target[env, time], rtol=2e-5)
    assert_frequencies(env, time, target)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_importance_weights_follow_formula(beta):
    jitted = buffers(STATS)
    state = fill(jitted, [9, 9, 9])  # Exactly full: rows 0..23 are valid starts.
    envs, times = np.meshgrid(np.arange(3), np.arange(27), indexing="ij")
    state = set_all(jitted, state, 1.0 + times + 5.0 * envs)
    sample = jitted.sample(state, jax.random.PRNGKey(3), beta)

    num_valid = 3 * 24
    priority = 1.0 + np.asarray(sample.time_index) + 5.0 * np.asarray(sample.env_index) + EPS
    probability = priority / (1.0 + times[:, :24] + 5.0 * envs[:, :24] + EPS).sum()
    np.testing.assert_allclose(sample.probabilities, probability, rtol=1e-5)
    weights = (num_valid * probability) ** (-beta)
    np.testing.assert_allclose(sample.weights, weights / weights.max(), rtol=1e-5)
    assert float(np.max(sample.weights)) == pytest.approx(1.0)


def test_set_priorities_concentrates_sampling():
    jitted = buffers(STATS)
    state = fill(jitted, [9, 9, 9, 9])  # 3 * 24 valid starts, priority 1.
    state = jitted.set_priorities(
        state, np.array([2, 2, 0]), np.array([17, 17, 3]), np.array([-1000.0, 1000.0, 0.0])
    )
    assert float(state.priorities[2, 17]) == pytest.approx(1000.0)
    assert float(state.priorities[0, 3]) == pytest.approx(EPS)
    assert float(state.max_priority) == pytest.approx(1000.0)

    env, time, _, weights = draw(jitted, state, 4)
    hot = (env == 2) & (time == 17)
    expected = 1000.0 / (1000.0 + (3 * 24 - 2) + EPS)  # The others keep priority 1.
    assert abs(hot.mean() - expected) < 0.03
    assert not np.any((env == 0) & (time == 3))
    assert np.all(weights[hot] == weights.min())  # Most likely, so smallest weight.


def test_sample_of_empty_buffer_is_finite():
    jitted = buffers(SMALL)
    state = fill(jitted, [2])
    assert not bool(jitted.can_sample(state))
    sample = jitted.sample(state, jax.random.PRNGKey(0), 1.0)
    np.testing.assert_array_equal(sample.probabilities, 0.0)
    np.testing.assert_array_equal(sample.weights, 0.0)
    assert np.all((sample.env_index >= 0) & (sample.env_index < 2))
    assert np.all((sample.time_index >= 0) & (sample.time_index < 8))


def test_state_without_cache_samples_identically():
    jitted = buffers(STATS, alpha=0.6)
    state = fill(jitted, [9, 9, 9, 9], last_times=[7, 30])
    state = set_all(jitted, state, np.linspace(0.1, 5.0, 81).reshape(3, 27))
    bare = ReplayState(*state[:5])  # As another module might build it: no cache.
    assert bare.block_weights is None and bare.block_counts is None
    key = jax.random.PRNGKey(5)
    cached, uncached = jitted.sample(state, key, 0.5), jitted.sample(bare, key, 0.5)
    np.testing.assert_array_equal(cached.env_index, uncached.env_index)
    np.testing.assert_array_equal(cached.time_index, uncached.time_index)
    np.testing.assert_allclose(cached.weights, uncached.weights, rtol=1e-6)
    bare = jitted.set_priorities(fill(jitted, [1], start=36, state=bare), 0, 0, 1.0)
    assert bare.block_weights is None and float(bare.priorities[0, 0]) == pytest.approx(1.0)


# ---------------------------------------------------------------------------
# Compilation.


class JitTest(chex.TestCase):
    @chex.variants(with_jit=True)
    def test_add_sample_set_priorities(self):
        buffer = buffers(SMALL).buffer
        add = self.variant(buffer.add)
        sample = self.variant(buffer.sample)
        set_priorities = self.variant(buffer.set_priorities)
        state = buffer.init(example_row())
        for start in range(0, 20, 5):
            state = add(state, chunk(2, start, 5))
        out = sample(state, jax.random.PRNGKey(0), 0.5)
        state = set_priorities(state, out.env_index, out.time_index, jnp.arange(16.0))
        out = sample(state, jax.random.PRNGKey(1), 0.5)
        chex.assert_shape([out.env_index, out.time_index, out.probabilities, out.weights], (16,))
        chex.assert_tree_all_finite(out)
        # Rows hold times [16, ..., 19, 12, ..., 15]: no start at rows 2 and 3.
        assert not np.any(np.isin(out.time_index, [2, 3]))


def test_donated_jit_loop():
    buffer = buffers(SMALL).buffer

    @functools.partial(jit, donate_argnums=0)
    def step(state, trajectory, key):
        state = buffer.add(state, trajectory)
        out = buffer.sample(state, key, 1.0)
        new = jnp.abs(out.sequences.reward[:, 0]) + 1.0
        return buffer.set_priorities(state, out.env_index, out.time_index, new), out

    state = buffer.init(example_row())
    for i in range(7):
        state, out = step(state, chunk(2, 5 * i, 5), jax.random.PRNGKey(i))
    np.testing.assert_array_equal(np.diff(out.sequences.observation[..., 0], axis=1), 1.0)
    assert int(state.num_added) == 35 and int(state.insert_index) == 35 % 8
    weights, counts = expected_block_stats(state, 3, 1.0, True)
    np.testing.assert_allclose(state.block_weights, weights, rtol=1e-5)
    np.testing.assert_array_equal(state.block_counts, counts)


# ---------------------------------------------------------------------------
# Arguments.


@pytest.mark.parametrize(
    "override, name",
    [
        (dict(num_envs=0), "num_envs"),
        (dict(num_envs=2.0), "num_envs"),
        (dict(capacity=0), "capacity"),
        (dict(capacity=-5), "capacity"),
        (dict(sequence_length=0), "sequence_length"),
        (dict(sequence_length=9), "sequence_length"),
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=True), "batch_size"),
        (dict(alpha=-0.1), "alpha"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(epsilon=-1e-3), "epsilon"),
        (dict(prioritized=1), "prioritized"),
    ],
)
def test_bad_arguments_raise(override, name):
    with pytest.raises(ValueError, match=name):
        make_replay_buffer(**{**SMALL, **override})


def test_bad_trajectories_raise():
    buffer = buffers(SMALL).buffer
    state = buffer.init(example_row())
    with pytest.raises(ValueError, match="capacity"):
        buffer.add(state, chunk(2, 0, 9))
    with pytest.raises(ValueError, match="num_envs"):
        buffer.add(state, chunk(3, 0, 2))
    with pytest.raises(ValueError, match="does not match"):
        buffer.add(state, chunk(2, 0, 2, obs_shape=(3,)))
