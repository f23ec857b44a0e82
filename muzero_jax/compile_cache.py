"""JAX's persistent compilation cache, on by default for the command line.

Compiling the training iteration is most of the start-up of a short run on
CPU (about 20 CPU seconds for the Catch preset on a 2-core machine, against
about 5 s with a warm cache: tracing still runs, XLA does not). XLA keys each
entry by the program, the compile options, the device kind and the jax/jaxlib
versions, so a cached entry is reused only for the same program on the same
kind of machine. An entry is about 1 MB; nothing trims the directory, so
delete it to reclaim the space.

`muzero-jax train` and `muzero-jax eval` call `enable()` with their
`--compile-cache` flag: "auto" (the default) uses `$JAX_COMPILATION_CACHE_DIR`
if set, else `$XDG_CACHE_HOME/muzero-jax/xla` (`~/.cache/muzero-jax/xla`);
"none" turns the cache off; anything else is a directory. From Python, call
`muzero_jax.compile_cache.enable()` yourself (the library never turns it on
behind your back). Like any compilation cache it is trusted code: keep it in
a directory only you can write to.
"""

from __future__ import annotations

import os

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

#: Programs that compile faster than this are not worth a disk entry.
MIN_COMPILE_TIME_S = 0.5


def default_dir() -> str:
    """Where "auto" puts the cache."""
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "muzero-jax", "xla")


def resolve(spec: str) -> str | None:
    """The directory `spec` names ("auto", "none" or a path); None means off."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--compile-cache must be 'auto', 'none' or a directory, got {spec!r}")
    if spec == "none":
        return None
    path = default_dir() if spec == "auto" else os.path.expanduser(spec)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--compile-cache {spec!r}: {path} exists and is not a directory")
    return path


def enable(spec: str = "auto") -> str | None:
    """Points JAX's persistent compilation cache at `spec`; returns the directory.

    "none" turns the cache off (even one set by `$JAX_COMPILATION_CACHE_DIR`).
    An unusable directory (read-only, full disk) only costs the cache: JAX
    warns and compiles as usual.
    """
    path = resolve(spec)
    if path is not None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            path = None
    if path != jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", path)
        _jax_cache.reset_cache()  # JAX reads the directory once; make it read it again
    if path is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    return path
