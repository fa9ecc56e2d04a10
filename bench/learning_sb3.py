"""An equal-budget Stable-Baselines3 reference for rows of the learning table: MinAtar,
which no published PPO table covers (neither the RL-zoo, CleanRL nor Tianshou publishes
PPO results for it; the one published number is a JAX port's single agent at 10× the
budget), and the MuJoCo tasks, whose published references were measured on older task
versions (the RL-zoo's on ``-v3``: another observation, another termination).

    python -m bench.learning sb3 --tasks minatar-breakout,minatar-asterix --seeds 0-2
    python -m bench.learning sb3 --tasks ant --seeds 0-1
    python -m bench.learning sb3 --tasks minatar-breakout --seeds 0 --steps 20000  # smoke

Each run trains Stable-Baselines3's PPO on the task at the task's budget with the values
of ppokit's preset for the id (read from ppokit's resolved configuration, so the two
cannot drift apart; a setting without an SB3 counterpart is refused) and the same network.

* MinAtar: :class:`MinAtarCNN` has the layers of ppokit's small-image CNN (three 3×3
  convolutions of stride 1 on the 10×10 planes, ReLU after each, a linear layer to the
  features and ReLU), one trunk shared by linear actor and critic heads, orthogonal
  initialisation with the same gains. The observations are what ppokit's CNN reads:
  MinAtar's boolean 10×10×C planes as 0.0 / 1.0 floats, channels last, no scaling.
* MuJoCo: SB3's ``MlpPolicy`` with the preset's ``net_arch`` (separate actor and critic
  MLPs, as ppokit's), activation, ``ortho_init`` and ``log_std_init`` (a state-independent
  log standard deviation, as ppokit's). The preset's ``normalize_obs`` /
  ``normalize_reward`` become SB3's ``VecNormalize(norm_obs, norm_reward, clip_obs,
  clip_reward, gamma)``, the arithmetic of ppokit's ObsNormalizer and RewardScaler.

Evaluation is ppokit's own: the SB3 policy's weights are copied into ppokit's network for
the same configuration (:func:`ppokit_twin`; the two compute the same log-probabilities
and values, tests/test_bench_sb3_reference.py) and, where the preset normalises
observations, VecNormalize's running statistics into ppokit's observation normaliser
(:func:`obs_normalizer`: the same clipped standardisation), which
``ppokit.algos.evaluate.evaluate_policy`` plays on the episode seeds of ``bench.learning``
(``seed + EVAL_SEED + k`` for the final ``final_episodes`` episodes, the trainer's
``seed + EVAL_SEED_OFFSET + k`` for the ``curve_points`` evaluations during training),
sampling actions as ppokit's MinAtar rows do, the Gaussian's mean (clipped to the action
bounds) for the MuJoCo rows, as ppokit's.

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
from stable_baselines3.common.vec_env import VecNormalize
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
_SEEDS = ("random streams: initial weights, action sampling and minibatch order come from "
          "different generators (same seed, different draws); the environments' seeds "
          "agree (env i reset with seed + i, then unseeded resets)")
_BOOKKEEPING = ("bookkeeping: ppokit writes metrics, checkpoints and best/ during "
                "training; SB3 keeps only its logger's means (the wall times include each "
                "side's own)")
DIFFERENCES = (
    _SEEDS,
    "implementation: SB3 samples rollout actions with torch.distributions.Categorical and "
    "updates with autograd and torch.optim.Adam; ppokit samples by inverse CDF (NumPy or "
    "its compiled kernel) and updates with its fused minibatch step and flat Adam "
    "(same arithmetic: betas 0.9/0.999, eps 1e-5)",
    "vector env: SB3's DummyVecEnv with Monitor wrappers; ppokit's SyncVectorEnv in "
    "same-step autoreset mode (both bootstrap only at truncations, which MinAtar, having "
    "no time limit, never has)",
    "rollout storage: SB3 keeps observations as float32 in its buffer, ppokit as the "
    "planes; both give the network 0.0 / 1.0 floats",
    _BOOKKEEPING,
)
_SCHEDULES = ("schedules: learning rate and clip range decay linearly with the progress "
              "before each iteration's rollout, as ppokit's (SB3 reads the progress after "
              "it: shifted by one rollout here), where the preset has them decay")
_LOSS = ("advantages whitened per minibatch (ddof 1, + 1e-8); value loss unclipped mean "
         "squared error, no 1/2; entropy bonus on the mean entropy; gradients clipped to "
         "max_grad_norm over all parameters; no target_kl")
SAME = (_SCHEDULES, _LOSS + "; no observation or reward normalisation")
DIFFERENCES_MLP = (
    _SEEDS,
    "implementation: SB3 samples rollout actions with torch.distributions.Normal and "
    "updates with autograd and torch.optim.Adam; ppokit samples mean + exp(log_std) · "
    "noise (NumPy or its compiled kernel) and updates with its fused minibatch step and "
    "flat Adam (same arithmetic: betas 0.9/0.999, eps 1e-5)",
    "vector env: SB3's DummyVecEnv with Monitor wrappers under VecNormalize; ppokit's "
    "vector env in same-step autoreset mode with its own normalisers outside it (both "
    "bootstrap at time-limit truncations from the final observation's value)",
    "normalisation: at a time-limit truncation the final observation (the bootstrap's) "
    "is normalised with the statistics after folding in that step's observations (SB3) "
    "or before (ppokit)",
    _BOOKKEEPING,
)
SAME_MLP = (
    _SCHEDULES, _LOSS,
    "network: separate actor and critic MLPs of net_arch with the preset's activation, "
    "orthogonal initialisation (gains √2, 0.01 actor, 1 critic) where ortho_init, a "
    "state-independent log standard deviation starting at log_std_init; actions clipped "
    "to the bounds for the environment only (the stored action is the unclipped sample)",
    "normalisation: observations (x − μ) / √(σ² + 1e-8) clipped to ±clip_obs with running "
    "statistics (parallel update, pseudo-count 1e-4); rewards divided by the running "
    "standard deviation of the discounted return (γ of the preset, reset at episode "
    "ends), clipped to ±clip_reward; evaluation with the statistics frozen",
)


def differences(cfg) -> tuple[str, ...]:
    """What still differs between SB3's run and ppokit's for ``cfg``'s network."""
    return DIFFERENCES_MLP if is_mlp(cfg) else DIFFERENCES


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
                 target_kl=None, recurrent="none", precision="fp32")
# and per network: MinAtar's CNN (no normalisation), MuJoCo's MLP (ppokit's own, or
# VecNormalize's, normalisation)
_REQUIRED_CNN = dict(policy="cnn", normalize_obs=False, normalize_reward=False)
_MLP_POLICIES = ("auto", "mlp")


def _check(cfg, want: dict) -> None:
    for key, value in want.items():
        if getattr(cfg, key) != value:
            raise UsageError(f"sb3: {cfg.env_id}'s preset has {key}={getattr(cfg, key)!r}, "
                             f"which this mapping does not carry over (expected {value!r})")


def is_mlp(cfg) -> bool:
    """Whether ``cfg`` is mapped to SB3's MlpPolicy (else to :class:`MinAtarCNN`)."""
    return cfg.policy in _MLP_POLICIES


def _policy_kwargs(cfg) -> dict:
    act = {"relu": nn.ReLU, "tanh": nn.Tanh}[cfg.activation]
    common = dict(activation_fn=act, ortho_init=cfg.ortho_init,
                  optimizer_kwargs=dict(eps=cfg.optimizer_eps))
    if is_mlp(cfg):
        return dict(net_arch=dict(pi=list(cfg.net_arch), vf=list(cfg.net_arch)),
                    log_std_init=cfg.log_std_init, **common)
    return dict(features_extractor_class=MinAtarCNN,
                features_extractor_kwargs=dict(channels=tuple(cfg.cnn_channels),
                                               features_dim=cfg.features_dim),
                net_arch=list(cfg.net_arch), share_features_extractor=cfg.share_features,
                **common)


def ppo_arguments(cfg, steps: int) -> dict:
    """The keyword arguments of SB3's ``PPO`` (environment and seed aside) that carry
    ppokit's configuration ``cfg`` for a budget of ``steps``."""
    _check(cfg, _REQUIRED)
    if not is_mlp(cfg):
        _check(cfg, _REQUIRED_CNN)
    shift = cfg.n_envs * cfg.n_steps / steps

    def sched(value, kind):
        return PresetSchedule(value, shift) if kind == "linear" else float(value)

    return dict(
        n_steps=cfg.n_steps, batch_size=cfg.batch_size or cfg.n_envs * cfg.n_steps,
        n_epochs=cfg.n_epochs, learning_rate=sched(cfg.learning_rate, cfg.lr_schedule),
        clip_range=sched(cfg.clip_range, cfg.clip_schedule), ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
        max_grad_norm=cfg.max_grad_norm, normalize_advantage=cfg.normalize_advantage,
        clip_range_vf=None, target_kl=None, use_sde=False, policy_kwargs=_policy_kwargs(cfg))


def normalize_arguments(cfg) -> dict | None:
    """The keyword arguments of SB3's ``VecNormalize`` for ``cfg``'s normalisation (None:
    the preset normalises nothing)."""
    if not (cfg.normalize_obs or cfg.normalize_reward):
        return None
    return dict(norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward,
                clip_obs=cfg.clip_obs, clip_reward=cfg.clip_reward, gamma=cfg.gamma,
                epsilon=1e-8)


def build_model(cfg, env, steps: int) -> PPO:
    """SB3's PPO on ``env`` (an id or a factory, ``cfg.n_envs`` copies seeded ``seed + i``,
    under VecNormalize where the preset normalises) with ppokit's values; on the CPU,
    ``cfg.torch_threads`` threads as ppokit's run."""
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    args = ppo_arguments(cfg, steps)  # (refuses before any environment is made)
    # an id is made with the task's environment settings, as ppokit's run makes it
    kwargs = dict(cfg.env_kwargs or {}) if isinstance(env, str) else None
    vec = make_vec_env(env, n_envs=cfg.n_envs, seed=cfg.seed, env_kwargs=kwargs)
    norm = normalize_arguments(cfg)
    if norm is not None:
        vec = VecNormalize(vec, **norm)
    return PPO(ActorCriticPolicy, vec, seed=cfg.seed, device="cpu", verbose=0, **args)


def arguments_record(model: PPO) -> dict:
    """What the constructed model holds, for the result file."""
    pol = model.policy
    out = {"n_envs": model.n_envs, "n_steps": model.n_steps, "batch_size": model.batch_size,
           "n_epochs": model.n_epochs, "learning_rate": repr(model.learning_rate),
           "clip_range": repr(model.clip_range.value_schedule), "ent_coef": model.ent_coef,
           "vf_coef": model.vf_coef, "gamma": model.gamma, "gae_lambda": model.gae_lambda,
           "max_grad_norm": model.max_grad_norm,
           "normalize_advantage": model.normalize_advantage,
           "clip_range_vf": model.clip_range_vf, "target_kl": model.target_kl,
           "net_arch": pol.net_arch, "share_features_extractor": pol.share_features_extractor,
           "activation_fn": pol.activation_fn.__name__, "ortho_init": pol.ortho_init,
           "adam_eps": pol.optimizer.param_groups[0]["eps"],
           "parameters": sum(p.numel() for p in pol.parameters()),
           "features_extractor": str(pol.features_extractor).replace("\n", " ")}
    if hasattr(pol, "log_std"):
        out["log_std_init"] = pol.log_std_init
    vn = vec_normalize(model)
    out["vec_normalize"] = None if vn is None else {
        "norm_obs": vn.norm_obs, "norm_reward": vn.norm_reward, "clip_obs": vn.clip_obs,
        "clip_reward": vn.clip_reward, "gamma": vn.gamma, "epsilon": vn.epsilon}
    return out


# ------------------------------------------------------------------ evaluation
_CNN_NAMES = (("encoder.", "features_extractor."), ("actor.0.", "action_net."),
              ("critic.0.", "value_net."))


def _sb3_name(key: str, twin) -> str:
    """The name in SB3's state dict of the twin's parameter ``key``."""
    if not is_mlp_policy(twin):
        ours, theirs = next((a, b) for a, b in _CNN_NAMES if key.startswith(a))
        return theirs + key[len(ours):]
    if key == "log_std":
        return key
    net, index, rest = key.split(".", 2)  # actor.<i>.weight: hidden layers, then the head
    last = len(getattr(twin, net)) - 1
    if int(index) == last:
        return f"{'action_net' if net == 'actor' else 'value_net'}.{rest}"
    return f"mlp_extractor.{'policy_net' if net == 'actor' else 'value_net'}.{index}.{rest}"


def is_mlp_policy(twin) -> bool:
    return getattr(twin, "encoder", None) is None


def ppokit_twin(model: PPO, cfg):
    """ppokit's network for ``cfg`` holding the SB3 policy's weights (every one of its
    parameters is taken from SB3's: a missing counterpart raises)."""
    from ppokit.policies import policy_for_config

    twin = policy_for_config(cfg, model.observation_space, model.action_space)
    src = model.policy.state_dict()
    state = {key: src[_sb3_name(key, twin)].detach().clone() for key in twin.state_dict()}
    twin.load_state_dict(state, strict=True)
    twin.eval()
    return twin


def vec_normalize(model: PPO) -> VecNormalize | None:
    env = model.get_env()
    return env if isinstance(env, VecNormalize) else None


def obs_normalizer(model: PPO, cfg):
    """ppokit's observation normaliser holding VecNormalize's current statistics (a copy:
    evaluation does not update them); None where observations are not normalised."""
    from ppokit.envs import ObsNormalizer

    vn = vec_normalize(model)
    if vn is None or not vn.norm_obs:
        return None
    norm = ObsNormalizer(tuple(model.observation_space.shape), vn.clip_obs, eps=vn.epsilon)
    rms = vn.obs_rms
    norm.load_state_dict({"mean": rms.mean, "var": rms.var, "count": np.array([rms.count])})
    return norm


def evaluate(model: PPO, cfg, t: Task, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` episodes of ppokit's evaluation (the same episode seeds,
    sampling actions for the tasks evaluated so, the observations normalised with the
    frozen statistics) of the SB3 policy."""
    from ppokit.algos.evaluate import evaluate_policy

    return evaluate_policy(ppokit_twin(model, cfg), cfg, episodes=episodes, seed=seed,
                           deterministic=not t.stochastic_eval,
                           obs_norm=obs_normalizer(model, cfg))


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
                                   "the SB3 policy's weights" + (
                                       ", observations normalised with VecNormalize's "
                                       "statistics in ppokit's ObsNormalizer (frozen)"
                                       if obs_normalizer(model, cfg) is not None else "")},
        "preset": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in cfg.to_dict().items() if k not in ("env_kwargs",)},
        "sb3_arguments": arguments_record(model),
        "differences": list(differences(cfg)), "same": list(SAME_MLP if is_mlp(cfg) else SAME),
        "resume": RESUME_NOTE,
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


SB3_FAMILIES = ("minatar", "mujoco")  # the tasks this reference is run for


def choose(a) -> list[tuple[Task, int]]:
    """The (task, seed) pairs of ``--tasks`` and ``--seeds`` (MinAtar and MuJoCo tasks,
    whose presets this mapping carries over to SB3)."""
    if not a.tasks:
        raise UsageError("--tasks: expected MinAtar or MuJoCo task names, e.g. "
                         "minatar-breakout,ant")
    tasks = []
    for name in a.tasks.split(","):
        try:
            t = task(name.strip())
        except KeyError as exc:
            raise UsageError(f"--tasks: {exc.args[0]}") from None
        if t.family not in SB3_FAMILIES:
            raise UsageError(f"--tasks: {t.name} is covered by published PPO results on its "
                             "own task version; the SB3 reference is run for MinAtar and "
                             "MuJoCo tasks only")
        if not installed(t):
            raise UsageError(f"--tasks: {t.name} needs the {t.extra} extra (pip install "
                             f"'ppokit[{t.extra}]')")
        ppo_arguments(preset_config(t), a.steps or t.steps)  # refused before any run
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
    for d in dict.fromkeys(d for t, _ in pairs for d in differences(preset_config(t))):
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
