"""The pgx adapter: seats, mover's rewards, masks, auto-reset, vmap/scan."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from muzero_jax.envs import ENV_NAMES, make_env
from muzero_jax.envs.pgx import PGX_GAMES, reward_of_seat


def play(env, actions, seed=0):
    state, ts = env.reset(jax.random.key(seed))
    out = [ts]
    step = jax.jit(env.step)
    for a in actions:
        state, ts = step(state, a)
        out.append(ts)
    return out


def test_registered_with_specs():
    for game, length in PGX_GAMES.items():
        assert game in ENV_NAMES
        env = make_env(game)
        assert env.num_players == 2 and env.max_episode_steps == length
    assert make_env("tic_tac_toe").observation_shape == (3, 3, 2)
    assert make_env("connect_four").num_actions == 7
    assert make_env("go_9x9").num_actions == 82  # 81 points + pass


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tic_tac_toe_first_player_wins_row(seed):
    # Seat 0 plays 0, 1, 2 (top row); seat 1 plays 3, 4. pgx draws which of its
    # ids starts: the seats must not depend on that draw (seeds 0-3).
    ts = play(make_env("tic_tac_toe"), [0, 3, 1, 4, 2], seed)
    assert [int(t.to_play) for t in ts[:5]] == [0, 1, 0, 1, 0]
    assert bool(ts[0].first) and not any(bool(t.last) for t in ts[:5])
    assert [float(t.reward) for t in ts] == [0, 0, 0, 0, 0, 1.0]  # the mover's reward
    assert bool(ts[5].last) and bool(ts[5].terminated) and not bool(ts[5].truncated)
    assert float(reward_of_seat(ts[5], 0)) == 1.0 and float(reward_of_seat(ts[5], 1)) == -1.0
    # Observation from the mover's side: channel 0 holds the mover's marks.
    np.testing.assert_array_equal(np.asarray(ts[2].observation[..., 0]).ravel(),
                                  [1, 0, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(ts[2].observation[..., 1]).ravel(),
                                  [0, 0, 0, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(ts[2].legal_action_mask),
                                  [0, 1, 1, 0, 1, 1, 1, 1, 1])


def test_second_player_win_and_draw_and_auto_reset():
    env = make_env("tic_tac_toe")
    ts = play(env, [0, 3, 1, 4, 8, 5, 7])  # seat 1 completes 3-4-5 with its 3rd move
    assert float(ts[6].reward) == 1.0 and int(ts[5].to_play) == 1
    assert float(reward_of_seat(ts[6], 1)) == 1.0
    assert bool(ts[7].first) and float(ts[7].reward) == 0.0  # action ignored: new game
    assert int(np.asarray(ts[7].observation).sum()) == 0
    draw = play(env, [0, 1, 2, 4, 3, 5, 7, 6, 8])
    assert bool(draw[9].last) and float(draw[9].reward) == 0.0


def test_connect_four_vertical_win_and_vmap_scan():
    env = make_env("connect_four")
    ts = play(env, [3, 4, 3, 4, 3, 4, 3])
    assert float(ts[7].reward) == 1.0 and bool(ts[7].terminated)

    # A batch under vmap inside scan: random legal moves until every game ended.
    def body(carry, key):
        state, ts = carry
        logits = jnp.where(ts.legal_action_mask, 0.0, -jnp.inf)
        action = jax.random.categorical(key, logits)
        state, ts = jax.vmap(env.step)(state, action)
        return (state, ts), (ts.last, ts.reward)

    state, ts0 = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 8))
    _, (last, reward) = jax.lax.scan(body, (state, ts0), jax.random.split(jax.random.key(1), 43))
    last, reward = np.asarray(last), np.asarray(reward)
    assert last.any(axis=0).all()  # every game ends within 42 plies
    assert set(np.unique(reward[last])) <= {-1.0, 0.0, 1.0}
    assert np.all(reward[~last] == 0.0)
    assert env.terminal_rewards_only  # what the value support's sizing relies on


def test_go_smoke():
    env = make_env("go_9x9")
    ts = play(env, [40, 81, 81])  # a stone, then two passes end the game
    assert bool(ts[3].last)
    assert float(ts[3].reward) in (-1.0, 1.0)
    assert ts[1].observation.shape == (9, 9, 17)


def _tiny_go_config():
    import dataclasses

    from muzero_jax.networks import ResNetConfig
    from muzero_jax.presets import preset

    return dataclasses.replace(
        preset("go_9x9"), num_envs=2, rollout_length=4, batch_size=2, replay_ratio=0.125,
        num_simulations=4, td_steps=6, num_unroll_steps=2, replay_capacity=16,
        min_replay_steps=9, resnet=ResNetConfig(channels=8, num_blocks=1, downsample=False,
                                                head_channels=2, head_hidden_sizes=(8,)),
    )


def test_go_9x9_preset_traces_through_a_training_iteration():
    """The GPU-sized Go config, shrunk: every shape of one iteration checks out."""
    from muzero_jax.learning import make_train

    trainer = make_train(_tiny_go_config())
    state = jax.eval_shape(trainer.init, jax.random.key(0))
    new_state, metrics = jax.eval_shape(trainer.iteration, state)
    assert metrics.loss.shape == ()
    assert new_state.actor.timestep.observation.shape[-3:] == (9, 9, 17)


@pytest.mark.slow
def test_go_9x9_tiny_training_runs():
    from muzero_jax.learning import make_train

    trainer = make_train(_tiny_go_config())
    state = trainer.init(jax.random.key(0))
    for _ in range(4):
        state, metrics = trainer.iteration(state)
    assert bool(metrics.finite) and bool(metrics.learned)


def test_go_min_plies_before_pass_masks_only_an_early_pass():
    plain, late = make_env("go_9x9"), make_env("go_9x9", min_plies_before_pass=2)
    moves = [40, 41, 81, 81]
    for ply, (a, b) in enumerate(zip(play(plain, moves), play(late, moves))):
        mask_a, mask_b = np.asarray(a.legal_action_mask), np.asarray(b.legal_action_mask)
        # Stones are as pgx offers them; pass is refused on plies 0 and 1 only.
        np.testing.assert_array_equal(mask_a[:81], mask_b[:81])
        assert bool(mask_a[81]) and bool(mask_b[81]) == (ply >= 2)
        assert float(a.reward) == float(b.reward) and bool(a.last) == bool(b.last)
    assert bool(b.last)  # the rules are pgx's: two passes still end the game


def test_early_pass_stays_when_no_other_move_is_legal():
    from muzero_jax.envs.pgx import mask_early_pass

    stones = np.zeros(82, bool)
    stones[[3, 40]] = True
    only_pass = np.zeros(82, bool)
    with_pass = stones.copy()
    with_pass[81] = True
    only_pass[81] = True
    # Before ply 81 pass goes while a stone can be placed...
    np.testing.assert_array_equal(mask_early_pass(jnp.asarray(with_pass), 10, 81), stones)
    # ...but stays when it is the only legal move, and from ply 81 on.
    np.testing.assert_array_equal(mask_early_pass(jnp.asarray(only_pass), 10, 81), only_pass)
    np.testing.assert_array_equal(mask_early_pass(jnp.asarray(with_pass), 81, 81), with_pass)
    # An illegal pass is never made legal.
    np.testing.assert_array_equal(mask_early_pass(jnp.asarray(stones), 90, 81), stones)


@pytest.mark.parametrize("game, value", [("go_9x9", -1), ("go_9x9", 1.5), ("go_9x9", True),
                                         ("connect_four", 5)])
def test_min_plies_before_pass_refused(game, value):
    with pytest.raises(ValueError, match="min_plies_before_pass"):
        make_env(game, min_plies_before_pass=value)


def test_go_score_reward_is_the_movers_area_margin():
    plain, scored = make_env("go_9x9"), make_env("go_9x9", score_reward=True)
    # Two passes on the empty board: white (the mover) wins by komi, 7.5 points.
    assert float(play(plain, [81, 81])[2].reward) == 1.0
    last = play(scored, [81, 81])[2]
    assert bool(last.last) and float(last.reward) == pytest.approx(7.5 / 88.5)
    assert float(reward_of_seat(last, 0)) == pytest.approx(-7.5 / 88.5)  # black's view
    # One black stone owns the whole board: black (the mover) by 81 - 7.5.
    moves = [40, 81, 81]
    assert float(play(scored, moves)[3].reward) == pytest.approx(73.5 / 88.5)
    assert all(float(t.reward) == 0.0 for t in play(scored, moves)[:3])
    with pytest.raises(ValueError, match="score_reward is for Go"):
        make_env("connect_four", score_reward=True)
    with pytest.raises(ValueError, match="score_reward must be true or false"):
        make_env("go_9x9", score_reward="yes")


def test_go_env_kwargs_shape_self_play_but_matches_play_the_real_game():
    """The Go preset's self-play holds pass back until ply 81 and scores the
    final area margin (and its evaluations take the moving average); the
    agent's matches are the standard game, ended +-1."""
    import dataclasses

    from muzero_jax.agent import Agent
    from muzero_jax.arena import match_env
    from muzero_jax.learning import make_train

    config = _tiny_go_config()
    assert config.parsed_env_kwargs() == {"min_plies_before_pass": 81, "score_reward": True}
    assert config.target_ema == 0.001 and config.eval_weights == "target"
    trainer = make_train(config)
    _, ts = trainer.env.reset(jax.random.key(0))
    assert not bool(ts.legal_action_mask[81])  # self-play: no pass before ply 81
    agent = Agent(config, trainer, params=None)
    game = match_env(agent)
    state, ts = game.reset(jax.random.key(0))
    assert bool(ts.legal_action_mask[81]) and bool(ts.legal_action_mask.all())
    for action in (40, 81, 81):  # a stone and two passes: the standard +-1 ending
        state, ts = game.step(state, action)
    assert bool(ts.last) and float(ts.reward) in (-1.0, 1.0)
    plain_config = dataclasses.replace(config, env_kwargs="{}")
    plain = Agent(plain_config, make_train(plain_config), params=None)
    assert match_env(plain) is plain.env


def test_go_areas_count_stones_and_the_empty_points_only_they_reach():
    import pgx

    from muzero_jax.envs.pgx import go_areas

    env = pgx.make("go_9x9")
    g = env.init(jax.random.key(0))
    # pgx counts an empty region that reaches no stone for both colours.
    np.testing.assert_array_equal(go_areas(g), [81, 81])
    g = env.step(g, jnp.int32(40))  # black on the centre: every point reaches only black
    np.testing.assert_array_equal(go_areas(g), [81, 0])
    g = env.step(g, jnp.int32(0))  # white in a corner: empty points now reach both
    np.testing.assert_array_equal(go_areas(g), [1, 1])
    g = env.step(g, jnp.int32(1))  # black beside it: stones alone, 2 to 1
    np.testing.assert_array_equal(go_areas(g), [2, 1])
