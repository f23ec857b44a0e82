"""Opponents and matches: the solved TicTacToe table, minimax, MCTS, rates."""

from __future__ import annotations

import io

import jax
import numpy as np
import pytest

from muzero_jax import arena
from muzero_jax.envs import make_env
from muzero_jax.envs.base import TimeStep


class StandInAgent:
    """An object with the `Agent` shape whose moves come from an opponent function."""

    def __init__(self, env, fn):
        self.env = env
        self._fn = jax.jit(fn)

    def act(self, observation, legal_action_mask=None, *, num_simulations=None, rng=None):
        ts = TimeStep(observation, None, None, None, None, None, legal_action_mask, None)
        return self._fn(None, ts, rng)


def key_of(cells: str) -> int:
    """Table key of a board written from the mover's side: M mover, T opponent."""
    return sum({".": 0, "M": 1, "T": 2}[c] * 3**i for i, c in enumerate(cells))


def test_solved_table_matches_known_values():
    table = arena.solve_tic_tac_toe()
    np.testing.assert_array_equal(table[key_of(".........")], np.zeros(9))  # every opening draws
    # Immediate win on 2; elsewhere the opponent completes 3-4-5 next.
    q = table[key_of("MM.TT....")]
    assert q[2] == 1.0 and q[5] == 0.0 and q[0] == -2.0 and q[6] == -1.0
    # X in a corner, O on an adjacent edge: X (to move) wins, e.g. with the centre.
    assert table[key_of("MT.......")][4] == 1.0
    # X in the centre, O in a corner: a draw with best play; O on an edge loses.
    assert table[key_of("T...M....")].max() == 0.0
    assert table[key_of(".T..M....")].max() == 1.0
    assert (table.max(axis=1) > -2).sum() == 4520  # non-terminal reachable positions


def test_minimax_never_loses_and_draws_itself():
    env = make_env("tic_tac_toe")
    perfect = StandInAgent(env, arena.make_minimax_opponent())
    out = arena.evaluate_against(perfect, "minimax", num_games=50, rng_key=jax.random.key(0))
    assert out["as_first"] == {"win": 0.0, "draw": 1.0, "loss": 0.0}
    assert out["as_second"] == {"win": 0.0, "draw": 1.0, "loss": 0.0}
    vs_random = arena.evaluate_against(perfect, "random", num_games=300,
                                       rng_key=jax.random.key(1))
    assert vs_random["as_first"]["loss"] == 0.0 and vs_random["as_second"]["loss"] == 0.0
    assert vs_random["as_first"]["win"] > 0.9  # a perfect first player beats random ~99%


def test_random_vs_random_matches_known_rates():
    # Uniformly random TicTacToe: the first player wins 58.5 %, draws 12.7 %
    # (exact enumeration, e.g. Beck, "Combinatorial Games"); +-4 sigma here.
    env = make_env("tic_tac_toe")
    rnd = StandInAgent(env, arena.random_opponent)
    out = arena.evaluate_against(rnd, "random", num_games=1000, rng_key=jax.random.key(2))
    assert out["as_first"]["win"] == pytest.approx(0.585, abs=0.065)
    assert out["as_first"]["draw"] == pytest.approx(0.127, abs=0.045)
    assert out["as_second"]["loss"] == pytest.approx(0.585, abs=0.065)
    assert out["win_rate"] == pytest.approx(
        (out["as_first"]["win"] + out["as_second"]["win"]) / 2)
    assert out["num_games"] == 1000 and out["opponent"] == "random"


def _c4_after(moves, batch=4):
    env = make_env("connect_four")
    state, ts = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), batch))
    step = jax.jit(jax.vmap(env.step))
    for m in moves:
        state, ts = step(state, np.full(batch, m))
    return env, state, ts


def test_mcts_takes_the_win_and_blocks():
    # Mover (seat 0) has three stacked in column 0: it wins there.
    env, state, ts = _c4_after([0, 1, 0, 1, 0, 2])
    mcts = jax.jit(arena.make_mcts_opponent(env))  # 200 simulations
    np.testing.assert_array_equal(np.asarray(mcts(state, ts, jax.random.key(0))), 0)
    # Seat 1 to move; seat 0 threatens column 0: block it.
    env, state, ts = _c4_after([0, 1, 0, 1, 0])
    np.testing.assert_array_equal(np.asarray(mcts(state, ts, jax.random.key(1))), 0)


def test_bad_input_is_refused_before_playing():
    ttt = StandInAgent(make_env("tic_tac_toe"), arena.random_opponent)
    c4 = StandInAgent(make_env("connect_four"), arena.random_opponent)
    with pytest.raises(ValueError, match="unknown opponent"):
        arena.evaluate_against(ttt, "alphago", num_games=1, rng_key=jax.random.key(0))
    with pytest.raises(ValueError, match="tic_tac_toe only"):
        arena.evaluate_against(c4, "minimax", num_games=1, rng_key=jax.random.key(0))
    with pytest.raises(ValueError, match="mcts:N"):
        arena.evaluate_against(c4, "mcts:zero", num_games=1, rng_key=jax.random.key(0))
    with pytest.raises(ValueError, match="go_9x9 only"):
        arena.evaluate_against(c4, "pgx_baseline", num_games=1, rng_key=jax.random.key(0))
    with pytest.raises(ValueError, match="num_games"):
        arena.evaluate_against(ttt, "random", num_games=0, rng_key=jax.random.key(0))
    with pytest.raises(ValueError, match="two-player"):
        arena.evaluate_against(StandInAgent(make_env("catch"), arena.random_opponent),
                               "random", num_games=1, rng_key=jax.random.key(0))


def _fours(board: np.ndarray) -> bool:
    """Four in a row of True cells on a [6, 7] bool board (numpy, by hand)."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        for r in range(6):
            for c in range(7):
                cells = [(r + i * dr, c + i * dc) for i in range(4)]
                if all(0 <= y < 6 and 0 <= x < 7 and board[y, x] for y, x in cells):
                    return True
    return False


def _drop(filled: np.ndarray, col: int, bottom: int) -> int | None:
    rows = range(5, -1, -1) if bottom == 5 else range(6)
    return next((r for r in rows if not filled[r, col]), None)


def test_tactical_positions_match_a_hand_written_connect_four():
    pos = arena.tactical_positions("connect_four", 96, jax.random.key(3))
    obs = np.asarray(pos.observation) > 0
    mine, theirs = obs[..., 0], obs[..., 1]
    filled = mine | theirs
    bottom = 5 if filled[:, 5].sum() >= filled[:, 0].sum() else 0  # gravity side
    for n in range(96):
        legal = np.asarray(pos.legal_action_mask[n])
        np.testing.assert_array_equal(legal, [not filled[n, 5 - bottom, c] for c in range(7)])
        for a in np.flatnonzero(legal):
            me = mine[n].copy()
            me[_drop(filled[n], a, bottom), a] = True
            win = _fours(me)
            assert bool(pos.wins[n, a]) == win
            after = filled[n].copy()
            after[_drop(filled[n], a, bottom), a] = True
            replies = [b for b in range(7) if _drop(after, b, bottom) is not None]
            lose = False
            for b in replies if not win else []:
                them = theirs[n].copy()
                them[_drop(after, b, bottom), b] = True
                lose |= _fours(them)
            assert bool(pos.loses[n, a]) == lose
    assert pos.has_win.any() and pos.must_block.any()


def test_tactics_score_of_hand_written_players():
    pos = arena.tactical_positions("connect_four", 512, jax.random.key(4))
    wins, loses, legal = (np.asarray(x) for x in (pos.wins, pos.loses, pos.legal_action_mask))

    def one_ply(obs, mask):  # win if possible, else a move that does not lose
        score = wins * 4.0 + (legal & ~loses) * 2.0 + legal
        return score.argmax(1)

    def blunder(obs, mask):  # never wins, loses at once when it can
        score = (legal & ~wins) * 4.0 + loses * 2.0 + legal
        return score.argmax(1)

    good, bad = arena.tactics_score(one_ply, pos), arena.tactics_score(blunder, pos)
    assert good["wins_taken"] == 1.0 and good["blocks_made"] == 1.0
    assert bad["wins_taken"] == 0.0 and bad["blocks_made"] == 0.0
    assert 0.0 < good["random_blocks"] < 1.0
    assert good["num_has_win"] == int(wins.any(1).sum()) > 0


def test_match_tactics_of_scripted_connect_four_games():
    """The agent always drops in column 0, the opponent in column 1. Moving
    first, the agent stacks three, the opponent ignores the threat (a missed
    block) and the agent wins at once. Moving second, the opponent stacks
    three first, the agent misses the block and the opponent wins at once: that
    loss began with a missed block. (Worked out by hand.)"""
    env = make_env("connect_four")
    column = lambda c: lambda state, ts, key: np.full(ts.observation.shape[0], c)  # noqa: E731
    results, record = arena.play_games(column(0), jax.jit(column(1)), env, np.array([0, 1]),
                                       jax.random.key(0), record_tactics=True)
    np.testing.assert_array_equal(results, [1.0, -1.0])
    assert record["played"].shape == (7, 2) and record["played"].all()  # 7 plies each
    np.testing.assert_array_equal(record["agent_moved"][:, 0], [1, 0, 1, 0, 1, 0, 1])
    out = arena.match_tactics(record, results)
    one_each = {"wins_available": 1, "wins_taken": 1.0, "must_block": 1, "blocks_made": 0.0}
    assert out["agent"] == one_each and out["opponent"] == one_each
    assert out["losses"] == {"num_lost": 1, "missed_win": 0.0, "missed_block": 1.0,
                             "no_error": 0.0}
    # The opponent's missed block is at ply 5 of the first game, the agent's at
    # ply 5 of the second; the wins are taken at ply 6.
    assert np.flatnonzero(record["must_block"][:, 0]).tolist() == [5]
    assert np.flatnonzero(record["must_block"][:, 1]).tolist() == [5]
    assert np.flatnonzero(record["has_win"].any(1)).tolist() == [6]


def test_tactics_do_not_change_the_games_and_refuse_go():
    c4 = StandInAgent(make_env("connect_four"), arena.random_opponent)
    plain = arena.evaluate_against(c4, "random", num_games=6, rng_key=jax.random.key(5))
    labelled = arena.evaluate_against(c4, "random", num_games=6, rng_key=jax.random.key(5),
                                      tactics=True)
    assert {k: v for k, v in labelled.items() if k != "tactics"} == plain
    t = labelled["tactics"]
    losses = t["losses"]
    assert losses["num_lost"] == round(12 * plain["loss_rate"])
    if losses["num_lost"]:
        assert sum(losses[k] for k in ("missed_win", "missed_block", "no_error")) == \
            pytest.approx(1.0)
    go = StandInAgent(make_env("go_9x9"), arena.random_opponent)
    with pytest.raises(ValueError, match="tactics are labelled only for"):
        arena.evaluate_against(go, "random", num_games=1, rng_key=jax.random.key(0),
                               tactics=True)


def test_eval_cli_reports_tactics(tmp_path, monkeypatch, capsys):
    """`muzero-jax eval --opponent random --tactics` writes what
    `evaluate_against(..., tactics=True)` returns for the same agent and key to
    eval.json, and prints it."""
    import json

    import muzero_jax.agent
    from muzero_jax.cli import main
    from muzero_jax.presets import preset

    class ColumnZero(StandInAgent):
        step, config, model, weights = 7, preset("connect_four"), "learned", "online"
        symmetry_ensemble = win_lookahead = False

        def _num_simulations(self, n):
            return n or 1

    agent = ColumnZero(make_env("connect_four"),
                       lambda s, ts, k: jax.numpy.argmax(ts.legal_action_mask, axis=-1))
    monkeypatch.setattr(muzero_jax.agent, "load_agent",
                        lambda logdir, step=None, search=None, search_kwargs=None,
                        model="learned", weights=None, symmetry_ensemble=None,
                        win_lookahead=None: agent)
    (tmp_path / "config.json").write_text("{}")
    assert main(["eval", "--logdir", str(tmp_path), "--opponent", "random", "--episodes", "3",
                 "--tactics"]) == 0
    out = capsys.readouterr().out
    written = json.loads((tmp_path / "eval.json").read_text())
    expected = arena.evaluate_against(agent, "random", num_games=3, rng_key=jax.random.key(0),
                                      tactics=True)
    assert written["tactics"] == expected["tactics"] and written["as_first"] == \
        expected["as_first"]
    assert f"of the agent's {expected['tactics']['losses']['num_lost']} losses" in out


def test_an_agent_planning_in_the_game_beats_random_with_untrained_networks():
    """`Agent(..., model="env")` searches Connect Four itself from the games'
    states (the arena passes them): with untrained networks (prior uniform,
    value ~0) 64 simulations of PUCT take the immediate wins and make the
    forced blocks, and win nearly every game against random play; the same
    networks searching their (untrained) learned model do not."""
    import dataclasses

    from muzero_jax.agent import Agent
    from muzero_jax.learning import make_train
    from muzero_jax.networks import MLPConfig
    from muzero_jax.presets import preset

    config = dataclasses.replace(
        preset("connect_four"), num_envs=8, batch_size=8, num_simulations=4,
        consistency_loss_weight=0.0, action_reward_loss_weight=0.0, action_reward_batch_size=0,
        augment_symmetries=False,
        reconstruction_loss_weight=0.0, search_model="learned", eval_symmetry_ensemble=False,
        mlp=MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,)),
        search="muzero", search_kwargs='{"dirichlet_fraction": 0.0}')
    trainer = make_train(config)
    params = trainer.init(jax.random.key(0)).params
    rates = {}
    for model in ("env", "learned"):
        agent = Agent(config, trainer, params, model=model)
        out = arena.evaluate_against(agent, "random", num_games=12, rng_key=jax.random.key(1),
                                     num_simulations=64, tactics=True)
        rates[model] = out["win_rate"]
        if model == "env":
            assert out["tactics"]["agent"]["wins_taken"] == 1.0
            assert out["tactics"]["agent"]["blocks_made"] == 1.0
    assert rates["env"] >= 0.9 and rates["learned"] <= 0.75, rates


def _tiny_decoded_connect_four(**overrides):
    """A tiny Connect Four run of the preset (the decoded model, whose
    reconstruction weight is 1) and random weights everywhere (the
    initialisation zeroes the output layers), so that values, priors and
    decoded boards are far from an untrained network's ~0 and ties."""
    import dataclasses

    from muzero_jax.learning import make_train
    from muzero_jax.networks import MLPConfig
    from muzero_jax.presets import preset

    config = dataclasses.replace(
        preset("connect_four"), num_envs=8, batch_size=8, num_simulations=4,
        consistency_loss_weight=0.0, action_reward_loss_weight=0.0, action_reward_batch_size=0,
        augment_symmetries=False,
        reconstruction_loss_weight=1.0,
        mlp=MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,)), **overrides)
    trainer = make_train(config)
    leaves, treedef = jax.tree.flatten(trainer.init(jax.random.key(0)).params)
    params = jax.tree.unflatten(treedef, [
        0.5 * jax.random.normal(k, x.shape, x.dtype)
        for k, x in zip(jax.random.split(jax.random.key(5), len(leaves)), leaves)])
    return config, trainer, params


def test_an_agent_planning_in_its_decoded_model():
    """`Agent(..., model="decoded")` runs the run's search over
    `search.make_decoded_recurrent_fn` (the same action, value and policy as
    that search called by hand with the same key), and is refused, before
    anything is compiled, for a run with no decoder or observations that are
    not 0/1."""
    import dataclasses

    import mctx

    from muzero_jax.agent import Agent
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset
    from muzero_jax.search import make_decoded_recurrent_fn, make_root_fn

    config, trainer, params = _tiny_decoded_connect_four(eval_symmetry_ensemble=False)
    agent = Agent(config, trainer, params, model="decoded")
    state, ts = jax.vmap(agent.env.reset)(jax.random.split(jax.random.key(2), 3))
    out = agent.search(ts.observation, ts.legal_action_mask, num_simulations=6,
                       rng=jax.random.key(3))
    root = make_root_fn(trainer.networks, trainer.value_support)(params, ts.observation)
    recurrent = make_decoded_recurrent_fn(trainer.networks, trainer.value_support,
                                          trainer.reward_support, discount=1.0, two_player=True)
    by_hand = jax.jit(lambda p, r: trainer.search_fn(
        p, jax.random.key(3), r, recurrent, num_simulations=6,
        invalid_actions=~ts.legal_action_mask))(params, root)
    np.testing.assert_allclose(out.value, by_hand.search_tree.node_values[:, mctx.Tree.ROOT_INDEX],
                               rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(out.policy, by_hand.action_weights, rtol=1e-3, atol=1e-4)
    learned = Agent(config, trainer, params, model="learned").search(
        ts.observation, ts.legal_action_mask, num_simulations=6, rng=jax.random.key(3))
    assert float(np.abs(out.value).max()) > 0.05
    assert not np.allclose(learned.value, out.value, atol=1e-3)
    result = arena.evaluate_against(agent, "random", num_games=2, rng_key=jax.random.key(1),
                                    num_simulations=4)
    assert result["as_first"]["win"] + result["as_first"]["draw"] + result["as_first"][
        "loss"] == pytest.approx(1.0)

    no_decoder = dataclasses.replace(config, reconstruction_loss_weight=0.0,
                                     search_model="learned")
    with pytest.raises(ValueError, match="reconstruction_loss_weight > 0"):
        Agent(no_decoder, make_train(no_decoder), params, model="decoded")
    cartpole = dataclasses.replace(preset("cartpole"), reconstruction_loss_weight=1.0)
    cart_trainer = make_train(cartpole)
    with pytest.raises(ValueError, match="not binary"):
        Agent(cartpole, cart_trainer, cart_trainer.init(jax.random.key(0)).params,
              model="decoded")


def test_an_agent_with_the_symmetry_ensemble():
    """`Agent(..., symmetry_ensemble=True)` (the default when the run's
    `eval_symmetry_ensemble` is set, as in the Connect Four preset) searches
    the decoded model of the mirror-averaged networks: the same result as the
    run's search called by hand over `ensemble_networks`, and, unlike the
    plain agent, the same root value and the mirrored policy on a board and
    its mirror image. Refused, before anything is compiled, for a game
    without symmetries."""
    import dataclasses

    import jax.numpy as jnp
    import mctx

    from muzero_jax.agent import Agent
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset
    from muzero_jax.search import make_decoded_recurrent_fn, make_root_fn
    from muzero_jax.symmetries import ensemble_networks, inverse_actions

    config, trainer, params = _tiny_decoded_connect_four()
    agent, plain = Agent(config, trainer, params), Agent(config, trainer, params,
                                                         symmetry_ensemble=False)
    assert agent.symmetry_ensemble and not plain.symmetry_ensemble and agent.model == "decoded"
    env = agent.env
    state, ts = jax.vmap(env.reset)(jax.random.split(jax.random.key(2), 2))
    state, ts = jax.vmap(env.step)(state, jnp.asarray([1, 2], jnp.int32))  # off-centre
    flip = np.asarray(inverse_actions(env.symmetries)[1])
    mirror = jax.vmap(lambda o: o[:, ::-1])(ts.observation)
    obs = jnp.concatenate([ts.observation, mirror])
    legal = jnp.concatenate([ts.legal_action_mask, ts.legal_action_mask[:, flip]])
    out = agent.search(obs, legal, num_simulations=8, rng=jax.random.key(3))

    ens = ensemble_networks(trainer.networks, env.symmetries)
    root = make_root_fn(ens, trainer.value_support)(params, obs)
    recurrent = make_decoded_recurrent_fn(ens, trainer.value_support, trainer.reward_support,
                                          discount=1.0, two_player=True)
    by_hand = jax.jit(lambda p, r: trainer.search_fn(
        p, jax.random.key(3), r, recurrent, num_simulations=8,
        invalid_actions=~legal))(params, root)
    np.testing.assert_allclose(out.value, by_hand.search_tree.node_values[:, mctx.Tree.ROOT_INDEX],
                               rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(out.policy, by_hand.action_weights, rtol=1e-3, atol=1e-4)
    # Mirror images: the ensemble's search sees one position.
    np.testing.assert_allclose(out.value[2:], out.value[:2], atol=1e-4)
    np.testing.assert_allclose(out.policy[2:], out.policy[:2][:, flip], atol=1e-4)
    np.testing.assert_array_equal(out.action[2:], flip[np.asarray(out.action[:2])])
    base = plain.search(obs, legal, num_simulations=8, rng=jax.random.key(3))
    assert float(np.abs(base.value[2:] - base.value[:2]).max()) > 1e-3

    catch = preset("catch")
    catch_trainer = make_train(catch)
    with pytest.raises(ValueError, match="board symmetries"):
        Agent(catch, catch_trainer, catch_trainer.init(jax.random.key(0)).params,
              symmetry_ensemble=True)
    with pytest.raises(ValueError, match="eval_symmetry_ensemble is set, but"):
        make_train(dataclasses.replace(catch, eval_symmetry_ensemble=True))


def test_planning_in_the_game_uses_the_standard_game_not_the_self_play_options():
    """A run's `env_kwargs` shape only its self-play (Go's `score_reward`
    makes the final reward the area margin): `model="env"` plans in the game
    the matches are played in, the standard one, whose final reward is +-1.
    Black, whose one stone owns the board, may end the game by passing after
    white's pass: that child's value is +1 in the standard game ((81 - 7.5) /
    88.5 with the score reward), so the search's policy is the same as a run
    without the options', and differs from a search in the scored game."""
    import dataclasses

    from muzero_jax.agent import Agent
    from muzero_jax.envs import make_env
    from muzero_jax.learning import make_train
    from muzero_jax.networks import ResNetConfig
    from muzero_jax.presets import preset
    from muzero_jax.search import make_env_recurrent_fn

    def tiny(env_kwargs):
        return dataclasses.replace(
            preset("go_9x9"), env_kwargs=env_kwargs, num_envs=2, batch_size=2,
            min_replay_steps=9, replay_capacity=16, rollout_length=4, td_steps=6,
            replay_ratio=0.125, num_simulations=4,
            # Every legal move considered and visited once: the pass's value counts.
            search_kwargs='{"gumbel_scale": 0.0, "max_num_considered_actions": 82}',
            resnet=ResNetConfig(channels=4, num_blocks=1, downsample=False,
                                head_channels=2, head_hidden_sizes=(8,)))

    game = make_env("go_9x9")
    state, ts = game.reset(jax.random.key(0))
    for action in (40, 81):  # black's stone in the centre, white passes
        state, ts = game.step(state, action)
    state, ts = jax.tree.map(lambda x: x[None], (state, ts))
    assert bool(ts.legal_action_mask[0, 81])

    plain = tiny("{}")
    trainer = make_train(plain)
    # Random weights everywhere (the initialisation zeroes the output layers),
    # so the other moves' values differ and the search's min-max scaling of
    # values does not hide the pass's.
    leaves, treedef = jax.tree.flatten(trainer.init(jax.random.key(0)).params)
    params = jax.tree.unflatten(treedef, [
        0.5 * jax.random.normal(k, x.shape, x.dtype)
        for k, x in zip(jax.random.split(jax.random.key(5), len(leaves)), leaves)])

    def policy(agent):
        return np.asarray(agent.search(ts.observation, ts.legal_action_mask, num_simulations=82,
                                       rng=jax.random.key(1), env_state=state).policy)

    scored_config = tiny('{"score_reward": true}')
    scored_run = Agent(scored_config, make_train(scored_config), params, model="env")
    assert scored_run.env.name == "go_9x9"
    expected = policy(Agent(plain, trainer, params, model="env"))
    np.testing.assert_allclose(policy(scored_run), expected, atol=1e-6)

    # Planning in the scored game instead gives the pass a lower value, and so
    # another policy: the comparison above tells the two games apart.
    in_scored_game = Agent(plain, trainer, params, model="env")
    in_scored_game._recurrent_fn = make_env_recurrent_fn(
        make_env("go_9x9", score_reward=True), trainer.networks, trainer.value_support,
        discount=1.0)
    assert not np.allclose(policy(in_scored_game), expected, atol=1e-3)


def _tiny_pgx_baseline(directory, seed=0):
    """A pgx baseline checkpoint in pgx's own format (`args`, `params`,
    `state`), built with pgx's own network code at a tiny size and random
    weights: what `pgx.make_baseline_model` reads from `DIR/go_9x9_v0.ckpt`.
    Returns the Haiku function it holds and its weights."""
    import pickle

    import haiku as hk
    from pgx._src.baseline import _create_az_model_v0

    args = {"num_actions": 82, "num_channels": 4, "num_layers": 1, "resnet_v2": True}

    def forward(x, is_training=False):
        return _create_az_model_v0(**args)(x, is_training=is_training, test_local_stats=False)

    net = hk.without_apply_rng(hk.transform_with_state(forward))
    # (Initialised in training mode, which creates the batch norms' averages.)
    params, state = net.init(jax.random.key(seed), np.zeros((1, 9, 9, 17), np.float32),
                             is_training=True)
    # Random output layers, so that the policies differ from move to move.
    params = jax.tree.map(
        lambda x: np.asarray(x) + np.random.default_rng(seed).normal(size=x.shape) * 0.5, params)
    directory.mkdir(exist_ok=True)
    with open(directory / "go_9x9_v0.ckpt", "wb") as f:
        pickle.dump({"args": args, "params": params, "state": state}, f)
    return net, params, state


def test_pgx_baseline_opponent_plays_the_networks_best_legal_move(tmp_path):
    """`pgx_baseline:DIR` plays, in every game of a batch, the legal move with
    the highest policy logit of pgx's baseline network read from
    `DIR/go_9x9_v0.ckpt` (logits computed here with the same Haiku function
    and weights, and the argmax taken by hand over the legal moves)."""
    net, params, state = _tiny_pgx_baseline(tmp_path / "baselines")
    env = make_env("go_9x9")
    opponent = jax.jit(arena.make_opponent(f"pgx_baseline:{tmp_path / 'baselines'}", env))
    # (Jitted: Go's step and the network run op by op would compile each operation.)
    step = jax.jit(lambda g, t, key: jax.vmap(env.step)(g, arena.random_opponent(g, t, key)))
    apply = jax.jit(lambda obs: net.apply(params, state, obs.astype(np.float32))[0][0])
    game, ts = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 6))
    played = 0
    for ply in range(8):  # random moves in between: positions with stones and fewer legal moves
        actions = np.asarray(opponent(game, ts, jax.random.key(ply)))
        legal = np.asarray(ts.legal_action_mask)
        expected = np.argmax(np.where(legal, np.asarray(apply(ts.observation)), -np.inf), axis=-1)
        np.testing.assert_array_equal(actions, expected)
        assert legal[np.arange(6), actions].all()
        played += 1
        game, ts = step(game, ts, jax.random.key(100 + ply))
    assert played == 8 and len(set(expected.tolist())) > 1  # the policies differ by position


def test_pgx_baseline_opponent_refusals(tmp_path, monkeypatch):
    """One ValueError, before anything is compiled: a game pgx ships no
    baseline for, a directory without the checkpoint, a file that is not
    one, and (no DIR) a failed download, which names the address and where
    to put the file and leaves no partial file behind."""
    go = make_env("go_9x9")
    with pytest.raises(ValueError, match="go_9x9 only, not 'connect_four'"):
        arena.make_opponent("pgx_baseline", make_env("connect_four"))
    with pytest.raises(ValueError, match="no .*go_9x9_v0.ckpt"):
        arena.make_opponent(f"pgx_baseline:{tmp_path}", go)
    (tmp_path / "go_9x9_v0.ckpt").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="is not a pgx baseline checkpoint"):
        arena.make_opponent(f"pgx_baseline:{tmp_path}", go)
    cache = tmp_path / "cache"
    monkeypatch.setattr(arena, "DEFAULT_PGX_BASELINE_DIR", str(cache))

    def offline(url, timeout):
        raise OSError("network unreachable")

    monkeypatch.setattr(arena.urllib.request, "urlopen", offline)
    with pytest.raises(ValueError, match=r"downloading pgx's go_9x9_v0 from https://\S+ failed "
                                         r"\(network unreachable\); fetch that file to "):
        arena.make_opponent("pgx_baseline", go)
    assert not cache.exists() or not any(cache.iterdir())

    class Sent(io.BytesIO):  # what a download returns: a context manager with read()
        pass

    # A download of something else (e.g. a web page) is refused and not kept...
    monkeypatch.setattr(arena.urllib.request, "urlopen",
                        lambda url, timeout: Sent(b"<html>quota exceeded</html>"))
    with pytest.raises(ValueError, match=r"what https://\S+ sent is not a pgx baseline"):
        arena.make_opponent("pgx_baseline", go)
    assert not cache.exists() or not any(cache.iterdir())
    # ...and a checkpoint is kept in the default directory and played with.
    _tiny_pgx_baseline(tmp_path / "elsewhere")
    good = (tmp_path / "elsewhere" / "go_9x9_v0.ckpt").read_bytes()
    monkeypatch.setattr(arena.urllib.request, "urlopen", lambda url, timeout: Sent(good))
    assert callable(arena.make_opponent("pgx_baseline", go))
    assert [p.name for p in cache.iterdir()] == ["go_9x9_v0.ckpt"]
    assert (cache / "go_9x9_v0.ckpt").read_bytes() == good
    # Once there, nothing is downloaded.
    monkeypatch.setattr(arena.urllib.request, "urlopen", offline)
    assert callable(arena.make_opponent("pgx_baseline", go))
