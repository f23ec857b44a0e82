"""`muzero-jax bench`: the commands run, count the right work and write their JSON."""

import json
import sys

import pytest

from muzero_jax import cli
from muzero_jax.bench import cli as bench


def test_unroll_rows_and_json(tmp_path, capsys):
    out = tmp_path / "unroll.json"
    code = cli.main(["bench", "unroll", "--network", "mlp", "--unroll-steps", "2",
                     "--batch-sizes", "8", "--repeats", "2", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["machine"]["jax"] and data["machine"]["device"]
    (row,) = data["rows"]
    assert (row["network"], row["unroll_steps"], row["batch_size"], row["repeats"]) == (
        "mlp", 2, 8, 2)
    # A sample is one sequence in the batch: samples/s = batch / median step time.
    assert row["samples_per_s"] == pytest.approx(8 / row["step_median_s"])
    assert row["samples_per_s_min"] <= row["samples_per_s"] <= row["samples_per_s_max"]
    assert row["flops_per_step"] > 0 and row["num_params"] > 0
    # No peak FLOP/s is known for a CPU, so there is no MFU unless one is given.
    assert row["device_kind"] == "cpu" and row["peak_flops_per_s"] is None
    assert row["mfu"] is None
    assert row["model_flops_per_s"] == pytest.approx(
        row["model_flops_per_step"] / row["step_median_s"])
    assert "samples_per_s" in capsys.readouterr().out


def test_unroll_mfu_against_a_given_peak(tmp_path):
    out = tmp_path / "unroll.json"
    assert bench.main(["unroll", "--network", "mlp", "--unroll-steps", "1", "--batch-sizes",
                       "8", "--repeats", "1", "--peak-tflops", "0.5", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["peak_flops_per_s"] == 0.5e12
    assert row["mfu"] == pytest.approx(row["model_flops_per_step"] / row["step_median_s"] / 0.5e12)


def test_unroll_mfu_uses_each_dtypes_peak(tmp_path, monkeypatch):
    """Each row's MFU is against the listed peak of its own compute dtype."""
    from muzero_jax.bench import flops

    monkeypatch.setattr(flops, "_PEAKS", {"float32": (("cpu", 1.0),), "bfloat16": (("cpu", 2.0),)})
    out = tmp_path / "unroll.json"
    assert bench.main(["unroll", "--network", "mlp", "--unroll-steps", "1", "--batch-sizes", "8",
                       "--repeats", "1", "--compute-dtypes", "float32,bfloat16",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["peak_flops_per_s"] for r in rows] == [1e12, 2e12]
    for r in rows:
        assert r["mfu"] == pytest.approx(r["model_flops_per_s"] / r["peak_flops_per_s"])


def test_unroll_updates_per_call_scans_the_steps(tmp_path):
    rows = {}
    for updates in (1, 3):
        out = tmp_path / f"unroll_{updates}.json"
        assert bench.main(["unroll", "--network", "resnet", "--unroll-steps", "1",
                           "--batch-sizes", "4", "--repeats", "1", "--updates-per-call",
                           str(updates), "--json", str(out)]) == 0
        (rows[updates],) = json.loads(out.read_text())["rows"]
    row = rows[3]
    assert row["updates_per_call"] == 3
    # Per-step figures stay per step: XLA's cost analysis counts the scan's
    # body once, and the own matmul count is of one step.
    assert row["flops_per_step"] == pytest.approx(rows[1]["flops_per_step"], rel=1e-3)
    assert row["model_flops_per_step"] == rows[1]["model_flops_per_step"]
    # Three steps of 4 samples per timed call: step time is a third of the call's.
    assert row["samples_per_s"] == pytest.approx(4 / row["step_median_s"])
    assert row["model_flops_per_s"] == pytest.approx(
        row["model_flops_per_step"] / row["step_median_s"])


def test_repeat_update_runs_the_step_that_many_times():
    import jax
    import jax.numpy as jnp

    from muzero_jax.bench.cli import repeat_update

    def step(params, opt_state, data):  # params += data; opt_state counts calls
        return params + data, opt_state + 1

    for updates in (1, 3, 5):
        params, count = jax.jit(repeat_update(step, updates))(
            jnp.float32(1.0), jnp.int32(0), jnp.float32(2.0))
        assert int(count) == updates
        assert float(params) == 1.0 + 2.0 * updates


def test_matmul_flops_hand_counted():
    import jax
    import jax.numpy as jnp

    from muzero_jax.bench.flops import matmul_flops, peak_flops

    x, w = jnp.ones((4, 8)), jnp.ones((8, 16))
    dense = 2 * 4 * 8 * 16
    assert matmul_flops(lambda x, w: jnp.tanh(x @ w), x, w) == dense
    # Gradient with respect to the weights only: forward + dW (no dx).
    assert matmul_flops(jax.grad(lambda w: jnp.sum(x @ w)), w) == 2 * dense

    def unrolled(c, v):  # a scan body runs `length` times
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ v), None), c, None, length=3)[0].sum()

    v, step = jnp.ones((8, 8)), 2 * 4 * 8 * 8
    assert matmul_flops(unrolled, x, v) == 3 * step
    # Backward: dV and d(carry) per step, so 3 products per step in all.
    assert matmul_flops(jax.grad(unrolled, argnums=1), x, v) == 9 * step
    # A 3x3 convolution, 2 -> 5 channels, 'SAME' on 6x7: 2 * out size * (2 * 3 * 3).
    image, kernel = jnp.ones((1, 6, 7, 2)), jnp.ones((3, 3, 2, 5))
    conv = lambda a, k: jax.lax.conv_general_dilated(  # noqa: E731
        a, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert matmul_flops(conv, image, kernel) == 2 * (6 * 7 * 5) * (2 * 3 * 3)
    # Of a cond, the costliest branch; nested jits are walked into.
    branchy = jax.jit(lambda p, x: jax.lax.cond(p, lambda: x @ w @ w.T, lambda: 2 * x))
    assert matmul_flops(branchy, True, x) == dense + 2 * 4 * 16 * 8
    assert peak_flops("NVIDIA H100 80GB HBM3") == 494.7e12
    assert peak_flops("NVIDIA H100 PCIe") == 378e12 and peak_flops("cpu") is None
    # bfloat16 runs at twice TF32's rate on NVIDIA; a TPU's listed peak is bf16 already.
    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "bfloat16") == 2 * peak_flops("NVIDIA A100")
    assert peak_flops("TPU v4", "bfloat16") == peak_flops("TPU v4") == 275e12
    assert peak_flops("cpu", "bfloat16") is None
    with pytest.raises(ValueError, match="no peak table for dtype 'float16'"):
        peak_flops("NVIDIA H100", "float16")


def test_learner_step_flops_grow_linearly_with_the_unroll():
    """The count covers every unroll step (XLA's cost analysis counts a loop once)."""
    import jax
    import numpy as np

    from muzero_jax.bench.cli import _random_batch
    from muzero_jax.bench.flops import matmul_flops
    from muzero_jax.loss import unrolled_loss
    from muzero_jax.networks import MLPConfig, make_networks
    from muzero_jax.value_transforms import make_support

    vs, rs = make_support(5), make_support(5)
    nets = make_networks(MLPConfig(), num_actions=3, value_bins=vs.num_bins,
                         reward_bins=rs.num_bins)
    counts = []
    for k in (1, 2, 3):
        data = _random_batch(np.random.default_rng(0), (10, 5), 3, 16, k)
        params = nets.init(jax.random.key(0), data.observation[:1])
        grad = jax.grad(lambda p, d: unrolled_loss(p, d, networks=nets, value_support=vs,
                                                   reward_support=rs)[0])
        counts.append(matmul_flops(grad, params, data))
    assert counts[0] > 0 and counts[2] - counts[1] == counts[1] - counts[0] > 0


def test_e2e_counts_environment_steps(tmp_path, monkeypatch, console):
    # With no one reading the console (`... | head -0`): the rows reach the file all the same.
    console.reader_gone = True
    monkeypatch.setattr(sys, "stdout", console)
    out = tmp_path / "e2e.json"
    tiny = dict(num_envs=8, rollout_length=10, batch_size=8, replay_ratio=1 / 80,
                num_simulations=4, replay_capacity=40, min_replay_steps=16, reanalyse_rows=5)
    code = bench.main(["e2e", "--envs", "catch", "--iterations", "2", "--set", json.dumps(tiny),
                       "--json", str(out), "--solve-seeds", "3", "--max-seconds", "0.5"])
    assert code == 0
    row, solve = json.loads(out.read_text())["rows"]
    # The time-to-threshold row: seed 3, stopped by the budget after one
    # iteration (which compiles), before the two evaluations "solved" needs
    # and before learning starts (16 rows per environment).
    assert solve["kind"] == "time_to_threshold" and solve["seed"] == 3
    assert solve["threshold"] == 0.95 and not solve["solved"]
    assert solve["env_steps"] == 80 and solve["updates"] == 0
    # 8 envs x 10 steps per iteration; 1 update of batch 8 per iteration.
    assert row["env_steps_per_s"] == pytest.approx(80 / row["iteration_median_s"])
    assert row["learner_samples_per_s"] == pytest.approx(row["env_steps_per_s"] * 8 / 80)
    assert row["num_devices"] == 1 and row["updates_per_iteration"] == 1
    # 4 simulations per env step. A Catch episode is 9 steps plus the step
    # that starts the next one, so every env ends exactly one game in each
    # 10-step iteration: 8 x 2 games in the 2 timed iterations.
    assert row["search_simulations_per_s"] == pytest.approx(row["env_steps_per_s"] * 4)
    # Reanalyse: 5 rows of each of the 8 envs per 80-step iteration, 4 simulations each.
    assert row["reanalyse_rows"] == 5
    assert row["reanalyse_simulations_per_s"] == pytest.approx(
        row["env_steps_per_s"] * 4 * 5 / 10)
    assert row["games"] == 16
    assert row["games_per_s"] == pytest.approx(16 / row["timed_s"])
    assert row["timed_s"] == pytest.approx(2 * row["iteration_median_s"])  # median of 2 = mean


@pytest.mark.parametrize(
    "argv, message",
    [
        (["unroll", "--network", "transformer"], "--network must list"),
        (["unroll", "--batch-sizes", "0"], "positive integers"),
        (["unroll", "--updates-per-call", "0"], "must be >= 1"),
        (["e2e", "--envs", "pong"], "unknown environment"),
        (["e2e", "--set", "[1]"], "JSON object"),
        (["e2e", "--set", '{"warp": 1}'], "unknown config field"),
        (["e2e", "--set", '{"num_envs": -1}'], "num_envs"),
        (["nonsense"], "invalid choice"),
        (["e2e", "--num-devices", "64"], "JAX sees"),
        (["e2e", "--solve-seeds", "x"], "seeds >= 0"),
        (["e2e", "--max-seconds", "0"], "--max-seconds must be > 0"),
        (["e2e", "--cpu-devices", "0"], "must be >= 1"),
        (["search", "--actions", "x"],
         "muzero-jax bench search: argument --actions: expected comma-separated integers >= 1,"
         " got 'x'"),
        (["search", "--bogus"], "muzero-jax bench search: unrecognized arguments: --bogus"),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv, message, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_unroll_compares_compute_dtypes(tmp_path):
    out = tmp_path / "unroll.json"
    assert bench.main(["unroll", "--network", "mlp", "--unroll-steps", "1", "--batch-sizes", "8",
                       "--repeats", "1", "--compute-dtypes", "float32,bfloat16",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["compute_dtype"] for r in rows] == ["float32", "bfloat16"]
    # The same network and batch: the same parameter count.
    assert rows[0]["num_params"] == rows[1]["num_params"]
    # On the CPU no peak is listed for either dtype.
    assert rows[1]["peak_flops_per_s"] is None and rows[1]["mfu"] is None
    assert bench.main(["unroll", "--compute-dtypes", "float16"]) == 2
