"""Rollout throughput of a slow environment: local vectorisation against Ray actors, side
by side in one run.

    python -m bench.ray_scaling [--work-ms 1.0] [--envs 4] [--steps 64] [--rounds 3]
                                [--windows 3] [--cpus 3]

The environment is ``SlowCartPole-v0`` (:mod:`ppokit.envs.slow`): CartPole whose every
step burns ``--work-ms`` of real CPU work. Every setup collects rollouts of the same size
(``--envs`` environments × ``--steps`` steps) with the same MLP policy:

* ``local sync``   — one process steps all environments (ppokit's Collector);
* ``local async``  — Gymnasium's AsyncVectorEnv, one subprocess per environment;
* ``ray 1 actor``  — vectorization=ray, num_workers=1 (all environments in one actor);
* ``ray 2 actors`` — vectorization=ray, num_workers=2 (half the environments in each).

The setups take turns, ``--rounds`` times, each time collecting ``--windows`` rollouts
(after one warm-up window), so a burst of load from other processes is spread over all of
them. Printed per setup: the median rollout throughput (environment steps per second of
``collect``), its ratio to ``ray 1 actor`` and the parallel efficiency (ratio divided by
the number of processes stepping environments). Also printed: the machine's load average
before and after (other processes on the machine lower every figure), the bytes sent to
the actors per iteration (the weights) and back (one rollout), and the learner's time for
one PPO update of that rollout — the quantities of the scaling model in
docs/performance.md — and, as the yardstick for the 2-actor figure, the speed-up two plain
processes doing the same work get on the machine, measured in every round between the
setups.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def _kwargs(args) -> dict:
    """The environment's arguments: the same number of work units in every process (the
    driver's calibration of ``--work-ms``)."""
    return {"work_ms": args.work_ms, "work_units": args.units}


def _cfg(args, **over):
    from ppokit.algos import resolve_config
    from ppokit.envs.slow import ENV_ID

    base = dict(env_id=ENV_ID, env_kwargs=_kwargs(args), n_envs=args.envs,
                n_steps=args.steps, batch_size=64, n_epochs=10, tensorboard=False,
                total_timesteps=args.envs * args.steps)
    base.update(over)
    return resolve_config(overrides=base)


class _Local:
    def __init__(self, args, policy, mode):
        from ppokit.envs import make_vec
        from ppokit.envs.slow import ENV_ID
        from ppokit.rollout import Collector

        self.env = make_vec(ENV_ID, args.envs, vectorization=mode, env_kwargs=_kwargs(args))
        self.c = Collector(self.env, policy, generator=torch.Generator().manual_seed(1),
                           fast=True)
        self.c.reset(seed=0)
        self.procs = 1 if mode == "sync" else args.envs

    def collect(self, n):
        return self.c.collect(n)

    def close(self):
        self.env.close()


class _Ray:
    def __init__(self, args, policy, workers):
        from ppokit.distributed import RayCollector

        cfg = _cfg(args, vectorization="ray", num_workers=workers)
        self.c = RayCollector(cfg, cfg.env_id, log=lambda m: None)
        self.c.attach(policy, None, None)
        self.c.reset(seed=0)
        self.procs = workers

    def collect(self, n):
        return self.c.collect(n)

    def close(self):
        self.c.close()


def _burn_steps(units: int, n: int) -> None:
    from ppokit.envs.slow import burn_units

    for _ in range(n):
        burn_units(units)


def _machine_round(units: int, n: int, rates: dict[int, list[float]]) -> None:
    """What the machine gives plain processes right now: the work rate (steps of
    ``units`` work units per second) of one process and of two, appended to ``rates``."""
    import multiprocessing as mp

    for k in (1, 2):
        procs = [mp.Process(target=_burn_steps, args=(units, n)) for _ in range(k)]
        t = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        rates[k].append(k * n / (time.perf_counter() - t))


def _bytes(obj) -> int:
    if isinstance(obj, dict):
        return sum(_bytes(v) for v in obj.values())
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    return 0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-ms", type=float, default=1.0)
    ap.add_argument("--envs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=3,
                    help="logical CPUs of the local Ray (default 3: the 1-actor and the "
                    "2-actor setups are alive at once and each actor asks for one CPU; "
                    "only one setup steps its environments at a time)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import ray

    from ppokit.algos import Trainer
    from ppokit.envs.slow import ENV_ID, burn_units, units_per_ms
    from ppokit.envs.source import import_env_module

    import_env_module(ENV_ID)
    load0 = os.getloadavg()
    args.units = max(1, round(args.work_ms * units_per_ms()))
    t0 = time.process_time()
    for _ in range(200):
        burn_units(args.units)
    per_step = (time.process_time() - t0) / 200 * 1e3
    # Ray runs its worker processes at niceness 15 unless told otherwise; on a machine that
    # other work shares, that alone would starve the actors against the local setups
    # (niceness 0). Same priority for all, unless the caller set it.
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # the learner: policy and one PPO update
        tr = Trainer(_cfg(args), os.path.join(tmp, "r"), log=lambda m: None)
        policy = tr.policy
        setups = {"local sync": lambda: _Local(args, policy, "sync"),
                  "local async": lambda: _Local(args, policy, "async"),
                  "ray 1 actor": lambda: _Ray(args, policy, 1),
                  "ray 2 actors": lambda: _Ray(args, policy, 2)}
        live = {name: make() for name, make in setups.items()}
        sps: dict[str, list[float]] = {name: [] for name in live}
        n = args.steps
        size = args.envs * n
        ro = None
        plain: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.rounds):
            _machine_round(args.units, size, plain)
            for name, s in live.items():
                s.collect(n)  # warm-up (first window after the others ran)
                for _ in range(args.windows):
                    t = time.perf_counter()
                    ro = s.collect(n)
                    sps[name].append(size / (time.perf_counter() - t))
        procs = {name: s.procs for name, s in live.items()}
        for s in live.values():
            s.close()
        weights = _bytes(dict(policy.state_dict()))
        rollout_bytes = sum(_bytes(getattr(ro, f)) for f in
                            ("obs", "actions", "logp", "values", "rewards", "terminated",
                             "episode_end", "next_values", "valid"))
        ro.compute_advantages(0.99, 0.95)
        upd = []
        for _ in range(3):
            t = time.perf_counter()
            tr.update(ro)
            upd.append(time.perf_counter() - t)
        tr.close()
    ray.shutdown()
    machine = statistics.median(plain[2]) / statistics.median(plain[1])
    load1 = os.getloadavg()
    base = statistics.median(sps["ray 1 actor"])
    print(f"SlowCartPole-v0: {args.work_ms:g} ms of work per step ({args.units} work units "
          f"in every process; measured {per_step:.2f} ms CPU here), rollouts of "
          f"{args.envs} envs x {n} steps, "
          f"{args.rounds} rounds x {args.windows} windows, local Ray of {args.cpus} logical CPUs, "
          f"actors at niceness {os.environ['RAY_worker_niceness']}; "
          f"{os.cpu_count()} cores, load average {load0[0]:.2f} before, {load1[0]:.2f} after")
    print(f"{'setup':<14} {'procs':>5} {'steps/s (median)':>17} {'min-max':>15} "
          f"{'vs ray 1':>9} {'efficiency':>10}")
    for name, v in sps.items():
        med = statistics.median(v)
        ratio = med / base
        eff = f"{ratio / procs[name]:.2f}" if "ray" in name else "-"
        print(f"{name:<14} {procs[name]:>5} {med:>17.0f} {min(v):>7.0f}-{max(v):<7.0f} "
              f"{ratio:>8.2f}x {eff:>10}")
    ideal = 1e3 / per_step
    print(f"one process's ceiling at {per_step:.2f} ms/step: {ideal:.0f} steps/s")
    print(f"per iteration: weights broadcast {weights / 1024:.1f} KiB, rollout back "
          f"{rollout_bytes / 1024:.1f} KiB, learner update {statistics.median(upd) * 1e3:.0f} "
          f"ms (n_epochs 10, batch 64)")
    print(f"ray 2 actors / ray 1 actor: "
          f"{statistics.median(sps['ray 2 actors']) / base:.2f}x")
    print(f"the machine's own speed-up of 2 plain processes over 1 doing the same work "
          f"(no Ray; measured in every round, between the setups): {machine:.2f}x "
          f"(2.00 on two idle cores; lower when other work shares them)")


if __name__ == "__main__":
    main()
