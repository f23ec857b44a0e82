"""Device set-up: several CPU devices on one host, multi-host `jax.distributed`
start-up, and placing host values on a global mesh.

A run that spans hosts is one SPMD program over all processes' devices
(multi-controller JAX): every process runs the same Python, builds the same
mesh over `jax.devices()` (all processes' devices) and calls the same jitted
iteration; XLA's collectives (`lax.pmean`) cross hosts. Only process 0 writes
logs and checkpoints.

On one CPU host, `use_cpu_devices(N)` splits the host into N JAX CPU devices
before JAX starts. XLA:CPU runs one device's program mostly on one thread
(the small matrix products of these networks do not spread over cores), and
each device on its own, so a data-parallel run over N devices keeps N cores
busy at once: the same global batch and environments, each device taking its
1/N share, with gradients averaged by `lax.pmean`.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import time
from typing import Any

import jax
import numpy as np

__all__ = [
    "DistributedConfig",
    "initialize",
    "is_main_process",
    "place_on_mesh",
    "use_cpu_devices",
]

_HOST_PORT = re.compile(r"^[A-Za-z0-9.\-_\[\]:]+:(\d{1,5})$")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How this process joins a multi-host run.

    Attributes:
      coordinator: `HOST:PORT` of process 0's coordination service; empty to
        let `jax.distributed.initialize()` detect the cluster (TPU pods,
        Slurm, Open MPI) when `auto` is set.
      num_processes: processes in the run (0 with `auto`: detected).
      process_id: this process's index in `[0, num_processes)`.
      auto: call `jax.distributed.initialize()` with no arguments and let it
        detect the cluster environment.
      timeout_s: give up (with a clear error) if the coordinator cannot be
        reached within this many seconds.
    """

    coordinator: str = ""
    num_processes: int = 0
    process_id: int = -1
    auto: bool = False
    timeout_s: int = 120

    def __post_init__(self):
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.auto:
            if self.coordinator or self.num_processes or self.process_id >= 0:
                raise ValueError(
                    "--distributed-auto detects the cluster; do not also give "
                    "--coordinator, --num-processes or --process-id"
                )
            return
        given = [bool(self.coordinator), self.num_processes > 0, self.process_id >= 0]
        if any(given) and not all(given):
            raise ValueError(
                "a multi-host run needs all of --coordinator HOST:PORT, --num-processes P "
                "and --process-id I (or --distributed-auto)"
            )
        if not any(given):
            return
        match = _HOST_PORT.match(self.coordinator)
        if match is None or not 0 < int(match.group(1)) < 65536:
            raise ValueError(f"--coordinator must be HOST:PORT, got {self.coordinator!r}")
        if self.num_processes < 1:
            raise ValueError(f"--num-processes must be >= 1, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                f"--process-id must be in [0, {self.num_processes}), got {self.process_id}"
            )

    @property
    def enabled(self) -> bool:
        """Whether this run spans processes."""
        return self.auto or bool(self.coordinator)


def use_cpu_devices(count: int) -> None:
    """Makes JAX's CPU backend start with `count` devices (`jax_num_cpu_devices`).

    Call it before anything runs on JAX (the CLI's `--cpu-devices` does so
    first thing). A run then uses them as it would use `count` GPUs (by
    default all of them; `num_devices` picks fewer): the same seed and device
    count give the same result, and resuming a checkpoint needs the device
    count that wrote it. Accelerator backends keep their own devices.

    Raises:
      ValueError: `count` is not a positive integer, or JAX has already
        started its backends with another count (in a Python process, set
        `jax.config.update("jax_num_cpu_devices", N)` right after `import jax`).
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"--cpu-devices must be an integer >= 1, got {count!r}")
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        raise ValueError(
            f"--cpu-devices {count}: JAX has already started with "
            f"{len(jax.devices('cpu'))} CPU device(s); in a Python process, call "
            f"jax.config.update('jax_num_cpu_devices', {count}) right after importing jax"
        ) from None


def initialize(config: DistributedConfig) -> None:
    """Joins the multi-host run described by `config` (no-op when not enabled).

    Must run before any other JAX call that touches devices. On CPU the
    collectives go through gloo.

    Raises:
      RuntimeError: the coordinator could not be reached in time, with the
        address and the timeout in the message (instead of hanging).
    """
    if not config.enabled:
        return
    # Only affects collectives between CPU devices (GPU/TPU use their own).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if not config.auto and config.process_id > 0:
        _wait_for_coordinator(config.coordinator, config.timeout_s)
    try:
        if config.auto:
            jax.distributed.initialize(initialization_timeout=config.timeout_s)
        else:
            jax.distributed.initialize(
                coordinator_address=config.coordinator,
                num_processes=config.num_processes,
                process_id=config.process_id,
                initialization_timeout=config.timeout_s,
            )
    except Exception as e:  # noqa: BLE001 - one clear message for any start-up failure
        where = config.coordinator or "the auto-detected coordinator"
        raise RuntimeError(
            f"could not join the multi-host run at {where} within {config.timeout_s}s "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e


def _wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Waits until process 0's coordination service accepts connections.

    JAX's client aborts the whole process (a fatal log, no exception) when the
    coordinator stays unreachable; probing first turns that into a clear error.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"could not join the multi-host run at {address} within {timeout_s}s "
                    f"(the coordinator, process 0, is not reachable: {e.strerror or e})"
                ) from e
            time.sleep(0.5)


def is_main_process() -> bool:
    """True on the process that writes logs and checkpoints (process 0)."""
    return jax.process_index() == 0


def place_on_mesh(tree: Any, shardings: Any) -> Any:
    """Places host-computed values on (possibly multi-host) shardings.

    `shardings` is a tree of `jax.sharding.Sharding`s matching `tree` or a
    prefix of it.

    Single-process: `jax.device_put`. Multi-process: every process holds the
    same full value (computed from the same seed), and each builds only the
    shards its own devices own (`jax.make_array_from_callback`), so no process
    needs to address another's devices.
    """

    def place(x, sharding):
        if isinstance(x, jax.core.Tracer):  # traced for shapes (eval_shape): nothing to place
            return x
        if sharding.is_fully_addressable:
            return jax.device_put(x, sharding)
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(x)
            data = place(jax.random.key_data(x), sharding)
            return jax.random.wrap_key_data(data, impl=impl)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    # `shardings` may be a prefix of `tree` (one sharding per subtree).
    return jax.tree.map(
        lambda sharding, subtree: jax.tree.map(lambda x: place(x, sharding), subtree),
        shardings, tree, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding),
    )
