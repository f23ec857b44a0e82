"""Typed, frozen training configuration, validated when constructed.

Configs never reach jitted code: `learning.make_train` reads plain values from
them once and closes over those.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from muzero_jax.networks import COMPUTE_DTYPES, MLPConfig, ResNetConfig

__all__ = ["Config", "config_from_dict", "config_to_dict"]


def _positive(name: str, value: Any, *, allow_zero: bool = False, integer: bool = True) -> None:
    low = 0 if allow_zero else 1
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not integer and not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    too_small = value < low if integer else (value < 0 or (not allow_zero and value == 0))
    if too_small:
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def _fraction(name: str, value: Any, *, include_one: bool) -> None:
    """`value` must be a number (not a bool) in [0, 1] or [0, 1)."""
    number = not isinstance(value, bool) and isinstance(value, int | float)
    if not number or not (0.0 <= value and (value <= 1.0 if include_one else value < 1.0)):
        raise ValueError(f"{name} must be a number in [0, 1{']' if include_one else ')'}, "
                         f"got {value!r}")


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a training run needs. Defaults suit Catch on a laptop CPU.

    Attributes:
      env: environment name (see `muzero_jax.envs.ENV_NAMES`).
      seed: seed of every random number in the run.
      env_kwargs: JSON object of keyword arguments for the training
        environment (`make_env(env, **env_kwargs)`), e.g.
        `{"min_plies_before_pass": 81}` for Go. Matches against opponents
        (`muzero-jax eval --opponent`, `muzero-jax play`) play the registered
        game at its defaults.
      num_envs: environments acting in parallel (split evenly across devices).
      rollout_length: environment steps per environment per iteration.
      max_env_steps: stop after this many environment steps (also sets the
        temperature and importance-sampling schedules).
      network: "mlp" (vector observations) or "resnet" (images).
      mlp: sizes of the MLP networks.
      resnet: sizes of the ResNet networks.
      compute_dtype: "float32", or "bfloat16" for mixed precision: the
        networks compute in bfloat16 (their parameters and inputs cast on
        each call, outputs back to float32) while parameters, gradients, the
        optimiser, targets and search statistics stay float32. For GPUs and
        TPUs, whose matrix units run bfloat16 several times faster; on CPU
        it is slower.
      value_support_size: half-width of the categorical value support
        (2 * size + 1 bins over the h-transformed value, or over the raw
        value without `support_transform`).
      reward_support_size: half-width of the categorical reward support.
      support_transform: squash values and rewards with MuZero's h transform
        before projecting them onto their supports (the paper's choice, for
        Atari's unbounded returns). False makes both supports linear: bins at
        the integers of the raw scalar, so a game whose values lie in
        [-1, 1] can use `value_support_size` 1, a win/draw/loss head whose
        expectation is P(win) - P(loss).
      discount: the environment discount gamma.
      num_unroll_steps: K, the steps the model is unrolled in the loss.
      td_steps: n, the steps of the n-step value target.
      value_loss_weight: weight of the value loss (0.25 in MuZero Reanalyze).
      reward_loss_weight: weight of the reward loss (1 in the paper). Other
        values are passed to the loss as `reward_loss_weight=`, so a custom
        `loss_fn` must accept it.
      consistency_loss_weight: weight of EfficientZero's self-supervised
        consistency loss (0: off, as in MuZero; EfficientZero uses 2). When
        > 0 the networks gain projection and predictor heads (left out of
        `weight_decay`, see `learning.make_optimizer`), and the loss gets
        `consistency_loss_weight=` and the batch `next_observation`, so a
        custom `loss_fn` must accept them.
      consistency_projection_size: width of those heads.
      consistency_batch_size: how many of each update's `batch_size` sampled
        sequences the consistency loss covers (0: all of them). The samples
        are drawn independently, so the first M are a random subset; their
        terms are scaled by batch / M, so the loss keeps its weight. Its
        targets then cost one representation call on M * K observations
        instead of batch * K (in the `connect_four` preset the consistency
        loss was ~1/3 of an iteration on the 2-core CPU; at 64 of 256 one
        seed ran 1.19x the iterations at equal wall time and won no more,
        so the preset keeps 0; README, Board games). Passed to the loss as
        `consistency_batch=` (per device: M / D of its batch / D), so a
        custom `loss_fn` must accept it. Split across devices like
        `batch_size`.
      action_reward_loss_weight: weight of a reward loss on every legal
        action of each unrolled position, not only the one taken (0: off, as
        in MuZero). While acting, the environment is stepped once more per
        action from the same state (a pure JAX environment can be) to label
        the reward each action would have given; the learner applies the
        dynamics to every action and trains its reward head on those labels.
        Search still plans only in the learned model. Beyond the paper: it
        aims at games whose only reward is rare (a board game's winning
        move), where one played action per row teaches the model little
        about which moves win. When > 0 the loss gets
        `action_reward_loss_weight=` and the batch `target_action_reward`
        and `action_reward_mask`, so a custom `loss_fn` must accept them
        (and `action_reward_steps=`).
      action_reward_steps: how many of the K unroll steps that loss covers,
        from the first (1..K; 1: the positions sampled, whose hidden state
        comes from the representation). Each step costs one dynamics call on
        batch * num_actions rows per update. The threat-value loss covers the
        same steps.
      action_reward_batch_size: how many of each update's `batch_size`
        sampled sequences that loss and the other every-action losses
        (threat values, replies, predictions, reconstructions) cover (0: all
        of them). The samples are drawn independently, so the first M are a
        random subset; each every-action loss is averaged over those M and so
        keeps its weight. Each covered step then costs M * num_actions rows
        instead of batch * num_actions (in the `connect_four` preset the
        every-action rewards were ~40 % of an iteration on the 2-core CPU;
        README, Board games). Split across devices like `batch_size`.
      threat_value_loss_weight: weight of a value loss on the hidden states
        that every-action dynamics reaches (0: off; needs
        `action_reward_loss_weight` > 0 and a two-player game). While acting,
        the environment is stepped once more per reply after each action; an
        action after which the player to reply can end the game at once with
        a positive reward (a win) is labelled with that reward, which is the
        value of the position it leads to for that player, and the learner
        trains the value the prediction gives there towards it. Other actions
        get no value label. Beyond the paper: it teaches the model, from the
        sampled positions, which moves let the opponent win at once (a missed
        block), including moves never played. When > 0 the loss gets
        `threat_value_loss_weight=` and the batch `target_action_threat`.
      action_prediction_loss_weight: weight of a value and policy loss on the
        hidden states that every-action dynamics reaches (0: off; needs
        `action_reward_loss_weight` > 0). While acting, the networks' own
        prediction (`initial_inference`, the acting parameters) is taken on
        the real observation each legal action leads to, and the learner
        trains the prediction at the dynamics' hidden state for that action
        towards it: value cross-entropy towards that value (0 where the action
        ends the episode), policy cross-entropy towards that policy (masked
        to the legal actions there; none where the action ends the episode).
        Beyond the paper: self-play trains the dynamics only along the
        actions played, while the search evaluates the learned model after
        every action. When > 0 the loss gets `action_prediction_loss_weight=`
        and the batch `target_action_value` / `target_action_policy`.
      reconstruction_loss_weight: weight of an observation-reconstruction
        loss (0: off, as in MuZero). When > 0 the networks gain a decoder
        head (the network's `head_hidden_sizes`, then the observation's
        size), and every hidden state of the unroll, the representation's
        and each one the dynamics reaches, is decoded and trained towards
        the observation actually there (squared error summed over the
        observation's elements), so that the learned model keeps the board
        in its hidden state along the actions played. Beyond the paper
        (an auxiliary loss in the spirit of world models). When > 0 the
        loss gets `reconstruction_loss_weight=` and the batch
        `next_observation`, so a custom `loss_fn` must accept them.
      action_reconstruction_loss_weight: weight of the same reconstruction
        on the hidden states that every-action dynamics reaches (0: off;
        needs `action_reward_loss_weight` > 0). While acting, the real
        observation each legal action leads to is stored (`A` observations
        per step in replay), and the learner decodes the dynamics' hidden
        state for that action and trains it towards that observation
        (squared error summed over its elements, averaged over the legal
        actions), so the model keeps the board after the moves never played
        too, which the search evaluates. Builds the decoder head as
        `reconstruction_loss_weight` does. When > 0 the loss gets
        `action_reconstruction_loss_weight=` and the batch
        `target_action_observation`.
      reply_reward_loss_weight: weight of a reward loss one move deeper
        (0: off; needs `action_reward_loss_weight` > 0). While acting, the
        environment is also stepped once per reply after each action; for
        each action one reply is kept, the one with the highest positive
        reward (e.g. the opponent's winning move) or else a uniformly random
        legal one, with its reward. The learner applies the dynamics to that
        reply from each every-action hidden state and trains the reward head
        on it: exact labels, both ways, for moves never played, at the
        cost of one more dynamics call on batch * num_actions rows per
        covered step. When > 0 the loss gets `reply_reward_loss_weight=` and
        the batch `target_reply` and `target_reply_reward`.
      augment_symmetries: train on each sampled example moved by a random
        symmetry of the board (AlphaGo Zero's augmentation: Connect Four's
        mirror, the square's eight for TicTacToe and Go): observations,
        actions and policy targets move together, values and rewards stay.
        Needs an environment with `symmetries` (the pgx games).
      value_target: "target_network" bootstraps from a target network's value
        at the bootstrap state (MuZero Reanalyze); "search" from the search
        value stored when acting (the original paper).
      search_value_mix: w in [0, 1]; w > 0 makes every value target (before
        the episode's end) `(1 - w) * n-step return + w * the search value
        stored at that row` (its root value from acting, or from reanalyse):
        AlphaZero's "average z and q" (A. Prasad, "Lessons from AlphaZero",
        2019, on Connect Four). It lowers the variance of final-outcome
        targets (`td_steps` at least the game's length), which carry every
        exploratory move made after the row. 0 (default) is the paper's.
        Prioritised replay's priorities |q - target| shrink by (1 - w), so
        at w = 1 sampling is uniform.
      target_update_period: copy params to the target network every this many
        updates (ignored when `target_ema` > 0).
      target_ema: if > 0, the target network tracks params as an exponential
        moving average with this step size instead of periodic copies.
      eval_weights: the weights the trainer's evaluations and, by default,
        `load_agent` / `muzero-jax eval` use: "online" (the optimiser's, the
        default) or "target" (the target network's; needs `target_ema` > 0,
        so that they are the exponential moving average of the online
        weights: Polyak averaging, which smooths the noise of the last
        updates). Self-play acts with the weights `act_weights` names.
      act_weights: the weights self-play (and reanalyse) search with:
        "online" (the default, as in the paper) or "target" (the moving
        average of the online weights; needs `target_ema` > 0). The stored
        search policies and values, and so the policy targets, then come
        from the averaged weights, which lag the online ones by about
        1 / target_ema updates.
      eval_symmetry_ensemble: the trainer's evaluations and, by default,
        `load_agent` / `muzero-jax eval` / `play` average every network
        evaluation of their search over the board's symmetries
        (`symmetries.ensemble_networks`: test-time augmentation, S times the
        network cost per simulation; Connect Four's mirror, S = 2). Needs an
        environment with `symmetries` (the pgx games). Self-play does only
        with `act_symmetry_ensemble`.
      act_symmetry_ensemble: self-play's search too averages every network
        evaluation over the board's symmetries, so the stored search
        policies and values (the policy and value targets) come from the
        averaged networks; S times the network cost of acting. Needs an
        environment with `symmetries`.
      eval_win_lookahead: the trainer's evaluations and, by default,
        `load_agent` / `muzero-jax eval` / `play` search the learned model
        with its own predicted rewards read as wins
        (`search.with_win_lookahead`): a node where the player to move has a
        move predicted to win is worth at least that reward, and a predicted
        win ends the game in the search. For two-player games rewarded only
        at their end (the pgx games); one more dynamics evaluation per move
        per expanded node. Self-play's search is unchanged unless
        `act_win_lookahead` is set too.
      act_win_lookahead: self-play's search (and reanalyse's) reads the
        learned model's predicted rewards as wins the same way, so the stored
        search policies and values come from that search; one more dynamics
        evaluation per move per expanded node of acting. Same games as
        `eval_win_lookahead`.
      search: a built-in search name ("gumbel_muzero", "muzero", "puct",
        "muzero_paper") or "package.module:attr".
      search_kwargs: JSON object of keyword hyper-parameters for the search;
        its "qtransform" may be a name or a JSON object of the qtransform's
        own keyword arguments (`search.resolve_qtransform`), e.g.
        '{"qtransform": {"value_scale": 0.2}}' for gumbel_muzero.
      search_model: what the search plans in, in self-play and evaluation:
        "learned" (MuZero's dynamics, the default) or "decoded" (the same
        learned model re-grounded at every step: the dynamics' next hidden
        state is decoded to an observation, rounded onto 0/1 and encoded
        again by the representation, `search.make_decoded_recurrent_fn`).
        "decoded" needs the decoder (`reconstruction_loss_weight` or
        `action_reconstruction_loss_weight` > 0) and an environment whose
        observations are 0/1 (`Environment.binary_observation`: the pgx
        games, Catch). Beyond the paper; it costs a decoder and a
        representation call per simulation.
      num_simulations: simulations per search when acting.
      act_with_search_action: act with the search's own chosen action (its
        own exploration; what Gumbel MuZero prescribes) instead of sampling
        the search policy with `temperature_schedule`.
      temperature_schedule: (fraction of training, temperature) pairs: the
        temperature used to sample actions from the search policy until that
        fraction of `max_env_steps`; 0 is greedy. Used when
        `act_with_search_action` is False.
      exploration_plies: when > 0, explore (sample, or the search's own
        action) only during the first this many steps of each episode and act
        greedily after them, as AlphaZero does in its board games; 0 explores
        at every step.
      random_move_prob: the probability that a self-play move is replaced by
        a uniformly random legal one (epsilon-greedy on top of the search,
        at every ply and for both players; evaluation never does). The row
        keeps the search's policy and value as targets, and the dynamics
        learns the moves a weak or random opponent makes. 0 (default) is off.
        In Go at 0.2 (one seed) it held learning back: the final outcomes
        the values learn from are those of games full of blunders (README,
        Board games).
      replay_capacity: time steps kept per environment.
      reanalyse_rows: R > 0 re-searches R stored rows of every environment
        per iteration with the networks self-play acts with (MuZero
        Reanalyze, as a sweep over the buffer: each row once every
        `replay_capacity / R` iterations), refreshing their policy targets
        and search values; each row costs one search, as an acting step
        does. 0 (default) keeps the targets the row was acted with.
      prioritized_replay: prioritised (True) or uniform (False) sampling.
      priority_alpha: priority exponent alpha.
      priority_beta_start: importance-sampling exponent at the start,
        annealed linearly to `priority_beta_end` over training.
      priority_beta_end: importance-sampling exponent at the end.
      min_replay_steps: environment steps per environment collected before
        learning starts.
      batch_size: sequences per update (global, split across devices).
      replay_ratio: updates per environment step; updates per iteration are
        `replay_ratio * num_envs * rollout_length` (must be a whole number).
      optimizer: "adam" or "sgd" (with momentum).
      learning_rate: peak learning rate.
      lr_warmup_updates: linear warm-up from 0 over this many updates.
      lr_decay: "constant", "cosine" or "exponential" after warm-up.
      lr_decay_rate: for "exponential": factor per `lr_decay_updates`.
      lr_decay_updates: for "cosine" and "exponential": the decay horizon.
      momentum: SGD momentum.
      weight_decay: L2 weight decay (added to the gradient, as the paper's L2
        loss term does), on every parameter but the consistency heads'.
      max_grad_norm: global gradient-norm clipping (0 disables).
      eval_every: evaluate every this many iterations (0 disables).
      eval_episodes: greedy evaluation episodes per evaluation.
      eval_num_simulations: simulations per search in evaluation (0: same as
        `num_simulations`).
      eval_search: the search of the trainer's evaluations and, by default,
        of `load_agent` (`muzero-jax eval`, `muzero-jax play`): a name as for
        `search`. Empty (the default): self-play's `search`. E.g. self-play
        with "gumbel_muzero" and 16 simulations, evaluation with "muzero"
        (PUCT) and `eval_num_simulations` 128.
      eval_search_kwargs: that search's keyword hyper-parameters, as for
        `search_kwargs`. Empty (the default): self-play's `search_kwargs`
        when `eval_search` is empty or names the same search, none
        otherwise (another search's signature may not take them).
      num_devices: devices to run on (0: all local devices).
    """

    env: str = "catch"
    seed: int = 0
    env_kwargs: str = "{}"
    num_envs: int = 64
    rollout_length: int = 10
    max_env_steps: int = 200_000
    network: Literal["mlp", "resnet"] = "mlp"
    mlp: MLPConfig = MLPConfig()
    resnet: ResNetConfig = ResNetConfig(
        channels=32, num_blocks=2, downsample=False, head_hidden_sizes=(64,)
    )
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    value_support_size: int = 10
    reward_support_size: int = 5
    support_transform: bool = True
    discount: float = 0.997
    num_unroll_steps: int = 5
    td_steps: int = 10
    value_loss_weight: float = 0.25
    reward_loss_weight: float = 1.0
    consistency_loss_weight: float = 0.0
    consistency_projection_size: int = 128
    consistency_batch_size: int = 0
    action_reward_loss_weight: float = 0.0
    action_reward_steps: int = 1
    action_reward_batch_size: int = 0
    threat_value_loss_weight: float = 0.0
    reply_reward_loss_weight: float = 0.0
    action_prediction_loss_weight: float = 0.0
    reconstruction_loss_weight: float = 0.0
    action_reconstruction_loss_weight: float = 0.0
    augment_symmetries: bool = False
    value_target: Literal["target_network", "search"] = "target_network"
    search_value_mix: float = 0.0
    target_update_period: int = 100
    target_ema: float = 0.0
    eval_weights: Literal["online", "target"] = "online"
    act_weights: Literal["online", "target"] = "online"
    eval_symmetry_ensemble: bool = False
    act_symmetry_ensemble: bool = False
    eval_win_lookahead: bool = False
    act_win_lookahead: bool = False
    search: str = "gumbel_muzero"
    search_kwargs: str = "{}"
    search_model: Literal["learned", "decoded"] = "learned"
    num_simulations: int = 16
    act_with_search_action: bool = True
    temperature_schedule: tuple[tuple[float, float], ...] = ((0.5, 1.0), (0.75, 0.5), (1.0, 0.25))
    exploration_plies: int = 0
    random_move_prob: float = 0.0
    replay_capacity: int = 500
    reanalyse_rows: int = 0
    prioritized_replay: bool = True
    priority_alpha: float = 1.0
    priority_beta_start: float = 0.4
    priority_beta_end: float = 1.0
    min_replay_steps: int = 20
    batch_size: int = 256
    replay_ratio: float = 0.0125
    optimizer: Literal["adam", "sgd"] = "adam"
    learning_rate: float = 3e-3
    lr_warmup_updates: int = 50
    lr_decay: Literal["constant", "cosine", "exponential"] = "constant"
    lr_decay_rate: float = 0.1
    lr_decay_updates: int = 100_000
    momentum: float = 0.9
    weight_decay: float = 1e-4
    max_grad_norm: float = 5.0
    eval_every: int = 10
    eval_episodes: int = 32
    eval_num_simulations: int = 0
    eval_search: str = ""
    eval_search_kwargs: str = ""
    num_devices: int = 0

    def __post_init__(self):
        for name in (
            "num_envs", "rollout_length", "max_env_steps", "value_support_size",
            "reward_support_size", "num_unroll_steps", "td_steps", "target_update_period",
            "num_simulations", "replay_capacity", "min_replay_steps", "batch_size",
            "lr_decay_updates", "eval_episodes", "consistency_projection_size",
        ):
            _positive(name, getattr(self, name))
        for name in ("lr_warmup_updates", "eval_every", "eval_num_simulations", "num_devices",
                     "seed"):
            _positive(name, getattr(self, name), allow_zero=True)
        for name in ("learning_rate", "replay_ratio"):
            _positive(name, getattr(self, name), integer=False)
        for name in ("weight_decay", "max_grad_norm", "value_loss_weight",
                     "reward_loss_weight", "consistency_loss_weight",
                     "action_reward_loss_weight", "threat_value_loss_weight",
                     "reply_reward_loss_weight", "action_prediction_loss_weight",
                     "reconstruction_loss_weight", "action_reconstruction_loss_weight",
                     "priority_alpha",
                     "target_ema", "momentum"):
            _positive(name, getattr(self, name), allow_zero=True, integer=False)
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {self.discount!r}")
        _fraction("random_move_prob", self.random_move_prob, include_one=False)
        _fraction("search_value_mix", self.search_value_mix, include_one=True)
        if not 0.0 <= self.target_ema < 1.0:
            raise ValueError(f"target_ema must be in [0, 1), got {self.target_ema!r}")
        for name in ("priority_beta_start", "priority_beta_end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.network not in ("mlp", "resnet"):
            raise ValueError(f"network must be 'mlp' or 'resnet', got {self.network!r}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"compute_dtype must be 'float32' or 'bfloat16', got {self.compute_dtype!r}")
        if self.search_model not in ("learned", "decoded"):
            raise ValueError(
                f"search_model must be 'learned' or 'decoded', got {self.search_model!r}")
        if self.search_model == "decoded" and not (self.reconstruction_loss_weight > 0
                                                   or self.action_reconstruction_loss_weight > 0):
            raise ValueError(
                "search_model='decoded' needs the decoder: set reconstruction_loss_weight > 0 "
                "(or action_reconstruction_loss_weight > 0)")
        for name, verb in (("eval_weights", "evaluates"), ("act_weights", "acts with")):
            weights = getattr(self, name)
            if weights not in ("online", "target"):
                raise ValueError(f"{name} must be 'online' or 'target', got {weights!r}")
            if weights == "target" and not self.target_ema > 0:
                raise ValueError(
                    f"{name}='target' {verb} the moving average of the weights: set "
                    f"target_ema > 0 (e.g. 0.001), or {name}='online'")
        if self.value_target not in ("target_network", "search"):
            raise ValueError(
                f"value_target must be 'target_network' or 'search', got {self.value_target!r}"
            )
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.lr_decay not in ("constant", "cosine", "exponential"):
            raise ValueError(f"lr_decay must be constant/cosine/exponential, got {self.lr_decay!r}")
        if not self.temperature_schedule:
            raise ValueError("temperature_schedule must have at least one (fraction, temperature)")
        fractions = [f for f, _ in self.temperature_schedule]
        if fractions != sorted(fractions) or any(t < 0 for _, t in self.temperature_schedule):
            raise ValueError(
                "temperature_schedule must be (fraction, temperature) pairs with increasing "
                f"fractions and temperatures >= 0, got {self.temperature_schedule!r}"
            )
        if (isinstance(self.action_reward_steps, bool)
                or not isinstance(self.action_reward_steps, int)
                or not 1 <= self.action_reward_steps <= self.num_unroll_steps):
            raise ValueError(
                f"action_reward_steps must be an integer in [1, num_unroll_steps="
                f"{self.num_unroll_steps}], got {self.action_reward_steps!r}")
        if (isinstance(self.consistency_batch_size, bool)
                or not isinstance(self.consistency_batch_size, int)
                or not 0 <= self.consistency_batch_size <= self.batch_size):
            raise ValueError(
                f"consistency_batch_size must be an integer in [0, batch_size="
                f"{self.batch_size}] (0: the whole batch), got "
                f"{self.consistency_batch_size!r}")
        if (isinstance(self.action_reward_batch_size, bool)
                or not isinstance(self.action_reward_batch_size, int)
                or not 0 <= self.action_reward_batch_size <= self.batch_size):
            raise ValueError(
                f"action_reward_batch_size must be an integer in [0, batch_size="
                f"{self.batch_size}] (0: the whole batch), got "
                f"{self.action_reward_batch_size!r}")
        if self.threat_value_loss_weight > 0 and not self.action_reward_loss_weight > 0:
            raise ValueError(
                f"threat_value_loss_weight={self.threat_value_loss_weight} needs "
                "action_reward_loss_weight > 0: it trains the value after the same "
                "every-action dynamics")
        if self.reply_reward_loss_weight > 0 and not self.action_reward_loss_weight > 0:
            raise ValueError(
                f"reply_reward_loss_weight={self.reply_reward_loss_weight} needs "
                "action_reward_loss_weight > 0: it steps on from the same every-action "
                "dynamics")
        if self.action_prediction_loss_weight > 0 and not self.action_reward_loss_weight > 0:
            raise ValueError(
                f"action_prediction_loss_weight={self.action_prediction_loss_weight} needs "
                "action_reward_loss_weight > 0: it trains the prediction after the same "
                "every-action dynamics")
        if self.action_reconstruction_loss_weight > 0 and not self.action_reward_loss_weight > 0:
            raise ValueError(
                f"action_reconstruction_loss_weight={self.action_reconstruction_loss_weight} "
                "needs action_reward_loss_weight > 0: it decodes the hidden states of the "
                "same every-action dynamics")
        for name in ("eval_symmetry_ensemble", "act_symmetry_ensemble", "eval_win_lookahead",
                     "act_win_lookahead"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, "
                                 f"got {getattr(self, name)!r}")
        if not isinstance(self.augment_symmetries, bool):
            raise ValueError(
                f"augment_symmetries must be true or false, got {self.augment_symmetries!r}")
        if (isinstance(self.exploration_plies, bool) or not isinstance(self.exploration_plies, int)
                or self.exploration_plies < 0):
            raise ValueError(
                f"exploration_plies must be an integer >= 0, got {self.exploration_plies!r}")
        if (isinstance(self.reanalyse_rows, bool) or not isinstance(self.reanalyse_rows, int)
                or not 0 <= self.reanalyse_rows <= self.replay_capacity):
            raise ValueError(
                f"reanalyse_rows must be an integer in [0, replay_capacity="
                f"{self.replay_capacity}], got {self.reanalyse_rows!r}")
        if self.reanalyse_rows * self.replay_capacity >= 2**31:
            raise ValueError(
                f"reanalyse_rows * replay_capacity must be below 2**31 (the sweep's int32 "
                f"index), got {self.reanalyse_rows} * {self.replay_capacity}")
        self.parsed_search_kwargs()  # raises on malformed JSON
        self.parsed_eval_search_kwargs()
        self.parsed_env_kwargs()
        if self.sequence_length > self.replay_capacity:
            raise ValueError(
                f"replay_capacity={self.replay_capacity} cannot hold one sequence of "
                f"num_unroll_steps + td_steps + 1 = {self.sequence_length} steps"
            )
        if self.min_replay_steps > self.replay_capacity:
            raise ValueError(
                f"min_replay_steps={self.min_replay_steps} exceeds "
                f"replay_capacity={self.replay_capacity}"
            )
        updates = self.replay_ratio * self.env_steps_per_iteration
        if updates < 1 - 1e-9 or abs(updates - round(updates)) > 1e-6:
            raise ValueError(
                f"replay_ratio={self.replay_ratio} gives {updates:g} updates per iteration of "
                f"{self.env_steps_per_iteration} environment steps (num_envs * rollout_length); "
                "it must be a whole number >= 1 (the learner would starve otherwise)"
            )

    @property
    def sequence_length(self) -> int:
        """Rows per sampled sequence: K + n + 1."""
        return self.num_unroll_steps + self.td_steps + 1

    @property
    def env_steps_per_iteration(self) -> int:
        """Environment steps of one iteration over all environments."""
        return self.num_envs * self.rollout_length

    @property
    def updates_per_iteration(self) -> int:
        """Learner updates per iteration (`replay_ratio * env steps`)."""
        return int(round(self.replay_ratio * self.env_steps_per_iteration))

    def parsed_search_kwargs(self) -> dict[str, Any]:
        """`search_kwargs` as a dict (JSON object, or `key=value,key=value`)."""
        return _search_kwargs("search_kwargs", self.search_kwargs)

    def evaluation_search(self) -> tuple[str, str]:
        """The search and its `search_kwargs` text that evaluation uses.

        `eval_search` (default: `search`) and `eval_search_kwargs`, which
        default to `search_kwargs` for the same search and to none for
        another.
        """
        name = self.eval_search.strip() or self.search
        if self.eval_search_kwargs.strip():
            return name, self.eval_search_kwargs
        return name, self.search_kwargs if name == self.search else "{}"

    def parsed_eval_search_kwargs(self) -> dict[str, Any]:
        """`evaluation_search()`'s keyword arguments as a dict."""
        name = "eval_search_kwargs" if self.eval_search_kwargs.strip() else "search_kwargs"
        return _search_kwargs(name, self.evaluation_search()[1])

    def parsed_env_kwargs(self) -> dict[str, Any]:
        """`env_kwargs` as a dict (a JSON object; empty text is `{}`)."""
        return _json_object("env_kwargs", self.env_kwargs.strip() or "{}")


def _search_kwargs(name: str, text: str) -> dict[str, Any]:
    """A search's keyword arguments from a JSON object or `key=value,key=value`."""
    stripped = text.strip()
    if not stripped:
        return {}
    if not stripped.startswith("{"):
        out: dict[str, Any] = {}
        for item in stripped.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{name} must be JSON or key=value pairs, got {text!r}")
            try:
                out[key.strip()] = json.loads(value)
            except json.JSONDecodeError:
                out[key.strip()] = value.strip()
        return out
    return _json_object(name, stripped)


def _json_object(name: str, text: str) -> dict[str, Any]:
    """`text` parsed as a JSON object; a ValueError naming field `name` otherwise."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not valid JSON: {e}") from e
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must be a JSON object, got {text!r}")
    return parsed


def config_to_dict(config: Config) -> dict[str, Any]:
    """A JSON-serialisable dict of every field (nested configs included)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuilds a `Config` from `config_to_dict` output (validated)."""
    data = dict(data)
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = set(data) - fields
    if unknown:
        raise ValueError(f"unknown config fields: {', '.join(sorted(unknown))}")
    if "mlp" in data and isinstance(data["mlp"], dict):
        data["mlp"] = MLPConfig(**{k: tuple(v) if isinstance(v, list) else v
                                   for k, v in data["mlp"].items()})
    if "resnet" in data and isinstance(data["resnet"], dict):
        data["resnet"] = ResNetConfig(**{k: tuple(v) if isinstance(v, list) else v
                                         for k, v in data["resnet"].items()})
    if "temperature_schedule" in data:
        data["temperature_schedule"] = tuple(tuple(p) for p in data["temperature_schedule"])
    return Config(**data)
