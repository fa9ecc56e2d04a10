"""One Atari PPO training run — ppokit's or Stable-Baselines3's — timed from inside.

Run by ``bench.vs_sb3_atari`` in a fresh process (``--lib ppokit`` or ``--lib sb3``); prints
one JSON line: environment steps, training time and its rollout/update split, peak memory.

Both libraries train on the same environments: ppokit's Atari preprocessing
(:func:`ppokit.envs.atari.make_env`, training stack: no-op reset, 4-frame skip with
max-pool, episodic life, FIRE at life start, 84x84 greyscale, sign rewards, 4 stacked
frames, channel-first uint8), in a sync vector env of the same size — ppokit's own, and
SB3's ``DummyVecEnv`` over the same constructors — with the same PPO settings (ppokit's
Atari preset; SB3's ``CnnPolicy``, whose net_arch for the Nature CNN is empty as the
preset's). Torch runs with one thread in both.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from bench._split import sb3_atari_ppo, sb3_rollout_clock, train_ppokit

T_START = time.perf_counter()


def _ppokit(a) -> dict:
    import tempfile

    from ppokit.algos import Trainer, resolve_config
    from ppokit.algos.config import parse_value

    overrides = {"tensorboard": False, "n_envs": a.envs, "torch_threads": 1,
                 "checkpoint_every": 10**9}
    for item in a.sets:
        k, v = item.split("=", 1)
        overrides[k] = parse_value(k, v)
    cfg = resolve_config(overrides=overrides, flags={"env_id": a.env, "seed": a.seed,
                                                     "total_timesteps": a.steps})
    with tempfile.TemporaryDirectory() as run_dir:
        tr = Trainer(cfg, run_dir, log=lambda s: None)
        train_s, rollout_s = train_ppokit(tr)
        steps = tr.global_step
        tr.close()
    return {"steps": steps, "train_s": train_s, "rollout_s": rollout_s,
            "update_s": train_s - rollout_s}


def _sb3(a) -> dict:
    model = sb3_atari_ppo(a.env, a.envs, a.seed)
    split = sb3_rollout_clock()
    t0 = time.perf_counter()
    model.learn(total_timesteps=a.steps, callback=split)
    train_s = time.perf_counter() - t0
    return {"steps": int(model.num_timesteps), "train_s": train_s,
            "rollout_s": split.rollout, "update_s": train_s - split.rollout}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lib", choices=("ppokit", "sb3"), required=True)
    p.add_argument("--env", default="ALE/Breakout-v5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--set", dest="sets", action="append", default=[])
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    out = _ppokit(a) if a.lib == "ppokit" else _sb3(a)
    print(json.dumps({
        "lib": a.lib, "env": a.env, "seed": a.seed, **out,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "in_process_s": time.perf_counter() - T_START,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
