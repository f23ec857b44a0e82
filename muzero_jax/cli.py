"""`muzero-jax` command line: `train` (more commands come with later issues).

Every field of `Config` is a flag (`--num-simulations 32`, `--mlp.hidden-sizes
128,128`); the environment's preset supplies the defaults. Bad input exits with
code 2 and one line on stderr; a failure while running exits with code 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import typing
import warnings
from typing import Any

__all__ = ["main"]


class _UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one line, no usage dump
        raise _UsageError(f"{self.prog}: {message}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_tuple(text: str, cast) -> tuple:
    text = text.strip()
    if text.startswith("[") or text.startswith("("):
        value = json.loads(text.replace("(", "[").replace(")", "]"))
        return tuple(tuple(v) if isinstance(v, list) else cast(v) for v in value)
    return tuple(cast(v) for v in text.split(",") if v.strip())


def _add_field_flags(parser: argparse.ArgumentParser, cls, prefix: str = "",
                     skip: tuple[str, ...] = ()) -> None:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        name = prefix + field.name
        hint = hints[field.name]
        origin = typing.get_origin(hint)
        default = field.default
        if dataclasses.is_dataclass(hint):
            _add_field_flags(parser, hint, prefix=name + ".")
            continue
        help_text = f"(default: {default!r})"
        if hint is bool:
            parser.add_argument(_flag(name), action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text, dest=name)
        elif hint in (int, float, str):
            parser.add_argument(_flag(name), type=hint, default=argparse.SUPPRESS,
                                help=help_text, dest=name)
        elif origin is typing.Literal:
            parser.add_argument(_flag(name), choices=typing.get_args(hint),
                                default=argparse.SUPPRESS, help=help_text, dest=name)
        elif origin is tuple:
            args = typing.get_args(hint)
            cast = args[0] if args and args[0] in (int, float) else float
            parser.add_argument(_flag(name), type=lambda t, c=cast: _parse_tuple(t, c),
                                default=argparse.SUPPRESS, dest=name,
                                help=f"comma-separated or JSON {help_text}")


def _build_parser() -> argparse.ArgumentParser:
    from muzero_jax.config import Config
    from muzero_jax.envs import ENV_NAMES

    parser = _Parser(prog="muzero-jax", description="MuZero in JAX: train and evaluate agents.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser(
        "train",
        help="train an agent",
        description="Train MuZero. Defaults come from the environment's preset; every config "
        "field is a flag.",
    )
    train.add_argument("--env", required=True, choices=ENV_NAMES, help="environment")
    train.add_argument("--logdir", default=None,
                       help="run directory (default: runs/ENV-<timestamp>)")
    train.add_argument("--max-seconds", type=float, default=None,
                       help="wall-clock budget in seconds, compile included")
    train.add_argument("--stop-at", type=float, default=None,
                       help="stop once two consecutive evaluations reach this return")
    _add_field_flags(train, Config, skip=("env",))
    return parser


def _config_from_args(args: argparse.Namespace):
    from muzero_jax.config import Config
    from muzero_jax.networks import MLPConfig, ResNetConfig
    from muzero_jax.presets import preset

    values: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {"mlp": {}, "resnet": {}}
    field_names = {f.name for f in dataclasses.fields(Config)}
    for key, value in vars(args).items():
        if "." in key:
            group, sub = key.split(".", 1)
            nested[group][sub] = value
        elif key in field_names and key != "env":
            values[key] = value
    base = preset(args.env)
    if nested["mlp"]:
        values["mlp"] = dataclasses.replace(base.mlp, **nested["mlp"])
    if nested["resnet"]:
        values["resnet"] = dataclasses.replace(base.resnet, **nested["resnet"])
    del MLPConfig, ResNetConfig
    return dataclasses.replace(base, **values)


def _prepare_logdir(logdir: str | None, env: str) -> str:
    if logdir is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        logdir = os.path.join("runs", f"{env}-{stamp}")
    if os.path.exists(os.path.join(logdir, "metrics.jsonl")):
        raise _UsageError(
            f"muzero-jax: {logdir} already holds a run (metrics.jsonl); choose another --logdir"
        )
    try:
        os.makedirs(logdir, exist_ok=True)
        probe = os.path.join(logdir, ".write-test")
        with open(probe, "w") as f:
            f.write("")
        os.remove(probe)
    except OSError as e:
        raise _UsageError(f"muzero-jax: cannot write to --logdir {logdir}: {e.strerror}") from e
    return logdir


def _format_row(row: dict[str, Any], config) -> str:
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


def _train(args: argparse.Namespace) -> int:
    from muzero_jax.config import config_to_dict
    from muzero_jax.learning import make_train
    from muzero_jax.train import train

    try:  # Everything that can be wrong with the input is found here, before compiling.
        config = _config_from_args(args)
        trainer = make_train(config)
    except (ValueError, TypeError) as e:
        raise _UsageError(f"muzero-jax: {e}") from e
    logdir = _prepare_logdir(args.logdir, config.env)
    with open(os.path.join(logdir, "config.json"), "w") as f:
        json.dump(config_to_dict(config), f, indent=2, sort_keys=True)
    print(f"muzero-jax: training {config.env} -> {logdir} on {trainer.mesh.devices.size} "
          f"device(s); compiling...", flush=True)
    last_print = [0.0]

    def on_row(row):
        if row["wall_s"] - last_print[0] >= 2.0 or "eval_return" in row:
            last_print[0] = row["wall_s"]
            print(_format_row(row, config), flush=True)

    result = train(
        config,
        trainer=trainer,
        max_seconds=args.max_seconds,
        stop_threshold=args.stop_at,
        on_row=on_row,
        metrics_path=os.path.join(logdir, "metrics.jsonl"),
    )
    last = result.history[-1] if result.history else {}
    print(f"muzero-jax: done after {last.get('env_steps', 0)} environment steps, "
          f"{last.get('wall_s', 0):.1f}s; metrics in {logdir}/metrics.jsonl", flush=True)
    if result.solved_at is not None:
        print(f"muzero-jax: solved ({args.stop_at}) at {result.solved_at['wall_s']:.1f}s, "
              f"{result.solved_at['env_steps']} environment steps", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `muzero-jax` console script."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        parser = _build_parser()
        args = parser.parse_args(argv)
        if args.command == "train":
            return _train(args)
    except _UsageError as e:
        print(str(e).splitlines()[0] if str(e) else "muzero-jax: bad input", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("muzero-jax: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - runtime failure: clear message, exit 1
        print(f"muzero-jax: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
