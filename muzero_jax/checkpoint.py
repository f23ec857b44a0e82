"""Checkpoints of whole training runs (orbax-checkpoint), restored exactly.

A checkpoint is one step directory under `LOGDIR/checkpoints/` (the step is
the iteration count) holding every field of `TrainState` as its own orbax
item (params, target params, optimiser state, replay, actors, rng, counters)
and a JSON item `meta`: the resolved config and the host-side state of the
loop (wall time so far, evaluation history for the solved rule). Orbax
writes each step into a temporary directory and renames it when complete, so
a process killed mid-write leaves the previous checkpoints intact; the
manager keeps the last `max_to_keep`.

Restoring always goes against an abstract target tree built from the config
(`jax.eval_shape` of `trainer.init`, with the trainer's shardings): without
one, orbax returns optax's NamedTuples as lists. Typed PRNG keys are stored
as their raw `uint32` key data and re-wrapped on restore.
"""

from __future__ import annotations

import ast
import json
import os
import warnings
from typing import Any, NamedTuple

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from muzero_jax.config import Config, config_from_dict, config_to_dict
from muzero_jax.learning import AXIS, Trainer, TrainState

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "Restored",
    "abstract_state",
    "find_checkpoint_dir",
    "latest_step",
]

FORMAT_VERSION = 1
_STATE_ITEMS = TrainState._fields
_PER_DEVICE = ("replay", "actor", "rng_key")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or does not match the config."""


class Restored(NamedTuple):
    """What `Checkpointer.restore` returns.

    Attributes:
      state: the `TrainState` (placed on the trainer's mesh), or None when only
        parameters were asked for.
      params: the network parameters.
      meta: the JSON metadata saved with the state (`config`, `iteration`,
        `env_steps`, `wall_s`, `eval_history`, `solved_at`, ...).
      step: the checkpoint's step (iteration count).
    """

    state: TrainState | None
    params: Any
    meta: dict[str, Any]
    step: int


def _ocp():
    # Orbax is imported on first use: it is slow to import and only needed
    # when a run writes or reads checkpoints.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import orbax.checkpoint as ocp
    return ocp


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _unwrap_keys(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _rewrap_keys(tree: Any, like: Any) -> Any:
    return jax.tree.map(
        lambda x, ref: jax.random.wrap_key_data(x, impl=ref.dtype._impl) if _is_key(ref) else x,
        tree, like,
    )


def abstract_state(trainer: Trainer) -> TrainState:
    """`TrainState` of `jax.ShapeDtypeStruct`s with the trainer's shardings.

    Typed keys appear as their key data (what is stored on disk).
    """
    shapes = jax.eval_shape(trainer.init, jax.random.key(0))
    mesh = trainer.mesh

    def with_sharding(field: str, subtree: Any) -> Any:
        spec = P(AXIS) if field in _PER_DEVICE else P()
        sharding = NamedSharding(mesh, spec)

        def leaf(x):
            if _is_key(x):
                x = jax.eval_shape(jax.random.key_data, x)
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

        return jax.tree.map(leaf, subtree)

    return TrainState(**{f: with_sharding(f, getattr(shapes, f)) for f in _STATE_ITEMS})


def find_checkpoint_dir(path: str | os.PathLike) -> tuple[str, int | None]:
    """Resolves a run directory, its `checkpoints/` or one step directory.

    Returns:
      `(checkpoints_dir, step)`: `step` is None for "the latest".

    Raises:
      CheckpointError: if `path` holds no checkpoint.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} is not a directory")
    base = os.path.basename(path.rstrip(os.sep))
    if base.isdigit() and os.path.isdir(os.path.join(path, "params")):
        return os.path.dirname(path), int(base)
    if os.path.isdir(os.path.join(path, "checkpoints")):
        path = os.path.join(path, "checkpoints")
    if latest_step(path) is None:
        raise CheckpointError(f"no checkpoint in {path}")
    return path, None


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest complete step in a checkpoints directory (None if none)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return None
    steps = [int(n) for n in os.listdir(directory)
             if n.isdigit() and os.path.isdir(os.path.join(directory, n))]
    return max(steps) if steps else None


class Checkpointer:
    """Saves and restores `TrainState`s in `directory` (an orbax CheckpointManager).

    Saving is synchronous: a call returns once the step directory is complete
    and renamed into place, and the state may then be donated to the next
    iteration. Every process of a multi-host run must call `save` (orbax
    coordinates the writes; only process 0 writes metadata).
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
                 create: bool = True):
        ocp = _ocp()
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=False, create=create,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=_STATE_ITEMS + ("meta",)
        )

    def latest_step(self) -> int | None:
        """The newest complete step, or None."""
        self._manager.reload()
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All complete steps, oldest first."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: TrainState, meta: dict[str, Any],
             config: Config) -> None:
        """Writes `state`, `meta` and `config` as step `step` (atomically)."""
        ocp = _ocp()
        meta = dict(meta, config=config_to_dict(config), format_version=FORMAT_VERSION)
        # Items are wrapped in a dict: StandardSave refuses a bare array (rng_key).
        items = {f: ocp.args.StandardSave({f: _unwrap_keys(getattr(state, f))})
                 for f in _STATE_ITEMS}
        self._manager.save(step, args=ocp.args.Composite(meta=ocp.args.JsonSave(meta), **items),
                           force=True)
        self._manager.wait_until_finished()

    def read_meta(self, step: int | None = None) -> tuple[dict[str, Any], int]:
        """The metadata of `step` (default: the latest) and the step."""
        ocp = _ocp()
        step = self._resolve(step)
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
            meta = out.meta
        except Exception as e:  # noqa: BLE001 - any failure means unreadable
            raise CheckpointError(
                f"checkpoint {self._step_dir(step)} is unreadable ({type(e).__name__}: "
                f"{_first_line(e)})"
            ) from e
        if not isinstance(meta, dict) or "config" not in meta:
            raise CheckpointError(f"checkpoint {self._step_dir(step)} has no config metadata")
        return meta, step

    def restore(self, trainer: Trainer, step: int | None = None, *,
                params_only: bool = False, params_item: str = "params") -> Restored:
        """Restores step `step` (default: the latest) against `trainer`'s shapes.

        Args:
          trainer: the `Trainer` whose state shapes the restore.
          step: the checkpoint step (default: the latest).
          params_only: read only one set of parameters (no state).
          params_item: with `params_only`, which: "params" (the online
            network's) or "target_params" (the target network's; an
            exponential moving average of the online weights when the run
            trained with `target_ema` > 0).

        Raises:
          CheckpointError: no checkpoint, unreadable files, a config that
            differs from `trainer.config`, a whole state written on another
            number of devices than `trainer`'s, or arrays whose shapes or
            dtypes do not match.
          ValueError: a `params_item` other than those two.
        """
        if params_item not in ("params", "target_params"):
            raise ValueError(f"params_item must be 'params' or 'target_params', "
                             f"got {params_item!r}")
        ocp = _ocp()
        meta, step = self.read_meta(step)
        saved = _with_defaults(meta["config"])
        wanted = config_to_dict(trainer.config)
        diff = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
        if diff:
            details = ", ".join(f"{k}: {saved.get(k)!r} != {wanted.get(k)!r}" for k in diff[:4])
            raise CheckpointError(
                f"checkpoint {self._step_dir(step)} was written with a different config "
                f"({details})"
            )
        saved_devices, devices = meta.get("num_devices"), trainer.mesh.devices.size
        if not params_only and saved_devices is not None and saved_devices != devices:
            raise CheckpointError(
                f"checkpoint {self._step_dir(step)} was written on {saved_devices} device(s) "
                f"and this run has {devices}: resume it on {saved_devices} (on a CPU host: "
                f"--cpu-devices {saved_devices}; its parameters alone load anywhere, as eval "
                "and play do)")
        target = abstract_state(trainer)
        names = (params_item,) if params_only else _STATE_ITEMS
        # Optional fields added since the checkpoint was written (None in
        # this version's state, absent on disk) are left out of the restore
        # and put back as None.
        fitted = {f: _drop_absent_none({f: getattr(target, f)},
                                       _saved_paths(self._step_dir(step), f)) for f in names}
        args = {f: ocp.args.StandardRestore(fitted[f]) for f in names}
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(**args))
            restored = {f: _refill_none(out[f], {f: getattr(target, f)})[f] for f in names}
        except Exception as e:  # noqa: BLE001 - any failure means unusable
            raise CheckpointError(
                f"checkpoint {self._step_dir(step)} does not match the config or is corrupt "
                f"({type(e).__name__}: {_first_line(e)})"
            ) from e
        for f in names:
            _check_like(restored[f], getattr(target, f), f, self._step_dir(step))
        if params_only:
            return Restored(state=None, params=restored[params_item], meta=meta, step=step)
        like = jax.eval_shape(trainer.init, jax.random.key(0))
        state = TrainState(**{f: _rewrap_keys(restored[f], getattr(like, f))
                              for f in _STATE_ITEMS})
        return Restored(state=state, params=state.params, meta=meta, step=step)

    def _resolve(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"no checkpoint in {self.directory}")
        elif step not in (steps := self.all_steps()):
            saved = ", ".join(map(str, steps)) if steps else "none"
            raise CheckpointError(
                f"no checkpoint step {step} in {self.directory} (saved steps: {saved})")
        return step

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def close(self) -> None:
        """Waits for pending writes and releases the manager."""
        self._manager.close()


def _saved_paths(step_dir: str, item: str) -> set[tuple[str, ...]] | None:
    """The key paths of the leaves saved in `step_dir/item` (orbax's tree
    metadata, None fields included), or None when that cannot be read."""
    try:
        with open(os.path.join(step_dir, item, "_METADATA")) as f:
            tree = json.load(f)["tree_metadata"]
        return {tuple(str(k) for k in ast.literal_eval(path)) for path in tree}
    except (OSError, ValueError, KeyError, TypeError, SyntaxError):
        return None


def _drop_absent_none(tree: Any, saved: set[tuple[str, ...]] | None, prefix=()) -> Any:
    """`tree` with every None field of a NamedTuple that is not among the
    `saved` paths left out (that NamedTuple becomes a dict of the rest)."""
    if saved is None:
        return tree
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        kept = {k: _drop_absent_none(v, saved, prefix + (k,))
                for k, v in zip(tree._fields, tree)
                if v is not None or prefix + (k,) in saved}
        if len(kept) == len(tree._fields):
            return type(tree)(**kept)
        return kept
    if isinstance(tree, dict):
        return {k: _drop_absent_none(v, saved, prefix + (str(k),)) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_drop_absent_none(v, saved, prefix + (str(i),))
                          for i, v in enumerate(tree))
    return tree


def _refill_none(restored: Any, like: Any) -> Any:
    """Undoes `_drop_absent_none`: the structure of `like`, the fields left
    out as None."""
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        if isinstance(restored, dict):
            return type(like)(**{k: _refill_none(restored[k], v) if k in restored else None
                                 for k, v in zip(like._fields, like)})
        return type(like)(*(_refill_none(r, v) for r, v in zip(restored, like)))
    if isinstance(like, dict):
        return {k: _refill_none(restored[k], v) for k, v in like.items()}
    if isinstance(like, list | tuple):
        return type(like)(_refill_none(r, v) for r, v in zip(restored, like))
    return restored


def _with_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config with the fields added since it was written at their defaults.

    Fields added to `Config` later default to the old behaviour, so a
    checkpoint from before them still matches; a config that does not parse
    (e.g. from a newer version) is compared as written.
    """
    try:
        return config_to_dict(config_from_dict(saved))
    except (TypeError, ValueError):
        return saved


def _check_like(tree: Any, target: Any, name: str, where: str) -> None:
    got = jax.tree.structure(tree)
    want = jax.tree.structure(target)
    if got != want:
        raise CheckpointError(f"checkpoint {where}: {name} has a different structure")
    for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(target)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise CheckpointError(
                f"checkpoint {where}: {name} holds {a.dtype}{list(a.shape)} where the config "
                f"needs {b.dtype}{list(b.shape)}"
            )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
