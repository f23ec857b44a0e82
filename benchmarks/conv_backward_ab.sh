#!/usr/bin/env bash
# A/B of the convolution backward pass (commit efc73c1): the same benchmark
# harness (this checkout's muzero_jax/bench/cli.py) run on the networks of
# BEFORE (default c426c11, autodiff of XLA's convolution) and of this checkout
# (`networks.same_conv`), one after the other on a quiet machine. Writes
# benchmarks/results/conv_backward/{before,after}_*.json.
# Usage: bash benchmarks/conv_backward_ab.sh [BEFORE]   (~15 min on 2 CPU cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
before=${1:-c426c11}
out=$root/benchmarks/results/conv_backward
wt=$(mktemp -d)
git -C "$root" worktree add -q --detach "$wt" "$before"
trap 'git -C "$root" worktree remove --force "$wt"' EXIT
cp "$root/muzero_jax/bench/cli.py" "$wt/muzero_jax/bench/cli.py"
mkdir -p "$out"
resnet='{"network": "resnet", "resnet": {"channels": 32, "num_blocks": 2, "downsample": false, "head_hidden_sizes": [128], "action_planes": "board"}}'
bench() { (cd "$1" && PYTHONPATH="$1" "$root/.venv/bin/muzero-jax" bench "${@:2}"); }
for side in before after; do
  src=$root; [ "$side" = before ] && src=$wt
  for u in 1 8; do
    bench "$src" unroll --env connect_four --network resnet --unroll-steps 5 --batch-sizes 256 \
      --updates-per-call "$u" --repeats 3 --json "$out/${side}_unroll_u$u.json"
  done
  bench "$src" e2e --envs connect_four,tic_tac_toe --iterations 5 --json "$out/${side}_e2e.json"
  bench "$src" e2e --envs connect_four --iterations 2 --set "$resnet" \
    --json "$out/${side}_e2e_resnet.json"
done
