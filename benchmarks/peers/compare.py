"""muzero-jax vs LightZero, side by side in one run (search, learner, end to end).

Runs in the muzero-jax venv; LightZero runs in its own venv
(benchmarks/peers/.venv-lightzero, made by setup_lightzero.sh) as a worker
process (`lightzero_bench.py serve`) that this script drives over a pipe. The
two sides take turns, A B A B, cell by cell, so that slow drift of the shared
machine hits both alike; only one side computes at a time (the other waits on
the pipe). Ratios are ours / LightZero's.

Same network on both sides: muzero-general's fully connected MuZero net,
observation 16 -> 128 -> latent 64, ELU, 21-bin value and reward heads
(LightZero: `lightzero_bench.FCNet`; ours: `MLPConfig(hidden_sizes=(128,),
latent_size=64, head_hidden_sizes=(128,), activation="elu", layer_norm=False,
reward_input="latent")` with value and reward support size 10: the reward head
reads the unscaled next latent as muzero-general's does, 57,900 parameters at
A=2 on both sides). See README.md for what still differs.

    python benchmarks/peers/compare.py                      # everything (~30 min)
    python benchmarks/peers/compare.py --only search --rounds 3
    python benchmarks/peers/compare.py --only e2e --lightzero-e2e-seconds 600
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIGHTZERO_PYTHON = os.path.join(HERE, ".venv-lightzero", "bin", "python")

OBS = 16
SUPPORT_SIZE = 10  # 21 bins
DISCOUNT = 0.997
OUR_SEARCHES = ("muzero_paper", "puct")


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def matched_mlp():
    from muzero_jax.networks import MLPConfig

    return MLPConfig(hidden_sizes=(128,), latent_size=64, head_hidden_sizes=(128,),
                     activation="elu", layer_norm=False, reward_input="latent")


# ----------------------------------------------------------------------------
# The LightZero worker.
# ----------------------------------------------------------------------------


class LightZero:
    """`lightzero_bench.py serve` in the peer venv: one JSON request, JSON rows back."""

    def __init__(self, python: str, log_path: str, threads: int, cwd: str):
        if not os.path.exists(python):
            raise SystemExit(f"{python} not found: run bash benchmarks/peers/setup_lightzero.sh")
        self.log = open(log_path, "w")
        env = dict(os.environ, LIGHTZERO_BENCH_THREADS=str(threads))
        self.proc = subprocess.Popen(
            [python, os.path.join(HERE, "lightzero_bench.py"), "serve"], cwd=cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)

    def __call__(self, **request) -> list[dict[str, Any]]:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        rows = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"LightZero worker died; see {self.log.name}")
            row = json.loads(line)
            if row.get("error"):
                raise RuntimeError(f"LightZero worker: {row['error']}")
            if row.get("done"):
                return rows
            rows.append(row)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


# ----------------------------------------------------------------------------
# Our side.
# ----------------------------------------------------------------------------


def our_info() -> dict[str, Any]:
    import jax
    import mctx

    import muzero_jax
    from muzero_jax.bench.search import machine_info

    info = machine_info()
    info.update(muzero_jax=muzero_jax.__version__, mctx=mctx.__version__, jax=jax.__version__)
    return info


def our_search_setup(actions: int, batch: int, simulations: int, seed: int = 0):
    """Jitted `batch_search` (root inference + search) per built-in, on the matched net."""
    import jax
    import jax.numpy as jnp

    from muzero_jax.networks import make_networks
    from muzero_jax.search import BUILTIN_SEARCHES, batch_search, make_recurrent_fn, make_root_fn
    from muzero_jax.value_transforms import make_support

    support = make_support(SUPPORT_SIZE)
    nets = make_networks(matched_mlp(), num_actions=actions, value_bins=support.num_bins,
                         reward_bins=support.num_bins)
    obs = jax.random.normal(jax.random.key(seed + 1), (batch, OBS))
    params = nets.init(jax.random.key(seed), obs[:1])
    legal = jnp.ones((batch, actions), bool)
    root_fn = make_root_fn(nets, support)
    recurrent_fn = make_recurrent_fn(nets, support, support, discount=DISCOUNT)
    out = {}
    for name in OUR_SEARCHES:
        run = batch_search(BUILTIN_SEARCHES[name], root_fn, recurrent_fn,
                           num_simulations=simulations)
        t0 = time.perf_counter()
        compiled = jax.jit(run).lower(params, jax.random.key(0), obs, legal).compile()
        compile_s = time.perf_counter() - t0
        fn = (lambda c=compiled: lambda key: c(params, key, obs, legal))()
        jax.block_until_ready(fn(jax.random.key(0)))  # warm-up
        out[name] = (fn, compile_s)
    num_params = int(sum(x.size for x in jax.tree.leaves(params)))
    return out, num_params


def time_our_search(fn, repeats: int, round_index: int) -> list[float]:
    import jax

    keys = jax.random.split(jax.random.key(1000 + round_index), repeats)
    times = []
    for key in keys:
        t0 = time.perf_counter()
        jax.block_until_ready(fn(key))
        times.append(time.perf_counter() - t0)
    return times


def our_learner_setup(actions: int, batch: int, k: int, seed: int = 0):
    """The jitted learner step of `muzero-jax bench unroll` (grad of `unrolled_loss`
    + the run's Optax update), on the matched network."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from muzero_jax.bench.cli import _random_batch
    from muzero_jax.learning import make_optimizer
    from muzero_jax.loss import unrolled_loss
    from muzero_jax.networks import make_networks
    from muzero_jax.presets import preset
    from muzero_jax.value_transforms import make_support

    config = preset("cartpole", mlp=matched_mlp(), value_support_size=SUPPORT_SIZE,
                    reward_support_size=SUPPORT_SIZE, num_unroll_steps=k, batch_size=batch)
    vs = make_support(config.value_support_size)
    rs = make_support(config.reward_support_size)
    nets = make_networks(config.mlp, num_actions=actions, value_bins=vs.num_bins,
                         reward_bins=rs.num_bins)
    optimizer, _ = make_optimizer(config)
    data = _random_batch(np.random.default_rng(seed), (OBS,), actions, batch, k)
    params = nets.init(jax.random.key(seed), jnp.asarray(data.observation[:1]))
    opt_state = optimizer.init(params)

    def step(params, opt_state, data):
        grads, _ = jax.grad(unrolled_loss, has_aux=True)(
            params, data, networks=nets, value_support=vs, reward_support=rs,
            value_loss_weight=config.value_loss_weight)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    t0 = time.perf_counter()
    compiled = jax.jit(step).lower(params, opt_state, data).compile()
    compile_s = time.perf_counter() - t0
    data = jax.device_put(data)
    jax.block_until_ready(compiled(params, opt_state, data))
    num_params = int(sum(x.size for x in jax.tree.leaves(params)))
    return (lambda: compiled(params, opt_state, data)), compile_s, num_params


def our_e2e(max_seconds: float, seed: int, out_dir: str) -> dict[str, Any]:
    """`experiments/solve.py --env cartpole` in a fresh process (compile included)."""
    out = os.path.join(out_dir, f"solve_cartpole_{int(time.time())}.jsonl")
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "solve.py"), "--env", "cartpole",
           "--seeds", str(seed), "--max-seconds", str(max_seconds), "--out", out]
    load_before = load()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    with open(out) as f:
        row = json.loads(f.readlines()[-1])
    row.update(side="muzero_jax", bench="e2e", command=" ".join(cmd[1:]),
               process_wall_s=round(wall, 1), load=load_before)
    return row


# ----------------------------------------------------------------------------
# The runs.
# ----------------------------------------------------------------------------


def _summ(times: list[float], work: float) -> dict[str, float]:
    med = statistics.median(times)
    return {"median_s": med, "min_s": min(times), "max_s": max(times), "per_s": work / med}


def run_search(lz: LightZero, cells, rounds: int, repeats: int, log) -> list[dict[str, Any]]:
    rows = []
    for a, b, n in cells:
        ours, num_params = our_search_setup(a, b, n)
        times = {name: [] for name in OUR_SEARCHES}
        lz_times, lz_rows, loads = [], [], []
        for r in range(rounds):
            loads.append(load())
            order = ("ours", "lz") if r % 2 == 0 else ("lz", "ours")
            for side in order:
                if side == "ours":
                    for name in OUR_SEARCHES:
                        times[name] += time_our_search(ours[name][0], repeats, r)
                else:
                    row = lz(bench="search", actions=a, batch=b, simulations=n, repeats=repeats,
                             seed=r)[0]
                    lz_rows.append(row)
                    lz_times.append(row["median_s"])
        # LightZero's per-round medians of `repeats` calls; ours: every call. Both
        # summarised by the median; ratio = ours / LightZero simulations/s.
        lz_med = statistics.median(lz_times)
        row = {
            "bench": "search", "actions": a, "batch": b, "simulations": n, "rounds": rounds,
            "repeats": repeats, "loads": loads,
            "lightzero_sims_per_s": b * n / lz_med,
            "lightzero_round_sims_per_s": [b * n / t for t in lz_times],
            "lightzero_num_params": lz_rows[0]["num_params"], "ours_num_params": num_params,
        }
        for name in OUR_SEARCHES:
            s = _summ(times[name], b * n)
            row[f"ours_{name}_sims_per_s"] = s["per_s"]
            row[f"ours_{name}_compile_s"] = ours[name][1]
            row[f"ours_{name}_min_max_ms"] = [s["min_s"] * 1e3, s["max_s"] * 1e3]
            row[f"ratio_{name}"] = s["per_s"] / row["lightzero_sims_per_s"]
        rows.append(row)
        log(search_table([row], header=not rows[:-1]))
    return rows


def run_learner(lz: LightZero, actions: int, batch: int, k: int, rounds: int, repeats: int,
                impls: Sequence[str], log) -> dict[str, Any]:
    fn, compile_s, num_params = our_learner_setup(actions, batch, k)
    ours, lz_rows, loads = [], {}, []
    for r in range(rounds):
        loads.append(load())
        order = ("ours", "lz") if r % 2 == 0 else ("lz", "ours")
        for side in order:
            if side == "ours":
                import jax

                for _ in range(repeats):
                    t0 = time.perf_counter()
                    jax.block_until_ready(fn())
                    ours.append(time.perf_counter() - t0)
            else:
                for row in lz(bench="learner", actions=actions, batch_size=batch, unroll_steps=k,
                              repeats=repeats, impls=list(impls)):
                    lz_rows.setdefault(row["impl"], []).append(row)
        log(f"learner round {r + 1}/{rounds} done, load {load()}")
    s = _summ(ours, batch)
    out = {"bench": "learner", "actions": actions, "batch_size": batch, "unroll_steps": k,
           "rounds": rounds, "repeats": repeats, "loads": loads,
           "ours_samples_per_s": s["per_s"], "ours_min_max_s": [s["min_s"], s["max_s"]],
           "ours_compile_s": compile_s, "ours_num_params": num_params, "lightzero": {}}
    for impl, rows in lz_rows.items():
        if "error" in rows[0]:
            out["lightzero"][impl] = {"error": rows[0]["error"]}
            continue
        per_s = statistics.median(row["samples_per_s"] for row in rows)
        out["lightzero"][impl] = {
            "samples_per_s": per_s, "round_samples_per_s": [row["samples_per_s"] for row in rows],
            "num_params": rows[0]["num_params"], "first_calls_s": rows[0]["warmup_s"],
            "ratio_ours_over": s["per_s"] / per_s,
        }
    log(learner_table(out))
    return out


def run_e2e(lz: LightZero, our_seconds: float, lz_seconds: float, seed: int, order: str,
            out_dir: str, log) -> dict[str, Any]:
    ours, theirs = [], []
    for side in order:
        if side == "A":
            log(f"e2e: ours (solve.py, <= {our_seconds:g} s), load {load()}")
            ours.append(our_e2e(our_seconds, seed, out_dir))
            log(json.dumps({k: ours[-1][k] for k in ("solved", "solved_wall_s",
                                                      "solved_env_steps",
                                                      "loop_env_steps_per_s")}))
        else:
            log(f"e2e: LightZero CartPole config ({lz_seconds:g} s), load {load()}")
            # DI-engine puts its logs under ./<exp_name>; the worker runs in out_dir.
            theirs.append(lz(bench="e2e", seconds=lz_seconds, seed=seed,
                             exp_dir=f"lightzero_e2e_{len(theirs)}")[0])
            log(json.dumps({k: theirs[-1][k] for k in ("env_steps", "env_steps_per_s",
                                                        "first_eval_at_threshold",
                                                        "two_consecutive_evals_at_threshold",
                                                        "best_eval")}))
    return {"bench": "e2e", "order": order, "ours": ours, "lightzero": theirs}


# ----------------------------------------------------------------------------
# Tables (pure Python).
# ----------------------------------------------------------------------------


def search_table(rows: Sequence[dict[str, Any]], header: bool = True) -> str:
    lines = []
    if header:
        lines += ["| A | B | N | LightZero ctree k sims/s | "
                  + " | ".join(f"ours {n} k sims/s" for n in OUR_SEARCHES) + " | "
                  + " | ".join(f"{n} / LightZero" for n in OUR_SEARCHES) + " |",
                  "|" + "---|" * (4 + 2 * len(OUR_SEARCHES))]
    for r in rows:
        lines.append(
            f"| {r['actions']} | {r['batch']} | {r['simulations']} | "
            f"{r['lightzero_sims_per_s'] / 1e3:.1f} | "
            + " | ".join(f"{r[f'ours_{n}_sims_per_s'] / 1e3:.1f}" for n in OUR_SEARCHES) + " | "
            + " | ".join(f"{r[f'ratio_{n}']:.2f}x" for n in OUR_SEARCHES) + " |")
    return "\n".join(lines)


def learner_table(row: dict[str, Any]) -> str:
    lines = ["| learner | params | samples/s | ours / it |", "|---|---|---|---|",
             f"| muzero-jax (jit, `bench unroll` step) | {row['ours_num_params']:,} | "
             f"{row['ours_samples_per_s']:,.0f} | 1.00x |"]
    for impl, r in row["lightzero"].items():
        if "error" in r:
            lines.append(f"| {impl} | - | error: {r['error'][:60]} | - |")
        else:
            lines.append(f"| {impl} | {r['num_params']:,} | {r['samples_per_s']:,.0f} | "
                         f"{r['ratio_ours_over']:.2f}x |")
    return "\n".join(lines)


def e2e_table(result: dict[str, Any]) -> str:
    lines = ["| run | solved (475, 2 consecutive evals) at s | env steps then | "
             "env steps/s (loop) | eval episodes |", "|---|---|---|---|---|"]
    for r in result["ours"]:
        wall = r["solved_wall_s"] if r["solved"] else "not in {:g}s".format(r["wall_s"])
        lines.append(f"| muzero-jax solve.py seed {r['seed']} | {wall} | "
                     f"{r['solved_env_steps'] or r['env_steps']:,} | "
                     f"{r['loop_env_steps_per_s']:,} | 32 |")
    for r in result["lightzero"]:
        two = r["two_consecutive_evals_at_threshold"]
        first = r["first_eval_at_threshold"]
        solved = (f"{two['wall_s']}" if two else f"not in {r['wall_s']:g}s") + (
            f" (first single eval >= 475 at {first['wall_s']} s)" if first else "")
        lines.append(f"| LightZero cartpole_muzero_config seed {r['seed']} | {solved} | "
                     f"{(two or {}).get('env_steps', r['env_steps']):,} | "
                     f"{r['env_steps_per_s']:.1f} | {r['eval_episodes']} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="search,learner,e2e",
                        help="comma-separated subset of search,learner,e2e")
    parser.add_argument("--actions", type=_ints, default=[2, 4, 9])
    parser.add_argument("--batch", type=_ints, default=[1, 16, 256])
    parser.add_argument("--simulations", type=_ints, default=[16, 50])
    parser.add_argument("--rounds", type=int, default=3, help="A B alternations per cell")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per side per round")
    parser.add_argument("--learner-actions", type=int, default=2)
    parser.add_argument("--learner-batch", type=int, default=256)
    parser.add_argument("--learner-unroll", type=int, default=5)
    parser.add_argument("--learner-impls",
                        default="forward_learn,torch_compile,torch_eager,"
                        "forward_learn_lightzero_mlp")
    parser.add_argument("--our-e2e-seconds", type=float, default=120)
    parser.add_argument("--lightzero-e2e-seconds", type=float, default=600)
    parser.add_argument("--e2e-order", default="ABA",
                        help="A = ours, B = LightZero, e.g. ABA or AB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="LightZero's torch intra-op threads (see lightzero_bench.py)")
    parser.add_argument("--lightzero-python", default=LIGHTZERO_PYTHON)
    parser.add_argument("--json", default=None,
                        help="default: benchmarks/results/peers_<UTC date-time>.json")
    args = parser.parse_args(argv)
    parts = [p for p in args.only.split(",") if p]

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_path = args.json or os.path.join(ROOT, "benchmarks", "results", f"peers_{stamp}.json")
    work_dir = os.path.join("/tmp", f"peers_{stamp}")
    os.makedirs(work_dir, exist_ok=True)

    def log(text: str) -> None:
        print(text, flush=True)

    lz = LightZero(args.lightzero_python, os.path.join(work_dir, "lightzero_worker.log"),
                   args.torch_threads, work_dir)
    result: dict[str, Any] = {
        "argv": list(sys.argv[1:] if argv is None else argv),
        "machine": our_info(), "lightzero": lz(bench="info")[0],
        "host": platform.node(), "torch_threads": args.torch_threads,
        "network": {
            "description": "muzero-general fully connected: obs 16 -> 128 -> latent 64, ELU, "
                           "21-bin value and reward heads (hidden 128)",
            "ours_mlp_config": vars(matched_mlp()) | {"value_support_size": SUPPORT_SIZE,
                                                       "reward_support_size": SUPPORT_SIZE},
        },
    }
    log(" | ".join(f"{k}: {v}" for k, v in result["machine"].items()))
    log(f"LightZero: {result['lightzero']['versions']}")

    def save():
        result["load_end"] = load()
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)

    try:
        if "search" in parts:
            cells = [(a, b, n) for a in args.actions for b in args.batch
                     for n in args.simulations]
            result["search"] = run_search(lz, cells, args.rounds, args.repeats, log)
            save()
        if "learner" in parts:
            result["learner"] = run_learner(
                lz, args.learner_actions, args.learner_batch, args.learner_unroll,
                args.rounds, max(args.repeats, 10), args.learner_impls.split(","), log)
            save()
        if "e2e" in parts:
            result["e2e"] = run_e2e(lz, args.our_e2e_seconds, args.lightzero_e2e_seconds,
                                    args.seed, args.e2e_order, work_dir, log)
            log(e2e_table(result["e2e"]))
            save()
    finally:
        lz.close()
    if "search" in result:
        log(search_table(result["search"]))
    if "learner" in result:
        log(learner_table(result["learner"]))
    log(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
