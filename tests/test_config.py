"""Config validation: bad input is reported clearly, before compiling."""

import dataclasses

import pytest

from muzero_jax.config import Config, config_from_dict, config_to_dict
from muzero_jax.presets import preset


def test_defaults_and_derived_values():
    c = Config()
    assert c.sequence_length == c.num_unroll_steps + c.td_steps + 1
    assert c.env_steps_per_iteration == c.num_envs * c.rollout_length
    assert c.updates_per_iteration == round(c.replay_ratio * c.env_steps_per_iteration)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("num_envs", 0, "num_envs must be > 0"),
        ("num_unroll_steps", 0, "num_unroll_steps must be > 0"),
        ("batch_size", -4, "batch_size must be > 0"),
        ("learning_rate", 0.0, "learning_rate must be > 0"),
        ("discount", 1.5, "discount must be in"),
        ("replay_capacity", 10, "cannot hold one sequence"),
        ("replay_ratio", 0.0001, "learner would starve"),
        ("replay_ratio", 0.0101, "whole number"),
        ("search_kwargs", "{bad json", "not valid JSON"),
        ("search_kwargs", "[1, 2]", "must be JSON or key=value"),
        ("env_kwargs", "{bad json", "env_kwargs is not valid JSON"),
        ("env_kwargs", "[1, 2]", "env_kwargs must be a JSON object"),
        ("temperature_schedule", ((0.5, 1.0), (0.2, 0.5)), "increasing"),
        ("network", "transformer", "network must be"),
        ("num_envs", 2.5, "must be an integer"),
        ("search_model", "oracle", "search_model must be 'learned' or 'decoded'"),
        ("search_model", "decoded", "needs the decoder: set reconstruction_loss_weight"),
        ("eval_weights", "ema", "eval_weights must be 'online' or 'target'"),
        ("eval_weights", "target", "set target_ema > 0"),
        ("act_weights", "ema", "act_weights must be 'online' or 'target'"),
        ("act_weights", "target", "act_weights='target' acts with the moving average"),
        ("eval_symmetry_ensemble", "yes", "eval_symmetry_ensemble must be true or false"),
        ("act_symmetry_ensemble", 1, "act_symmetry_ensemble must be true or false"),
        ("random_move_prob", 1.0, r"random_move_prob must be a number in \[0, 1\)"),
        ("random_move_prob", -0.1, "random_move_prob must be a number"),
        ("random_move_prob", True, "random_move_prob must be a number"),
        ("search_value_mix", 1.5, r"search_value_mix must be a number in \[0, 1\]"),
        ("search_value_mix", -0.1, "search_value_mix must be a number"),
        ("search_value_mix", True, "search_value_mix must be a number"),
    ],
)
def test_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{field: value})


def test_search_kwargs_forms():
    assert Config(search_kwargs='{"dirichlet_alpha": 0.3}').parsed_search_kwargs() == {
        "dirichlet_alpha": 0.3
    }
    cfg = Config(search_kwargs="max_num_considered_actions=4,qtransform=x")
    parsed = cfg.parsed_search_kwargs()
    assert parsed == {"max_num_considered_actions": 4, "qtransform": "x"}


def test_evaluation_search_defaults_to_self_plays_and_its_kwargs_only_for_the_same_search():
    own = '{"gumbel_scale": 0.0}'
    cases = [  # (eval_search, eval_search_kwargs) -> (search, kwargs text, parsed)
        (("", ""), ("gumbel_muzero", own, {"gumbel_scale": 0.0})),
        (("gumbel_muzero", ""), ("gumbel_muzero", own, {"gumbel_scale": 0.0})),
        (("muzero", ""), ("muzero", "{}", {})),
        (("muzero", "dirichlet_fraction=0"), ("muzero", "dirichlet_fraction=0",
                                              {"dirichlet_fraction": 0})),
        (("", '{"gumbel_scale": 1.0}'), ("gumbel_muzero", '{"gumbel_scale": 1.0}',
                                         {"gumbel_scale": 1.0})),
    ]
    for (name, kwargs), (want_name, want_text, want_parsed) in cases:
        cfg = Config(search="gumbel_muzero", search_kwargs=own, eval_search=name,
                     eval_search_kwargs=kwargs)
        assert cfg.evaluation_search() == (want_name, want_text)
        assert cfg.parsed_eval_search_kwargs() == want_parsed
    with pytest.raises(ValueError, match="eval_search_kwargs is not valid JSON"):
        Config(eval_search_kwargs="{bad")
    with pytest.raises(ValueError, match="eval_search_kwargs must be JSON or key=value"):
        Config(eval_search_kwargs="nope")


def test_env_kwargs_build_the_training_environment():
    from muzero_jax.learning import make_train

    assert Config().parsed_env_kwargs() == {}
    env = make_train(Config(env="catch", env_kwargs='{"rows": 6, "columns": 4}')).env
    assert env.observation_shape[:2] == (6, 4)
    with pytest.raises(ValueError, match="env_kwargs .* do not fit 'catch'"):
        make_train(Config(env="catch", env_kwargs='{"bogus": 1}'))


def test_round_trip_through_dict():
    c = preset("cartpole", seed=3)
    assert config_from_dict(config_to_dict(c)) == c
    with pytest.raises(ValueError, match="unknown config fields: nope"):
        config_from_dict({**config_to_dict(c), "nope": 1})


def test_presets():
    assert preset("catch").env == "catch"
    assert dataclasses.replace(preset("catch"), seed=5).seed == 5
    with pytest.raises(ValueError, match="unknown environment 'pong'; known: catch, cartpole"):
        preset("pong")
