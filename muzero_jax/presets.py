"""Per-environment default configurations (tuned on a 2-core CPU).

`muzero-jax train --env NAME` starts from `preset(NAME)`; every field can be
overridden on the command line. The experiment scripts in `experiments/` use
the same presets and record what they reach.
"""

from __future__ import annotations

import dataclasses

from muzero_jax.config import Config
from muzero_jax.envs import ENV_NAMES
from muzero_jax.networks import MLPConfig, ResNetConfig

__all__ = ["PRESETS", "preset"]

PRESETS: dict[str, Config] = {
    # Catch: 9-step episodes, reward +-1 at the end.
    "catch": Config(
        env="catch",
        discount=1.0,
        value_loss_weight=1.0,
        num_simulations=8,
        # 32 updates of 128 per iteration of 640 steps: same samples per step
        # as 16 of 256 at about the same cost, and half the training time to
        # solve on seeds 0 and 1 (37k and 44k env steps instead of 73k and 37k).
        batch_size=128,
        replay_ratio=0.05,
        value_support_size=5,
        reward_support_size=5,
        # Catch needs neither LayerNorm nor a 5-step unroll: without them an
        # iteration runs in half the time (0.11 s instead of 0.21 s on the
        # 2-core CPU) and seeds 0-4 still solve in 27k-49k env steps, so a cold
        # run solves within 30 s (`python experiments/solve.py --env catch
        # --seeds 0,1,2,3,4`; vmapped tuning: K=3 with LayerNorm 37k-49k,
        # K=3 without 35k-51k, the K=5 LayerNorm preset before 33k-68k).
        num_unroll_steps=3,
        mlp=MLPConfig(layer_norm=False),
        max_env_steps=300_000,
        # Evaluation is cheap here (32 episodes of 9 steps), and evaluating
        # often finds the two consecutive solved evaluations sooner.
        eval_every=2,
    ),
    # CartPole-v1: reward 1 per step up to 500 steps; values up to ~1/(1-gamma).
    "cartpole": Config(
        env="cartpole",
        discount=0.99,
        value_support_size=20,
        reward_support_size=5,
        mlp=MLPConfig(hidden_sizes=(64,), latent_size=64, head_hidden_sizes=(64,)),
        max_env_steps=1_000_000,
        replay_capacity=1000,
        # Cosine decay steadies the policy once it balances: with a constant
        # rate, greedy returns of ~470 kept falling back below 475. Over 1500
        # updates it reached 0 before seed 1 balanced; over 3000, seeds 0-4
        # all solved, in 1272-1752 updates (102k-141k env steps; `python
        # experiments/solve.py --env cartpole --seeds 0,1,2,3,4 --vmap-seeds`).
        lr_decay="cosine",
        lr_decay_updates=3000,
        eval_every=10,
        # A greedy evaluation is 32 episodes of up to 500 sequential searches:
        # with 16 simulations it cost ~0.6 s per evaluation, a third of a
        # run's time. With 8, seeds 0-4 all solved within 60 s cold (40.7-57.5
        # s; with 16: 48.3-68.6 s, 3 of 5; `python experiments/solve.py --env
        # cartpole --seeds 0,1,2,3,4 --max-seconds 120`).
        eval_num_simulations=8,
    ),
    # Two-player board games (pgx): values from the mover's point of view,
    # discount 1 and td_steps = the longest game, so value targets are the final
    # outcome (the paper's board-game setting). No periodic self-play eval:
    # strength is measured against opponents (`muzero_jax.arena`).
    "tic_tac_toe": Config(
        env="tic_tac_toe",
        discount=1.0,
        num_unroll_steps=5,
        value_loss_weight=1.0,
        value_support_size=5,
        reward_support_size=2,
        mlp=MLPConfig(hidden_sizes=(128, 128), latent_size=64, head_hidden_sizes=(64,)),
        num_simulations=32,
        eval_num_simulations=64,
        # Deterministic search (no Gumbel noise at the root): evaluation and
        # play are greedy, and exploration comes from sampling the improved
        # policy with a temperature instead. With Gumbel's own sampled action,
        # self-play was nearly deterministic (sigma(q) dwarfs the Gumbel noise),
        # saw few openings, and lost 66-93 % as second player to minimax, which
        # opens with any of the 9 cells; with temperatures of 4 then 3 the
        # 10-minute run loses no game from either seat (README, "Board games";
        # ending at temperature 2 left ~10 % losses as second player).
        search_kwargs='{"gumbel_scale": 0.0}',
        act_with_search_action=False,
        temperature_schedule=((0.5, 4.0), (1.0, 3.0)),
        # Values bootstrap from the search value 3 plies on (the paper's
        # original target) rather than the final outcome of exploratory play.
        value_target="search",
        td_steps=3,
        num_envs=64,
        rollout_length=10,
        replay_capacity=1000,
        prioritized_replay=False,
        min_replay_steps=20,
        batch_size=256,
        replay_ratio=0.05,
        # Sized for 10 minutes on a 2-core CPU (~600 iterations of 640 steps
        # and 32 updates): temperature and learning-rate schedules end there.
        max_env_steps=400_000,
        lr_decay="cosine",
        lr_decay_updates=20_000,
        eval_every=0,
    ),
    # Connect Four: TicTacToe's recipe (deterministic Gumbel search, sampling
    # the improved policy with a temperature, search-value targets a few plies
    # on, uniform replay) with 16 simulations over 256 games at once: an
    # iteration of 2,560 env steps took 1.9 s against 1.7 s for 640 steps
    # with 32 simulations over 64 games (both measured beside another job),
    # ~2,700 env steps/s alone on the 2-core CPU. The old preset (Gumbel's own action,
    # final-outcome targets, 64 games, 32 simulations) won 0-1 % against the
    # 200-simulation MCTS after 938 s; against a 50-simulation MCTS this one
    # wins ~50 % as first and ~20 % as second player after 0.6-0.9 M env steps,
    # but against the 200-simulation MCTS only 0-8 % up to 2.7 M. With the
    # reward weight and conv stem below: 15-35 % as first, 5-10 % as second
    # after 1,000-1,800 s (two runs; README, "Board games": the 90 % goal is
    # not met). Tuning runs
    # (`experiments/board_games.py --opponent mcts:50`): a learning rate of
    # 1e-3 with temperatures 1 then 0.5 learnt more slowly, temperatures 4
    # then 3 were unstable; a 512-wide net learnt more per env step but runs
    # ~2.7x slower.
    "connect_four": Config(
        env="connect_four",
        # 0.99 won 0.93 / 0.8375 on seeds 15, 16 on an Intel Xeon against
        # that machine's preset's 0.9175 / 0.86 (README).
        discount=1.0,
        # Seven steps won 0.93 / 0.875 on seeds 15, 16 in 30 minutes (0.85x
        # the iterations) against the same-day preset's 0.9325 / 0.8775;
        # three were within noise (README).
        num_unroll_steps=5,
        # Weighted 0.5, three seeds lost from both seats against MCTS-200
        # (0.867 / 0.778 as first / second player, the same-day preset 0.928 /
        # 0.858); 2 lost in two seeds of the 256-wide preset (README).
        value_loss_weight=1.0,
        # The only reward is the winning move (~4 % of rows): weighting it and
        # a conv stem took 0.37 -> ~0.6 of immediate wins (README). Weighted
        # 20, seed 15 won 0.885 / 0.85 in 30 minutes against the same-day
        # preset's 0.93 / 0.885; weighted 5, 0.845 / 0.77 (README).
        reward_loss_weight=10.0,
        # EfficientZero's consistency loss: at 1,800 s it took more immediate
        # wins on average (0.80 / 0.67 / 0.53 in three seeds, against 0.59 /
        # 0.59 in two without) at ~25 % fewer env steps/s. With the decoder
        # in the preset, two seeds without it (and 20 % more iterations) won
        # 0.65 and 0.615 of 400 games against MCTS-200, where the preset's
        # same seeds won 0.71 and 0.86 (README). Weighted 4, seeds 15, 16
        # won 0.885 / 0.865 in 30 minutes against the same-day preset's
        # 0.9325 / 0.8775; weighted 1, seed 15 won 0.935 / 0.855 against
        # 0.93 / 0.885 (README).
        consistency_loss_weight=2.0,
        # Reward labels on every move (from pgx while acting) for the first
        # two unroll positions, and the left-right mirror: in two seeds more
        # wins taken and blocks made at every matched env step (e.g. 0.89 /
        # 0.73 and 0.78 / 0.61 at 1.5 M, against 0.63 / 0.43 and 0.61 / 0.51),
        # at ~30 % fewer env steps/s (README, Board games). Three positions
        # won 0.935 / 0.82 on seed 15 in 30 minutes against the same-day
        # preset's 0.93 / 0.885 (README). Weighted 20 instead of 10, seeds
        # 15, 16 won 0.91 / 0.8325 on an Intel Xeon against that machine's
        # preset runs' 0.9175 / 0.86, and weighted 5 0.8925 / 0.8125
        # (README).
        action_reward_loss_weight=10.0,
        action_reward_steps=2,
        # ...on 64 of each update's 256 sequences: at equal wall time on the
        # 2-core CPU (two seeds side by side, 3,000 s each) ~1.31x the
        # iterations, and 0.905 / 0.835 of 400 games against MCTS-200 as
        # first / second player where the whole batch won 0.87 / 0.765
        # (README, Board games).
        action_reward_batch_size=64,
        augment_symmetries=True,
        # Decoding every hidden state of the unroll back to the board: in
        # three seeds the final states won 0.725, 0.60 and 0.50 of the
        # common 40 games against MCTS-200, where the same seeds without it
        # won 0.225, 0.30 and 0.325 (README, Board games).
        reconstruction_loss_weight=1.0,
        # Searching the learned model re-grounded in its decoded boards, in
        # self-play and evaluation: every state evaluated both ways won more
        # of 200 games against MCTS-200 decoded (e.g. 0.775 against 0.715);
        # the runs trained that way were the strongest (README, Board games).
        search_model="decoded",
        # Evaluating the moving average of the weights (target_ema 0.001, ~1k
        # updates; the target network is otherwise unused here, as every
        # value target is the final outcome): +0.02 to +0.09 of 200 games
        # (+0.065 on average) in both seeds and both evaluation seeds tried
        # (README).
        # 0.0003 gained nothing; 0.002 lost 0.015 / 0.020 on seeds 15, 16
        # beside same-day preset runs (README).
        target_ema=0.001,
        eval_weights="target",
        # Evaluating with the networks averaged over the board and its mirror
        # (test-time augmentation; twice the network cost per simulation): in
        # all four seeds of this preset at least as strong, +0.033 of 400
        # games on average (0.84 / 0.81 against 0.80 / 0.78; README).
        eval_symmetry_ensemble=True,
        # Reading the model's predicted rewards as wins in the evaluation's
        # search (a node whose player to move has a move predicted to win is
        # worth at least that reward; a predicted win ends the game there):
        # nearly all the learned model's extra losses began with a missed
        # forced block, and with it the preset's four AMD EPYC states won
        # 0.919 / 0.904 of 400 games each against 0.902 / 0.861, the losses
        # begun with a missed block 92 -> 14; held-out seeds 22, 23, 24
        # 0.92 / 0.825 against 0.893 / 0.787 without it (README, Board
        # games). ~1.7x the evaluation's time. Not in self-play's search:
        # act_win_lookahead lost there (0.848 / 0.760 against 0.888 / 0.815
        # on seeds 22, 16).
        eval_win_lookahead=True,
        value_support_size=6,
        reward_support_size=2,
        # Torsos 384 wide (256 until 2026-12-03): at the reference runs'
        # iterations two seeds won 0.935 / 0.865 of 400 games against MCTS-200
        # where 256 won 0.835 / 0.785 on the same machine (0.905 / 0.835 on
        # 2026-11-28); ~1.26x the time per iteration, and near equal time
        # 0.9275 / 0.835; held-out seed 8 in 30 minutes alone 0.905 / 0.85
        # against 256's 0.885 / 0.835; eight seeds in that design 0.911 /
        # 0.821 (README, Board games). A 192-wide latent won 0.929 / 0.886 on
        # seeds 12-16 against the same-day preset's 0.930 / 0.866, lower as
        # first player in three seeds; with seeds 17, 18 on an Intel Xeon,
        # 0.918 / 0.877 against 0.933 / 0.854: it trades the first seat for
        # the second within the seed spread, so it stays 128 (README). With
        # the 5 x 5 stem, seed 15 on an AMD EPYC won 0.835 / 0.79 against
        # that machine's preset runs' 0.905 / 0.87 and 0.895 / 0.845 (README).
        # Heads (and decoder) 256 wide won 0.93 / 0.875 on seed 15 at 0.91x
        # the iterations against the same-day preset's 0.93 / 0.885 (README).
        # Three layers of 256 won 0.93 / 0.76 on seed 15 at 1.14x the
        # iterations (README).
        # On an Intel Xeon (~1.22x the iterations of the AMD EPYC behind the
        # runs above in 30 minutes) seeds 15-18 won 0.929 / 0.841 (README);
        # there SiLU activations instead of ReLU won 0.62 / 0.575 on seed 15,
        # against 0.89 / 0.88 (README).
        # The stem's kernel 5 x 5 since 2026-12-06 (4 x 4 before): on the Intel
        # Xeon seeds 15-18 won 0.951 / 0.88 in 30 minutes at 0.70x the
        # iterations, against the 4 x 4 preset's 0.929 / 0.841, higher as
        # second player in all four seeds (README). Held-out seeds 19-21 won
        # 0.94 / 0.862; the seven runs 0.946 / 0.872 (README).
        # A 6 x 6 kernel won 0.945 / 0.889 on seeds 15-18 against
        # 0.951 / 0.88: the seats trade within noise (README).
        # 48 planes won 0.938 / 0.865 on seeds 15, 16 against the same
        # session's preset's 0.943 / 0.823: one seed each way (README).
        # Two stem layers (conv_layers 2: a 3 x 3 convolution after the
        # 5 x 5) won 0.912 / 0.872 on seeds 15-17 against 0.947 / 0.872 (README).
        # On an AMD EPYC (0.71-0.90x the 4 x 4 stem's iterations there) seeds
        # 15, 16, 14 won 0.905 / 0.867 against the 4 x 4 preset's 0.932 / 0.867
        # on the same machine: neutral there (README).
        mlp=MLPConfig(hidden_sizes=(384, 384), latent_size=128, head_hidden_sizes=(128,),
                      conv_channels=32, conv_kernel=5),
        # 8 won 0.935 / 0.8575 on seeds 15, 16 in 30 minutes (1.19x the
        # iterations) against the same-day preset's 0.9325 / 0.8775; 32 cost
        # ~1.8x the time per iteration with the 256-wide torsos (README).
        num_simulations=16,
        eval_num_simulations=128,
        # Without rescaling the completed Q-values ({"qtransform":
        # {"rescale_values": false}}) seeds 15, 16, 14 won 0.803 / 0.753 on an
        # AMD EPYC against the same day's preset runs' 0.905 / 0.867 (README).
        search_kwargs='{"gumbel_scale": 0.0}',
        act_with_search_action=False,
        temperature_schedule=((0.5, 2.0), (1.0, 1.0)),
        value_target="search",
        # The final outcome as every value target (td_steps = Connect Four's
        # longest game, so no target bootstraps and value_target is unused),
        # as in the paper: four seeds won 0.90 / 0.85 of 400 games each
        # against MCTS-200 where search values 5 plies on won 0.84 / 0.81,
        # and two seeds held their gain at equal time (0.95x the iterations,
        # for the longer sequences). 3 plies won 0.81 / 0.78 (README).
        # Averaging it with the stored search value (search_value_mix 0.5)
        # won 0.9275 / 0.85 on seeds 15, 16 on an Intel Xeon against that
        # machine's preset runs' 0.9175 / 0.86 (README).
        td_steps=42,
        # 128 environments with 2,000 replay steps each (the same buffer
        # rows and updates per env step, the acting weights refreshed twice
        # as often) won 0.95 / 0.83 on seeds 15, 16 against the same-day
        # preset's 0.9325 / 0.8775 (README).
        num_envs=256,
        rollout_length=10,
        replay_capacity=1000,
        prioritized_replay=False,
        min_replay_steps=20,
        batch_size=256,
        # 32 updates per iteration. Halved, seed 15 ran 1.50x the iterations
        # in 30 minutes and won 0.865 / 0.83 against the same-day preset's
        # 0.93 / 0.885; 1.5x, seeds 15, 16 ran 0.75x and won 0.905 / 0.805
        # against 0.9325 / 0.8775 (README).
        replay_ratio=0.0125,
        # The gradient-norm clip stays the default 5: it binds early (the
        # mean norm before clipping is ~11 over the first 100 iterations);
        # at 20, seeds 15, 16, 14 won 0.833 / 0.728 on an AMD EPYC against
        # the same day's preset runs' 0.905 / 0.867, and at 2.5 seeds 15, 16
        # won 0.767 / 0.740 against 0.890 / 0.847 (README).
        max_grad_norm=5.0,
        # Schedules sized for ~2,700 env steps/s (the MLP without the conv
        # stem); with the stem, the consistency loss and the every-move
        # rewards ~1,000/s, so 30 minutes on the 2-core CPU covers ~1.8 M of
        # the 5 M steps (the runs behind this preset used the same).
        max_env_steps=5_000_000,
        lr_decay="cosine",
        lr_decay_updates=62_500,
        eval_every=0,
    ),
    # Go 9x9: sized for one GPU (a ResNet over the 17 pgx feature planes); on
    # a GPU or TPU add compute_dtype "bfloat16" (the learner 1.54x float32's
    # on an H100; kept out of the preset, which also runs on CPUs).
    "go_9x9": Config(
        env="go_9x9",
        discount=1.0,
        td_steps=162,
        num_unroll_steps=5,
        value_loss_weight=1.0,
        value_support_size=12,
        reward_support_size=2,
        network="resnet",
        # The move drawn on the board, as the paper encodes Go moves (and an
        # all-ones plane for pass), rather than 82 constant planes.
        resnet=ResNetConfig(channels=64, num_blocks=6, downsample=False,
                            head_hidden_sizes=(128,), action_planes="board"),
        num_simulations=32,
        # Self-play only (matches and `play` use the standard game): pass is
        # offered from ply 81 on (Leela Zero's --nopassbefore), and the final
        # reward is the area-score margin, without which self-play settled
        # on passing early (with komi, two early passes win for white).
        # Every GPU run used them (README, Board games).
        env_kwargs='{"min_plies_before_pass": 81, "score_reward": true}',
        # Evaluating the moving average of the weights (the target network is
        # otherwise unused: every return ends at a terminal row): +0.04 /
        # +0.04 against random in the H100 bfloat16 run, +0.08 / -0.01 in the
        # H200 one, where it won 0.98 / 0.96 (README, Board games).
        target_ema=0.001,
        eval_weights="target",
        # Evaluating with the networks averaged over the square's eight
        # symmetries (S = 8 times the network cost of a simulation; not in
        # self-play): the H200 bfloat16 run of seed 1 won 0.835 / 0.95 with it
        # and 0.575 / 0.815 without, 200 games per seat each with the same rng
        # key; seed 0's stronger state 0.95 / 0.89 against 0.92 / 0.98 (64
        # games per seat; as white a possible loss): +0.15 / +0.02 over the two seeds
        # (README, Board games).
        eval_symmetry_ensemble=True,
        num_envs=256,
        rollout_length=16,
        replay_capacity=400,
        min_replay_steps=168,
        batch_size=512,
        replay_ratio=0.0625,
        max_env_steps=20_000_000,
        eval_every=0,
    ),
}


def preset(env: str, **overrides) -> Config:
    """The default config for `env`, with `overrides` applied (validated)."""
    if env in PRESETS:
        base = PRESETS[env]
    elif env in ENV_NAMES:
        base = Config(env=env)
    else:
        raise ValueError(f"unknown environment {env!r}; known: {', '.join(ENV_NAMES)}")
    for name in ("mlp", "resnet"):  # a dict updates the preset's network config
        if isinstance(overrides.get(name), dict):
            try:
                overrides[name] = dataclasses.replace(getattr(base, name), **overrides[name])
            except TypeError as e:
                fields = ", ".join(f.name for f in dataclasses.fields(getattr(base, name)))
                raise ValueError(
                    f"{name} overrides {overrides[name]!r}: {e}; fields: {fields}"
                ) from e
    return dataclasses.replace(base, **overrides)
