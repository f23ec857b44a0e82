"""Multi-host: two processes x two fake CPU devices on 127.0.0.1 (gloo collectives).

The 4-device global run must keep the parameters identical across processes
and match a single-process run on 4 fake devices with the same seed.
"""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from muzero_jax.distributed import DistributedConfig

TINY = dict(
    num_envs=8, rollout_length=4, batch_size=8, replay_ratio=1 / 32, num_simulations=4,
    replay_capacity=40, min_replay_steps=16, eval_every=0, eval_episodes=4,
)
ITERATIONS = 7

_RUN = textwrap.dedent(
    """
    import json, os, sys
    devices, coordinator, num_processes, process_id = sys.argv[1:5]
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}"
    import jax
    from muzero_jax import distributed
    if coordinator:
        distributed.initialize(distributed.DistributedConfig(
            coordinator=coordinator, num_processes=int(num_processes),
            process_id=int(process_id), timeout_s=60))
    import numpy as np
    from muzero_jax.learning import make_train
    from muzero_jax.presets import preset
    config = preset("catch", **json.loads(sys.argv[5]))
    trainer = make_train(config)
    state = trainer.init(jax.random.key(3))
    losses = []
    for i in range(int(sys.argv[6])):
        state, metrics = trainer.iteration(state)
        losses.append(float(metrics.loss))  # also a sync every iteration
    params = [np.asarray(leaf.addressable_data(0)).ravel().tolist()
              for leaf in jax.tree.leaves(state.params)]
    print("RESULT " + json.dumps({
        "devices": jax.device_count(), "local": jax.local_device_count(),
        "process": jax.process_index(), "losses": losses, "params": params,
        "updates": int(state.counters.updates)}))
    """
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(tmp_path, devices: int, coordinator: str = "", num_processes: int = 0,
           process_id: int = 0) -> tuple[subprocess.Popen, str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # the child appends its device count
    # Files, not pipes: a process blocked on a full pipe would stall its peers.
    out = str(tmp_path / f"out-{devices}-{process_id}.txt")
    err = str(tmp_path / f"err-{devices}-{process_id}.txt")
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUN, str(devices), coordinator, str(num_processes),
             str(process_id), json.dumps(TINY), str(ITERATIONS)],
            stdout=stdout, stderr=stderr, text=True, env=env,
        )
    return proc, out, err


def _result(spawned: tuple[subprocess.Popen, str, str]) -> dict:
    proc, out, err = spawned
    proc.wait(timeout=600)
    with open(out) as f:
        lines = f.read().splitlines()
    with open(err) as f:
        assert proc.returncode == 0, f.read()[-3000:]
    line = next(line for line in lines if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_two_processes_match_one_process_on_four_devices(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = [_spawn(tmp_path, 2, coordinator, 2, i) for i in range(2)]
    try:
        results = [_result(p) for p in procs]
    finally:
        for p, _, _ in procs:
            p.kill()
    single = _result(_spawn(tmp_path, 4))

    assert [r["process"] for r in results] == [0, 1]
    assert all(r["devices"] == 4 and r["local"] == 2 for r in results)
    assert single["devices"] == 4
    assert results[0]["updates"] > 0  # learning happened, so the params moved
    # Replicated parameters stay bit-identical across processes.
    for a, b in zip(results[0]["params"], results[1]["params"]):
        np.testing.assert_array_equal(a, b)
    assert results[0]["losses"] == results[1]["losses"]
    # ... and equal the single-process 4-device run up to float reassociation
    # (gloo and the in-process all-reduce may sum in different orders).
    for a, b in zip(results[0]["params"], single["params"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(results[0]["losses"], single["losses"], rtol=1e-4, atol=1e-6)


def test_unreachable_coordinator_fails_with_a_clear_message():
    code = textwrap.dedent(
        f"""
        from muzero_jax import distributed
        try:
            distributed.initialize(distributed.DistributedConfig(
                coordinator="127.0.0.1:{_free_port()}", num_processes=2, process_id=1,
                timeout_s=3))
        except RuntimeError as e:
            print("ERROR", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert "ERROR could not join the multi-host run at 127.0.0.1:" in out.stdout, out.stderr
    assert "within 3s" in out.stdout


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(coordinator="127.0.0.1:1234"), "needs all of"),
        (dict(coordinator="127.0.0.1:1234", num_processes=2), "needs all of"),
        (dict(coordinator="localhost", num_processes=2, process_id=0), "HOST:PORT"),
        (dict(coordinator="127.0.0.1:99999", num_processes=2, process_id=0), "HOST:PORT"),
        (dict(coordinator="127.0.0.1:1234", num_processes=2, process_id=2), r"\[0, 2\)"),
        (dict(auto=True, num_processes=2), "detects the cluster"),
        (dict(timeout_s=0), "timeout_s"),
    ],
)
def test_inconsistent_multihost_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedConfig(**kwargs)


def test_single_process_is_the_default():
    assert not DistributedConfig().enabled
    assert DistributedConfig(coordinator="127.0.0.1:1234", num_processes=2, process_id=0).enabled


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--coordinator", "127.0.0.1:1234"], "needs all of"),
        (["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "5"],
         r"\[0, 2\)"),
        (["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "0"],
         "needs --logdir"),
    ],
)
def test_cli_rejects_inconsistent_multihost_flags(flags, message, capsys):
    from muzero_jax import cli

    assert cli.main(["train", "--env", "catch", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


_SAME_UPDATE = textwrap.dedent(
    """
    import functools, json
    import jax, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from muzero_jax.bench.cli import _random_batch
    from muzero_jax.envs import make_env
    from muzero_jax.learning import AXIS, make_learner_step, make_optimizer
    from muzero_jax.loss import unrolled_loss
    from muzero_jax.networks import make_networks
    from muzero_jax.presets import preset
    from muzero_jax.value_transforms import make_support

    config = preset("catch", num_unroll_steps=3, max_grad_norm=0.0, optimizer="sgd",
                    learning_rate=0.1, lr_warmup_updates=0, weight_decay=0.0)
    env = make_env("catch")
    vs, rs = make_support(config.value_support_size), make_support(config.reward_support_size)
    nets = make_networks(config.mlp, num_actions=env.num_actions, value_bins=vs.num_bins,
                         reward_bins=rs.num_bins)
    rng = np.random.default_rng(0)
    batch = _random_batch(rng, env.observation_shape, env.num_actions, 32, 3)
    batch = batch._replace(importance_weight=rng.uniform(0.2, 1.0, 32).astype(np.float32))
    optimizer, _ = make_optimizer(config)
    params = nets.init(jax.random.key(0), batch.observation[:1])
    opt_state = optimizer.init(params)
    loss = functools.partial(unrolled_loss, networks=nets, value_support=vs,
                             reward_support=rs, value_loss_weight=config.value_loss_weight)
    step = make_learner_step(loss, optimizer)
    out = {}
    for d in (1, 4):
        mesh = Mesh(np.asarray(jax.devices()[:d]), (AXIS,))
        run = jax.jit(jax.shard_map(
            lambda p, o, b: step(p, o, b)[:3], mesh=mesh,
            in_specs=(P(), P(), P(AXIS)), out_specs=(P(), P(), P()), check_vma=False))
        p, o = params, opt_state
        for _ in range(3):  # Adam's state makes later steps depend on earlier ones
            p, o, norm = run(p, o, batch)
        out[d] = dict(params=[np.asarray(x).ravel().tolist() for x in jax.tree.leaves(p)],
                      norm=float(norm))
    out["moved"] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                       for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(p)))
    print("RESULT " + json.dumps(out))
    """
)


def _run_on_four_devices(code: str, timeout: int) -> dict:
    """Runs `code` in a child with 4 fake CPU devices; returns its `RESULT {json}` line."""
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    env = dict(os.environ, XLA_FLAGS=flags,
               JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_four_devices_take_the_same_learner_step_as_one():
    out = _run_on_four_devices(_SAME_UPDATE, timeout=600)
    assert out["moved"] > 1e-4  # the steps changed the parameters
    for a, b in zip(out["1"]["params"], out["4"]["params"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert out["1"]["norm"] == pytest.approx(out["4"]["norm"], rel=1e-4)


_LEARN_4 = textwrap.dedent(
    """
    import json
    import jax, numpy as np
    from muzero_jax.presets import preset
    from muzero_jax.train import train
    config = preset("catch", seed=0, num_devices=4, eval_every=0, max_env_steps=64_000,
                    eval_episodes=64)
    result = train(config)  # blocks on every iteration's metrics (fake-device trap)
    returns = np.asarray(result.trainer.evaluate(result.state.params, jax.random.key(123)))
    print("RESULT " + json.dumps(dict(devices=int(result.trainer.mesh.devices.size),
                                      eval=float(returns.mean()))))
    """
)


@pytest.mark.slow
def test_catch_learns_on_four_fake_devices():
    out = _run_on_four_devices(_LEARN_4, timeout=1200)
    assert out["devices"] == 4
    assert out["eval"] > 0.5, out  # random play scores about -0.6


def _cli_processes(tmp_path, name: str, args: list[str]) -> list[str]:
    port = _free_port()
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    env = dict(os.environ, XLA_FLAGS=flags,
               JAX_PLATFORMS="cpu")
    procs, logs = [], []
    for i in range(2):
        log = tmp_path / f"{name}-{i}.log"
        with open(log, "w") as f:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "muzero_jax.cli", "train", *args, "--progress", "lines",
                 "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                 "--process-id", str(i)], stdout=f, stderr=subprocess.STDOUT, env=env))
        logs.append(log)
    for p, log in zip(procs, logs):
        assert p.wait(timeout=900) == 0, log.read_text()[-3000:]
    return [log.read_text() for log in logs]


@pytest.mark.slow
def test_multihost_cli_checkpoints_and_resumes(tmp_path):
    run = tmp_path / "run"
    flags = ["--env", "catch", "--num-envs", "8", "--rollout-length", "4", "--batch-size", "8",
             "--replay-ratio", "0.03125", "--num-simulations", "4", "--replay-capacity", "40",
             "--min-replay-steps", "16", "--eval-every", "2", "--eval-episodes", "4",
             "--checkpoint-every", "2", "--max-iterations", "4", "--logdir", str(run)]
    _cli_processes(tmp_path, "first", flags)
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]
    _cli_processes(tmp_path, "resume", ["--resume", str(run), "--max-iterations", "6"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]  # one writer: process 0
