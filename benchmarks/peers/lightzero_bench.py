"""LightZero's side of the peer benchmark (runs in benchmarks/peers/.venv-lightzero).

Three measurements, each printed as one JSON object per line on stdout:

* search: simulations/s of LightZero's C++ ``ctree`` MuZero MCTS
  (``lzero.mcts.MuZeroMCTSCtree``), network inference included the way
  LightZero's ``_forward_collect`` runs it: the torch model on CPU in eval
  mode under ``no_grad``, root inference, Dirichlet noise, ``Roots.prepare``,
  ``N`` simulations of ``batch_traverse`` / ``recurrent_inference`` /
  ``batch_backpropagate``, then the root visit distributions;
* learner: samples/s (a sample = one sequence of K unroll steps) of
  ``MuZeroPolicy._forward_learn`` on a synthetic batch, and of a plain torch
  learner step on the same network, eager and under ``torch.compile``;
* e2e: LightZero's own CartPole MuZero config (the wheel's
  ``zoo/classic_control/cartpole/config/cartpole_muzero_config.py``, on
  CartPole-v1 so that returns can reach 475, CPU) for a bounded wall time,
  logging collected environment steps and greedy evaluation returns with time.

The network (``FCNet``) is muzero-general's fully connected MuZero network:
representation obs -> 128 -> latent 64, dynamics (latent + one-hot action) ->
128 -> latent 64, reward head latent -> 128 -> 21 bins, prediction heads
latent -> 128 -> A (policy) and latent -> 128 -> 21 bins (value), ELU between
layers, latent states min-max scaled to [0, 1]. It exposes the interface
LightZero's MCTS and policy call (``initial_inference`` /
``recurrent_inference`` returning ``MZNetworkOutput``), so LightZero's own
search and learner code runs on it unchanged. ``--model lightzero_mlp``
swaps in LightZero's ``MuZeroModelMLP`` at latent 64 with 128-wide heads, for
reference.

Usage (one-shot, JSON lines on stdout)::

    python lightzero_bench.py search --actions 2,4,9 --batch 1,16,256 --simulations 16,50
    python lightzero_bench.py learner --batch-size 256 --unroll-steps 5
    python lightzero_bench.py e2e --e2e-seconds 600

``serve`` reads one JSON request per line on stdin and answers one JSON line
per request (``compare.py`` drives it, so that the two sides can alternate
cell by cell without paying torch's import each time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

# The benchmark's own answers go to the real stdout; everything LightZero and
# DI-engine print goes to stderr, so that `serve` speaks clean JSON lines.
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

OBS = 16
HIDDEN = 128
LATENT = 64
SUPPORT_SCALE = 10  # 2 * 10 + 1 = 21 bins, value and reward
DISCOUNT = 0.997


def set_threads(n: int) -> None:
    """torch intra-op threads. Default 1: on the shared 2-core machine, 2 OpenMP
    threads contend with other processes and made the same search 5-30x slower
    (A=9, B=256, N=50: 2.2k-8.9k simulations/s with 2 threads, 45k-76k with 1)."""
    torch.set_num_threads(n)


set_threads(int(os.environ.get("LIGHTZERO_BENCH_THREADS", "1")))


def emit(obj: dict[str, Any]) -> None:
    _OUT.write(json.dumps(obj) + "\n")
    _OUT.flush()


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def versions() -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "LightZero": version("LightZero"),
        "DI-engine": version("DI-engine"),
        "numpy": np.__version__,
    }


# ----------------------------------------------------------------------------
# The network.
# ----------------------------------------------------------------------------


def _two_layer(n_in: int, n_out: int, zero_last: bool = False) -> nn.Sequential:
    last = nn.Linear(HIDDEN, n_out)
    if zero_last:
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
    return nn.Sequential(nn.Linear(n_in, HIDDEN), nn.ELU(), last)


def _scale(latent: torch.Tensor) -> torch.Tensor:
    low = latent.min(dim=1, keepdim=True).values
    high = latent.max(dim=1, keepdim=True).values
    return (latent - low) / torch.clamp(high - low, min=1e-5)


class FCNet(nn.Module):
    """muzero-general's fully connected MuZero network (see the module doc)."""

    def __init__(self, num_actions: int, bins: int = 2 * SUPPORT_SCALE + 1):
        super().__init__()
        self.action_space_size = num_actions
        self.representation = _two_layer(OBS, LATENT)
        self.dynamics_state = _two_layer(LATENT + num_actions, LATENT)
        self.dynamics_reward = _two_layer(LATENT, bins, zero_last=True)
        self.prediction_policy = _two_layer(LATENT, num_actions, zero_last=True)
        self.prediction_value = _two_layer(LATENT, bins, zero_last=True)

    def _predict(self, latent):
        return self.prediction_policy(latent), self.prediction_value(latent)

    def initial_inference(self, obs: torch.Tensor):
        from lzero.model.common import MZNetworkOutput

        latent = _scale(self.representation(obs))
        policy, value = self._predict(latent)
        return MZNetworkOutput(value, [0.0] * obs.shape[0], policy, latent)

    def recurrent_inference(self, latent: torch.Tensor, action: torch.Tensor):
        from lzero.model.common import MZNetworkOutput

        one_hot = nn.functional.one_hot(action.reshape(-1).long(), self.action_space_size)
        x = torch.cat([latent, one_hot.to(latent.dtype)], dim=1)
        nxt = self.dynamics_state(x)
        reward = self.dynamics_reward(nxt)
        nxt = _scale(nxt)
        policy, value = self._predict(nxt)
        return MZNetworkOutput(value, reward, policy, nxt)


def make_model(kind: str, num_actions: int) -> nn.Module:
    if kind == "fc":
        return FCNet(num_actions)
    if kind == "lightzero_mlp":
        from lzero.model.muzero_model_mlp import MuZeroModelMLP

        return MuZeroModelMLP(
            observation_shape=OBS, action_space_size=num_actions, latent_state_dim=LATENT,
            reward_head_hidden_channels=[HIDDEN], value_head_hidden_channels=[HIDDEN],
            policy_head_hidden_channels=[HIDDEN], reward_support_size=2 * SUPPORT_SCALE + 1,
            value_support_size=2 * SUPPORT_SCALE + 1, self_supervised_learning_loss=False,
            norm_type="BN",
        )
    raise ValueError(f"unknown model {kind!r}")


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------
# Search.
# ----------------------------------------------------------------------------


def search_cell(actions: int, batch: int, simulations: int, repeats: int, seed: int = 0,
                model_kind: str = "fc") -> dict[str, Any]:
    from easydict import EasyDict
    from lzero.mcts import MuZeroMCTSCtree
    from lzero.policy import InverseScalarTransform

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = make_model(model_kind, actions).eval()
    cfg = EasyDict(dict(
        num_simulations=simulations, discount_factor=DISCOUNT, device="cpu",
        model=EasyDict(support_scale=SUPPORT_SCALE, categorical_distribution=True),
        pb_c_base=19652, pb_c_init=1.25, root_dirichlet_alpha=0.3, root_noise_weight=0.25,
        value_delta_max=0.01, env_type="not_board_games",
    ))
    mcts = MuZeroMCTSCtree(cfg)
    inverse = InverseScalarTransform(SUPPORT_SCALE, "cpu", True)
    obs = torch.from_numpy(rng.standard_normal((batch, OBS)).astype(np.float32))
    legal = [list(range(actions)) for _ in range(batch)]
    to_play = [-1] * batch

    def act():
        # As MuZeroPolicy._forward_collect does it (minus the per-env dict).
        with torch.no_grad():
            out = model.initial_inference(obs)
            latent = out.latent_state.detach().cpu().numpy()
            _ = inverse(out.value).detach().cpu().numpy()
            logits = out.policy_logits.detach().cpu().numpy().tolist()
            noises = [np.random.dirichlet([0.3] * actions).astype(np.float32).tolist()
                      for _ in range(batch)]
            roots = MuZeroMCTSCtree.roots(batch, legal)
            roots.prepare(0.25, noises, [0.0] * batch, logits, to_play)
            mcts.search(roots, model, latent, to_play)
            return roots.get_distributions()

    act()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        act()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {
        "side": "lightzero", "bench": "search", "impl": "lightzero_ctree_muzero",
        "model": model_kind, "num_params": num_params(model), "actions": actions,
        "batch": batch, "simulations": simulations, "repeats": repeats,
        "median_s": med, "min_s": min(times), "max_s": max(times),
        "sims_per_s": batch * simulations / med, "load": load(),
    }


# ----------------------------------------------------------------------------
# Learner.
# ----------------------------------------------------------------------------


def _policy_config(actions: int, batch: int, k: int):
    from lzero.policy.muzero import MuZeroPolicy

    cfg = MuZeroPolicy.default_config()
    cfg.model.update(dict(
        observation_shape=OBS, action_space_size=actions, model_type="mlp",
        support_scale=SUPPORT_SCALE, categorical_distribution=True,
        self_supervised_learning_loss=False, frame_stack_num=1,
    ))
    cfg.update(dict(
        cuda=False, device="cpu", multi_gpu=False, batch_size=batch, num_unroll_steps=k,
        optim_type="Adam", learning_rate=3e-3, piecewise_decay_lr_scheduler=False,
        use_augmentation=False, ssl_loss_weight=0, use_priority=True, on_policy=False,
        use_wandb=False,
    ))
    return cfg


def synthetic_learn_batch(actions: int, batch: int, k: int, seed: int = 0):
    """A `_forward_learn` batch: ([obs, action, mask, indices, weights, make_time],
    [target_reward, target_value, target_policy]), as MuZeroGameBuffer.sample returns."""
    rng = np.random.default_rng(seed)
    policy = rng.random((batch, k + 1, actions)).astype(np.float32)
    policy /= policy.sum(-1, keepdims=True)
    current = [
        rng.standard_normal((batch, OBS * (k + 1))).astype(np.float32),
        rng.integers(0, actions, (batch, k)),
        np.ones((batch, k + 1), np.float32),
        list(range(batch)),
        np.ones((batch,), np.float32),
        [0.0] * batch,
    ]
    target = [
        rng.standard_normal((batch, k)).astype(np.float32),
        rng.standard_normal((batch, k + 1)).astype(np.float32),
        policy,
    ]
    return current, target


def _time(fn, repeats: int, warmup: int = 2) -> tuple[list[float], float]:
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times, first


def _learner_row(impl: str, model, batch, k, actions, times, first) -> dict[str, Any]:
    med = statistics.median(times)
    return {
        "side": "lightzero", "bench": "learner", "impl": impl, "num_params": num_params(model),
        "actions": actions, "batch_size": batch, "unroll_steps": k, "repeats": len(times),
        "median_s": med, "min_s": min(times), "max_s": max(times),
        "samples_per_s": batch / med, "samples_per_s_min": batch / max(times),
        "samples_per_s_max": batch / min(times), "warmup_s": first, "load": load(),
    }


# Learner set-ups are built once per process and re-timed on later requests
# (`serve` alternates rounds with our side; torch.compile takes ~100 s here).
_SETUPS: dict[tuple, tuple] = {}


def learner_forward_learn(actions: int, batch: int, k: int, repeats: int,
                          model_kind: str = "fc") -> dict[str, Any]:
    """LightZero's `MuZeroPolicy._forward_learn` on the same network."""
    from lzero.policy.muzero import MuZeroPolicy

    key = ("forward_learn", model_kind, actions, batch, k)
    if key not in _SETUPS:
        torch.manual_seed(0)
        model = make_model(model_kind, actions)
        policy = MuZeroPolicy(_policy_config(actions, batch, k), model=model,
                              enable_field=["learn"])
        # Set by _init_collect, which this learner-only policy skips; read for logging.
        policy._collect_mcts_temperature = 1.0
        policy.collect_epsilon = 0.0
        data = synthetic_learn_batch(actions, batch, k)
        _SETUPS[key] = (model, lambda: policy._forward_learn(data))
    model, fn = _SETUPS[key]
    times, first = _time(fn, repeats)
    return _learner_row(f"lightzero_forward_learn[{model_kind}]", model, batch, k, actions,
                        times, first)


def _support_targets(x: torch.Tensor) -> torch.Tensor:
    """h-transform then two-hot over 21 bins (what MuZero's categorical targets are)."""
    eps = 1e-3
    x = torch.sign(x) * (torch.sqrt(torch.abs(x) + 1) - 1) + eps * x
    x = torch.clamp(x, -SUPPORT_SCALE, SUPPORT_SCALE)
    low = torch.floor(x)
    frac = x - low
    idx = (low + SUPPORT_SCALE).long()
    out = torch.zeros(*x.shape, 2 * SUPPORT_SCALE + 1)
    out.scatter_(-1, idx.unsqueeze(-1), (1 - frac).unsqueeze(-1))
    out.scatter_add_(-1, torch.clamp(idx + 1, max=2 * SUPPORT_SCALE).unsqueeze(-1),
                     frac.unsqueeze(-1))
    return out


def _make_plain_step(model: FCNet, k: int, compiled: bool):
    """A hand-written torch learner step: the unrolled MuZero loss (value, reward,
    policy cross-entropies, 0.5 gradient scale on the latent, 1/K on the unrolled
    steps), backward, gradient clipping, Adam."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)

    def ce(logits, target):
        return -(target * torch.log_softmax(logits, -1)).sum(-1)

    def loss_fn(obs, actions, target_value, target_reward, target_policy):
        out = model.initial_inference(obs)
        latent = out.latent_state
        loss = 0.25 * ce(out.value, target_value[:, 0]) + ce(out.policy_logits, target_policy[:, 0])
        for step in range(k):
            out = model.recurrent_inference(latent, actions[:, step])
            latent = out.latent_state
            step_loss = (0.25 * ce(out.value, target_value[:, step + 1])
                         + ce(out.reward, target_reward[:, step])
                         + ce(out.policy_logits, target_policy[:, step + 1]))
            # scale_gradient(x, s) = s * x + (1 - s) * stop_gradient(x)
            step_loss = step_loss / k + (1 - 1 / k) * step_loss.detach()
            loss = loss + step_loss
            latent = 0.5 * latent + 0.5 * latent.detach()
        return loss.mean()

    if compiled:
        loss_fn = torch.compile(loss_fn)

    def step(data):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(*data)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        return loss

    return step


def learner_plain(actions: int, batch: int, k: int, repeats: int, compiled: bool) -> dict[str, Any]:
    key = ("plain", compiled, actions, batch, k)
    if key not in _SETUPS:
        torch.manual_seed(0)
        model = FCNet(actions)
        rng = np.random.default_rng(0)
        policy = torch.from_numpy(rng.random((batch, k + 1, actions)).astype(np.float32))
        data = (
            torch.from_numpy(rng.standard_normal((batch, OBS)).astype(np.float32)),
            torch.from_numpy(rng.integers(0, actions, (batch, k))),
            _support_targets(
                torch.from_numpy(rng.standard_normal((batch, k + 1)).astype(np.float32))),
            _support_targets(torch.from_numpy(rng.standard_normal((batch, k)).astype(np.float32))),
            policy / policy.sum(-1, keepdim=True),
        )
        step = _make_plain_step(model, k, compiled)
        _SETUPS[key] = (model, lambda: step(data))
    model, fn = _SETUPS[key]
    times, first = _time(fn, repeats, warmup=3 if compiled else 2)
    impl = "torch_compile_learner" if compiled else "torch_eager_learner"
    return _learner_row(impl, model, batch, k, actions, times, first)


# ----------------------------------------------------------------------------
# End to end: LightZero's own CartPole MuZero config.
# ----------------------------------------------------------------------------


class _OutOfTime(Exception):
    pass


def e2e(seconds: float, seed: int = 0, env_id: str = "CartPole-v1", exp_dir: str | None = None,
        threshold: float = 475.0) -> dict[str, Any]:
    """Trains with LightZero's CartPole MuZero config for `seconds` of wall time."""
    import tensorboardX
    from lzero.entry import train_muzero
    from lzero.worker import MuZeroCollector
    from zoo.classic_control.cartpole.config import cartpole_muzero_config as mod

    main_config, create_config = mod.main_config, mod.create_config
    main_config.env.env_id = env_id
    # Never stop on LightZero's own rule (one 3-episode evaluation >= stop_value):
    # we record every evaluation and apply ours afterwards.
    main_config.env.stop_value = int(1e9)
    main_config.policy.cuda = False
    # DI-engine writes its logs and checkpoints under ./<exp_name> (relative).
    exp_dir = exp_dir or f"lightzero_e2e_{os.getpid()}"
    main_config.exp_name = os.path.join(exp_dir, "cartpole_muzero")

    start = time.perf_counter()
    collects: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    original_collect = MuZeroCollector.collect

    def collect(self, *args, **kwargs):
        if time.perf_counter() - start > seconds:
            raise _OutOfTime
        out = original_collect(self, *args, **kwargs)
        collects.append({"wall_s": round(time.perf_counter() - start, 2),
                         "env_steps": int(self.envstep)})
        return out

    original_add_scalar = tensorboardX.SummaryWriter.add_scalar

    def add_scalar(self, tag, value, step=None, *args, **kwargs):
        if tag == "evaluator_step/reward_mean":
            evals.append({"wall_s": round(time.perf_counter() - start, 2),
                          "env_steps": int(step), "return": float(value)})
            print(f"[lightzero e2e] eval at {evals[-1]['wall_s']} s, "
                  f"{step} env steps: {float(value):.1f}", flush=True)
        return original_add_scalar(self, tag, value, step, *args, **kwargs)

    MuZeroCollector.collect = collect
    tensorboardX.SummaryWriter.add_scalar = add_scalar
    error = None
    try:
        train_muzero([main_config, create_config], seed=seed, max_env_step=int(1e9))
    except _OutOfTime:
        pass
    except Exception as e:  # report what happened, with what was measured so far
        error = f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - start
    first_hit = next((e for e in evals if e["return"] >= threshold), None)
    two = next((evals[i] for i in range(1, len(evals))
                if evals[i - 1]["return"] >= threshold and evals[i]["return"] >= threshold), None)
    steps = collects[-1]["env_steps"] if collects else 0
    return {
        "side": "lightzero", "bench": "e2e", "impl": "lightzero_cartpole_muzero_config",
        "env_id": env_id, "seed": seed, "budget_s": seconds, "wall_s": round(wall, 1),
        "env_steps": steps, "env_steps_per_s": steps / wall if wall else None,
        # Throughput after the first collect (which carries start-up costs).
        "loop_env_steps_per_s": (
            (collects[-1]["env_steps"] - collects[0]["env_steps"])
            / (collects[-1]["wall_s"] - collects[0]["wall_s"])
            if len(collects) > 1 and collects[-1]["wall_s"] > collects[0]["wall_s"] else None),
        "eval_episodes": int(main_config.env.n_evaluator_episode),
        "num_simulations": int(main_config.policy.num_simulations),
        "threshold": threshold, "first_eval_at_threshold": first_hit,
        "two_consecutive_evals_at_threshold": two,
        "best_eval": max(evals, key=lambda e: e["return"]) if evals else None,
        "evals": evals, "collects": collects, "error": error, "load": load(),
        "config": {k: v for k, v in main_config.policy.items()
                   if isinstance(v, int | float | str | bool)},
    }


# ----------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def handle(request: dict[str, Any]) -> list[dict[str, Any]]:
    what = request["bench"]
    if what == "info":
        return [{"side": "lightzero", "bench": "info", "versions": versions(),
                 "num_params": {kind: {a: num_params(make_model(kind, a)) for a in (2, 4, 9)}
                                for kind in ("fc", "lightzero_mlp")},
                 "load": load()}]
    if what == "search":
        return [search_cell(request["actions"], request["batch"], request["simulations"],
                            request.get("repeats", 10), request.get("seed", 0),
                            request.get("model", "fc"))]
    if what == "learner":
        a, b, k = request.get("actions", 2), request["batch_size"], request["unroll_steps"]
        reps = request.get("repeats", 10)
        rows = []
        for impl in request.get("impls", ["forward_learn", "torch_eager", "torch_compile"]):
            if impl == "forward_learn":
                rows.append(learner_forward_learn(a, b, k, reps, request.get("model", "fc")))
            elif impl == "forward_learn_lightzero_mlp":
                rows.append(learner_forward_learn(a, b, k, reps, "lightzero_mlp"))
            elif impl in ("torch_eager", "torch_compile"):
                try:
                    rows.append(learner_plain(a, b, k, reps, impl == "torch_compile"))
                except Exception as e:  # torch.compile needs a working C++ toolchain
                    rows.append({"side": "lightzero", "bench": "learner", "impl": impl,
                                 "error": f"{type(e).__name__}: {e}"[:500]})
        return rows
    if what == "e2e":
        return [e2e(request["seconds"], request.get("seed", 0),
                    request.get("env_id", "CartPole-v1"), request.get("exp_dir"))]
    raise ValueError(f"unknown bench {what!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search")
    s.add_argument("--actions", type=_ints, default=[2, 4, 9])
    s.add_argument("--batch", type=_ints, default=[1, 16, 256])
    s.add_argument("--simulations", type=_ints, default=[16, 50])
    s.add_argument("--repeats", type=int, default=10)
    s.add_argument("--model", default="fc", choices=["fc", "lightzero_mlp"])
    learn = sub.add_parser("learner")
    learn.add_argument("--actions", type=int, default=2)
    learn.add_argument("--batch-size", type=int, default=256)
    learn.add_argument("--unroll-steps", type=int, default=5)
    learn.add_argument("--repeats", type=int, default=20)
    learn.add_argument("--impls", default="forward_learn,forward_learn_lightzero_mlp,"
                       "torch_eager,torch_compile")
    e = sub.add_parser("e2e")
    e.add_argument("--e2e-seconds", type=float, default=600)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--env-id", default="CartPole-v1")
    sub.add_parser("info")
    sub.add_parser("serve", help="JSON requests on stdin, one JSON answer line each")
    args = parser.parse_args(argv)

    if args.cmd == "serve":
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                for row in handle(json.loads(line)):
                    emit(row)
                emit({"done": True})
            except Exception as e:
                emit({"error": f"{type(e).__name__}: {e}", "done": True})
        return 0
    if args.cmd == "info":
        rows = handle({"bench": "info"})
    elif args.cmd == "search":
        rows = []
        for a in args.actions:
            for b in args.batch:
                for n in args.simulations:
                    rows += handle({"bench": "search", "actions": a, "batch": b, "simulations": n,
                                    "repeats": args.repeats, "model": args.model})
                    emit(rows[-1])
        return 0
    elif args.cmd == "learner":
        rows = handle({"bench": "learner", "actions": args.actions, "batch_size": args.batch_size,
                       "unroll_steps": args.unroll_steps, "repeats": args.repeats,
                       "impls": args.impls.split(",")})
    else:
        rows = handle({"bench": "e2e", "seconds": args.e2e_seconds, "seed": args.seed,
                       "env_id": args.env_id})
    for row in rows:
        emit(row)
    return 0


if __name__ == "__main__":
    code = main()
    _OUT.flush()
    # DI-engine's env managers leave worker processes and threads behind.
    os._exit(code)
