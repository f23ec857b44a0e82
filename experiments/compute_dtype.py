"""float32 against bfloat16 networks (`Config.compute_dtype`): learning, per seed.

    python experiments/compute_dtype.py --env catch --seeds 0,1 --max-env-steps 64000

Trains the environment's preset once per dtype and seed (no evaluations
during training) and prints, per run, the mean of the last ten logged
episode returns of self-play and the greedy return of the final parameters
over 64 evaluation episodes (the most visited action of each search). The
speed of bfloat16 is a GPU/TPU question: `muzero-jax bench unroll
--compute-dtypes float32,bfloat16` measures it.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from muzero_jax.presets import preset
from muzero_jax.train import train


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="catch")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--max-env-steps", type=int, default=64_000)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args(argv)
    for dtype in args.dtypes.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            config = preset(args.env, seed=seed, compute_dtype=dtype, eval_every=0,
                            eval_episodes=64, max_env_steps=args.max_env_steps)
            result = train(config)
            greedy = np.asarray(result.trainer.evaluate(result.state.params,
                                                        jax.random.key(123)))
            late = [r["episode_return"] for r in result.history[-10:]
                    if r["episode_return"] is not None]
            print(json.dumps({"env": args.env, "compute_dtype": dtype, "seed": seed,
                              "env_steps": args.max_env_steps,
                              "last_10_self_play_return": round(float(np.mean(late)), 3),
                              "greedy_return": round(float(greedy.mean()), 3)}), flush=True)


if __name__ == "__main__":
    main()
