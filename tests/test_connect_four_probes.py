"""experiments/connect_four_probes.py: the win lookahead raises a node's value
to its best predicted winning reward, and leaves it alone otherwise."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from muzero_jax.value_transforms import make_support

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))


def test_win_lookahead_takes_the_best_winning_reward_as_a_lower_bound():
    from experiments.connect_four_probes import with_win_lookahead
    from muzero_jax.networks import Networks

    support = make_support(1)
    # Hidden states [B, 1]: from a state h the model predicts reward h for
    # action 2 and 0 for actions 0 and 1.
    def dynamics(params, hidden, action):
        reward = jnp.where(action == 2, hidden[:, 0], 0.0)
        return hidden, jnp.log(support.scalar_to_probs(reward) + 1e-12)

    networks = Networks(init=None, representation=None, dynamics=dynamics, prediction=None,
                        initial_inference=None, recurrent_inference=None, num_actions=3,
                        value_bins=support.num_bins, reward_bins=support.num_bins)
    values = jnp.array([0.2, -0.6, 0.9, -0.3])
    hidden = jnp.array([[0.8], [0.95], [0.7], [0.4]])  # the best reward of each node

    def base(params, rng_key, action, embedding):
        out = mctx.RecurrentFnOutput(reward=jnp.zeros(4), discount=-jnp.ones(4),
                                     prior_logits=jnp.zeros((4, 3)), value=values)
        return out, hidden

    fn = with_win_lookahead(base, networks, support, threshold=0.5)
    out, next_hidden = fn((), jax.random.key(0), jnp.zeros(4, jnp.int32), hidden)
    # 0.8 > 0.2 and 0.95 > -0.6 are winning rewards: they bound the value from
    # below; 0.7 < 0.9 leaves the value; 0.4 is under the threshold.
    np.testing.assert_allclose(out.value, [0.8, 0.95, 0.9, -0.3], atol=1e-3)
    np.testing.assert_allclose(next_hidden, hidden)
    np.testing.assert_allclose(out.discount, -np.ones(4))
