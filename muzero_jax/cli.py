"""`muzero-jax` command line: `train`, `eval`, `bench ...`, `play ...`.

`train` and `eval` are parsed by tyro over the frozen config dataclasses: every
field of `Config` is a flag (`--num-simulations 32`, `--mlp.hidden-sizes 128
128`) whose help text is the field's documentation, and the environment's
preset supplies the defaults. `bench` and `play` hand the rest of the command
line to `muzero_jax.bench.cli.main` and `muzero_jax.play.main`.

Exit codes: 0 success, 2 bad input (one line on stderr, before anything is
compiled or written), 1 failure while running (one clear message), 130
interrupted, 141 (silently) when the reader of stdout has gone, as with
`muzero-jax train --help | head`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import io
import json
import os
import shutil
import sys
import warnings
from typing import Annotated, Literal

import tyro

from muzero_jax.config import Config, config_from_dict, config_to_dict
from muzero_jax.files import write_text_atomically
from muzero_jax.logger import Printer
from muzero_jax.provenance import ENVIRONMENT_FILE

__all__ = ["LAUNCH_FILE", "EvalArgs", "TrainArgs", "main", "write_launch_file"]

_PROG = "muzero-jax"
_COMMANDS = {
    "train": "train an agent (muzero-jax train --env catch)",
    "eval": "evaluate a trained agent (muzero-jax eval --logdir DIR)",
    "bench": "throughput benchmarks (muzero-jax bench --help)",
    "play": "play against a trained agent (muzero-jax play --help)",
}
_FORWARDED = {"bench": "muzero_jax.bench.cli", "play": "muzero_jax.play"}
LAUNCH_FILE = "launch.json"
"""A run directory's record of how its processes were started (`{"cpu_devices":
N}`): `train --resume` starts the same way unless told otherwise."""
_RUN_FILES = ("config.json", LAUNCH_FILE, "metrics.jsonl", "checkpoints", "curve.png",
              "eval.json", ENVIRONMENT_FILE)


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit code 2."""


@dataclasses.dataclass(frozen=True)
class TrainArgs:
    """Train MuZero. Defaults are the preset of --env (shown: the preset of the
    --env given, else catch's); every config field is a flag.

    Attributes:
      config: the run's configuration.
      logdir: run directory (default: runs/ENV-<timestamp>).
      resume: continue the run in this directory from its latest checkpoint
        (config flags, if given, must equal the run's; --max-env-steps may
        change; --cpu-devices defaults to the run's own, from its
        launch.json).
      overwrite: replace the run files already in --logdir.
      max_seconds: wall-clock budget of this invocation in seconds, compile
        included (None: no limit).
      max_iterations: stop once the run has done this many iterations in all
        (None: no limit).
      stop_at: stop once two consecutive greedy evaluations reach this return
        (default per environment: catch 0.95, cartpole 475; None: never).
      checkpoint_every: checkpoint every this many iterations (0: every
        --checkpoint-every-s seconds); always at the end.
      checkpoint_every_s: seconds between checkpoints when --checkpoint-every
        is 0.
      keep_checkpoints: checkpoints kept in DIR/checkpoints.
      progress: "auto": a progress bar on a terminal, plain lines otherwise.
      coordinator: multi-host: HOST:PORT of process 0's coordination service
        (give --num-processes and --process-id too; every process runs the
        same command with the same --logdir).
      num_processes: multi-host: number of processes in the run.
      process_id: multi-host: this process's index, 0 .. num_processes - 1.
      distributed_auto: multi-host: let jax.distributed.initialize() detect
        the cluster (TPU pod slices, Slurm, Open MPI).
      distributed_timeout_s: multi-host: seconds to wait for the coordinator.
      num_seeds: train this many independent seeds (--seed, --seed + 1, ...)
        in one compiled program (vmapped): one metrics stream per seed in
        DIR/seed_K/metrics.jsonl and a curve.png with the mean and spread.
        No checkpoints, no --stop-at.
      compile_cache: JAX's persistent compilation cache: "auto"
        ($JAX_COMPILATION_CACHE_DIR, else ~/.cache/muzero-jax/xla), "none"
        (off) or a directory. A repeated run of the same program skips XLA's
        compile (about 20 s of the Catch preset's start on a 2-core CPU).
      cpu_devices: on a CPU, split the host into this many JAX devices so
        that a data-parallel run keeps that many cores busy (XLA:CPU runs one
        device's program mostly on one core); 0: JAX's default (one). The
        run uses them all unless --num-devices says fewer, and a resume needs
        the same count (the run directory's launch.json records it, and
        --resume uses it unless given). On the 2-core CPU, 2 ran the Connect
        Four preset's iterations 1.34x faster, but Catch's tiny ones 0.60x
        (README).
    """

    config: Annotated[Config, tyro.conf.arg(name="", prefix_name=False)]
    logdir: str | None = None
    resume: str | None = None
    overwrite: bool = False
    max_seconds: float | None = None
    max_iterations: int | None = None
    stop_at: float | None = None
    checkpoint_every: int = 0
    checkpoint_every_s: float = 60.0
    keep_checkpoints: int = 3
    progress: Literal["auto", "bar", "lines", "none"] = "auto"
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    distributed_auto: bool = False
    distributed_timeout_s: int = 120
    num_seeds: int = 1
    compile_cache: str = "auto"
    cpu_devices: int = 0

    def distributed(self):
        """The validated `DistributedConfig` of these flags (ValueError if inconsistent)."""
        from muzero_jax.distributed import DistributedConfig

        return DistributedConfig(
            coordinator=self.coordinator or "",
            num_processes=self.num_processes or 0,
            process_id=-1 if self.process_id is None else self.process_id,
            auto=self.distributed_auto,
            timeout_s=self.distributed_timeout_s,
        )

    def __post_init__(self):
        self.distributed()
        for name in ("max_seconds", "max_iterations"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        for name in ("checkpoint_every", "checkpoint_every_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, "
                                 f"got {getattr(self, name)}")
        if self.num_seeds < 1:
            raise ValueError(f"--num-seeds must be >= 1, got {self.num_seeds}")
        if self.num_seeds > 1 and self.resume is not None:
            raise ValueError("--num-seeds runs keep no checkpoints, so they cannot --resume")
        if self.keep_checkpoints < 1:
            raise ValueError(f"--keep-checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.cpu_devices < 0:
            raise ValueError(f"--cpu-devices must be >= 0, got {self.cpu_devices}")
        _check_compile_cache(self.compile_cache)


EVAL_MODELS = ("learned", "env", "decoded")
"""`eval --model` choices: `muzero_jax.agent.MODELS` (kept here so that
parsing the command line does not import JAX)."""

EVAL_WEIGHTS = ("online", "target")
"""`eval --weights` choices: `muzero_jax.agent.WEIGHTS` (likewise)."""


@dataclasses.dataclass(frozen=True)
class EvalArgs:
    """Evaluate a trained agent: greedy episodes (the most visited action),
    mean and standard error of the returns, written to DIR/eval.json.

    Attributes:
      logdir: the run directory (or a checkpoint directory).
      episodes: greedy episodes to play.
      num_simulations: simulations per search (None: the run's evaluation
        setting).
      seed: seed of the evaluation episodes.
      step: checkpoint step to evaluate (None: the latest).
      opponent: play against this opponent instead (two-player games; see
        muzero_jax.arena).
      tactics: with --opponent, on TicTacToe and Connect Four: also label
        every move of the matches on the real game and report both players'
        immediate wins taken and forced blocks made, and what the agent's
        losses began with (a missed win, a missed block, or no one-move
        error), as eval.json's `tactics`.
      compile_cache: JAX's persistent compilation cache ("auto", "none" or a
        directory; see `train --help`).
      search: search with another search than the run's, on the same
        network: a built-in name (gumbel_muzero, muzero, puct, muzero_paper)
        or "package.module:function" (None: the run's evaluation search, its
        `eval_search`, else its self-play `search`).
      search_kwargs: JSON object of the search's keyword hyper-parameters,
        e.g. '{"dirichlet_fraction": 0}' for puct (None: the run's own for a
        search it used, in evaluation or self-play; none for another).
      model: what the search plans in: "learned" (MuZero's dynamics),
        "env" (the environment's own step, with the networks' prior and
        value at every node: AlphaZero's planning, exact for the board
        games; it tells how much of the agent's strength the learned model
        costs) or "decoded" (the learned model re-grounded at every step:
        each next hidden state decoded to an observation, rounded onto 0/1
        and encoded again; runs trained with reconstruction_loss_weight > 0,
        binary observations). Default: the run's search_model ("learned"
        unless it trained with "decoded").
      weights: which parameters of the checkpoint: "online" (the optimiser's)
        or "target" (the target network's: an exponential moving average of
        the online weights when the run trained with --target-ema > 0, else
        a copy refreshed every --target-update-period updates). Default: the
        run's eval_weights ("online" unless it trained with "target").
      symmetry_ensemble: average every network evaluation of the search
        over the board's symmetries (Connect Four's mirror; the eight of
        TicTacToe and Go): test-time augmentation, S times the network cost.
        Default: the run's eval_symmetry_ensemble.
      win_lookahead: read the learned model's predicted rewards as wins in
        the search: a node where the player to move has a move predicted to
        win is worth at least that reward, and a predicted win ends the game
        there (two-player games rewarded only at their end; one more
        dynamics evaluation per move per expanded node). Default: the run's
        eval_win_lookahead, with the learned and decoded models; refused
        with --model env.
      output: the file the results are written to (None: DIR/eval.json
        for a run directory, no file for a checkpoint directory). Give each
        evaluation of one run its own file to keep them all, e.g. when
        several run side by side.
    """

    logdir: str
    episodes: int = 100
    num_simulations: int | None = None
    seed: int = 0
    step: int | None = None
    opponent: str | None = None
    tactics: bool = False
    compile_cache: str = "auto"
    search: str | None = None
    search_kwargs: str | None = None
    model: str | None = None
    weights: str | None = None
    symmetry_ensemble: bool | None = None
    win_lookahead: bool | None = None
    output: str | None = None

    def __post_init__(self):
        if self.model is not None and self.model not in EVAL_MODELS:
            raise ValueError(
                f"--model must be one of {', '.join(EVAL_MODELS)}, got {self.model!r}")
        if self.weights is not None and self.weights not in EVAL_WEIGHTS:
            raise ValueError(
                f"--weights must be one of {', '.join(EVAL_WEIGHTS)}, got {self.weights!r}")
        if self.tactics and self.opponent is None:
            raise ValueError("--tactics needs --opponent (it labels the moves of matches)")
        if self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {self.episodes}")
        if self.num_simulations is not None and self.num_simulations < 1:
            raise ValueError(f"--num-simulations must be >= 1, got {self.num_simulations}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        _check_compile_cache(self.compile_cache)


def _check_compile_cache(spec: str) -> None:
    from muzero_jax.compile_cache import resolve

    resolve(spec)  # ValueError with the flag's name if unusable


def _tyro_parse(cls, default, argv: list[str], prog: str):
    """tyro with its error boxes turned into one line (UsageError)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(cls, default=default, args=argv, prog=prog)
    except SystemExit as e:
        if not e.code:
            raise  # --help
        raise UsageError(f"{prog}: {_box_message(captured.getvalue())}") from None


def _box_message(text: str) -> str:
    """The title and first message of a tyro error box, on one line.

    When the box shows the option's usage (its "Argument helptext", e.g.
    `--temperature-schedule [FLOAT FLOAT [FLOAT FLOAT ...]]`), that usage
    ends the line, so a value of the wrong shape says which shape is wanted.
    tyro draws the box with Unicode lines, or with ASCII dashes when the
    output's encoding is not UTF-8 (e.g. `PYTHONIOENCODING=ascii`, or under
    pytest's capture); both read the same here.
    """
    lines = _box_lines(text)
    title, body = None, []
    for line in lines:
        if line.startswith("For full helptext"):
            break
        if not line:
            continue
        if _is_rule(line):
            if body:
                break
            continue
        if title is None:
            title = line.strip("─- ").strip()
        else:
            body.append(line)
    if title is None:
        return "bad command line"
    message = " ".join(body)
    if message.lower().startswith(title.lower()) or title.lower() == "value error":
        message = message or title
    elif message:
        message = f"{title.lower()}: {message}"
    else:
        message = title
    usage = next((lines[i + 1] for i, line in enumerate(lines[:-1])
                  if line == "Argument helptext:" and lines[i + 1].startswith("-")), None)
    return f"{message} (usage: {usage})" if usage else message


def _box_lines(text: str) -> list[str]:
    """A tyro error box's lines without its borders or indentation."""
    return [raw.strip().strip("│╭╮╰╯|+").strip() for raw in text.splitlines()]


def _is_rule(line: str) -> bool:
    return set(line) <= set("─━-+ ")


def _option(argv: list[str], name: str) -> str | None:
    """The value of `--name X` / `--name=X` in argv (the last one), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _load_run_config(logdir: str) -> Config:
    path = os.path.join(logdir, "config.json")
    if not os.path.isfile(path):
        raise UsageError(f"{_PROG} train: --resume {logdir}: no run there (no config.json)")
    try:
        with open(path) as f:
            return config_from_dict(json.load(f))
    except (ValueError, TypeError) as e:
        raise UsageError(f"{_PROG} train: --resume {logdir}: unreadable config.json ({e})") from e


def write_launch_file(logdir: str, cpu_devices: int) -> None:
    """Records in `logdir` how the run's processes were started (LAUNCH_FILE)."""
    write_text_atomically(os.path.join(logdir, LAUNCH_FILE),
                          json.dumps({"cpu_devices": int(cpu_devices)}) + "\n")


def _launched_cpu_devices(logdir: str) -> int:
    """The `--cpu-devices` a run was started with (0 for runs without a
    launch.json: JAX's default, as before the file existed)."""
    path = os.path.join(logdir, LAUNCH_FILE)
    if not os.path.isfile(path):
        return 0
    try:
        with open(path) as f:
            count = json.load(f)["cpu_devices"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{_PROG} train: --resume {logdir}: unreadable {LAUNCH_FILE} ({e}); "
                         "give --cpu-devices N to say how to start") from None
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise UsageError(f"{_PROG} train: --resume {logdir}: {LAUNCH_FILE} holds cpu_devices "
                         f"{count!r}, not an integer >= 0; give --cpu-devices N to say how "
                         "to start")
    return count


def _check_writable(logdir: str) -> None:
    parent = logdir
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    target = parent or "."
    if not os.path.isdir(target) or not os.access(target, os.W_OK | os.X_OK):
        raise UsageError(f"{_PROG} train: cannot write to --logdir {logdir} "
                         f"({target} is not a writable directory)")


def _parse_train(argv: list[str]) -> TrainArgs:
    from muzero_jax.envs import ENV_NAMES
    from muzero_jax.presets import preset
    from muzero_jax.train import DEFAULT_STOP_AT

    resume = _option(argv, "--resume")
    env = _option(argv, "--env")
    if env is not None and env not in ENV_NAMES:
        raise UsageError(f"{_PROG} train: unknown environment {env!r}; "
                         f"known: {', '.join(ENV_NAMES)}")
    if resume is not None:
        stored = _load_run_config(resume)
        # A given --cpu-devices wins (tyro parses it); only without one is the
        # run's launch.json read.
        launched = 0 if _option(argv, "--cpu-devices") else _launched_cpu_devices(resume)
        default = TrainArgs(config=stored, stop_at=DEFAULT_STOP_AT.get(stored.env),
                            cpu_devices=launched)
    else:
        if env is None and not any(a in ("-h", "--help") for a in argv):
            raise UsageError(f"{_PROG} train: --env is required "
                             f"(one of {', '.join(ENV_NAMES)}), or --resume DIR")
        base = preset(env or "catch")
        default = TrainArgs(config=base, stop_at=DEFAULT_STOP_AT.get(base.env))
    try:
        args = _tyro_parse(TrainArgs, default, argv, f"{_PROG} train")
    except (ValueError, TypeError) as e:  # a field's validation (Config.__post_init__)
        raise UsageError(f"{_PROG} train: {e}") from None
    if resume is not None:
        stored_d, given_d = config_to_dict(default.config), config_to_dict(args.config)
        diff = [k for k in stored_d if stored_d[k] != given_d[k] and k != "max_env_steps"]
        if diff:
            shown = ", ".join(f"{k} ({stored_d[k]!r} in the run, {given_d[k]!r} given)"
                              for k in diff[:3])
            raise UsageError(f"{_PROG} train: --resume {resume}: the config does not match the "
                             f"run's: {shown}; start a new run with another --logdir instead")
        if args.logdir is not None and os.path.abspath(args.logdir) != os.path.abspath(resume):
            raise UsageError(f"{_PROG} train: give either --resume DIR or --logdir DIR, "
                             "not two different directories")
    return args


def _prepare_logdir(args: TrainArgs) -> str:
    if args.resume is not None:
        from muzero_jax.checkpoint import latest_step

        if latest_step(os.path.join(args.resume, "checkpoints")) is None:
            raise UsageError(f"{_PROG} train: --resume {args.resume}: no checkpoint in "
                             f"{os.path.join(args.resume, 'checkpoints')}")
        _check_writable(args.resume)
        return args.resume
    logdir = args.logdir
    if logdir is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        logdir = os.path.join("runs", f"{args.config.env}-{stamp}")
    existing = [n for n in _RUN_FILES if os.path.exists(os.path.join(logdir, n))]
    if existing and not args.overwrite:
        raise UsageError(f"{_PROG} train: {logdir} already holds a run ({existing[0]}); "
                         "use --resume to continue it, --overwrite to replace it, or another "
                         "--logdir")
    _check_writable(logdir)
    return logdir


def _clear_run(logdir: str) -> None:
    for name in _RUN_FILES:
        path = os.path.join(logdir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    for name in os.listdir(logdir):
        if name.startswith("events.out.tfevents."):
            os.remove(os.path.join(logdir, name))


def _train(argv: list[str]) -> int:
    from muzero_jax.checkpoint import CheckpointError
    from muzero_jax.learning import make_train
    from muzero_jax.train import NonFiniteError, train

    args = _parse_train(argv)
    config = args.config
    dist = args.distributed()
    if args.cpu_devices:  # before anything starts JAX's backends
        from muzero_jax.distributed import use_cpu_devices

        try:
            use_cpu_devices(args.cpu_devices)
        except ValueError as e:
            raise UsageError(f"{_PROG} train: {e}") from None
    from muzero_jax import compile_cache

    compile_cache.enable(args.compile_cache)
    if dist.enabled:
        if args.logdir is None and args.resume is None:
            raise UsageError(f"{_PROG} train: a multi-host run needs --logdir (or --resume): "
                             "every process must name the same directory")
        from muzero_jax import distributed

        try:
            distributed.initialize(dist)
        except RuntimeError as e:
            print(f"{_PROG}: error: {e}", file=sys.stderr, flush=True)
            return 1
    main_process = not dist.enabled or distributed.is_main_process()
    # Only process 0 checks and prepares the run directory; the others write
    # their checkpoint shards into the same one through orbax.
    logdir = _prepare_logdir(args) if main_process else (args.resume or args.logdir)
    try:  # Everything else that can be wrong with the input shows here, before compiling.
        trainer = make_train(config)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{_PROG} train: {e}") from None
    try:
        os.makedirs(logdir, exist_ok=True)
        if args.overwrite and args.resume is None and main_process:
            _clear_run(logdir)
        if args.resume is None and main_process:
            write_launch_file(logdir, args.cpu_devices)
    except OSError as e:
        raise UsageError(f"{_PROG} train: cannot write to --logdir {logdir}: {e.strerror}") from e
    if args.num_seeds > 1:
        return _train_seeds(args, config, logdir)
    verb = "resuming" if args.resume else "training"
    print(f"{_PROG}: {verb} {config.env} -> {logdir} on {trainer.mesh.devices.size} "
          "device(s); compiling...", flush=True)
    try:
        result = train(
            config, trainer=trainer, logdir=logdir, resume=args.resume is not None,
            max_seconds=args.max_seconds, max_iterations=args.max_iterations,
            stop_threshold=args.stop_at, checkpoint_every=args.checkpoint_every,
            checkpoint_every_s=args.checkpoint_every_s, keep_checkpoints=args.keep_checkpoints,
            progress=args.progress,
        )
    except CheckpointError as e:
        raise UsageError(f"{_PROG} train: --resume {logdir}: {e}") from None
    except NonFiniteError as e:
        print(f"{_PROG}: stopped: {e}", file=sys.stderr, flush=True)
        return 1
    rows = result.history
    last = rows[-1] if rows else {}
    print(f"{_PROG}: done ({result.stop_reason}) after {last.get('env_steps', 0)} environment "
          f"steps, {last.get('wall_s', 0):.1f}s; see {logdir}/ (metrics.jsonl, curve.png, "
          f"checkpoints/; tensorboard --logdir {logdir})", flush=True)
    if result.solved_at is not None:
        print(f"{_PROG}: solved (two evaluations >= {args.stop_at}) at "
              f"{result.solved_at['wall_s']:.1f}s, {result.solved_at['env_steps']} environment "
              "steps", flush=True)
    return 0


def _train_seeds(args: TrainArgs, config, logdir: str) -> int:
    from muzero_jax.learning import make_train
    from muzero_jax.train import NonFiniteError, train_seeds

    try:  # bad input (e.g. sizes for the devices) before compiling the seeds' program
        make_train(config)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{_PROG} train: {e}") from None
    if args.overwrite:
        _clear_run(logdir)
    print(f"{_PROG}: training {args.num_seeds} seeds of {config.env} in one program -> "
          f"{logdir}; compiling...", flush=True)
    last, show = [0.0], Printer()

    def on_rows(rows):
        if rows[0]["wall_s"] - last[0] >= 5.0 or "eval_return" in rows[0]:
            last[0] = rows[0]["wall_s"]
            key = "eval_return" if "eval_return" in rows[0] else "episode_return"
            values = [r[key] for r in rows if r.get(key) is not None]
            shown = (f"{key} mean {sum(values) / len(values):.3f} "
                     f"[{min(values):.3f}, {max(values):.3f}]" if values else "no episodes")
            show(f"iter {rows[0]['iteration']:5d} | steps/seed {rows[0]['env_steps']:9d} | "
                 f"{shown} | t {rows[0]['wall_s']:.1f}s")  # a console gone: the run goes on

    try:
        result = train_seeds(config, args.num_seeds, logdir=logdir,
                             max_seconds=args.max_seconds, max_iterations=args.max_iterations,
                             on_rows=on_rows)
    except NonFiniteError as e:
        print(f"{_PROG}: stopped: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"{_PROG}: done ({result.stop_reason}); seeds {result.seeds[0]}..{result.seeds[-1]}: "
          f"{logdir}/seed_K/metrics.jsonl, {logdir}/curve.png", flush=True)
    return 0


def _eval(argv: list[str]) -> int:
    import jax

    from muzero_jax.agent import load_agent, standard_error
    from muzero_jax.checkpoint import CheckpointError

    try:
        args = _tyro_parse(EvalArgs, None, argv, f"{_PROG} eval")
    except (ValueError, TypeError) as e:
        raise UsageError(f"{_PROG} eval: {e}") from None
    if not os.path.isdir(args.logdir):
        raise UsageError(f"{_PROG} eval: --logdir {args.logdir} is not a directory")
    if args.output is not None:
        if os.path.isdir(args.output):
            raise UsageError(f"{_PROG} eval: --output {args.output} is a directory; "
                             "give a file name, e.g. eval_seed1.json")
        parent = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(parent):
            raise UsageError(f"{_PROG} eval: --output {args.output}: its directory {parent} "
                             "does not exist")
    from muzero_jax import compile_cache

    compile_cache.enable(args.compile_cache)
    evaluate_against = None
    if args.opponent is not None:
        try:
            arena = importlib.import_module("muzero_jax.arena")
        except ModuleNotFoundError as e:
            if e.name != "muzero_jax.arena":
                raise
            raise UsageError(f"{_PROG} eval: --opponent needs muzero_jax.arena, which this "
                             "installation does not have") from None
        evaluate_against = arena.evaluate_against
    try:
        agent = load_agent(args.logdir, step=args.step, search=args.search,
                           search_kwargs=args.search_kwargs, model=args.model,
                           weights=args.weights, symmetry_ensemble=args.symmetry_ensemble,
                           win_lookahead=args.win_lookahead)
    except (CheckpointError, ValueError, TypeError) as e:  # ValueError: --search(-kwargs)
        raise UsageError(f"{_PROG} eval: {e}") from None
    out_dir = args.logdir if os.path.isfile(os.path.join(args.logdir, "config.json")) else None
    rng_key = jax.random.key(args.seed)
    result: dict = {"step": agent.step, "env": agent.config.env, "seed": args.seed,
                    "num_simulations": agent._num_simulations(args.num_simulations),
                    "search": agent.config.search, "search_kwargs": agent.config.search_kwargs,
                    "model": agent.model, "weights": agent.weights,
                    "symmetry_ensemble": agent.symmetry_ensemble,
                    "win_lookahead": agent.win_lookahead}
    lines = []  # shown once the results are safe in their file
    if evaluate_against is not None:
        try:
            stats = evaluate_against(agent, args.opponent, num_games=args.episodes,
                                     rng_key=rng_key, num_simulations=args.num_simulations,
                                     tactics=args.tactics)
        except ValueError as e:
            raise UsageError(f"{_PROG} eval: {e}") from None
        result["opponent"] = args.opponent
        result.update(stats)
        lines.append(f"{_PROG}: {agent.config.env} vs {args.opponent} over {args.episodes} "
                     "games: " + ", ".join(f"{k}={v}" for k, v in stats.items()
                                           if not isinstance(v, list | dict)))
        if "tactics" in stats:
            t, lost = stats["tactics"], stats["tactics"]["losses"]

            def share(x):
                return "-" if x is None else f"{x:.2f}"

            lines.append(f"{_PROG}: in these games, " + "; ".join(
                f"the {who} took {share(t[who]['wins_taken'])} of {t[who]['wins_available']} "
                f"immediate wins and made {share(t[who]['blocks_made'])} of "
                f"{t[who]['must_block']} forced blocks" for who in ("agent", "opponent"))
                + f"; of the agent's {lost['num_lost']} losses, {share(lost['missed_block'])} "
                f"began with a missed block, {share(lost['missed_win'])} with a missed win, "
                f"{share(lost['no_error'])} with neither")
    else:
        returns = agent.evaluate(args.episodes, rng_key, num_simulations=args.num_simulations)
        mean, stderr = float(returns.mean()), standard_error(returns)
        result.update(episodes=args.episodes, mean=mean, stderr=stderr,
                      returns=[float(r) for r in returns])
        lines.append(f"{_PROG}: {agent.config.env}, checkpoint {agent.step}, {args.episodes} "
                     f"greedy episodes, {result['num_simulations']} simulations: return "
                     f"{mean:.4f} +- {stderr:.4f} (standard error)")
    out_path = args.output
    if out_path is None and out_dir is not None:
        out_path = os.path.join(out_dir, "eval.json")
    if out_path is not None:  # the file first: a console gone must not cost the results
        write_text_atomically(out_path, json.dumps(result, indent=2))
        lines.append(f"{_PROG}: wrote {out_path}")
    print("\n".join(lines), flush=True)
    return 0


def _forward(command: str, argv: list[str]) -> int:
    module_name = _FORWARDED[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            print(f"{_PROG}: '{command}' is not available in this installation "
                  f"({module_name} is missing)", file=sys.stderr)
            return 1
        raise
    return int(module.main(argv) or 0)


def _usage() -> str:
    lines = [f"usage: {_PROG} {{{','.join(_COMMANDS)}}} [OPTIONS]", "", "commands:"]
    lines += [f"  {name:<6} {text}" for name, text in _COMMANDS.items()]
    lines += ["", f"'{_PROG} COMMAND --help' lists the command's options with their defaults."]
    return "\n".join(lines)


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in _FORWARDED:
        return _forward(command, rest)
    if command == "train":
        return _train(rest)
    if command == "eval":
        return _eval(rest)
    raise UsageError(f"{_PROG}: unknown command {command!r}; commands: {', '.join(_COMMANDS)}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `muzero-jax` console script; returns the exit code."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            code = _dispatch(argv)
        except SystemExit as e:  # --help of a subcommand
            code = int(e.code or 0)
        sys.stdout.flush()  # here, not at exit, so that a reader gone is caught below
        return code
    except UsageError as e:
        print(str(e).splitlines()[0] if str(e) else f"{_PROG}: bad input", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Whoever read stdout has gone (`muzero-jax train --help | head`): stop
        # quietly, as a program killed by SIGPIPE would, and point stdout at
        # /dev/null so that Python's flush at exit does not complain either.
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no file behind
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # noqa: BLE001 - runtime failure: clear message, exit 1
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"{_PROG}: error: {type(e).__name__}: {first}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
