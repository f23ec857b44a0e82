"""Files written whole or not at all.

A run directory's files (`config.json`, `metrics.jsonl` when a resume drops
rows, `launch.json`, `eval.json`, `curve.png`) are written to a temporary file
beside their final path and then renamed over it: a reader, or a process killed
mid-write, sees the old file or the new one, never a truncated one. (The rename
is atomic because the two paths share a directory, hence a file system.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["atomic_path", "write_text_atomically"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path to write `path`'s new contents to; when the block
    ends normally the temporary file replaces `path` in one rename.

    The temporary file lies in `path`'s directory, is named per process
    (`NAME.PID.part.EXT`, created with the usual permissions by whatever writes
    it) and keeps `path`'s extension, so writers that pick a format from the
    name (matplotlib's `savefig`) still do. If the block raises, or writes
    nothing, the temporary file is removed and `path` is left as it was.
    """
    path = os.fspath(path)
    root, ext = os.path.splitext(path)
    tmp = f"{root}.{os.getpid()}.part{ext}"
    try:
        yield tmp
        if os.path.exists(tmp):
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to `path` through `atomic_path`."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)
