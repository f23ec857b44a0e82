"""Tests of the mctx adapter: root/recurrent functions, resolver, checks."""

import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest

from muzero_jax import (
    BUILTIN_SEARCHES,
    NetworkOutput,
    Networks,
    make_recurrent_fn,
    make_root_fn,
    make_support,
    resolve_search,
)
from muzero_jax.puct import qtransform_by_tree_min_max
from muzero_jax.search import batch_search, check_search_fn

SUPPORT = make_support(3)
NUM_ACTIONS = 4
BEST = 2


def _log_probs(x):
    return jnp.log(SUPPORT.scalar_to_probs(x) + 1e-30)


def bandit_networks(rewards=(0.0, 0.1, 1.0, 0.0)):
    """A one-step bandit: the hidden state is a step counter; the reward of
    action a is `rewards[a]` on the first step, 0 afterwards; all values 0,
    priors uniform."""
    rewards = jnp.asarray(rewards)

    def representation(params, obs):
        return jnp.zeros((obs.shape[0], 1))

    def dynamics(params, hidden, action):
        r = jnp.where(hidden[:, 0] == 0, rewards[action], 0.0)
        return hidden + 1, _log_probs(r)

    def prediction(params, hidden):
        b = hidden.shape[0]
        return jnp.zeros((b, NUM_ACTIONS)), _log_probs(jnp.zeros((b,)))

    def initial_inference(params, obs):
        h = representation(params, obs)
        p, v = prediction(params, h)
        return NetworkOutput(h, jnp.zeros_like(v), p, v)

    def recurrent_inference(params, hidden, action):
        h, r = dynamics(params, hidden, action)
        p, v = prediction(params, h)
        return NetworkOutput(h, r, p, v)

    return Networks(None, representation, dynamics, prediction, initial_inference,
                    recurrent_inference, NUM_ACTIONS, SUPPORT.num_bins, SUPPORT.num_bins)


# Compiling a search dominates these tests: each built-in is compiled once (XLA
# backend optimisations off) and its hyper-parameters are traced arguments.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


@functools.cache
def _compiled(name, num_simulations=32, batch=3):
    nets = bandit_networks()
    root_fn = make_root_fn(nets, SUPPORT)
    rec_fn = make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=0.9)

    def run(legal, kwargs):
        search = functools.partial(BUILTIN_SEARCHES[name], **kwargs)
        run = batch_search(search, root_fn, rec_fn, num_simulations=num_simulations)
        return run({}, jax.random.key(0), jnp.zeros((batch, 2)), legal)

    return _jit(run)


def _run(name, *, invalid=None, batch=3, **kwargs):
    legal = jnp.ones((batch, NUM_ACTIONS), bool) if invalid is None else ~invalid
    if name == "muzero":  # always the same traced arguments: one compilation
        kwargs = {"temperature": 1.0, "dirichlet_fraction": 0.25, **kwargs}
    return _compiled(name)(legal, {k: jnp.float32(v) for k, v in kwargs.items()})


def test_root_and_recurrent_outputs():
    nets = bandit_networks()
    root = make_root_fn(nets, SUPPORT)({}, jnp.zeros((2, 5)))
    np.testing.assert_allclose(root.value, 0.0, atol=1e-5)
    rec = make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=0.9)
    out, emb = rec({}, jax.random.key(0), jnp.array([2, 1]), root.embedding)
    np.testing.assert_allclose(out.reward, [1.0, 0.1], atol=1e-3)
    np.testing.assert_allclose(out.discount, [0.9, 0.9])
    np.testing.assert_array_equal(emb, 1.0)
    rec2 = make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=1.0, two_player=True)
    out2, _ = rec2({}, jax.random.key(0), jnp.array([2, 1]), root.embedding)
    np.testing.assert_allclose(out2.discount, [-1.0, -1.0])


@pytest.mark.parametrize("name", ["muzero", "gumbel_muzero"])
def test_builtin_searches_find_the_best_arm(name):
    # Without root noise the visit counts must concentrate on the best arm.
    no_noise = {"dirichlet_fraction": 0.0} if name == "muzero" else {}
    out = _run(name, **no_noise)
    assert np.all(np.argmax(out.action_weights, -1) == BEST)
    if name == "gumbel_muzero":  # deterministic given the Gumbel noise
        np.testing.assert_array_equal(out.action, BEST)
    else:
        greedy = _run(name, temperature=0.0, **no_noise)
        np.testing.assert_array_equal(greedy.action, BEST)


def test_invalid_actions_are_never_chosen():
    invalid = jnp.zeros((3, NUM_ACTIONS), bool).at[:, BEST].set(True)
    for name, kwargs in (("muzero", {"temperature": 0.0, "dirichlet_fraction": 0.0}),
                         ("gumbel_muzero", {})):
        out = _run(name, invalid=invalid, **kwargs)
        np.testing.assert_array_equal(out.action, 1)  # the next best arm
        np.testing.assert_allclose(out.action_weights[:, BEST], 0.0)


def test_search_kwargs_are_bound():
    fn = resolve_search("muzero", {"dirichlet_fraction": 0.0, "temperature": 0.0})
    assert isinstance(fn, functools.partial)
    assert fn.func is mctx.muzero_policy
    assert fn.keywords == {"dirichlet_fraction": 0.0, "temperature": 0.0}


def test_builtin_names():
    from muzero_jax.puct import muzero_paper_policy, puct_policy

    assert BUILTIN_SEARCHES["muzero"] is mctx.muzero_policy
    assert BUILTIN_SEARCHES["gumbel_muzero"] is mctx.gumbel_muzero_policy
    assert BUILTIN_SEARCHES["puct"] is puct_policy
    assert BUILTIN_SEARCHES["muzero_paper"] is muzero_paper_policy


def test_resolve_module_attr_and_callable():
    assert resolve_search("mctx:gumbel_muzero_policy") is mctx.gumbel_muzero_policy
    assert resolve_search(mctx.muzero_policy) is mctx.muzero_policy
    assert set(BUILTIN_SEARCHES) >= {"muzero", "gumbel_muzero"}


@pytest.mark.parametrize(
    "spec,message",
    [
        ("nope", "unknown search 'nope'; built-in searches: .*gumbel_muzero"),
        ("no_such_module_xyz:fn", "does not import"),
        ("mctx:not_there", "has no attribute 'not_there'"),
        ("mctx:__name__", "not a callable"),
        (":attr", "must look like"),
        ("", "must be a name"),
    ],
)
def test_resolve_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_search(spec)


def _checker(num_simulations=4):
    nets = bandit_networks()
    root_fn = make_root_fn(nets, SUPPORT)
    rec_fn = make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=0.9)
    # Abstract shapes, as make_train passes them.
    obs = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    legal = jax.ShapeDtypeStruct((2, NUM_ACTIONS), jnp.bool_)
    return functools.partial(check_search_fn, root_fn=root_fn, recurrent_fn=rec_fn, params={},
                             observation=obs, legal_action_mask=legal,
                             num_simulations=num_simulations)


def _policy_output(action, weights, node_values):
    tree = mctx.Tree(
        node_visits=None, raw_values=None, node_values=node_values, parents=None,
        action_from_parent=None, children_index=None, children_prior_logits=None,
        children_visits=None, children_rewards=None, children_discounts=None,
        children_values=None, embeddings=None, root_invalid_actions=None, extra_data=None,
    ) if node_values is not None else None
    return mctx.PolicyOutput(action=action, action_weights=weights, search_tree=tree)


def _fake_search(action=None, weights=None, node_values=None):
    """A search returning chosen shapes (defaults: the right ones for the checker)."""

    def search(params, rng_key, root, recurrent_fn, *, num_simulations, invalid_actions):
        batch, num_actions = root.prior_logits.shape
        return _policy_output(
            jnp.zeros((batch,), jnp.int32) if action is None else action,
            jnp.zeros((batch, num_actions)) if weights is None else weights,
            jnp.zeros((batch, num_simulations + 1)) if node_values is None else node_values,
        )

    return search


@pytest.mark.parametrize("name", sorted(BUILTIN_SEARCHES))
def test_check_search_fn_accepts_builtins(name):
    _checker()(resolve_search(name))
    _checker()(_fake_search())  # the well-formed fake is accepted too


def _three_args(params, rng_key, root, *, num_simulations, invalid_actions):
    del params, rng_key, root, num_simulations, invalid_actions


def _no_invalid_actions(params, rng_key, root, recurrent_fn, *, num_simulations):
    del params, rng_key, root, recurrent_fn, num_simulations


def _needs_extra(params, rng_key, root, recurrent_fn, *, num_simulations, invalid_actions, c):
    del params, rng_key, root, recurrent_fn, num_simulations, invalid_actions, c


def _raises_inside(params, rng_key, root, recurrent_fn, *, num_simulations, invalid_actions):
    return root.prior_logits @ jnp.zeros((3, 3))  # [2, 4] @ [3, 3]: shapes do not match


@pytest.mark.parametrize(
    "search, message",
    [
        pytest.param(42, "not a callable", id="not-callable"),
        pytest.param(_three_args, r"takes 3 positional argument\(s\) \(params, rng_key, root\) "
                     r"but is called with 4", id="too-few-positional"),
        pytest.param(_no_invalid_actions, "does not accept the keyword argument.s. invalid_actions",
                     id="missing-keyword"),
        pytest.param(lambda p, k, r, f: None,
                     "does not accept the keyword argument.s. num_simulations, invalid_actions",
                     id="missing-keywords"),
        pytest.param(functools.partial(mctx.muzero_policy, pb_c=1.0),
                     "does not take the keyword argument.s. pb_c bound by search_kwargs",
                     id="unknown-search-kwarg"),
        pytest.param(_needs_extra, "cannot be called as .*missing a required argument: 'c'",
                     id="extra-required"),
        pytest.param(_raises_inside, "failed when traced.*TypeError", id="fails-in-trace"),
        pytest.param(lambda p, k, r, f, **kw: r.value, "must return mctx.PolicyOutput, got",
                     id="wrong-output-type"),
        pytest.param(_fake_search(action=jnp.zeros((2, 1), jnp.int32)),
                     r"action has shape \(2, 1\), expected \(2,\)", id="action-shape"),
        pytest.param(_fake_search(action=jnp.zeros((2,))), "action has dtype float32",
                     id="action-dtype"),
        pytest.param(_fake_search(weights=jnp.zeros((2, 3))),
                     r"action_weights has shape \(2, 3\), expected \(2, 4\)",
                     id="weights-shape"),
        pytest.param(_fake_search(node_values=jnp.zeros((5,))),
                     r"node_values has shape \(2, num_nodes\).*got Tree with node_values shape "
                     r"\(5,\)", id="tree-shape"),
    ],
)
def test_check_search_fn_names_what_is_wrong(search, message):
    with pytest.raises(ValueError, match=message) as info:
        _checker()(search)
    assert "\n" not in str(info.value)  # one line


def test_bad_discount():
    with pytest.raises(ValueError, match="discount"):
        make_recurrent_fn(bandit_networks(), SUPPORT, SUPPORT, discount=1.5)


def _prior_only_policy(params, rng_key, root, recurrent_fn, num_simulations):
    """Stands in for a search: main's plumbing is under test, not a search."""
    del params, rng_key, recurrent_fn, num_simulations
    weights = jax.nn.softmax(root.prior_logits)
    return mctx.PolicyOutput(action=jnp.argmax(weights, -1), action_weights=weights,
                             search_tree=None)


def test_bench_search_main_writes_json(tmp_path, capsys, monkeypatch, console):
    from muzero_jax.bench import search as bench

    monkeypatch.setitem(bench.POLICIES, "mctx_muzero", _prior_only_policy)
    out = tmp_path / "rows.json"
    argv = ["--actions", "2", "--batch", "1", "--simulations", "2", "--repeats", "2",
            "--policies", "mctx_muzero", "--json", str(out)]
    assert bench.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["argv"] == argv
    for key in ("date", "machine", "device", "jax", "mctx", "backend", "load_average"):
        assert key in data["machine"]
    # With a training run's provenance: the packages, the CPU, the commit (the
    # checkout's HEAD here, read with git; None for an installed copy).
    machine = data["machine"]
    assert machine["packages"]["mctx"] == mctx.__version__ == machine["mctx"]
    assert machine["cpu"]["model"] and machine["xla_flags"] == os.environ.get("XLA_FLAGS", "")
    repo = pathlib.Path(bench.__file__).resolve().parents[2]
    if (repo / ".git").exists() and shutil.which("git"):
        assert machine["git_commit"] == subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
            check=True).stdout.strip()
    else:
        assert machine["git_commit"] is None
    assert [r["policy"] for r in data["rows"]] == ["mctx_muzero"]
    for row in data["rows"]:
        assert (row["actions"], row["batch"], row["simulations"]) == (2, 1, 2)
        assert (row["repeats"], row["seed"]) == (2, 0)
        assert row["sims_per_s"] == pytest.approx(2 / row["median_s"])
    assert data["rows"][0]["speedup_vs_mctx_muzero"] == 1.0
    assert "| 2 | 1 | 2 |" in capsys.readouterr().out  # the Markdown table
    # `... | head -1`: the console's reader goes after one line; the rows still
    # reach the file.
    console.lines = 1
    monkeypatch.setattr(sys, "stdout", console)
    assert bench.main([*argv[:-1], str(tmp_path / "again.json")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert [r["policy"] for r in again["rows"]] == ["mctx_muzero"]
    assert console.text.count("\n") == 1 and console.text.startswith("date:")


@pytest.mark.parametrize("argv", [["--policies", "nope"], ["--actions", "0"], ["--repeats", "0"]])
def test_bench_search_rejects_bad_arguments(argv, capsys):
    from muzero_jax.bench import search as bench

    with pytest.raises(SystemExit) as info:
        bench.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m muzero_jax.bench.search: "), err


def test_module_attr_resolves_from_the_working_directory(tmp_path, monkeypatch):
    # As under the `muzero-jax` console script: the working directory is not on sys.path.
    (tmp_path / "my_search_mod_xyz.py").write_text(
        "import mctx\nsearch = mctx.gumbel_muzero_policy\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert resolve_search("my_search_mod_xyz:search") is mctx.gumbel_muzero_policy
    with pytest.raises(ValueError, match="'no_such_mod_xyz' does not import"):
        resolve_search("no_such_mod_xyz:search")


def _null_networks(num_actions: int, value_bins: int):
    """Networks that know nothing: uniform prior, value exactly 0 (all mass on
    the support's middle bin; Gumbel MuZero's min-max normalisation would
    blow a value of -6e-5 up into a preference), everywhere. Only `initial_inference` is read by the
    search in the environment."""
    from muzero_jax.networks import NetworkOutput

    def initial_inference(params, observation):
        b = observation.shape[0]
        return NetworkOutput(hidden=jnp.zeros((b, 1)), reward_logits=jnp.zeros((b, 1)),
                             policy_logits=jnp.zeros((b, num_actions)),
                             value_logits=jnp.full((b, value_bins), -1e9).at[
                                 :, value_bins // 2].set(0.0))

    return Networks(init=None, representation=None, dynamics=None, prediction=None,
                    initial_inference=initial_inference, recurrent_inference=None,
                    num_actions=num_actions, value_bins=value_bins, reward_bins=1)


def _connect_four_after(moves, batch=2):
    from muzero_jax.envs import make_env

    env = make_env("connect_four")
    state, ts = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), batch))
    for m in moves:
        state, ts = jax.vmap(env.step)(state, jnp.full((batch,), m, jnp.int32))
    return env, state, ts


@pytest.mark.parametrize("policy", ["gumbel_muzero", "muzero"])
def test_search_in_the_environment_takes_the_win_and_blocks(policy):
    """With networks that know nothing (uniform prior, value 0 everywhere), a
    search in Connect Four's own dynamics finds what only the real game can
    tell: the winning move (one ply), and the one move that stops the
    opponent's (two plies: every other move lets them win)."""
    from muzero_jax.search import make_env_recurrent_fn, make_env_root_fn

    support = make_support(6)
    nets = _null_networks(7, support.num_bins)
    kwargs = {"gumbel_scale": 0.0} if policy == "gumbel_muzero" else {"dirichlet_fraction": 0.0}
    search = resolve_search(policy, kwargs)
    # The player to move has three in column 0, then three on the bottom row
    # from the left: it wins there; one ply earlier the other player must block.
    env = _connect_four_after([])[0]
    recurrent = make_env_recurrent_fn(env, nets, support, discount=1.0)

    @jax.jit
    def run(state, ts):
        root = make_env_root_fn(nets, support)((), ts.observation, state)
        return search((), jax.random.key(1), root, recurrent, num_simulations=200,
                      invalid_actions=~ts.legal_action_mask)

    for moves, best in (([0, 1, 0, 1, 0, 2], 0), ([0, 1, 0, 1, 0], 0),
                        ([0, 0, 1, 1, 2, 2], 3), ([0, 0, 1, 1, 2], 3)):
        _, state, ts = _connect_four_after(moves)
        out = run(state, ts)
        visits = np.asarray(out.search_tree.summary().visit_counts)
        np.testing.assert_array_equal(visits.argmax(-1), best, err_msg=f"{policy} {moves}")


def test_search_in_the_environment_stops_at_the_end_of_the_game():
    """The move that wins gives the mover reward 1 and ends the game
    (discount 0, value 0); anything after it counts for nothing, though the
    auto-resetting environment has started a new game underneath. A move that
    goes on passes the value on with discount -1."""
    from muzero_jax.search import make_env_recurrent_fn

    support = make_support(6)
    env, state, ts = _connect_four_after([0, 1, 0, 1, 0, 2])
    recurrent = make_env_recurrent_fn(env, _null_networks(7, support.num_bins), support,
                                      discount=1.0)
    done = jnp.zeros((2,), bool)
    out, (after, ended) = recurrent((), jax.random.key(0), jnp.array([0, 3]), (state, done))
    np.testing.assert_allclose(out.reward, [1.0, 0.0])
    np.testing.assert_allclose(out.discount, [0.0, -1.0])
    np.testing.assert_allclose(out.value, [0.0, 0.0])
    np.testing.assert_array_equal(ended, [True, False])
    out2, (_, ended2) = recurrent((), jax.random.key(0), jnp.array([0, 0]), (after, ended))
    np.testing.assert_allclose(out2.reward, [0.0, 0.0])
    np.testing.assert_allclose(out2.discount, [0.0, -1.0])
    np.testing.assert_array_equal(ended2, [True, False])
    # Interior nodes offer only legal moves: column 0 is full after six plies there.
    _, state, _ = _connect_four_after([0, 0, 0, 0, 0])
    out3, _ = recurrent((), jax.random.key(0), jnp.array([0, 1]), (state, done))
    assert float(out3.prior_logits[0, 0]) <= -1e8 and float(out3.prior_logits[1, 0]) == 0.0
    with pytest.raises(ValueError, match="discount"):
        make_env_recurrent_fn(env, _null_networks(7, support.num_bins), support, discount=1.5)


def _decoding_networks(support, *, decoder=True):
    """Stand-in networks over 3-element observations whose every step can be
    worked out by hand: the representation doubles the observation; the
    dynamics halves the hidden state, adds 0.6 at the action and subtracts
    0.05 everywhere; the decoder is the identity; the prior logits are 10x
    the hidden state and the value logits put all their mass on the bin
    `sum(hidden) / 2`, so both tell which state the prediction read."""
    from muzero_jax.networks import NetworkOutput

    def predict(hidden):
        bins = jnp.arange(support.num_bins)
        index = jnp.round(hidden.sum(-1) / 2).astype(jnp.int32)
        value_logits = jnp.where(bins == index[:, None], 0.0, -1e9)
        return 10.0 * hidden, value_logits

    def dynamics(params, hidden, action):
        nxt = 0.5 * hidden + 0.6 * jax.nn.one_hot(action, 3) - 0.05
        return nxt, jnp.zeros((hidden.shape[0], support.num_bins)).at[:, 1].set(5.0)

    def initial_inference(params, observation):
        hidden = 2.0 * observation
        policy, value = predict(hidden)
        return NetworkOutput(hidden=hidden, reward_logits=jnp.zeros((hidden.shape[0], 1)),
                             policy_logits=policy, value_logits=value)

    def recurrent_inference(params, hidden, action):
        nxt, reward_logits = dynamics(params, hidden, action)
        policy, value = predict(nxt)
        return NetworkOutput(hidden=nxt, reward_logits=reward_logits, policy_logits=policy,
                             value_logits=value)

    return Networks(init=None, representation=lambda p, o: 2.0 * o, dynamics=dynamics,
                    prediction=lambda p, h: predict(h), initial_inference=initial_inference,
                    recurrent_inference=recurrent_inference, num_actions=3,
                    value_bins=support.num_bins, reward_bins=support.num_bins,
                    decoder=(lambda p, h: h) if decoder else None)


def test_decoded_model_rounds_the_decoded_observation_and_encodes_it_again():
    """From the hidden state of observation [0, 1, 0] ([0, 2, 0]), the dynamics
    reaches [0.55, 0.95, -0.05] (action 0), [-0.05, 1.55, -0.05] (1) and
    [-0.05, 0.95, 0.55] (2); decoded and rounded at 0.5 these are the
    observations [1, 1, 0], [0, 1, 0] and [0, 1, 1], encoded again as twice
    them: the node's embedding, prior (10x) and value bin (half the sum)
    come from that state, the reward and the signed discount from the
    dynamics as in the plain learned model, which reads the raw state."""
    from muzero_jax.search import make_decoded_recurrent_fn, make_recurrent_fn

    support = make_support(6)
    nets = _decoding_networks(support)
    embedding = jnp.array([[0.0, 2.0, 0.0]] * 3)
    action = jnp.array([0, 1, 2])
    decoded = make_decoded_recurrent_fn(nets, support, support, discount=1.0, two_player=True)
    out, hidden = decoded((), jax.random.key(0), action, embedding)
    rounded = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    np.testing.assert_allclose(hidden, 2.0 * rounded)
    np.testing.assert_allclose(out.prior_logits, 20.0 * rounded)
    bin_values = [float(support.logits_to_scalar(jnp.where(jnp.arange(support.num_bins) == i,
                                                           0.0, -1e9)[None])[0])
                  for i in (2, 1, 2)]
    np.testing.assert_allclose(out.value, bin_values, rtol=1e-4)
    plain, plain_hidden = make_recurrent_fn(nets, support, support, discount=1.0,
                                            two_player=True)((), jax.random.key(0), action,
                                                             embedding)
    np.testing.assert_allclose(plain_hidden, [[0.55, 0.95, -0.05], [-0.05, 1.55, -0.05],
                                              [-0.05, 0.95, 0.55]], atol=1e-6)
    np.testing.assert_allclose(out.reward, plain.reward)
    assert float(jnp.abs(out.reward).max()) > 0.1  # a reward that tells them apart
    np.testing.assert_allclose(out.discount, [-1.0] * 3)
    assert not np.allclose(out.prior_logits, plain.prior_logits)
    # A higher threshold rounds 0.55 down too.
    high = make_decoded_recurrent_fn(nets, support, support, discount=0.9, threshold=0.6)
    out, hidden = high((), jax.random.key(0), action, embedding)
    np.testing.assert_allclose(hidden, [[0.0, 2.0, 0.0]] * 3)
    np.testing.assert_allclose(out.discount, [0.9] * 3)
    with pytest.raises(ValueError, match="reconstruction_loss_weight"):
        make_decoded_recurrent_fn(_decoding_networks(support, decoder=False), support, support,
                                  discount=1.0)
    with pytest.raises(ValueError, match="discount"):
        make_decoded_recurrent_fn(nets, support, support, discount=-0.5)


@pytest.mark.parametrize("value_scale", [0.05, 0.4])
def test_qtransform_kwargs_from_json_set_gumbel_improved_policy(value_scale):
    # `{"qtransform": {...}}` binds keyword arguments to Gumbel MuZero's own
    # qtransform. On the bandit every arm is visited, so the improved policy is
    # softmax(prior logits + (maxvisit_init + max N) * value_scale * q) with
    # the priors uniform and q the arms' rewards min-max rescaled to [0, 1].
    search = resolve_search("gumbel_muzero", {"qtransform": {"value_scale": value_scale,
                                                             "maxvisit_init": 10}})
    assert search.keywords["qtransform"].func is mctx.qtransform_completed_by_mix_value
    nets = bandit_networks()
    run = batch_search(search, make_root_fn(nets, SUPPORT),
                       make_recurrent_fn(nets, SUPPORT, SUPPORT, discount=0.9),
                       num_simulations=16)
    out = _jit(run)({}, jax.random.key(0), jnp.zeros((2, 2)), jnp.ones((2, NUM_ACTIONS), bool))
    visits = out.search_tree.summary().visit_counts
    assert np.all(visits > 0)
    q = np.array([0.0, 0.1, 1.0, 0.0])
    sigma = (10 + visits.max(-1, keepdims=True)) * value_scale * q
    expected = np.exp(sigma) / np.exp(sigma).sum(-1, keepdims=True)
    np.testing.assert_allclose(out.action_weights, expected, atol=2e-3)


def test_qtransform_by_name_and_errors():
    assert resolve_search("muzero", {"qtransform": "by_min_max"}).keywords == {
        "qtransform": mctx.qtransform_by_min_max}
    assert resolve_search("gumbel_muzero", {"qtransform": "mctx:qtransform_by_min_max"}
                          ).keywords["qtransform"] is mctx.qtransform_by_min_max
    named = resolve_search("puct", {"qtransform": {"name": "qtransform_by_tree_min_max",
                                                   "epsilon": 1e-6}}).keywords["qtransform"]
    assert named.func is qtransform_by_tree_min_max and named.keywords == {"epsilon": 1e-6}
    # A callable (from Python) is passed through untouched.
    assert resolve_search("muzero", {"qtransform": mctx.qtransform_by_min_max}).keywords[
        "qtransform"] is mctx.qtransform_by_min_max
    for kwargs, message in [
        ({"qtransform": {"value_scal": 0.2}}, "does not take \\['value_scal'\\]"),
        ({"qtransform": "nope"}, "unknown qtransform 'nope'; mctx's: .*by_min_max"),
        ({"qtransform": 3}, "must be a name or a JSON object"),
        ({"qtransform": "mctx:nope"}, "has no attribute 'nope'"),
    ]:
        with pytest.raises(ValueError, match=message):
            resolve_search("gumbel_muzero", kwargs)

    def no_qtransform(params, rng_key, root, recurrent_fn, *, num_simulations,
                      invalid_actions=None):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="has no default qtransform to configure"):
        resolve_search(no_qtransform, {"qtransform": {"value_scale": 0.2}})
