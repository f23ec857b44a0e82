"""Where and with what a run ran: one record per `train` invocation.

The same seed and device count give the same run only on the same machine and
packages: XLA compiles for the host CPU (or GPU), so another CPU model or
another jaxlib can part two runs of one seed within a few updates. A run
directory's `environment.jsonl` gets one line each time training starts or
resumes (the main process only), so two runs that differ can be told apart by
their code, packages and machine, and a resumed run shows where it moved.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from typing import Any

__all__ = ["ENVIRONMENT_FILE", "PACKAGES", "SIMD_FLAGS", "append_environment_record",
           "environment_record"]

ENVIRONMENT_FILE = "environment.jsonl"
PACKAGES = ("jax", "jaxlib", "dm-haiku", "optax", "rlax", "mctx", "chex", "numpy", "pgx",
            "orbax-checkpoint")
"""Distributions whose versions change a run's arithmetic or its environments."""


SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "amx_tile", "asimd", "sve")
"""Vector instruction sets XLA's CPU code generation depends on, recorded when present."""


def _cpu() -> dict[str, Any]:
    """The host CPU: model name, x86 family/model, and which `SIMD_FLAGS` it has
    (Linux `/proc/cpuinfo`; elsewhere `platform.processor()` only)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    family, model = fields.get("cpu family"), fields.get("model")
    return {
        "model": fields.get("model name") or platform.processor() or platform.machine(),
        "family_model": f"{family}/{model}" if family and model else None,
        "simd": [f for f in SIMD_FLAGS if f in flags],
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit(package_dir: str) -> tuple[str | None, bool | None]:
    """(HEAD commit, uncommitted changes to tracked files) of the checkout
    `package_dir` lies at the top of (an editable install); (None, None) for
    an installed copy, even one inside another repository, or without git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", package_dir, *args], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
    try:
        top = git("rev-parse", "--show-toplevel")
        if os.path.realpath(top) != os.path.realpath(os.path.dirname(package_dir)):
            return None, None
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, dirty


def environment_record(devices: Any = None) -> dict[str, Any]:
    """What this process runs on: time, Python, OS, CPU (model, family, vector
    instruction sets), JAX devices,
    package versions, the muzero_jax version and git commit, and XLA_FLAGS.

    Args:
      devices: the devices the run uses (default: `jax.devices()`).
    """
    import jax

    import muzero_jax

    devices = list(jax.devices() if devices is None else devices)
    commit, dirty = _git_commit(os.path.dirname(os.path.abspath(muzero_jax.__file__)))
    return {
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu(),
        "devices": {"platform": devices[0].platform if devices else None,
                    "kind": devices[0].device_kind if devices else None,
                    "count": len(devices), "processes": jax.process_count()},
        "packages": {name: _version(name) for name in PACKAGES},
        "muzero_jax": {"version": _version("muzero-jax"), "git_commit": commit,
                       "git_dirty": dirty},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def append_environment_record(logdir: str | os.PathLike, *, iteration: int, resumed: bool,
                              devices: Any = None) -> dict[str, Any]:
    """Appends `environment_record(devices)` with the iteration training starts
    from and whether it resumed to `logdir/environment.jsonl`; returns it."""
    record = {"iteration": int(iteration), "resumed": bool(resumed),
              **environment_record(devices)}
    with open(os.path.join(logdir, ENVIRONMENT_FILE), "a") as f:
        f.write(json.dumps(record) + "\n")
    return record
