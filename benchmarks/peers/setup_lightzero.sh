#!/usr/bin/env bash
# Installs LightZero (the peer MuZero implementation we benchmark against) into
# its own venv, benchmarks/peers/.venv-lightzero, CPU-only.
#
# Why not `pip install LightZero`: its requirements pull gymnasium[atari], a
# CUDA torch, openai, moviepy, minigrid, ... none of which the MuZero MLP
# search/learner/CartPole paths import. So torch is installed first (the pinned
# version resolves to the local +cpu wheel on the project's machines), then
# LightZero and DI-engine with --no-deps, then, also with --no-deps, exactly the
# modules their imports need. Every version is pinned.
#
# wandb is not installed: LightZero's policies do `import wandb` at module
# level but only call it when use_wandb=True (we never set it), and the real
# package drags in opentelemetry, sentry, gitpython, ... Instead a stub `wandb`
# package (every attribute is a no-op callable) is written into this venv's
# site-packages only. It never touches the muzero-jax venv.
#
# LightZero 0.2.0's wheel ships its C++ ctree extensions compiled for CPython
# 3.11 (lzero/mcts/ctree/ctree_muzero/mz_tree.cpython-311-*.so), so nothing is
# built here; the script checks that the extension imports.
#
# Usage: bash benchmarks/peers/setup_lightzero.sh   (idempotent; ~2-4 minutes)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LIGHTZERO_VENV:-$here/.venv-lightzero}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)

# 1. torch, CPU. torch's own dependencies are resolved normally (filelock,
#    sympy, networkx, jinja2, fsspec, typing_extensions, ...).
"${pip[@]}" "torch==2.13.0"

# 2. The peer itself, without its declared requirements.
"${pip[@]}" --no-deps "LightZero==0.2.0" "DI-engine==0.5.3"

# 3. What `import lzero.mcts, lzero.policy.muzero, lzero.model.muzero_model_mlp`
#    and LightZero's CartPole training entry (train_muzero) import.
"${pip[@]}" --no-deps \
  "numpy==1.26.4" \
  "easydict==1.13" \
  "cloudpickle==3.1.1" \
  "DI-toolkit==0.2.1" \
  "hbutils==0.9.3" \
  "deprecation==2.1.0" \
  "packaging==24.2" \
  "rich==13.9.4" \
  "markdown-it-py==3.0.0" \
  "mdurl==0.1.2" \
  "DI-treetensor==0.4.1" \
  "treevalue==1.5.0" \
  "graphviz==0.20.3" \
  "dill==0.3.9" \
  "PyYAML==6.0.2" \
  "requests==2.32.3" \
  "urllib3==2.3.0" \
  "idna==3.10" \
  "certifi==2025.1.31" \
  "charset-normalizer==3.4.1" \
  "Flask==3.1.0" \
  "Werkzeug==3.1.3" \
  "click==8.1.8" \
  "blinker==1.9.0" \
  "itsdangerous==2.2.0" \
  "URLObject==2.4.3" \
  "enum-tools==0.12.0" \
  "Pygments==2.19.1" \
  "tabulate==0.9.0" \
  "tensorboardX==2.6.2.2" \
  "protobuf==6.31.1" \
  "gym==0.25.1" \
  "gym-notices==0.0.8" \
  "gymnasium==0.28.1" \
  "farama-notifications==0.0.4" \
  "jax-jumpy==1.0.0" \
  "matplotlib==3.10.0" \
  "pillow==11.1.0" \
  "pyparsing==3.2.1" \
  "cycler==0.12.1" \
  "python-dateutil==2.9.0.post0" \
  "six==1.17.0" \
  "kiwisolver==1.4.8" \
  "fonttools==4.56.0" \
  "contourpy==1.3.1" \
  "scipy==1.15.2" \
  "platformdirs==4.3.6" \
  "pydantic==2.10.6" \
  "pydantic-core==2.27.2" \
  "annotated-types==0.7.0" \
  "typing-inspection==0.4.0" \
  "xxhash==3.5.0" \
  "einops==0.8.1" \
  "pympler==1.1" \
  "psutil==7.0.0" \
  "tqdm==4.67.1" \
  "bitmath==1.3.3.1" \
  "pynng==0.8.1" \
  "sniffio==1.3.1" \
  "cffi==1.17.1" \
  "pycparser==2.22" \
  "redis==5.2.1" \
  "mpire==2.10.2" \
  "responses==0.25.6" \
  "lz4==4.4.3" \
  "h5py==3.13.0" \
  "trueskill==0.4.5" \
  "pettingzoo==1.24.3" \
  "hickle==5.0.3" \
  "yapf==0.43.0" \
  "tensorboard==2.21.0" \
  "absl-py==2.5.1"

# 4. The wandb stub (see the header).
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site/wandb"
cat >"$site/wandb/__init__.py" <<'EOF'
"""Stand-in for wandb in the LightZero benchmark venv only (see
benchmarks/peers/setup_lightzero.sh): every attribute is a no-op."""


class _NoOp:
    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        return self


def __getattr__(name):
    return _NoOp()
EOF

# 5. Check: the modules the benchmark uses import, and the C++ tree is the
#    compiled extension shipped in the wheel.
"$venv/bin/python" - <<'EOF'
import lzero.mcts, lzero.policy.muzero, lzero.model.muzero_model_mlp  # noqa: F401
# The CartPole end-to-end path (yapf: DI-engine formats the saved config with it).
from lzero.entry import train_muzero  # noqa: F401
import zoo.classic_control.cartpole.envs.cartpole_lightzero_env  # noqa: F401
import yapf  # noqa: F401
from lzero.mcts.ctree.ctree_muzero import mz_tree
import torch
print("lightzero venv ok: torch", torch.__version__, "| ctree", mz_tree.__file__)
EOF
