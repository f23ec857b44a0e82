"""`search.with_win_lookahead`: the learned model's predicted rewards read as
wins in the search (a node's value bounded below by its best move's winning
reward; a predicted win ends the game there), where it fits, and through
`load_agent` / `muzero-jax eval` (tests/test_cli.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from muzero_jax.envs import make_env
from muzero_jax.learning import make_train
from muzero_jax.networks import Networks
from muzero_jax.presets import preset
from muzero_jax.search import check_win_lookahead, with_win_lookahead
from muzero_jax.value_transforms import make_support

SUPPORT = make_support(1)


def _networks(dynamics, num_actions):
    return Networks(init=None, representation=None, dynamics=dynamics, prediction=None,
                    initial_inference=None, recurrent_inference=None, num_actions=num_actions,
                    value_bins=SUPPORT.num_bins, reward_bins=SUPPORT.num_bins)


def _reward_logits(reward):
    return jnp.log(SUPPORT.scalar_to_probs(reward) + 1e-12)


def _table_networks(next_state, reward):
    """Networks whose dynamics step a hidden state `[B, 1]` holding a state
    id along the tables `next_state[s, a]` and `reward[s, a]` (the reward
    for the player who moves)."""
    next_state, reward = jnp.asarray(next_state), jnp.asarray(reward, jnp.float32)

    def dynamics(params, hidden, action):
        s = hidden[:, 0].astype(jnp.int32)
        return (next_state[s, action][:, None].astype(jnp.float32),
                _reward_logits(reward[s, action]))

    return _networks(dynamics, next_state.shape[1])


def test_the_value_is_bounded_by_a_winning_reward_and_a_predicted_win_ends_the_game():
    # From a state h the model predicts reward h for action 2, 0 for 0 and 1.
    networks = _networks(lambda params, hidden, action: (
        hidden, _reward_logits(jnp.where(action == 2, hidden[:, 0], 0.0))), 3)
    rewards = jnp.array([0.9, 0.3, 0.6, -0.8])  # the step's own predicted rewards
    values = jnp.array([0.2, -0.6, 0.9, -0.3])
    hidden = jnp.array([[0.8], [0.95], [0.7], [0.4]])  # each node's best move reward

    def base(params, rng_key, action, embedding):
        out = mctx.RecurrentFnOutput(reward=rewards, discount=-jnp.ones(4),
                                     prior_logits=jnp.zeros((4, 3)), value=values)
        return out, hidden

    action = jnp.zeros(4, jnp.int32)
    out, next_hidden = with_win_lookahead(base, networks, SUPPORT)(
        (), jax.random.key(0), action, hidden)
    # 0.8 > 0.2 and 0.95 > -0.6 are winning rewards: they bound the value
    # from below; 0.7 < 0.9 leaves the value; 0.4 is under the threshold.
    np.testing.assert_allclose(out.value, [0.8, 0.95, 0.9, -0.3], atol=1e-3)
    # 0.9 and 0.6 win for the mover: nothing after them counts (discount 0);
    # 0.3 is under the threshold and -0.8 is no win for the mover.
    np.testing.assert_allclose(out.discount, [0.0, -1.0, 0.0, -1.0])
    np.testing.assert_allclose(out.reward, rewards)
    np.testing.assert_allclose(next_hidden, hidden)
    out, _ = with_win_lookahead(base, networks, SUPPORT, end_at_win=False)(
        (), jax.random.key(0), action, hidden)
    np.testing.assert_allclose(out.discount, -np.ones(4))
    np.testing.assert_allclose(out.value, [0.8, 0.95, 0.9, -0.3], atol=1e-3)


def test_forced_loss_reads_a_predicted_double_threat_as_a_loss():
    """Three moves per state. From state 0 every move (to states 1, 2, 3)
    leaves the opponent a winning reply (rewards 0.9, 0.7, 0.8): the mover
    loses, at best -0.7. From state 4 move 2 leads to state 5, where no reply
    wins. From state 6 move 0 wins at once (0.9), which comes first."""
    next_state = np.array([[1, 2, 3], [5, 5, 5], [5, 5, 5], [5, 5, 5], [1, 2, 5], [5, 5, 5],
                           [1, 2, 3]], np.int32)
    reward = np.zeros((7, 3), np.float32)
    reward[1, 0], reward[2, 1], reward[3, 2], reward[6, 0] = 0.9, 0.7, 0.8, 0.9
    networks = _table_networks(next_state, reward)
    hidden = jnp.array([[0.0], [4.0], [6.0], [5.0], [0.0]])
    values = jnp.array([0.3, 0.3, 0.1, -0.9, -0.95])

    def base(params, rng_key, action, embedding):
        out = mctx.RecurrentFnOutput(reward=jnp.zeros(5), discount=-jnp.ones(5),
                                     prior_logits=jnp.zeros((5, 3)), value=values)
        return out, embedding

    action = jnp.zeros(5, jnp.int32)
    out, _ = with_win_lookahead(base, networks, SUPPORT, forced_loss=True)(
        (), jax.random.key(0), action, hidden)
    # State 0: at most minus its weakest winning reply (0.3 -> -0.7; -0.95
    # is already lower); state 4 escapes; state 6 wins; state 5 is quiet.
    np.testing.assert_allclose(out.value, [-0.7, 0.3, 0.9, -0.9, -0.95], atol=1e-3)
    out, _ = with_win_lookahead(base, networks, SUPPORT)((), jax.random.key(0), action, hidden)
    np.testing.assert_allclose(out.value, [0.3, 0.3, 0.9, -0.9, -0.95], atol=1e-3)


def test_the_search_refutes_a_move_that_lets_the_opponent_win_whatever_its_prior():
    """A two-player toy model. At the root (state 0) move 0 leads to state 1,
    where the opponent wins with move 1 (reward +1), a reply the prior nearly
    rules out (logits 4 / -4), and whose values misjudge the line: the
    opponent looks lost there (-0.8), and after its other reply (state 4)
    the threat stays (every move leads to state 1 again). Move 1 leads to
    state 2, worth 0. The plain search believes its values and plays 0; with
    the lookahead the first visit of state 1 is worth the opponent's win."""
    next_state = np.array([[1, 2], [4, 3], [5, 5], [3, 3], [1, 1], [5, 5]], np.int32)
    reward = np.zeros((6, 2), np.float32)
    reward[1, 1] = 1.0
    value = jnp.array([0.0, -0.8, 0.0, 0.0, 0.8, 0.0])
    prior = jnp.zeros((6, 2)).at[1].set(jnp.array([4.0, -4.0]))
    networks = _table_networks(next_state, reward)

    def recurrent_fn(params, rng_key, action, embedding):
        hidden, reward_logits = networks.dynamics(params, embedding, action)
        s = hidden[:, 0].astype(jnp.int32)
        out = mctx.RecurrentFnOutput(reward=SUPPORT.logits_to_scalar(reward_logits),
                                     discount=-jnp.ones_like(hidden[:, 0]),
                                     prior_logits=prior[s], value=value[s])
        return out, hidden

    root = mctx.RootFnOutput(prior_logits=jnp.zeros((1, 2)), value=jnp.zeros(1),
                             embedding=jnp.zeros((1, 1)))

    def search(fn):
        out = mctx.gumbel_muzero_policy((), jax.random.key(0), root, fn, num_simulations=16,
                                        gumbel_scale=0.0)
        q = out.search_tree.qvalues(jnp.zeros(1, jnp.int32))[0]
        return int(out.action[0]), np.asarray(q)

    action, q = search(recurrent_fn)
    assert action == 0 and q[0] > q[1] + 0.5  # blind to the winning reply (0.8 against 0)
    action, q = search(with_win_lookahead(recurrent_fn, networks, SUPPORT))
    assert action == 1 and q[0] < q[1] - 0.25  # (-0.55 against 0)


def test_it_is_refused_where_a_predicted_reward_is_not_a_won_game():
    check_win_lookahead(make_env("connect_four"))
    with pytest.raises(ValueError, match="'catch' is not one"):
        check_win_lookahead(make_env("catch"))
    with pytest.raises(ValueError, match="eval_win_lookahead is set, but"):
        make_train(preset("catch", eval_win_lookahead=True))
    with pytest.raises(ValueError, match="eval_win_lookahead must be true or false"):
        preset("connect_four", eval_win_lookahead=1)
    with pytest.raises(ValueError, match="act_win_lookahead is set, but"):
        make_train(preset("catch", act_win_lookahead=True))
    with pytest.raises(ValueError, match="act_win_lookahead must be true or false"):
        preset("connect_four", act_win_lookahead="yes")


SEEN = []


def recording_gumbel(params, rng_key, root, recurrent_fn, num_simulations,
                     invalid_actions=None, **kwargs):
    """mctx's Gumbel MuZero, recording which recurrent_fn each trace got."""
    SEEN.append(recurrent_fn.__qualname__)
    return mctx.gumbel_muzero_policy(params, rng_key, root, recurrent_fn, num_simulations,
                                     invalid_actions=invalid_actions, **kwargs)


LOOKAHEAD = "with_win_lookahead.<locals>.wrapped"
PLAIN = "make_recurrent_fn.<locals>.recurrent_fn"


def tiny_tic_tac_toe(**kwargs):
    import dataclasses

    from muzero_jax.networks import MLPConfig

    return dataclasses.replace(
        preset("tic_tac_toe"), num_envs=4, eval_episodes=2, eval_num_simulations=2,
        mlp=MLPConfig(hidden_sizes=(16,), latent_size=8, head_hidden_sizes=(8,)), **kwargs)


def test_the_trainers_evaluation_searches_with_it():
    import dataclasses

    config = tiny_tic_tac_toe(eval_search=f"{__name__}:recording_gumbel")
    for lookahead, wrapper in ((True, LOOKAHEAD), (False, PLAIN)):
        trainer = make_train(dataclasses.replace(config, eval_win_lookahead=lookahead))
        SEEN.clear()
        trainer.evaluate(trainer.init(jax.random.key(0)).params, jax.random.key(1))
        assert SEEN and set(SEEN) == {wrapper}, lookahead


def test_self_play_searches_with_it_only_when_asked():
    """`act_win_lookahead` wraps the model of self-play's search and of
    reanalyse's, independently of the evaluation's `eval_win_lookahead`."""
    import dataclasses

    config = tiny_tic_tac_toe(search=f"{__name__}:recording_gumbel", num_simulations=2,
                              rollout_length=5, batch_size=4, eval_win_lookahead=True)
    for reanalyse_rows in (0, 2):
        for lookahead, wrapper in ((True, LOOKAHEAD), (False, PLAIN)):
            trainer = make_train(dataclasses.replace(
                config, act_win_lookahead=lookahead, reanalyse_rows=reanalyse_rows))
            SEEN.clear()  # tracing the iteration calls each search once (nothing compiles)
            trainer.iteration.trace(trainer.state_shapes(jax.random.key(0)))
            assert SEEN == [wrapper] * (2 if reanalyse_rows else 1), (lookahead, reanalyse_rows)
