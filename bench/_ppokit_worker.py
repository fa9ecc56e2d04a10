"""One ppokit training run (the same settings as ``bench._sb3_worker``), timed from inside.

Run by ``bench.vs_sb3`` in a fresh process; prints one JSON line: training time and its
rollout/update split, peak memory and a deterministic evaluation.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time

from bench._split import train_ppokit

T_START = time.perf_counter()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--step", choices=("default", "eager"), default="default",
                   help="eager: the eager minibatch step (the fused step's reference) with "
                        "everything else as the configuration says (the fast collector "
                        "too), to compare the two steps alone")
    a = p.parse_args()
    from ppokit.algos import Trainer, resolve_config
    from ppokit.algos.config import parse_value
    from ppokit.algos.evaluate import evaluate_run

    overrides = {"tensorboard": False}
    for item in a.sets:
        k, v = item.split("=", 1)
        overrides[k] = parse_value(k, v)
    flags = {"env_id": a.env, "seed": a.seed, "total_timesteps": a.steps}
    cfg = resolve_config(overrides=overrides, flags=flags)
    if a.step == "eager":
        class EagerStep(Trainer):
            """A Trainer whose minibatch step is its own: the eager one (Trainer's
            _minibatch_step uses the fused step only when it is not overridden)."""

            def update_minibatch(self, mb, clip, kl_limit=None):
                return super().update_minibatch(mb, clip, kl_limit)

        trainer_cls = EagerStep
    else:
        trainer_cls = Trainer
    with tempfile.TemporaryDirectory() as run_dir:
        tr = trainer_cls(cfg, run_dir, log=lambda s: None)
        train_s, rollout_s = train_ppokit(tr)
        tr.close()
        res = evaluate_run(run_dir, episodes=a.eval_episodes, seed=10_000 + a.seed)
    import torch

    print(json.dumps({
        "lib": "ppokit", "env": a.env, "seed": a.seed, "steps": tr.global_step,
        "train_s": train_s, "rollout_s": rollout_s, "update_s": train_s - rollout_s,
        "eval_mean": res["mean_return"], "eval_std": res["std_return"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "in_process_s": time.perf_counter() - T_START,
        "threads": torch.get_num_threads(),
        # which minibatch step ran (the trainer builds the fused one when it uses it)
        "minibatch_step": "fused" if tr._fused is not None else "eager",
    }))


if __name__ == "__main__":
    main()
