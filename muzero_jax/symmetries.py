"""Board symmetries and the data augmentation built on them.

A board game often maps onto itself under a mirror or a rotation: Connect
Four under the left-right mirror, TicTacToe and Go under the eight symmetries
of the square. Training on a sampled position transformed by a random one of
them (AlphaGo Zero's augmentation) shows the network each position in every
orientation at no extra self-play cost. Values and rewards are unchanged by a
symmetry; observations, actions and policy targets are moved.

A `Symmetries` is plain data (gather indices), so it rides on an
`Environment` and is applied inside the compiled learner with one gather per
array.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from muzero_jax.networks import NetworkOutput, Networks

__all__ = ["Symmetries", "augment_batch", "board_symmetries", "check_symmetries",
           "check_symmetry_ensemble", "ensemble_networks", "inverse_actions"]


class Symmetries(NamedTuple):
    """The symmetries of a game, as gather indices (tuples, so hashable).

    Symmetry `s` (index 0 is the identity) maps

    * an observation `o` to `o.reshape(-1)[observation_index[s]]` reshaped to
      `o.shape`;
    * a policy (or legal-action mask) `p` over the actions to
      `p[action_index[s]]`: entry `a` of the moved policy is the original's
      entry at the action that `s` moves onto `a`;
    * an action `a` to `inverse_actions(symmetries)[s][a]`.

    Attributes:
      observation_index: `S` tuples of `prod(observation_shape)` ints.
      action_index: `S` tuples of `num_actions` ints, each a permutation.
    """

    observation_index: tuple[tuple[int, ...], ...]
    action_index: tuple[tuple[int, ...], ...]


def inverse_actions(symmetries: Symmetries) -> np.ndarray:
    """`[S, num_actions]` int32: row `s` maps an action to its image under `s`."""
    return np.argsort(np.asarray(symmetries.action_index), axis=1).astype(np.int32)


def check_symmetries(symmetries: Symmetries, observation_shape: tuple[int, ...],
                     num_actions: int) -> None:
    """Raises ValueError, with the first thing wrong, when `symmetries` does
    not fit an environment's observation shape and action count."""
    obs_size = int(np.prod(observation_shape))
    if len(symmetries.observation_index) != len(symmetries.action_index) \
            or not symmetries.observation_index:
        raise ValueError(f"symmetries need as many observation as action maps (at least one), "
                         f"got {len(symmetries.observation_index)} and "
                         f"{len(symmetries.action_index)}")
    for s, (obs, act) in enumerate(zip(symmetries.observation_index,
                                       symmetries.action_index)):
        if sorted(obs) != list(range(obs_size)):
            raise ValueError(f"symmetry {s}: observation_index must be a permutation of "
                             f"range({obs_size}) for observations of shape "
                             f"{tuple(observation_shape)}")
        if sorted(act) != list(range(num_actions)):
            raise ValueError(f"symmetry {s}: action_index must be a permutation of "
                             f"range({num_actions})")


def _square_transforms(cells: np.ndarray, dihedral: bool) -> list[np.ndarray]:
    """The images of a `[H, W]` array under the board's symmetries, identity first."""
    if not dihedral:
        return [cells, cells[:, ::-1]]
    out = []
    for flip in (False, True):
        base = cells[:, ::-1] if flip else cells
        out.extend(np.rot90(base, k) for k in range(4))
    return out


def board_symmetries(
    height: int,
    width: int,
    channels: int,
    *,
    dihedral: bool,
    actions: str,
    pass_action: bool = False,
) -> Symmetries:
    """The symmetries of a `[height, width, channels]` board observation.

    Args:
      height, width, channels: the observation's shape (channels last).
      dihedral: the eight symmetries of the square (needs `height == width`);
        otherwise the identity and the left-right mirror.
      actions: `"cells"` (action `r * width + c` is a point of the board) or
        `"columns"` (action `c` is a column, as in Connect Four).
      pass_action: one extra action after the board's (Go's pass), which every
        symmetry leaves in place.

    Returns:
      The symmetries (identity first).

    Raises:
      ValueError: `dihedral` on a board that is not square, an `actions` other
        than `"cells"` or `"columns"`, or a pass with column actions.
    """
    if dihedral and height != width:
        raise ValueError(f"the eight symmetries of the square need a square board, "
                         f"got {height}x{width}")
    if actions not in ("cells", "columns"):
        raise ValueError(f"actions must be 'cells' or 'columns', got {actions!r}")
    if actions == "columns" and (dihedral or pass_action):
        raise ValueError("column actions have only the left-right mirror and no pass")
    cells = np.arange(height * width).reshape(height, width)
    obs_index, act_index = [], []
    for moved in _square_transforms(cells, dihedral):
        source = moved.reshape(-1)  # the moved board's cell i is the original's cell source[i]
        obs_index.append(tuple(int(i) for i in (source[:, None] * channels
                                                + np.arange(channels)).reshape(-1)))
        if actions == "columns":
            acts = source[:width]  # row 0 of the moved board names the source columns
        else:
            acts = source
        if pass_action:
            acts = np.append(acts, acts.size)
        act_index.append(tuple(int(a) for a in acts))
    return Symmetries(tuple(obs_index), tuple(act_index))


def augment_batch(batch, symmetries: Symmetries, rng_key: chex.PRNGKey):
    """Moves each example of a `loss.LossBatch` by a random symmetry of its own.

    The observation (and `next_observation` when present), the K actions,
    the K+1 policy targets (and the per-action labels when present: the
    rewards and their mask, the threats, the replies, whose values are actions
    and are mapped as such, and their rewards, and the observations after
    every action, moved along both the action axis and their own cells) of an
    example all move by the same symmetry, drawn uniformly (the identity included); values, rewards
    and masks stay.

    Args:
      batch: a `LossBatch` with `observation` `[B, *obs]`.
      symmetries: the game's symmetries.
      rng_key: the key that draws the `B` symmetries.

    Returns:
      The moved `LossBatch`.
    """
    obs_index = jnp.asarray(np.asarray(symmetries.observation_index, np.int32))
    act_index = jnp.asarray(np.asarray(symmetries.action_index, np.int32))
    act_map = jnp.asarray(inverse_actions(symmetries))
    b = batch.observation.shape[0]
    s = jax.random.randint(rng_key, (b,), 0, obs_index.shape[0])

    def move_obs(obs, index):  # obs [..., *obs_shape] of one example
        lead = obs.ndim - len(batch.observation.shape[1:])
        flat = obs.reshape(obs.shape[:lead] + (-1,))
        return jnp.take(flat, index, axis=-1).reshape(obs.shape)

    observation = jax.vmap(move_obs)(batch.observation, obs_index[s])
    next_observation = batch.next_observation
    if next_observation is not None:
        next_observation = jax.vmap(move_obs)(next_observation, obs_index[s])
    actions = jnp.take_along_axis(act_map[s], batch.actions, axis=1)
    policy = jnp.take_along_axis(batch.target_policy, act_index[s][:, None, :], axis=2)
    moved = batch._replace(observation=observation, next_observation=next_observation,
                           actions=actions.astype(batch.actions.dtype), target_policy=policy)
    if getattr(batch, "target_action_reward", None) is not None:  # per-action labels move too
        moved = moved._replace(
            target_action_reward=jnp.take_along_axis(
                batch.target_action_reward, act_index[s][:, None, :], axis=2),
            action_reward_mask=jnp.take_along_axis(
                batch.action_reward_mask, act_index[s][:, None, :], axis=2))
    if getattr(batch, "target_action_threat", None) is not None:
        moved = moved._replace(target_action_threat=jnp.take_along_axis(
            batch.target_action_threat, act_index[s][:, None, :], axis=2))
    if getattr(batch, "target_action_value", None) is not None:
        # Per action, and the policy after it is over actions too: both axes move.
        index = act_index[s][:, None, :]
        moved = moved._replace(
            target_action_value=jnp.take_along_axis(batch.target_action_value, index, axis=2),
            target_action_policy=jnp.take_along_axis(
                jnp.take_along_axis(batch.target_action_policy, index[..., None], axis=2),
                index[:, :, None, :], axis=3))
    if getattr(batch, "target_action_observation", None) is not None:
        # Per action (that axis moves like the policy's), and each one an
        # observation (its cells move like the observation's).
        per_action = batch.target_action_observation
        flat = per_action.reshape(per_action.shape[:3] + (-1,))
        flat = jnp.take_along_axis(flat, act_index[s][:, None, :, None], axis=2)
        moved = moved._replace(target_action_observation=jax.vmap(move_obs)(
            flat.reshape(per_action.shape), obs_index[s]))
    if getattr(batch, "target_reply", None) is not None:
        # Per action, like the policy; the replies are actions, mapped like `actions`.
        reply = jnp.take_along_axis(batch.target_reply, act_index[s][:, None, :], axis=2)
        mapped = jax.vmap(lambda m, r: m[jnp.maximum(r, 0)])(act_map[s], reply)
        moved = moved._replace(
            target_reply=jnp.where(reply >= 0, mapped, -1).astype(batch.target_reply.dtype),
            target_reply_reward=jnp.take_along_axis(
                batch.target_reply_reward, act_index[s][:, None, :], axis=2))
    return moved


def _mean_of_distributions(logits: chex.Array) -> chex.Array:
    """`[B, S, N]` logits -> `[B, N]` logits of the mean of the S softmaxes."""
    logits = logits.astype(jnp.float32)
    return jax.nn.logsumexp(jax.nn.log_softmax(logits, axis=-1), axis=1) - np.log(logits.shape[1])


def check_symmetry_ensemble(env) -> None:
    """Raises one clear `ValueError` where an environment has no symmetries
    to average over (`Environment.symmetries` is None), or ones that do not
    fit its observations and actions."""
    if getattr(env, "symmetries", None) is None:
        raise ValueError(f"the symmetry ensemble needs a game with board symmetries (the pgx "
                         f"board games have them), and {env.name!r} has none")
    check_symmetries(env.symmetries, tuple(env.observation_shape), env.num_actions)


def ensemble_networks(networks: Networks, symmetries: Symmetries) -> Networks:
    """The same networks, averaged over the board's symmetries (test-time
    augmentation for the search, as AlphaGo Zero evaluated its network).

    A hidden state of the returned `Networks` is `[B, S, ...]`: one hidden
    state per symmetry `s`, that of the observation moved by `s` (hidden
    state `s` of an action's successor is the dynamics applied to hidden
    state `s` and the action moved by `s`). Every output is then brought
    back to the original frame and averaged over the S of them: the policy,
    value and reward as the mean of their categorical distributions (the
    logits returned are that mixture's log-probabilities), the decoded
    observation as the mean of the S decodings. With only the identity it is
    the original networks' output, up to the logits' normalisation. Costs S
    network evaluations per call; the parameters are the same. `projection`
    is dropped (a training-only head); `init` is the original's.

    Args:
      networks: a `muzero_jax.networks.Networks`.
      symmetries: the game's symmetries (`Environment.symmetries`).

    Returns:
      A `Networks` with the same fields, for search and evaluation.
    """
    num = len(symmetries.observation_index)
    obs_index = jnp.asarray(np.asarray(symmetries.observation_index, np.int32))
    obs_back = jnp.asarray(np.argsort(np.asarray(symmetries.observation_index), axis=1)
                           .astype(np.int32))
    # Row s maps an original action to its image under s: it moves an action
    # into frame s, and reads a policy of frame s back in the original frame.
    act_map = jnp.asarray(inverse_actions(symmetries))

    def flat(x):  # [B, S, ...] -> [B * S, ...]
        return x.reshape((x.shape[0] * num,) + x.shape[2:])

    def unflat(x):  # [B * S, ...] -> [B, S, ...]
        return x.reshape((x.shape[0] // num, num) + x.shape[1:])

    def representation(params, observation):
        b = observation.shape[0]
        cells = observation.reshape(b, -1)
        moved = jnp.take(cells, obs_index, axis=1)  # [B, S, cells]
        moved = moved.reshape((b, num) + observation.shape[1:])
        return unflat(networks.representation(params, flat(moved)))

    def dynamics(params, hidden, action):
        moved = act_map[:, action].T  # [B, S]: the action in each symmetry's frame
        next_hidden, reward_logits = networks.dynamics(params, flat(hidden), moved.reshape(-1))
        return unflat(next_hidden), _mean_of_distributions(unflat(reward_logits))

    def prediction(params, hidden):
        policy_logits, value_logits = networks.prediction(params, flat(hidden))
        policy = unflat(policy_logits)  # [B, S, A], each in its own frame
        policy = jnp.take_along_axis(policy, jnp.broadcast_to(act_map[None], policy.shape),
                                     axis=2)
        return _mean_of_distributions(policy), _mean_of_distributions(unflat(value_logits))

    def initial_inference(params, observation):
        hidden = representation(params, observation)
        policy_logits, value_logits = prediction(params, hidden)
        reward_logits = jnp.zeros((observation.shape[0], networks.reward_bins), jnp.float32)
        return NetworkOutput(hidden, reward_logits, policy_logits, value_logits)

    def recurrent_inference(params, hidden, action):
        next_hidden, reward_logits = dynamics(params, hidden, action)
        policy_logits, value_logits = prediction(params, next_hidden)
        return NetworkOutput(next_hidden, reward_logits, policy_logits, value_logits)

    decoder = None
    if networks.decoder is not None:
        def decoder(params, hidden):
            decoded = unflat(networks.decoder(params, flat(hidden)))  # [B, S, *obs], moved
            b = decoded.shape[0]
            cells = decoded.reshape(b, num, -1)
            back = jnp.take_along_axis(cells, jnp.broadcast_to(obs_back[None], cells.shape),
                                       axis=2)
            return jnp.mean(back, axis=1).reshape((b,) + decoded.shape[2:])

    return networks._replace(representation=representation, dynamics=dynamics,
                             prediction=prediction, initial_inference=initial_inference,
                             recurrent_inference=recurrent_inference, projection=None,
                             decoder=decoder)
