"""The persistent compilation cache: where it goes, that it is reused, bad flags."""

import os

import jax
import jax.numpy as jnp
import pytest

from muzero_jax import compile_cache
from muzero_jax.cli import main


@pytest.fixture
def restore_cache():
    before = jax.config.jax_compilation_cache_dir
    yield
    compile_cache.enable(before if before else "none")


def test_resolve(monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
    assert compile_cache.resolve("auto") == str(tmp_path / "env")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.resolve("auto") == str(tmp_path / "xdg" / "muzero-jax" / "xla")
    assert compile_cache.resolve("none") is None
    assert compile_cache.resolve(str(tmp_path / "mine")) == str(tmp_path / "mine")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        compile_cache.resolve(str(tmp_path / "file"))
    with pytest.raises(ValueError, match="--compile-cache"):
        compile_cache.resolve("")


def test_a_second_compile_of_the_same_program_is_a_cache_hit(tmp_path, restore_cache):
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    assert compile_cache.enable(str(tmp_path / "cache")) == str(tmp_path / "cache")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

    def make():  # a new function object each time: jit's in-memory cache misses
        return jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0)

    x = jnp.ones((8, 8))
    first = make()(x)
    assert os.listdir(tmp_path / "cache"), "nothing was written to the cache"
    hits = events.count("/jax/compilation_cache/cache_hits")
    second = make()(x)
    assert events.count("/jax/compilation_cache/cache_hits") == hits + 1
    assert float(first) == float(second)
    # "none" turns it off again: no further hits.
    compile_cache.enable("none")
    make()(x)
    assert events.count("/jax/compilation_cache/cache_hits") == hits + 1


@pytest.mark.parametrize("command", ["train", "eval"])
def test_bad_compile_cache_flag_is_one_line(tmp_path, capsys, command):
    (tmp_path / "file").write_text("x")
    argv = [command, "--compile-cache", str(tmp_path / "file")]
    if command == "train":
        argv += ["--env", "catch"]
    else:
        argv += ["--logdir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compile-cache" in err[0] and "not a directory" in err[0], err
