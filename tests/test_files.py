"""`muzero_jax.files`: a run directory's files are written whole or not at all."""

import gc
import json
import os

import pytest

from muzero_jax import logger as logger_module
from muzero_jax.files import atomic_path, write_text_atomically


def test_the_new_contents_replace_the_file_only_when_the_block_ends(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text("old")
    with atomic_path(path) as tmp:
        assert os.path.dirname(tmp) == str(tmp_path) and tmp.endswith(".part.json")
        with open(tmp, "w") as f:
            f.write("new")
        assert path.read_text() == "old"  # not yet
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["eval.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"seed": 1}')
    with pytest.raises(KeyboardInterrupt), atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write('{"se')
        raise KeyboardInterrupt  # e.g. Ctrl-C mid-write
    assert path.read_text() == '{"seed": 1}'
    with atomic_path(tmp_path / "absent.json"):
        pass  # nothing written: nothing created
    assert os.listdir(tmp_path) == ["config.json"]
    write_text_atomically(path, '{"seed": 2}')
    assert path.read_text() == '{"seed": 2}' and os.listdir(tmp_path) == ["config.json"]


def test_an_image_keeps_its_format(tmp_path):
    path = tmp_path / "curve.png"
    logger_module.plot_curve([{"env_steps": 1, "wall_s": 1.0, "episode_return": 0.5},
                              {"env_steps": 2, "wall_s": 2.0, "episode_return": 0.7}], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["curve.png"]


def test_a_resume_killed_while_dropping_rows_keeps_the_runs_history(tmp_path, monkeypatch):
    """A resume rewrites `metrics.jsonl` without the rows past its checkpoint;
    interrupted, the file must still hold every row it had."""
    rows = [{"iteration": i, "env_steps": 10 * i, "wall_s": float(i), "episode_return": 0.1 * i}
            for i in range(1, 6)]
    metrics = tmp_path / "metrics.jsonl"
    before = "".join(json.dumps(r) + "\n" for r in rows)
    metrics.write_text(before)
    real_dumps, calls = json.dumps, []

    def dumps_then_die(obj, *args, **kwargs):
        calls.append(obj)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(logger_module.json, "dumps", dumps_then_die)
    with pytest.raises(KeyboardInterrupt):
        logger_module.RunLogger(tmp_path, total_env_steps=100, start_iteration=3,
                                progress="none")
    monkeypatch.undo()
    assert metrics.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]

    run_logger = logger_module.RunLogger(tmp_path, total_env_steps=100, start_iteration=3,
                                         progress="none")
    run_logger.close()
    assert [json.loads(line) for line in metrics.read_text().splitlines()] == rows[:3]


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("progress", ["lines", "bar"])
def test_a_console_whose_reader_has_gone_costs_the_run_no_rows(tmp_path, progress, console):
    run_logger = logger_module.RunLogger(tmp_path, total_env_steps=50, progress=progress,
                                         print_every_s=0.0, stream=console)
    rows = [{"iteration": i, "env_steps": 10 * i, "wall_s": float(i), "sps": 10.0,
             "episode_return": 0.5, "loss": 1.0} for i in range(1, 6)]
    run_logger.write(rows[0])
    shown = console.text
    assert ("iter     1" in shown) if progress == "lines" else ("env steps" in shown)
    console.reader_gone = True
    for row in rows[1:3]:
        run_logger.write(row)
    run_logger.message("a line for the console")
    for row in rows[3:]:
        run_logger.write(row)
    run_logger.close()
    assert run_logger.mode == "none" and console.text == shown
    metrics = tmp_path / "metrics.jsonl"
    assert [json.loads(line) for line in metrics.read_text().splitlines()] == rows
    del run_logger
    gc.collect()  # a dropped bar must not write to the pipe when it is collected
