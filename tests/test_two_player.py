"""Two-player zero-sum MuZero end to end: search signs, masks, value targets.

The network here is hand-made: a perfect TicTacToe model whose hidden state is
the board seen from the mover's side (+1 mover, -1 opponent), whose reward is
+1 for a move that completes a line, and whose value and policy carry no
knowledge (0 and uniform). Whatever the search knows about a position it must
get from looking ahead through `make_recurrent_fn(two_player=True)`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from muzero_jax.acting import init_actor, make_act_step, make_rollout
from muzero_jax.envs import make_env
from muzero_jax.networks import NetworkOutput, Networks
from muzero_jax.search import make_recurrent_fn, make_root_fn
from muzero_jax.targets import make_targets
from muzero_jax.value_transforms import make_support

VALUE = make_support(5)
REWARD = make_support(2)
LINES = np.array(
    [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
)


def _logits(support, x):
    return jnp.log(support.scalar_to_probs(x) + 1e-12)


def perfect_model_networks() -> Networks:
    """A hand-made TicTacToe model in MuZero's `Networks` shape.

    Hidden state `[B, 10]`: 9 cells from the mover's side, then a "game over"
    flag. After a terminal move the state is absorbing (reward 0).
    """

    def representation(params, obs):
        del params
        flat = obs.reshape(obs.shape[0], 9, 2)
        board = flat[..., 0] - flat[..., 1]
        return jnp.concatenate([board, jnp.zeros((obs.shape[0], 1))], axis=-1)

    def dynamics(params, hidden, action):
        del params
        board, over = hidden[:, :9], hidden[:, 9] > 0
        empty = board[jnp.arange(board.shape[0]), action] == 0
        placed = board + jax.nn.one_hot(action, 9) * empty[:, None]
        won = jnp.any(jnp.all(placed[:, LINES] == 1, axis=-1), axis=-1)
        full = jnp.all(placed != 0, axis=-1)
        reward = jnp.where(over, 0.0, won.astype(jnp.float32))
        next_over = over | won | full
        next_board = jnp.where(over[:, None], board, -placed)
        return jnp.concatenate([next_board, next_over[:, None]], axis=-1), _logits(REWARD, reward)

    def prediction(params, hidden):
        del params
        batch = hidden.shape[0]
        return jnp.zeros((batch, 9)), _logits(VALUE, jnp.zeros((batch,)))

    def initial_inference(params, obs):
        h = representation(params, obs)
        policy, value = prediction(params, h)
        return NetworkOutput(h, jnp.zeros((h.shape[0], REWARD.num_bins)), policy, value)

    def recurrent_inference(params, hidden, action):
        h, reward = dynamics(params, hidden, action)
        policy, value = prediction(params, h)
        return NetworkOutput(h, reward, policy, value)

    return Networks(
        init=lambda rng_key, obs: {},
        representation=representation,
        dynamics=dynamics,
        prediction=prediction,
        initial_inference=initial_inference,
        recurrent_inference=recurrent_inference,
        num_actions=9,
        value_bins=VALUE.num_bins,
        reward_bins=REWARD.num_bins,
    )


def board_observation(board: str) -> tuple[np.ndarray, np.ndarray]:
    """`(observation [3, 3, 2], legal [9])` for a board like "XO.|.X.|..." with X to move."""
    cells = board.replace("|", "")
    mine = np.array([c == "X" for c in cells], np.float32)
    theirs = np.array([c == "O" for c in cells], np.float32)
    return np.stack([mine, theirs], -1).reshape(3, 3, 2), np.array([c == "." for c in cells])


SEARCHES = {
    "gumbel_muzero": functools.partial(mctx.gumbel_muzero_policy, max_num_considered_actions=9),
    "muzero": mctx.muzero_policy,
}


@functools.cache
def _compiled_search(search_name, two_player, num_simulations):
    networks = perfect_model_networks()
    root_fn = make_root_fn(networks, VALUE)
    recurrent_fn = make_recurrent_fn(networks, VALUE, REWARD, discount=1.0, two_player=two_player)

    @jax.jit
    def search(obs, legal, rng_key):
        return SEARCHES[search_name](
            {}, rng_key, root_fn({}, obs), recurrent_fn,
            num_simulations=num_simulations, invalid_actions=~legal,
        )

    return search


BATCH = 4  # every search runs on 4 boards (padded), so each variant compiles once


def run_search(boards, search_name, *, two_player=True, num_simulations=96, seed=0):
    padded = list(boards) + ["...|...|..."] * (BATCH - len(boards))
    obs, legal = zip(*(board_observation(b) for b in padded))
    obs, legal = jnp.asarray(np.stack(obs)), jnp.asarray(np.stack(legal))
    out = _compiled_search(search_name, two_player, num_simulations)(
        obs, legal, jax.random.key(seed))
    n = len(boards)
    return jax.tree.map(lambda x: x[:n], out), legal[:n]


# X (the mover) wins at once; O threatens too, so a search that ignores its
# own reward would be tempted to block instead.
WIN_IN_ONE = ("XX.|OO.|...", 2)
# O threatens 0-1-2 and X has no immediate win: X must block at 2.
MUST_BLOCK = ("OO.|.X.|X..", 2)
# O threatens 2 (0-1-2) and 6 (0-3-6), X has no immediate win: X is lost.
LOST = ("OO.|OX.|..X", None)


@pytest.mark.parametrize("search_name", list(SEARCHES))
def test_search_finds_the_winning_move_and_the_block(search_name):
    out, _ = run_search([WIN_IN_ONE[0], MUST_BLOCK[0]], search_name)
    np.testing.assert_array_equal(np.asarray(out.action), [WIN_IN_ONE[1], MUST_BLOCK[1]])
    root = jnp.full((2,), mctx.Tree.ROOT_INDEX)
    q = np.asarray(out.search_tree.qvalues(root))
    visited = np.asarray(out.search_tree.children_visits[:, mctx.Tree.ROOT_INDEX]) > 0
    # From the mover's side: the winning move is worth exactly +1 (its reward;
    # the game is over); not blocking loses (about -1), blocking does not.
    assert q[0, WIN_IN_ONE[1]] == pytest.approx(1.0, abs=1e-3)
    if search_name == "muzero":
        return  # PUCT with flat priors visits the losing moves too rarely to value them.
    others = visited[1] & (np.arange(9) != MUST_BLOCK[1])
    assert others.any() and q[1, others].max() < -0.25
    assert q[1, MUST_BLOCK[1]] > q[1, others].max() + 0.25


def test_without_sign_alternation_the_opponents_win_counts_as_ours():
    """Mutation check: with discount +1 not blocking looks good for the mover."""
    good, _ = run_search([MUST_BLOCK[0]], "gumbel_muzero", two_player=True)
    bad, _ = run_search([MUST_BLOCK[0]], "gumbel_muzero", two_player=False)
    root = jnp.full((1,), mctx.Tree.ROOT_INDEX)
    losing = [0 if a == MUST_BLOCK[1] else 1 for a in range(9)]
    legal = np.array([c == "." for c in MUST_BLOCK[0].replace("|", "")])
    mask = legal & np.array(losing, bool)
    visited = np.asarray(bad.search_tree.children_visits[0, mctx.Tree.ROOT_INDEX]) > 0
    assert (mask & visited).any()
    q_good = np.asarray(good.search_tree.qvalues(root))[0]
    q_bad = np.asarray(bad.search_tree.qvalues(root))[0]
    assert q_bad[mask & visited].max() > 0.25
    assert q_good[mask & visited].max() < 0.0


@pytest.mark.parametrize("search_name", list(SEARCHES))
def test_a_lost_position_has_a_negative_root_value(search_name):
    # O threatens 2 (0-1-2) and 6 (0-3-6); X has no immediate win: lost for X.
    out, _ = run_search([LOST[0]], search_name)
    assert float(out.search_tree.node_values[0, mctx.Tree.ROOT_INDEX]) < -0.3


@pytest.mark.parametrize("search_name", list(SEARCHES))
def test_illegal_actions_never_chosen_and_get_no_policy_weight(search_name):
    boards = ["XOX|OXO|O..", "XO.|...|...", "X..|.O.|..."]
    out, legal = run_search(boards, search_name)
    legal = np.asarray(legal)
    actions = np.asarray(out.action)
    assert legal[np.arange(len(boards)), actions].all()
    np.testing.assert_array_equal(np.asarray(out.action_weights)[~legal], 0.0)


def _expected_values(traj, env_index: int) -> dict[int, float]:
    """Final-outcome value targets of every in-game row, by replaying the rows.

    For each finished game: the winner's seat is the mover of the last move when
    the final reward is +1; the target of a row is +1 if its player to move is
    the winner, -1 if the loser, 0 for a draw; 0 at the terminal row.
    """
    reward = np.asarray(traj.reward[env_index])
    last = np.asarray(traj.last[env_index])
    to_play = np.asarray(traj.to_play[env_index])
    first = np.asarray(traj.first[env_index])
    out: dict[int, float] = {}
    start = int(np.argmax(first))
    for t in range(start, len(last)):
        if not last[t]:
            continue
        mover = to_play[t - 1]
        winner = mover if reward[t] > 0 else (1 - mover if reward[t] < 0 else None)
        for j in range(start, t):
            out[j] = 0.0 if winner is None else (1.0 if to_play[j] == winner else -1.0)
        out[t] = 0.0
        start = t + 1
    return out


def test_value_targets_are_the_final_outcome_from_the_movers_view():
    env = make_env("tic_tac_toe")
    networks = perfect_model_networks()
    root_fn = make_root_fn(networks, VALUE)
    recurrent_fn = make_recurrent_fn(networks, VALUE, REWARD, discount=1.0, two_player=True)
    act_step = make_act_step(
        env, root_fn, recurrent_fn,
        functools.partial(mctx.gumbel_muzero_policy, max_num_considered_actions=9),
        num_simulations=8,
    )
    rollout = jax.jit(make_rollout(act_step, 40))
    actor = init_actor(env, jax.random.key(1), 6)
    # Temperature 1 over a shallow search: varied games with wins for both seats.
    _, traj, _ = rollout({}, actor, jax.random.key(2), jnp.float32(1.0))
    k, n = 5, 9
    targets_fn = jax.jit(jax.vmap(functools.partial(
        make_targets, num_unroll_steps=k, td_steps=n, discount=-1.0)))
    seen = {"win_first": 0, "win_second": 0, "checked": 0}
    for b in range(traj.reward.shape[0]):
        expected = _expected_values(traj, b)
        starts = [t for t in expected if t + k + n + 1 <= traj.reward.shape[1]
                  and not bool(traj.last[b, t])]
        if not starts:
            continue
        seqs = jax.tree.map(lambda x, b=b, s=starts: jnp.stack([x[b, t:t + k + n + 1] for t in s]),
                            traj)
        # Bootstrap values that must not matter (n covers the whole game).
        boot = jnp.full(seqs.reward.shape, 7.0)
        got = targets_fn(seqs, boot)
        last = np.asarray(traj.last[b])
        for i, t in enumerate(starts):
            end = t + int(np.argmax(last[t:])) if last[t:].any() else len(last)
            for j in range(k + 1):
                if t + j in expected and t + j <= end:
                    assert float(got.value[i, j]) == pytest.approx(expected[t + j]), (b, t, j)
                    seen["checked"] += 1
        for t in range(traj.reward.shape[1]):
            if bool(traj.last[b, t]) and float(traj.reward[b, t]) > 0:
                seen["win_first" if int(traj.to_play[b, t - 1]) == 0 else "win_second"] += 1
    assert seen["checked"] > 50
    assert seen["win_first"] > 0 and seen["win_second"] > 0, seen


def test_n_step_target_with_bootstrap_alternates_sign():
    """z_0 = r_1 - r_2 + v_2 (hand-computed) for n = 2 and discount -1."""
    env = make_env("tic_tac_toe")
    state, ts = env.reset(jax.random.key(0))
    rows = []
    for action in (4, 0, 8, 2, 6, 1):  # X: 4, 8, 6; O: 0, 2, 1 -> O wins 0-1-2
        rows.append((ts, action))
        state, ts = env.step(state, action)
    rows.append((ts, 0))
    rows += [(ts, 0)] * 3
    from muzero_jax.replay import Trajectory

    traj = Trajectory(
        observation=jnp.stack([r[0].observation for r in rows]),
        action=jnp.asarray([r[1] for r in rows], jnp.int32),
        reward=jnp.stack([r[0].reward for r in rows]),
        first=jnp.stack([r[0].first for r in rows]),
        last=jnp.stack([r[0].last for r in rows]),
        terminated=jnp.stack([r[0].terminated for r in rows]),
        truncated=jnp.stack([r[0].truncated for r in rows]),
        legal_action_mask=jnp.stack([r[0].legal_action_mask for r in rows]),
        to_play=jnp.stack([r[0].to_play for r in rows]),
        search_policy=jnp.full((len(rows), 9), 1 / 9),
        search_value=jnp.zeros((len(rows),)),
    )
    assert float(traj.reward[6]) == 1.0 and int(traj.to_play[5]) == 1  # O won with move 6
    boot = jnp.asarray([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    got = make_targets(traj, boot, num_unroll_steps=5, td_steps=2, discount=-1.0)
    # Rows 0-3: no reward within 2 plies -> (+1) * v_{j+2}. Row 4: r_5 - r_6 = -1
    # (O's winning move is reward +1 for O, i.e. -1 for X to move at row 4).
    # Row 5: r_6 = +1 then the terminal (value 0).
    np.testing.assert_allclose(got.value, [0.3, 0.4, 0.5, 0.6, -1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(got.reward, [0, 0, 0, 0, 0, 0], atol=1e-6)


def _tic_tac_toe_rollout(num_envs=16, temperature=0.0, **act_kwargs):
    """One 30-step self-play rollout of TicTacToe (greedy by default) with the
    hand-made perfect model; `act_kwargs` go to `make_act_step`."""
    env = make_env("tic_tac_toe")
    networks = perfect_model_networks()
    act_step = make_act_step(
        env, make_root_fn(networks, VALUE),
        make_recurrent_fn(networks, VALUE, REWARD, discount=1.0, two_player=True),
        functools.partial(mctx.gumbel_muzero_policy, max_num_considered_actions=9),
        num_simulations=8, **act_kwargs,
    )
    rollout = jax.jit(make_rollout(act_step, 30))
    _, traj, _ = rollout({}, init_actor(env, jax.random.key(3), num_envs), jax.random.key(4),
                         jnp.float32(temperature))
    return traj


@pytest.mark.parametrize("plies", [0, 2])
def test_exploration_plies_then_greedy(plies):
    traj = _tic_tac_toe_rollout(temperature=1.0, exploration_plies=plies)
    first, last = np.asarray(traj.first), np.asarray(traj.last)
    weights = np.where(np.asarray(traj.legal_action_mask), np.asarray(traj.search_policy), -1.0)
    greedy = np.asarray(traj.action) == weights.argmax(-1)
    explored = {"early": [], "late": []}
    for b in range(first.shape[0]):
        ply = None
        for t in range(first.shape[1]):
            ply = 0 if first[b, t] else (None if ply is None else ply + 1)
            if ply is None or last[b, t]:
                continue
            explored["early" if ply < 2 else "late"].append(not greedy[b, t])
    early, late = np.mean(explored["early"]), np.mean(explored["late"])
    assert len(explored["late"]) > 100
    assert early > 0.2  # temperature 1 samples away from the argmax in the opening
    if plies:
        assert late == 0.0  # greedy from the third ply on
    else:
        assert late > 0.2


def test_random_move_prob_zero_changes_nothing():
    plain, off = _tic_tac_toe_rollout(), _tic_tac_toe_rollout(random_move_prob=0.0)
    np.testing.assert_array_equal(np.asarray(plain.action), np.asarray(off.action))


def test_random_moves_replace_a_share_of_greedy_moves_uniformly():
    p = 0.6
    traj = _tic_tac_toe_rollout(num_envs=64, random_move_prob=p)
    legal = np.asarray(traj.legal_action_mask)
    playing = ~np.asarray(traj.last) & legal.any(-1)
    action = np.asarray(traj.action)[playing]
    legal = legal[playing]
    assert legal[np.arange(len(action)), action].all()  # random moves are legal too
    # The row keeps the search's policy: its argmax is the greedy move, which a
    # random move matches with probability 1 / (legal moves).
    greedy = np.where(legal, np.asarray(traj.search_policy)[playing], -1.0).argmax(-1)
    expected = p * np.mean(1.0 - 1.0 / legal.sum(-1))
    assert len(action) > 1000
    assert np.mean(action != greedy) == pytest.approx(expected, abs=0.05)
