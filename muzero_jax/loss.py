"""MuZero's unrolled loss (Schrittwieser et al., 2020, Eq. 1 and Appendix G).

The model is unrolled K steps from a sampled position: initial inference on the
first observation, then K recurrent steps on the actions actually taken. Each
step predicts value, reward and policy against targets built outside autodiff.
As in the pseudocode's `update_weights`:

* the hidden state leaving every recurrent step passes through
  `scale_gradient(h, 0.5)`, halving the gradient that flows back into the
  dynamics from later steps;
* the loss of each recurrent step passes through `scale_gradient(l, 1 / K)`.

The loss is averaged over the batch (the pseudocode sums; the gradient here is
the pseudocode's divided by the batch size). L2 regularisation is not part of
this function: `learning.make_optimizer` adds it as `optax.add_decayed_weights`
before the optimiser, which for SGD is exactly the pseudocode's
`weight_decay * tf.nn.l2_loss(w)` term.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from muzero_jax.gradients import scale_gradient
from muzero_jax.networks import Networks, Params
from muzero_jax.value_transforms import DiscreteSupport

__all__ = ["LossBatch", "LossMetrics", "unrolled_loss"]


class LossBatch(NamedTuple):
    """Inputs of the unrolled loss for a batch of B positions unrolled K steps.

    Attributes:
      observation: `[B, *obs]` observation at each sampled position.
      actions: `[B, K]` int32 actions taken at steps 0..K-1.
      target_value: `[B, K+1]` scalar value targets (n-step returns).
      target_reward: `[B, K+1]` scalar reward targets; index 0 is unused (the
        initial inference predicts no reward).
      target_policy: `[B, K+1, A]` policy targets (search visit distributions).
      value_mask: `[B, K+1]` 1 where the value loss counts.
      reward_mask: `[B, K+1]` 1 where the reward loss counts (index 0 ignored).
      policy_mask: `[B, K+1]` 1 where the policy loss counts (0 past the end of
        an episode: absorbing states have no policy).
      importance_weight: `[B]` per-example weights (prioritised replay).
      next_observation: `[B, K, *obs]` the observation reached after each of
        the K actions (only the consistency and reconstruction losses read
        it; None without them).
        Entry k-1 counts where `policy_mask[:, k-1]` is 1, i.e. where the
        action was taken inside the episode.
      target_action_reward: `[B, K, A]` the reward each action would have
        given from the position at step k (k = 0..K-1), from the simulator
        (only the action-reward loss reads it; None without it).
      action_reward_mask: `[B, K, A]` 1 where that label counts (legal
        actions of positions inside the episode).
      target_action_threat: `[B, K, A]` for each action from the position at
        step k, the value of the position it leads to for the player to reply
        there, where that player can end the game at once with a positive
        reward (that reward); 0 where unknown (only the threat-value loss
        reads it, where it is positive and `action_reward_mask` is 1; None
        without it).
      target_reply: `[B, K, A]` int32, for each action from the position at
        step k, one reply from the position it leads to (-1: none), and
      target_reply_reward: `[B, K, A]` that reply's reward for its mover
        (only the reply-reward loss reads them, where the reply is >= 0 and
        `action_reward_mask` is 1; None without it).
      target_action_value: `[B, K, A]` for each action from the position at
        step k, the value of the position it leads to for the player to move
        there, from the networks' prediction on the real observation (0
        where the action ends the episode; only the action-prediction loss
        reads it, where `action_reward_mask` is 1; None without it), and
      target_action_policy: `[B, K, A, A]` the policy there (zeros where
        there is none; the policy term counts where it sums to 1).
      target_action_observation: `[B, K, A, *obs]` for each action from the
        position at step k, the observation it leads to (only the
        action-reconstruction loss reads it, where `action_reward_mask` is
        1; None without it).
    """

    observation: chex.Array
    actions: chex.Array
    target_value: chex.Array
    target_reward: chex.Array
    target_policy: chex.Array
    value_mask: chex.Array
    reward_mask: chex.Array
    policy_mask: chex.Array
    importance_weight: chex.Array
    next_observation: chex.Array | None = None
    target_action_reward: chex.Array | None = None
    action_reward_mask: chex.Array | None = None
    target_action_threat: chex.Array | None = None
    target_reply: chex.Array | None = None
    target_reply_reward: chex.Array | None = None
    target_action_value: chex.Array | None = None
    target_action_policy: chex.Array | None = None
    target_action_observation: chex.Array | None = None


class LossMetrics(NamedTuple):
    """Diagnostics of one loss evaluation (batch means unless said).

    Attributes:
      loss: the total loss (forward value; equals the returned scalar).
      value_loss: value cross-entropy summed over the K+1 steps (unweighted).
      reward_loss: reward cross-entropy summed over the K recurrent steps.
      policy_loss: policy cross-entropy summed over the K+1 steps.
      value_error: `[K+1]` mean |predicted value - target| at each step.
      reward_error: `[K+1]` mean |predicted reward - target| (0 at step 0).
      policy_entropy: mean entropy of the predicted policy at step 0.
      predicted_value: `[B]` scalar value predicted at step 0 (for priorities).
      consistency_loss: negative cosine similarity of the consistency loss,
        summed over the K recurrent steps (unweighted; 0 when it is off).
      action_reward_loss: reward cross-entropy averaged over the labelled
        actions of a position, summed over the steps the term covers
        (unweighted; 0 when it is off).
      threat_value_loss: value cross-entropy after every action labelled as
        a threat, averaged over those actions of a position, summed over the
        steps the term covers (unweighted; 0 when it is off).
      reply_reward_loss: reward cross-entropy of the labelled reply after
        every action, averaged over the labelled actions of a position,
        summed over the steps the term covers (unweighted; 0 when it is off).
      action_prediction_loss: value plus policy cross-entropy of the
        prediction after every action against the labelled prediction,
        each averaged over its labelled actions of a position, summed over
        the steps the term covers (unweighted; 0 when it is off).
      reconstruction_loss: squared error of the decoded observation, summed
        over its elements and over the K+1 steps (unweighted; 0 when off).
      action_reconstruction_loss: squared error of the decoded observation
        after every action, summed over its elements, averaged over the
        labelled actions of a position, summed over the steps the term
        covers (unweighted; 0 when it is off).
    """

    loss: chex.Array
    value_loss: chex.Array
    reward_loss: chex.Array
    policy_loss: chex.Array
    value_error: chex.Array
    reward_error: chex.Array
    policy_entropy: chex.Array
    predicted_value: chex.Array
    consistency_loss: chex.Array = 0.0
    action_reward_loss: chex.Array = 0.0
    threat_value_loss: chex.Array = 0.0
    reply_reward_loss: chex.Array = 0.0
    action_prediction_loss: chex.Array = 0.0
    reconstruction_loss: chex.Array = 0.0
    action_reconstruction_loss: chex.Array = 0.0


def _check_every_action_term(weight: str, action_reward: bool, why: str, batch: LossBatch,
                             labels: tuple[str, ...]) -> None:
    """A term built on the every-action dynamics needs that term on, and its labels."""
    if not action_reward:
        raise ValueError(f"{weight} > 0 needs action_reward_loss_weight > 0 ({why})")
    if any(getattr(batch, name) is None for name in labels):
        raise ValueError(f"{weight} > 0 needs a batch with {' and '.join(labels)}")


def _unit(x: chex.Array, eps: float = 1e-5) -> chex.Array:
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def _masked_ce(logits: chex.Array, target_probs: chex.Array) -> chex.Array:
    return optax.softmax_cross_entropy(logits, target_probs)


def unrolled_loss(
    params: Params,
    batch: LossBatch,
    *,
    networks: Networks,
    value_support: DiscreteSupport,
    reward_support: DiscreteSupport,
    value_loss_weight: float = 0.25,
    unroll: int | bool = True,
    reward_loss_weight: float = 1.0,
    consistency_loss_weight: float = 0.0,
    consistency_batch: int | None = None,
    action_reward_loss_weight: float = 0.0,
    action_reward_steps: int | None = None,
    action_reward_batch: int | None = None,
    threat_value_loss_weight: float = 0.0,
    reply_reward_loss_weight: float = 0.0,
    action_prediction_loss_weight: float = 0.0,
    reconstruction_loss_weight: float = 0.0,
    action_reconstruction_loss_weight: float = 0.0,
) -> tuple[chex.Array, LossMetrics]:
    """MuZero's loss over K unroll steps, with the paper's gradient scaling.

    Per step k, `l_k = value_loss_weight * CE(value) + reward_loss_weight *
    CE(reward) + CE(policy)`
    (no reward term at k = 0), plus, for k > 0 and `consistency_loss_weight`
    > 0, `consistency_loss_weight * -cos(predictor(projection(s_k)),
    stop_gradient(projection(h(o_k))))`: EfficientZero's self-supervised
    consistency between the hidden state the dynamics reached and the
    representation of the observation actually reached (Ye et al., 2021; the
    target branch uses the same parameters under `stop_gradient`), plus, for
    `action_reward_loss_weight` > 0, `action_reward_loss_weight` times the
    reward cross-entropy of the dynamics applied to *every* action from the
    hidden state of step k - 1 (for k up to `action_reward_steps`), against
    the simulator's labels `batch.target_action_reward[:, k - 1]`, averaged
    over the labelled actions (`batch.action_reward_mask`), plus, for
    `threat_value_loss_weight` > 0 (which needs the action-reward term), that
    weight times the value cross-entropy of the prediction at each of those
    every-action hidden states against `batch.target_action_threat`, averaged
    over the actions it labels (where it is positive: the player to reply
    can win at once, so the position is worth that to them), plus, for
    `reply_reward_loss_weight` > 0 (which needs the action-reward term too),
    that weight times the reward cross-entropy of the dynamics applied once
    more, from each of those hidden states (gradient scaled by 0.5 as
    between unroll steps), to its labelled reply
    (`batch.target_reply`) against `batch.target_reply_reward`, averaged over
    the labelled actions, plus, for `action_prediction_loss_weight` > 0
    (which needs the action-reward term too), that weight times the value
    and policy cross-entropies of the prediction at each of those
    every-action hidden states against `batch.target_action_value` and
    `batch.target_action_policy` (the networks' own prediction on the real
    observation the action leads to), each averaged over its labelled
    actions, plus, for `reconstruction_loss_weight` > 0, that weight times
    `sum((decoder(s_k) - o_k)^2)` over the observation's elements at every
    step k = 0..K: the hidden state the representation (k = 0) or the
    dynamics (k > 0) reached, decoded, against the observation actually
    there (`batch.observation`, then `batch.next_observation`), which keeps
    what the observation shows in the model's hidden states, plus, for
    `action_reconstruction_loss_weight` > 0 (which needs the action-reward
    term), that weight times the same squared error of each every-action
    hidden state, decoded, against the observation the action leads to
    (`batch.target_action_observation`), averaged over the labelled actions.
    Each term is masked by its mask; the total is
    `sum_k scale_gradient(l_k, 1 / K if k > 0 else 1)`, weighted per example by
    `importance_weight` and averaged over the batch. All targets are wrapped in
    `stop_gradient`.

    Args:
      params: network parameters.
      batch: a `LossBatch` (K >= 1 is read from `batch.actions.shape[1]`).
      networks: the `Networks` bundle.
      value_support: categorical support of the value head.
      reward_support: categorical support of the reward head.
      value_loss_weight: weight of the value term (the paper uses 0.25 with
        reanalyse, 1.0 otherwise).
      unroll: `lax.scan`'s `unroll` over the K recurrent steps. The default
        (True: all K steps inlined) lets XLA fuse across steps: on a 2-core CPU
        the learner step of muzero-general's net (K=5, batch 256) ran 1.36x
        faster than with a rolled loop (1), for ~1.5 s more compile. Use 1
        for very long unrolls, where compile time grows with K.
      reward_loss_weight: weight of the reward term (1 in the paper); more
        weight helps where rewards are rare (a board game's only reward is
        its last move).
      consistency_loss_weight: weight of the consistency term (0, off, in
        MuZero; EfficientZero uses 2). Needs `networks.projection` (built with
        `make_networks(..., projection_size=P)`) and `batch.next_observation`.
      consistency_batch: how many of the B examples, the first M, the
        consistency term covers (None: all B). Its targets then cost one
        representation call on M * K observations instead of B * K, and its
        heads M rows per step; each covered example's term is scaled by B / M,
        so that with independently sampled examples the loss keeps its
        expected value (as `action_reward_batch` does).
      action_reward_loss_weight: weight of the every-action reward term (0,
        off, in MuZero). Needs `batch.target_action_reward` and
        `batch.action_reward_mask`. Costs one dynamics call on B * A rows for
        each step it covers.
      action_reward_steps: how many of the K recurrent steps the every-action
        term covers, from the first (None: all K). The first covers the
        representation's hidden state, the second the dynamics' first.
      threat_value_loss_weight: weight of the threat-value term (0, off, in
        MuZero). Needs `action_reward_loss_weight` > 0 (it reads the value of
        the same every-action hidden states) and `batch.target_action_threat`.
      reply_reward_loss_weight: weight of the reply-reward term (0, off, in
        MuZero). Needs `action_reward_loss_weight` > 0 and
        `batch.target_reply` / `batch.target_reply_reward`. Costs one more
        dynamics call on B * A rows for each covered step.
      action_prediction_loss_weight: weight of the action-prediction term (0,
        off, in MuZero). Needs `action_reward_loss_weight` > 0 and
        `batch.target_action_value` / `batch.target_action_policy`. Costs one
        prediction call on B * A rows for each covered step (shared with the
        threat-value term).
      reconstruction_loss_weight: weight of the reconstruction term (0, off,
        in MuZero, which needs no reconstruction). Needs `networks.decoder`
        (built with `make_networks(..., observation_shape=...)`) and
        `batch.next_observation`. Costs one decoder call on B rows per step.
      action_reconstruction_loss_weight: weight of the every-action
        reconstruction term (0, off). Needs `action_reward_loss_weight` > 0,
        `networks.decoder` and `batch.target_action_observation`. Costs one
        decoder call on B * A rows for each covered step.

    Returns:
      `(loss, metrics)`: the scalar loss and a `LossMetrics`.
    """
    chex.assert_rank(batch.actions, 2)
    batch_size, num_steps = batch.actions.shape
    if num_steps < 1:
        raise ValueError(f"the unroll length K must be >= 1, got actions of shape "
                         f"{batch.actions.shape}")
    num_actions = networks.num_actions
    chex.assert_shape(batch.target_value, (batch_size, num_steps + 1))
    chex.assert_shape(batch.target_reward, (batch_size, num_steps + 1))
    chex.assert_shape(batch.target_policy, (batch_size, num_steps + 1, num_actions))
    chex.assert_shape(
        [batch.value_mask, batch.reward_mask, batch.policy_mask], (batch_size, num_steps + 1)
    )
    chex.assert_shape(batch.importance_weight, (batch_size,))
    consistency = consistency_loss_weight > 0
    if consistency and (networks.projection is None or batch.next_observation is None):
        raise ValueError(
            "consistency_loss_weight > 0 needs networks built with projection_size > 0 "
            "and a batch with next_observation"
        )
    consistency_examples = batch_size if consistency_batch is None else consistency_batch
    if (isinstance(consistency_examples, bool) or not isinstance(consistency_examples, int)
            or not 1 <= consistency_examples <= batch_size):
        raise ValueError(f"consistency_batch must be an integer in [1, B={batch_size}], "
                         f"got {consistency_batch!r}")
    reconstruct = reconstruction_loss_weight > 0
    if reconstruct:
        if networks.decoder is None or batch.next_observation is None:
            raise ValueError(
                "reconstruction_loss_weight > 0 needs networks built with observation_shape "
                "and a batch with next_observation")
        chex.assert_shape(batch.next_observation,
                          (batch_size, num_steps) + batch.observation.shape[1:])
    action_reward = action_reward_loss_weight > 0
    if action_reward:
        if batch.target_action_reward is None or batch.action_reward_mask is None:
            raise ValueError("action_reward_loss_weight > 0 needs a batch with "
                             "target_action_reward and action_reward_mask")
        chex.assert_shape([batch.target_action_reward, batch.action_reward_mask],
                          (batch_size, num_steps, num_actions))
        action_reward_probs = reward_support.scalar_to_probs(
            jax.lax.stop_gradient(batch.target_action_reward))  # [B, K, A, bins]
        action_reward_mask = jax.lax.stop_gradient(batch.action_reward_mask).astype(jnp.float32)
        covered = num_steps if action_reward_steps is None else int(action_reward_steps)
        if not 1 <= covered <= num_steps:
            raise ValueError(f"action_reward_steps must be in [1, K={num_steps}], "
                             f"got {action_reward_steps!r}")
        covered_examples = batch_size if action_reward_batch is None else action_reward_batch
        if (isinstance(covered_examples, bool) or not isinstance(covered_examples, int)
                or not 1 <= covered_examples <= batch_size):
            raise ValueError(f"action_reward_batch must be an integer in [1, B={batch_size}], "
                             f"got {action_reward_batch!r}")
    threat = threat_value_loss_weight > 0
    if threat:
        _check_every_action_term("threat_value_loss_weight", action_reward,
                                 "it reads the value after the same every-action dynamics",
                                 batch, ("target_action_threat",))
        chex.assert_shape(batch.target_action_threat, (batch_size, num_steps, num_actions))
        target_threat = jax.lax.stop_gradient(batch.target_action_threat)
        threat_probs = value_support.scalar_to_probs(target_threat)  # [B, K, A, bins]
        threat_mask = action_reward_mask * (target_threat > 0)
    reply = reply_reward_loss_weight > 0
    if reply:
        _check_every_action_term("reply_reward_loss_weight", action_reward,
                                 "it steps on from the same every-action dynamics",
                                 batch, ("target_reply", "target_reply_reward"))
        chex.assert_shape([batch.target_reply, batch.target_reply_reward],
                          (batch_size, num_steps, num_actions))
        target_reply = jax.lax.stop_gradient(batch.target_reply)
        reply_probs = reward_support.scalar_to_probs(
            jax.lax.stop_gradient(batch.target_reply_reward))  # [B, K, A, bins]
        reply_mask = action_reward_mask * (target_reply >= 0)

    reconstruct_actions = action_reconstruction_loss_weight > 0
    if reconstruct_actions:
        _check_every_action_term("action_reconstruction_loss_weight", action_reward,
                                 "it decodes the same every-action hidden states",
                                 batch, ("target_action_observation",))
        if networks.decoder is None:
            raise ValueError("action_reconstruction_loss_weight > 0 needs networks built with "
                             "observation_shape")
        chex.assert_shape(batch.target_action_observation,
                          (batch_size, num_steps, num_actions) + batch.observation.shape[1:])

    predict = action_prediction_loss_weight > 0
    if predict:
        _check_every_action_term("action_prediction_loss_weight", action_reward,
                                 "it reads the prediction after the same every-action dynamics",
                                 batch, ("target_action_value", "target_action_policy"))
        chex.assert_shape(batch.target_action_value, (batch_size, num_steps, num_actions))
        chex.assert_shape(batch.target_action_policy,
                          (batch_size, num_steps, num_actions, num_actions))
        action_value_probs = value_support.scalar_to_probs(
            jax.lax.stop_gradient(batch.target_action_value))  # [B, K, A, bins]
        action_policy = jax.lax.stop_gradient(batch.target_action_policy)  # [B, K, A, A]
        action_policy_mask = action_reward_mask * (jnp.sum(action_policy, axis=-1) > 0.5)

    targets = jax.lax.stop_gradient(
        (batch.target_value, batch.target_reward, batch.target_policy)
    )
    target_value, target_reward, target_policy = targets
    value_probs = value_support.scalar_to_probs(target_value)  # [B, K+1, bins]
    reward_probs = reward_support.scalar_to_probs(target_reward)
    masks = jax.lax.stop_gradient(
        (batch.value_mask, batch.reward_mask, batch.policy_mask, batch.importance_weight)
    )
    value_mask, reward_mask, policy_mask, weight = (m.astype(jnp.float32) for m in masks)

    def step_terms(out, k):
        """Per-example value, reward and policy losses at step k: each `[B]`."""
        v = _masked_ce(out.value_logits, value_probs[:, k]) * value_mask[:, k]
        p = _masked_ce(out.policy_logits, target_policy[:, k]) * policy_mask[:, k]
        r = _masked_ce(out.reward_logits, reward_probs[:, k]) * reward_mask[:, k]
        return v, r, p

    def errors(out, k):
        value = value_support.logits_to_scalar(out.value_logits)
        reward = reward_support.logits_to_scalar(out.reward_logits)
        v_err = jnp.abs(value - target_value[:, k]) * value_mask[:, k]
        r_err = jnp.abs(reward - target_reward[:, k]) * reward_mask[:, k]
        return v_err, r_err, value

    if consistency:
        obs_shape = batch.observation.shape[1:]
        chex.assert_shape(batch.next_observation, (batch_size, num_steps) + obs_shape)
        m = consistency_examples
        flat = batch.next_observation[:m].reshape((-1,) + obs_shape)
        target_z, _ = networks.projection(params, networks.representation(params, flat))
        target_z = jax.lax.stop_gradient(target_z.reshape(m, num_steps, -1))
        # The observation after action k-1 exists where that action was taken.
        consistency_mask = policy_mask[:m, :num_steps]

    def consistency_term(hidden, k):
        """`[B]` negative cosine similarity at recurrent step k (0 when off).

        Only the first `consistency_examples` examples get it, scaled by B / M.
        """
        if not consistency:
            return jnp.zeros((batch_size,), jnp.float32)
        m = consistency_examples
        _, predicted = networks.projection(params, hidden[:m])
        target = jax.lax.dynamic_index_in_dim(target_z, k - 1, axis=1, keepdims=False)
        mask = jax.lax.dynamic_index_in_dim(consistency_mask, k - 1, axis=1, keepdims=False)
        term = -jnp.sum(_unit(predicted) * _unit(target), axis=-1) * mask
        if m < batch_size:
            term = jnp.pad(term * (batch_size / m), (0, batch_size - m))
        return term

    def reconstruction_term(hidden, k):
        """`[B]` squared error of the hidden state of step k, decoded (0 when off).

        Step 0 (a Python 0) decodes the representation's hidden state against
        the observation; step k > 0 the dynamics' against the observation
        after action k-1, which exists where that action was taken.
        """
        if not reconstruct:
            return jnp.zeros((batch_size,), jnp.float32)
        if isinstance(k, int) and k == 0:
            observation, mask = batch.observation, policy_mask[:, 0]
        else:
            observation = jax.lax.dynamic_index_in_dim(batch.next_observation, k - 1, axis=1,
                                                       keepdims=False)
            mask = jax.lax.dynamic_index_in_dim(policy_mask, k - 1, axis=1, keepdims=False)
        error = networks.decoder(params, hidden) - jax.lax.stop_gradient(observation)
        return jnp.sum(jnp.square(error).reshape(batch_size, -1), axis=-1) * mask

    def mean_over_actions(ce, mask):
        return jnp.sum(ce * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)

    def action_reward_terms(sources):
        """`[S, M]` reward CE of every labelled action from the first S source
        states, `[S, M]` the threat-value CE, `[S, M]` the reply-reward CE,
        `[S, M]` the action-prediction CE and `[S, M]` the action-reconstruction
        squared error (zeros when those are off).

        `sources` `[S, M, ...]`: the hidden state each of the first S recurrent
        steps takes its action from, for the batch's first M examples. One
        batched dynamics call on S * M * A rows (and, for the threat values,
        one prediction call on them).
        """
        num_sources, m = sources.shape[:2]  # m: the first m examples of the batch
        lead = (num_sources, m, num_actions)
        rows = num_sources * m
        repeated = jnp.repeat(sources.reshape((rows,) + sources.shape[2:]), num_actions, axis=0)
        every_action = jnp.tile(jnp.arange(num_actions, dtype=jnp.int32), rows)
        after, logits = networks.dynamics(params, repeated, every_action)
        logits = logits.reshape(lead + logits.shape[1:])
        probs = jnp.swapaxes(action_reward_probs[:m, :covered], 0, 1)  # [S, M, A, bins]
        mask = jnp.swapaxes(action_reward_mask[:m, :covered], 0, 1)  # [S, M, A]
        reward_ce = mean_over_actions(_masked_ce(logits, probs), mask)
        threat_ce = reply_ce = predict_ce = recon_se = jnp.zeros_like(reward_ce)
        if threat or predict:
            policy_logits, value_logits = networks.prediction(params, after)
            value_logits = value_logits.reshape(lead + value_logits.shape[1:])
            policy_logits = policy_logits.reshape(lead + policy_logits.shape[1:])
        if predict:
            v_probs = jnp.swapaxes(action_value_probs[:m, :covered], 0, 1)  # [S, M, A, bins]
            p_target = jnp.swapaxes(action_policy[:m, :covered], 0, 1)  # [S, M, A, A]
            p_mask = jnp.swapaxes(action_policy_mask[:m, :covered], 0, 1)
            predict_ce = (mean_over_actions(_masked_ce(value_logits, v_probs), mask)
                          + mean_over_actions(_masked_ce(policy_logits, p_target), p_mask))
        if threat:
            t_probs = jnp.swapaxes(threat_probs[:m, :covered], 0, 1)
            t_mask = jnp.swapaxes(threat_mask[:m, :covered], 0, 1)
            threat_ce = mean_over_actions(_masked_ce(value_logits, t_probs), t_mask)
        if reply:
            replies = jnp.swapaxes(target_reply[:m, :covered], 0, 1)  # [S, M, A]
            # One more recurrent step: its hidden state's gradient is halved too.
            _, r_logits = networks.dynamics(params, scale_gradient(after, 0.5),
                                            jnp.maximum(replies, 0).reshape(-1).astype(jnp.int32))
            r_logits = r_logits.reshape(lead + r_logits.shape[1:])
            r_probs = jnp.swapaxes(reply_probs[:m, :covered], 0, 1)
            r_mask = jnp.swapaxes(reply_mask[:m, :covered], 0, 1)
            reply_ce = mean_over_actions(_masked_ce(r_logits, r_probs), r_mask)
        if reconstruct_actions:
            decoded = networks.decoder(params, after).reshape(lead + (-1,))
            target = jax.lax.stop_gradient(jnp.swapaxes(
                batch.target_action_observation[:m, :covered], 0, 1)).reshape(lead + (-1,))
            recon_se = mean_over_actions(jnp.sum(jnp.square(decoded - target), axis=-1), mask)
        return reward_ce, threat_ce, reply_ce, predict_ce, recon_se

    # Step 0: initial inference, no reward loss, gradient scale 1.
    out0 = networks.initial_inference(params, batch.observation)
    v0, _, p0 = step_terms(out0, 0)
    o0 = reconstruction_term(out0.hidden, 0)
    loss0 = value_loss_weight * v0 + p0 + reconstruction_loss_weight * o0
    v_err0, _, value0 = errors(out0, 0)

    def body(hidden, k):
        action = jax.lax.dynamic_index_in_dim(batch.actions, k - 1, axis=1, keepdims=False)
        out = networks.recurrent_inference(params, hidden, action)
        v, r, p = step_terms(out, k)
        c = consistency_term(out.hidden, k)
        o = reconstruction_term(out.hidden, k)
        l_k = scale_gradient(
            value_loss_weight * v + reward_loss_weight * r + p + consistency_loss_weight * c
            + reconstruction_loss_weight * o,
            1.0 / num_steps)
        v_err, r_err, _ = errors(out, k)
        source = hidden
        hidden = scale_gradient(out.hidden, 0.5)
        return hidden, (l_k, v, r, p, c, o, v_err, r_err, source if action_reward else None)

    _, (l_steps, v_steps, r_steps, p_steps, c_steps, o_steps, v_errs, r_errs,
        sources) = jax.lax.scan(
        body, out0.hidden, jnp.arange(1, num_steps + 1), unroll=unroll
    )
    per_example = loss0 + jnp.sum(l_steps, axis=0)  # [B]
    if action_reward:
        # The every-action term of step k belongs to step k's loss (scaled 1 / K).
        # Only the first `covered_examples` examples get them, scaled by B / M.
        ar_steps, tv_steps, rr_steps, ap_steps, ao_steps = action_reward_terms(
            sources[:covered, :covered_examples])
        every_action = jnp.sum(scale_gradient(
            action_reward_loss_weight * ar_steps + threat_value_loss_weight * tv_steps
            + reply_reward_loss_weight * rr_steps + action_prediction_loss_weight * ap_steps
            + action_reconstruction_loss_weight * ao_steps,
            1.0 / num_steps), axis=0)  # [M]
        if covered_examples < batch_size:
            every_action = jnp.pad(every_action * (batch_size / covered_examples),
                                   (0, batch_size - covered_examples))
        per_example = per_example + every_action
    else:
        ar_steps = tv_steps = rr_steps = ap_steps = ao_steps = jnp.zeros((1, batch_size),
                                                                        jnp.float32)
    loss = jnp.mean(per_example * weight)

    log_probs = jax.nn.log_softmax(out0.policy_logits)
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    metrics = LossMetrics(
        loss=loss,
        value_loss=jnp.mean(v0 + jnp.sum(v_steps, axis=0)),
        reward_loss=jnp.mean(jnp.sum(r_steps, axis=0)),
        policy_loss=jnp.mean(p0 + jnp.sum(p_steps, axis=0)),
        value_error=jnp.concatenate([jnp.mean(v_err0)[None], jnp.mean(v_errs, axis=1)]),
        reward_error=jnp.concatenate([jnp.zeros((1,)), jnp.mean(r_errs, axis=1)]),
        policy_entropy=jnp.mean(entropy),
        predicted_value=jax.lax.stop_gradient(value0),
        consistency_loss=jnp.mean(jnp.sum(c_steps, axis=0)),
        action_reward_loss=jnp.mean(jnp.sum(ar_steps, axis=0)),
        threat_value_loss=jnp.mean(jnp.sum(tv_steps, axis=0)),
        reply_reward_loss=jnp.mean(jnp.sum(rr_steps, axis=0)),
        action_prediction_loss=jnp.mean(jnp.sum(ap_steps, axis=0)),
        reconstruction_loss=jnp.mean(o0 + jnp.sum(o_steps, axis=0)),
        action_reconstruction_loss=jnp.mean(jnp.sum(ao_steps, axis=0)),
    )
    return loss, metrics
