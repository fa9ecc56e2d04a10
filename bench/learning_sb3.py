"""An equal-budget Stable-Baselines3 reference for the learning table's rows that no
published PPO table covers (MinAtar: neither the RL-zoo, CleanRL nor Tianshou publishes
PPO results for it; the one published number is a JAX port's single agent at 10× the
budget).

    python -m bench.learning sb3 --tasks minatar-breakout,minatar-asterix --seeds 0-2
    python -m bench.learning sb3 --tasks minatar-breakout --seeds 0 --steps 20000  # smoke

Each run trains Stable-Baselines3's PPO on the task at the task's budget with the values
of ppokit's preset for the id (read from ppokit's resolved configuration, so the two
cannot drift apart; a setting without an SB3 counterpart is refused) and the same network:
:class:`MinAtarCNN` has the layers of ppokit's small-image CNN (three 3×3 convolutions of
stride 1 on the 10×10 planes, ReLU after each, a linear layer to the features and ReLU),
one trunk shared by linear actor and critic heads, orthogonal initialisation with the same
gains. The observations are what ppokit's CNN reads: MinAtar's boolean 10×10×C planes as
0.0 / 1.0 floats, channels last, no scaling.

Evaluation is ppokit's own: the SB3 policy's weights are copied into ppokit's network for
the same configuration (:func:`ppokit_twin`; the two compute the same log-probabilities
and values, tests/test_bench_sb3_reference.py), which
``ppokit.algos.evaluate.evaluate_policy`` plays on the episode seeds of ``bench.learning``
(``seed + EVAL_SEED + k`` for the final ``final_episodes`` episodes, the trainer's
``seed + EVAL_SEED_OFFSET + k`` for the ``curve_points`` evaluations during training),
sampling actions as ppokit's MinAtar rows do.

One JSON file per (task, seed): ``docs/benchmarks/results_sb3/<task>/seed<N>.json``. A
run whose file exists at the same budget is skipped. SB3 cannot resume a run exactly (its
rollout buffer, environment states and random streams are not saved), so a run stopped
before its end leaves no file and is trained again from the start. ``--steps`` (smoke
tests) records its budget in the file; the table reads only files at the task's budget.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from bench.learning import (
    EVAL_SEED,
    RESULTS_SB3,
    _commit,
    _shown,
    _versions,
    eval_every,
    installed,
    parse_seeds,
)
from bench.learning_tasks import Task, slug, task
from ppokit.errors import UsageError

MINATAR_SIDE = 10

# what still differs between the two sides (printed once at start, kept in every file)
DIFFERENCES = (
    "random streams: initial weights, action sampling and minibatch order come from "
    "different generators (same seed, different draws); the environments' seeds agree "
    "(env i reset with seed + i, then unseeded resets)",
    "implementation: SB3 samples rollout actions with torch.distributions.Categorical and "
    "updates with autograd and torch.optim.Adam; ppokit samples by inverse CDF (NumPy or "
    "its compiled kernel) and updates with its fused minibatch step and flat Adam "
    "(same arithmetic: betas 0.9/0.999, eps 1e-5)",
    "vector env: SB3's DummyVecEnv with Monitor wrappers; ppokit's SyncVectorEnv in "
    "same-step autoreset mode (both bootstrap only at truncations, which MinAtar, having "
    "no time limit, never has)",
    "rollout storage: SB3 keeps observations as float32 in its buffer, ppokit as the "
    "planes; both give the network 0.0 / 1.0 floats",
    "bookkeeping: ppokit writes metrics, checkpoints and best/ during training; SB3 keeps "
    "only its logger's means (the wall times include each side's own)",
)
SAME = (
    "schedules: learning rate and clip range decay linearly with the progress before "
    "each iteration's rollout, as ppokit's (SB3 reads the progress after it: shifted by "
    "one rollout here)",
    "advantages whitened per minibatch (ddof 1, + 1e-8); value loss unclipped mean "
    "squared error, no 1/2; entropy bonus on the mean entropy; gradients clipped to "
    "max_grad_norm over all parameters; no target_kl; no observation or reward "
    "normalisation",
)
RESUME_NOTE = ("SB3 cannot resume a run exactly: a run stopped before its end leaves no "
               "file and is trained again from the start")


# ------------------------------------------------------------------ the network
class MinAtarCNN(BaseFeaturesExtractor):
    """ppokit's small-image CNN for MinAtar's 10×10×C planes as an SB3 features extractor:
    ``channels`` 3×3 convolutions of stride 1, no padding (10×10 → 8×8 → 6×6 → 4×4), ReLU
    after each, flattened (channel-major), a linear layer to ``features_dim`` and ReLU.
    The input is ``[B, 10, 10, C]`` (channels last, 0.0 / 1.0)."""

    def __init__(self, observation_space, channels: tuple[int, ...] = (16, 32, 32),
                 features_dim: int = 256):
        super().__init__(observation_space, features_dim)
        shape = tuple(observation_space.shape)
        if len(shape) != 3 or shape[:2] != (MINATAR_SIDE, MINATAR_SIDE):
            raise ValueError(f"MinAtarCNN: expected 10x10xC planes, got {shape}")
        c, side = shape[2], MINATAR_SIDE
        layers: list[nn.Module] = []
        for out in channels:
            layers += [nn.Conv2d(c, out, kernel_size=3, stride=1, padding=0), nn.ReLU()]
            c, side = out, side - 2
        self.conv = nn.Sequential(*layers, nn.Flatten())
        self.linear = nn.Sequential(nn.Linear(c * side * side, features_dim), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(self.conv(obs.float().permute(0, 3, 1, 2)))


# ------------------------------------------------------------------ the settings
class PresetSchedule:
    """ppokit's linear schedule in SB3's terms: ``start · (1 − steps before the rollout /
    total)``, clamped to [0, 1]; SB3 passes the progress after the rollout, ``shift``
    (one rollout as a fraction of the budget) earlier."""

    def __init__(self, start: float, shift: float):
        self.start, self.shift = float(start), float(shift)

    def __call__(self, progress_remaining: float) -> float:
        return self.start * min(1.0, max(0.0, progress_remaining + self.shift))

    def __repr__(self) -> str:
        return f"PresetSchedule(start={self.start}, shift={self.shift:.6g})"


def preset_config(t: Task, seed: int = 0):
    """ppokit's resolved configuration for the task (its preset; nothing else set)."""
    from ppokit.algos.config import resolve_config

    return resolve_config(env_id=t.env_id, overrides={**t.sets, "seed": seed})


# settings whose value here has no SB3 counterpart in this mapping: refused otherwise
_REQUIRED = dict(algo="ppo", policy_loss="clip", optimizer="adam", advantage_estimator="gae",
                 use_critic=True, advantage_norm_scope="minibatch", clip_range_vf=None,
                 target_kl=None, normalize_obs=False, normalize_reward=False, policy="cnn",
                 recurrent="none")


def ppo_arguments(cfg, steps: int) -> dict:
    """The keyword arguments of SB3's ``PPO`` (environment and seed aside) that carry
    ppokit's configuration ``cfg`` for a budget of ``steps``."""
    for key, want in _REQUIRED.items():
        if getattr(cfg, key) != want:
            raise UsageError(f"sb3: {cfg.env_id}'s preset has {key}={getattr(cfg, key)!r}, "
                             f"which this mapping does not carry over (expected {want!r})")
    shift = cfg.n_envs * cfg.n_steps / steps

    def sched(value, kind):
        return PresetSchedule(value, shift) if kind == "linear" else float(value)

    return dict(
        n_steps=cfg.n_steps, batch_size=cfg.batch_size or cfg.n_envs * cfg.n_steps,
        n_epochs=cfg.n_epochs, learning_rate=sched(cfg.learning_rate, cfg.lr_schedule),
        clip_range=sched(cfg.clip_range, cfg.clip_schedule), ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
        max_grad_norm=cfg.max_grad_norm, normalize_advantage=cfg.normalize_advantage,
        clip_range_vf=None, target_kl=None,
        policy_kwargs=dict(
            features_extractor_class=MinAtarCNN,
            features_extractor_kwargs=dict(channels=tuple(cfg.cnn_channels),
                                           features_dim=cfg.features_dim),
            net_arch=list(cfg.net_arch), share_features_extractor=cfg.share_features,
            activation_fn={"relu": nn.ReLU, "tanh": nn.Tanh}[cfg.activation],
            ortho_init=cfg.ortho_init, optimizer_kwargs=dict(eps=cfg.optimizer_eps)))


def build_model(cfg, env, steps: int) -> PPO:
    """SB3's PPO on ``env`` (an id or a factory, ``cfg.n_envs`` copies seeded ``seed + i``)
    with ppokit's values; on the CPU, ``cfg.torch_threads`` threads as ppokit's run."""
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    vec = make_vec_env(env, n_envs=cfg.n_envs, seed=cfg.seed)
    return PPO(ActorCriticPolicy, vec, seed=cfg.seed, device="cpu", verbose=0,
               **ppo_arguments(cfg, steps))


def arguments_record(model: PPO) -> dict:
    """What the constructed model holds, for the result file."""
    pol = model.policy
    return {"n_envs": model.n_envs, "n_steps": model.n_steps, "batch_size": model.batch_size,
            "n_epochs": model.n_epochs, "learning_rate": repr(model.learning_rate),
            "clip_range": repr(model.clip_range.value_schedule), "ent_coef": model.ent_coef,
            "vf_coef": model.vf_coef, "gamma": model.gamma, "gae_lambda": model.gae_lambda,
            "max_grad_norm": model.max_grad_norm,
            "normalize_advantage": model.normalize_advantage,
            "clip_range_vf": model.clip_range_vf, "target_kl": model.target_kl,
            "net_arch": pol.net_arch, "share_features_extractor": pol.share_features_extractor,
            "ortho_init": pol.ortho_init,
            "adam_eps": pol.optimizer.param_groups[0]["eps"],
            "parameters": sum(p.numel() for p in pol.parameters()),
            "features_extractor": str(pol.features_extractor).replace("\n", " ")}


# ------------------------------------------------------------------ evaluation
_NAMES = (("encoder.", "features_extractor."), ("actor.0.", "action_net."),
          ("critic.0.", "value_net."))


def ppokit_twin(model: PPO, cfg):
    """ppokit's network for ``cfg`` holding the SB3 policy's weights (every one of its
    parameters is taken from SB3's: a missing counterpart raises)."""
    from ppokit.policies import policy_for_config

    twin = policy_for_config(cfg, model.observation_space, model.action_space)
    src = model.policy.state_dict()
    state = {}
    for key in twin.state_dict():
        ours, theirs = next((a, b) for a, b in _NAMES if key.startswith(a))
        state[key] = src[theirs + key[len(ours):]].detach().clone()
    twin.load_state_dict(state, strict=True)
    twin.eval()
    return twin


def evaluate(model: PPO, cfg, t: Task, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` episodes of ppokit's evaluation (the same episode seeds,
    sampling actions for the tasks evaluated so) of the SB3 policy."""
    from ppokit.algos.evaluate import evaluate_policy

    return evaluate_policy(ppokit_twin(model, cfg), cfg, episodes=episodes, seed=seed,
                           deterministic=not t.stochastic_eval)


class Curve(BaseCallback):
    """Evaluations during training where ppokit's run has them: after the update of every
    ``every``-th iteration (seen at the start of the next rollout, and after the last);
    a signal stops training at the next step (no result file)."""

    def __init__(self, t: Task, cfg, every: int, t0: float):
        super().__init__()
        self.t, self.cfg, self.every, self.t0 = t, cfg, every, t0
        self.points: list[list[float]] = []
        self.stop = False

    def check(self) -> None:
        per = self.cfg.n_envs * self.cfg.n_steps
        it = self.model.num_timesteps // per
        if it and it % self.every == 0 and (not self.points or self.points[-1][0] <
                                            self.model.num_timesteps):
            from ppokit.algos.trainer import EVAL_SEED_OFFSET

            rets = evaluate(self.model, self.cfg, self.t, self.t.curve_episodes,
                            self.cfg.seed + EVAL_SEED_OFFSET)
            self.points.append([int(self.model.num_timesteps), float(np.mean(rets)),
                                round(time.perf_counter() - self.t0, 3)])

    def _on_rollout_start(self) -> None:
        self.check()

    def _on_step(self) -> bool:
        return not self.stop


# ------------------------------------------------------------------ one run
def result_path(t: Task, seed: int, results: Path = RESULTS_SB3) -> Path:
    return results / slug(t) / f"seed{seed}.json"


def sb3_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = _versions()
    for dist in ("stable-baselines3", "minatar"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def run_one(t: Task, seed: int, steps: int, results: Path, log=print) -> Path | None:
    """Train, evaluate and write the result file of (task, seed) at ``steps``; None when a
    signal stopped it (nothing written)."""
    from ppokit.envs.vec import check_env_id

    check_env_id(t.env_id)  # registers MinAtar's ids (the minatar extra)
    cfg = preset_config(t, seed)
    t0 = time.perf_counter()
    model = build_model(cfg, t.env_id, steps)
    curve = Curve(t, cfg, eval_every(t, steps), t0)
    stop = lambda signum, frame: setattr(curve, "stop", True)  # noqa: E731, ARG005
    saved = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        model.learn(total_timesteps=steps, callback=curve)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if curve.stop:
        log(f"{t.name} seed {seed}: stopped at {model.num_timesteps} steps; no result "
            f"file ({RESUME_NOTE})")
        return None
    curve.check()  # the last iteration's evaluation, where it is one
    wall = time.perf_counter() - t0
    rets = evaluate(model, cfg, t, t.final_episodes, seed + EVAL_SEED)
    rec = record(t, seed, steps, model, cfg, curve.points, rets, wall)
    path = result_path(t, seed, results)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(path)
    log(f"{t.name} seed {seed}: SB3 final {rec['final']['mean']:.3f} ± "
        f"{rec['final']['std']:.3f} ({len(rets)} episodes), {rec['steps']} steps in "
        f"{rec['wall_s']:.0f} s ({rec['steps_per_s']:.0f} steps/s) -> {_shown(path)}")
    return path


def record(t: Task, seed: int, steps: int, model: PPO, cfg, curve: list, rets: list[float],
           wall: float) -> dict:
    done = int(model.num_timesteps)
    return {
        "task": t.name, "env_id": t.env_id, "seed": seed, "library": "stable-baselines3",
        "budget": steps, "task_budget": t.steps, "reduced": steps != t.steps,
        "steps": done, "wall_s": round(wall, 1), "steps_per_s": round(done / wall, 1),
        "final": {"mean": float(np.mean(rets)), "std": float(np.std(rets)),
                  "episodes": len(rets), "deterministic": not t.stochastic_eval,
                  "seed": seed + EVAL_SEED, "returns": rets},
        "curve": curve,
        "protocol": {"curve_episodes": t.curve_episodes, "final_episodes": t.final_episodes,
                     "stochastic_eval": t.stochastic_eval,
                     "evaluation": "ppokit's evaluate_policy on ppokit's network holding "
                                   "the SB3 policy's weights"},
        "preset": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in cfg.to_dict().items() if k not in ("env_kwargs",)},
        "sb3_arguments": arguments_record(model),
        "differences": list(DIFFERENCES), "same": list(SAME), "resume": RESUME_NOTE,
        "commit": _commit(), "versions": sb3_versions(),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "load_1min": round(os.getloadavg()[0], 2), "torch_threads":
                 torch.get_num_threads()},
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ------------------------------------------------------------------ the command
def _todo(t: Task, seed: int, steps: int, results: Path, log) -> bool:
    """Whether (task, seed) at ``steps`` is still to run: not when its file has this
    budget, nor when a reduced run would replace a full-budget result."""
    path = result_path(t, seed, results)
    if not path.exists():
        return True
    try:
        have = json.loads(path.read_text()).get("budget")
    except (OSError, ValueError, AttributeError):
        log(f"{t.name} seed {seed}: {_shown(path)} is not a result file; trained again")
        return True
    if have == steps:
        log(f"{t.name} seed {seed}: {_shown(path)} exists; skipped")
        return False
    if have == t.steps:
        log(f"{t.name} seed {seed}: {_shown(path)} holds the full budget's result; a "
            f"reduced run does not replace it (--results elsewhere); skipped")
        return False
    return True


def choose(a) -> list[tuple[Task, int]]:
    """The (task, seed) pairs of ``--tasks`` and ``--seeds`` (MinAtar tasks only)."""
    if not a.tasks:
        raise UsageError("--tasks: expected MinAtar task names, e.g. minatar-breakout")
    tasks = []
    for name in a.tasks.split(","):
        try:
            t = task(name.strip())
        except KeyError as exc:
            raise UsageError(f"--tasks: {exc.args[0]}") from None
        if t.family != "minatar":
            raise UsageError(f"--tasks: {t.name} is covered by published PPO results; the "
                             "SB3 reference is run for MinAtar tasks only")
        if not installed(t):
            raise UsageError(f"--tasks: {t.name} needs the {t.extra} extra (pip install "
                             f"'ppokit[{t.extra}]')")
        tasks.append(t)
    try:
        seeds = parse_seeds(a.seeds)
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise UsageError(f"--seeds: expected e.g. 0-2 or 0,1,2, got {a.seeds!r}")
    if a.steps is not None and a.steps < 1:
        raise UsageError(f"--steps: expected an integer >= 1, got {a.steps}")
    if a.jobs < 1:
        raise UsageError(f"--jobs: expected an integer >= 1, got {a.jobs}")
    return [(t, s) for t in tasks for s in seeds]


def cmd_sb3(a) -> int:
    try:
        pairs = choose(a)
    except UsageError as exc:
        print(f"python -m bench.learning sb3: {exc}", file=sys.stderr)
        return 2
    results = Path(a.results)
    print("SB3 reference: ppokit's preset values and network; what still differs:")
    for d in DIFFERENCES:
        print(f"  - {d}")
    print(f"  ({RESUME_NOTE})", flush=True)
    todo = [(t, s, a.steps or t.steps) for t, s in pairs
            if _todo(t, s, a.steps or t.steps, results, print)]
    running: list[subprocess.Popen] = []
    stopping = False

    def stop(signum, frame):  # noqa: ARG001
        nonlocal stopping
        stopping = True
        for p in running:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
    saved = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    failed = finished = 0
    try:
        while (todo or running) and not stopping:
            while todo and len(running) < a.jobs:
                t, s, n = todo.pop(0)
                print(f"{t.name} seed {s}: training SB3 for {n:,} steps", flush=True)
                running.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.learning_sb3", slug(t), str(s), str(n),
                     str(results)], env={**os.environ, "OMP_NUM_THREADS": "1"}))
            time.sleep(0.5)
            for p in [p for p in running if p.poll() is not None]:
                running.remove(p)
                failed += p.returncode != 0
                finished += p.returncode == 0
        for p in running:
            p.wait()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    print(f"{finished} SB3 run(s) finished this time" + (f", {failed} failed" if failed else "")
          + "; `python -m bench.learning table` reads the files at each task's budget")
    return 130 if stopping else (1 if failed else 0)


if __name__ == "__main__":  # one run, in its own process: TASK SEED STEPS RESULTS
    _t, _s, _n, _r = sys.argv[1:5]
    sys.exit(0 if run_one(task(_t), int(_s), int(_n), Path(_r)) else 3)
