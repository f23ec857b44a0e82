"""What a run writes for people to watch: JSONL, TensorBoard, curve.png, progress.

`RunLogger` takes one metrics row per iteration and writes it to
`LOGDIR/metrics.jsonl`, to TensorBoard event files in `LOGDIR` (tensorboardX,
no TensorFlow), refreshes `LOGDIR/curve.png` (return against environment steps
and against wall time) every `plot_every_s` seconds and at the end, and shows
progress: a tqdm bar on an interactive terminal, plain periodic lines
otherwise (CI logs).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from muzero_jax.files import atomic_path, write_text_atomically

__all__ = ["Printer", "RunLogger", "format_row", "plot_curve", "read_metrics"]

_NOT_SCALARS = ("iteration", "env_steps")


class Printer:
    """Prints lines to a console until its reader goes away.

    Once a write fails with `BrokenPipeError` (`muzero-jax bench ... | head`),
    it prints nothing more and the work goes on: what the command writes to
    files is not lost to a closed pipe. `gone` tells whether that happened.
    """

    def __init__(self, stream: TextIO | None = None):
        self.stream, self.gone = stream, False

    def __call__(self, text: str) -> None:
        if self.gone:
            return
        try:
            print(text, file=self.stream or sys.stdout, flush=True)
        except BrokenPipeError:
            self.gone = True


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl` (a torn last line, from a kill, is skipped)."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def format_row(row: dict[str, Any]) -> str:
    """One human-readable progress line for a metrics row."""
    ret = row.get("episode_return")
    parts = [
        f"iter {row['iteration']:5d}",
        f"steps {row['env_steps']:9d}",
        f"{row['sps']:8.0f} steps/s",
        f"return {ret:7.3f}" if ret is not None else "return     n/a",
        f"loss {row['loss']:.3f}",
        f"t {row['wall_s']:7.1f}s",
    ]
    if "eval_return" in row:
        parts.append(f"eval {row['eval_return']:.3f}")
    return " | ".join(parts)


def plot_curve(rows: Iterable[dict[str, Any]], path: str | os.PathLike, *,
               title: str = "") -> None:
    """Writes the learning curve: return vs environment steps and vs wall time.

    Training returns (mean of the episodes finished in an iteration) are a
    thin line; greedy evaluations are points with standard-error bars.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    rows = list(rows)
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    train = [r for r in rows if r.get("episode_return") is not None]
    evals = [r for r in rows if r.get("eval_return") is not None]
    for ax, x_key, x_label in ((axes[0], "env_steps", "environment steps"),
                               (axes[1], "wall_s", "wall time (s)")):
        if train:
            ax.plot([r[x_key] for r in train], [r["episode_return"] for r in train],
                    lw=0.8, alpha=0.7, label="training episodes")
        if evals:
            ax.errorbar([r[x_key] for r in evals], [r["eval_return"] for r in evals],
                        yerr=[r.get("eval_return_stderr") or 0.0 for r in evals],
                        fmt="o-", ms=3, capsize=2, label="greedy evaluation")
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("return")
    if train or evals:
        axes[0].legend(loc="lower right")
    if title:
        fig.suptitle(title)
    with atomic_path(path) as tmp:  # readers never see a half-written image
        fig.savefig(tmp, dpi=100)


class RunLogger:
    """Writes rows to `logdir` and shows progress (process 0 of a run only).

    Args:
      logdir: the run directory (exists).
      total_env_steps: the run's step budget (for the bar and the ETA).
      start_iteration: on resume, the checkpoint's iteration: rows after it
        (written before an interruption) are dropped from `metrics.jsonl`, and
        TensorBoard purges its events after it.
      title: the curve's title.
      plot_every_s: seconds between refreshes of `curve.png`.
      print_every_s: seconds between plain progress lines (not a TTY).
      progress: "auto" (bar on a TTY, lines otherwise), "bar", "lines" or "none".
      stream: where progress goes (default stdout).
    """

    def __init__(self, logdir: str | os.PathLike, *, total_env_steps: int,
                 start_iteration: int = 0, title: str = "", plot_every_s: float = 30.0,
                 print_every_s: float = 10.0, progress: str = "auto",
                 stream: TextIO | None = None):
        self.logdir = os.fspath(logdir)
        self.metrics_path = os.path.join(self.logdir, "metrics.jsonl")
        self.curve_path = os.path.join(self.logdir, "curve.png")
        self.title = title
        self.plot_every_s = plot_every_s
        self.print_every_s = print_every_s
        self.stream = stream or sys.stdout
        self.rows = [r for r in read_metrics(self.metrics_path)
                     if r.get("iteration", 0) <= start_iteration] if start_iteration else []
        # Rewritten whole or not at all (drops rows past the checkpoint): a kill
        # here must not cost the run its history.
        write_text_atomically(self.metrics_path, "".join(json.dumps(r) + "\n" for r in self.rows))
        self._sink = open(self.metrics_path, "a")  # noqa: SIM115 - closed in close()
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(self.logdir, purge_step=start_iteration or None,
                                 flush_secs=10)
        if progress == "auto":
            progress = "bar" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        self.mode = progress
        self._bar = None
        self._printer = Printer(self.stream)  # lines mode and messages without a bar
        if progress == "bar":
            from tqdm import tqdm

            done = self.rows[-1]["env_steps"] if self.rows else 0
            self._bar = tqdm(total=total_env_steps, initial=done, unit="step",
                             unit_scale=True, file=self.stream, dynamic_ncols=True,
                             desc="env steps", smoothing=0.1)
        self._last_plot = time.monotonic()
        self._last_print = -math.inf

    def write(self, row: dict[str, Any]) -> None:
        """Records one iteration's row everywhere."""
        self.rows.append(row)
        self._sink.write(json.dumps(row) + "\n")
        self._sink.flush()
        step = row["env_steps"]
        for key, value in row.items():
            if key in _NOT_SCALARS or isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                self._tb.add_scalar(key, value, global_step=step)
        if self._bar is not None:
            self._console(lambda: self._update_bar(row))
        elif self.mode == "lines":
            if row["wall_s"] - self._last_print >= self.print_every_s or "eval_return" in row:
                self._last_print = row["wall_s"]
                self._print(format_row(row))
        if time.monotonic() - self._last_plot >= self.plot_every_s:
            self.plot()

    def _console(self, show: Callable[[], Any]) -> None:
        """Runs one write to the progress bar. If the console's reader has gone
        (`muzero-jax train ... | head`), the console is dropped and the run goes
        on: the rows still reach `metrics.jsonl` and TensorBoard."""
        try:
            show()
        except BrokenPipeError:
            if self._bar is not None:
                self._bar.disable = True  # else its close() at exit writes to the pipe again
            self.mode, self._bar = "none", None

    def _print(self, text: str) -> None:
        """One plain line; the console is dropped once its reader has gone."""
        self._printer(text)
        if self._printer.gone:
            self.mode = "none"

    def _update_bar(self, row: dict[str, Any]) -> None:
        bar = self._bar
        bar.update(row["env_steps"] - bar.n)
        postfix = {"steps/s": f"{row['sps']:.0f}"}
        last_return = next((r["episode_return"] for r in reversed(self.rows)
                            if r.get("episode_return") is not None), None)
        if last_return is not None:
            postfix["return"] = f"{last_return:.3f}"
        last_eval = next((r["eval_return"] for r in reversed(self.rows)
                          if "eval_return" in r), None)
        if last_eval is not None:
            postfix["eval"] = f"{last_eval:.3f}"
        bar.set_postfix(postfix, refresh=False)

    def message(self, text: str) -> None:
        """A line that does not break the progress bar."""
        if self._bar is not None:
            bar = self._bar
            self._console(lambda: bar.write(text, file=self.stream))
        elif self.mode != "none":
            self._print(text)

    def plot(self) -> None:
        """Refreshes `curve.png` now."""
        self._last_plot = time.monotonic()
        if self.rows:
            plot_curve(self.rows, self.curve_path, title=self.title)

    def close(self) -> None:
        """Final plot; flushes and closes every writer."""
        try:
            self.plot()
        finally:
            if self._bar is not None:
                bar = self._bar
                self._console(bar.close)
            self._sink.close()
            self._tb.close()
