"""Training configuration: one frozen, typed dataclass, validated at construction.

Every field carries a one-line description (``field(metadata={"help": ...})``) that
``ppokit train --help`` prints. Keys follow Stable-Baselines3's names where one exists
(``learning_rate``, ``n_steps``, ``batch_size``, ``n_epochs``, ``gamma``, ``gae_lambda``,
``clip_range``, ``clip_range_vf``, ``ent_coef``, ``vf_coef``, ``max_grad_norm``,
``target_kl``, ``normalize_advantage``, ``n_envs``, ``total_timesteps``).

Resolution order (later wins): field defaults < algorithm preset < environment preset
(PPO only) < ``--config FILE.toml`` < ``--set key=value`` < dedicated flags
(``--env``, ``--algo``, ``--total-steps``, ``--seed``, ``--num-envs``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from ppokit.cliutil import in_range
from ppokit.core.registry import ENV_ADVANTAGES, IMPORT_HINT, POLICY_LOSSES, Registry
from ppokit.errors import UsageError
from ppokit.plugins import names_checked
from ppokit.policies.encoders import POLICIES

__all__ = ["TrainConfig", "ALGORITHMS", "ENV_PRESETS", "ATARI_PRESET", "MINATAR_PRESET",
           "env_preset",
           "resolve_config", "config_help",
           "parse_value", "parse_sets", "config_from_dict", "LIMITS", "SEED_MAX", "FLAGS",
           "available_memory", "estimate_memory", "check_memory", "max_torch_threads"]


def _f(default, help: str, **kw):  # noqa: A002
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class TrainConfig:
    # what to train
    env_id: str = _f("CartPole-v1", "Gymnasium environment id (module:Id imports module "
                     "first; it is never imported because a run directory names it)")
    env_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "keyword arguments of the environment's "
                                        "constructor (a table of plain values)"})
    env_source: str = _f("id", "id (env_id is a Gymnasium id) or factory (trained from "
                         "Python on a factory; env_id is only its label)")
    algo: str = _f("ppo", "algorithm preset the values came from (ppo, a2c, reinforce, ppo-kl)")
    total_timesteps: int = _f(100_000, "environment steps to train for (all envs together)")
    seed: int = _f(0, "seed of envs, network initialisation and sampling")
    n_envs: int = _f(8, "number of parallel environments")
    # rollout
    n_steps: int = _f(256, "steps per env per rollout (rollout size = n_steps * n_envs)")
    gamma: float = _f(0.99, "discount factor")
    gae_lambda: float = _f(0.95, "GAE lambda (1 = Monte-Carlo advantage with bootstrap)")
    advantage_estimator: str = _f("gae", "gae, reward_to_go (REINFORCE), or one registered "
                                         "with ppokit.register_advantage_estimator")
    use_critic: bool = _f(True, "learn a value function and use it as baseline/bootstrap")
    # update
    n_epochs: int = _f(10, "passes over each rollout")
    batch_size: int = _f(64, "minibatch size (0 = the whole rollout in one minibatch)")
    learning_rate: float = _f(3e-4, "optimiser learning rate (initial value if scheduled)")
    lr_schedule: str = _f("constant", "learning-rate schedule: constant or linear (to 0)")
    optimizer: str = _f("adam", "adam or rmsprop")
    optimizer_eps: float = _f(1e-5, "epsilon of the optimiser's denominator")
    policy_loss: str = _f("clip", "clip (PPO-Clip), vanilla (-logp*A), "
                          "kl_penalty (ratio*A - beta*KL), or one registered with "
                          "ppokit.register_policy_loss")
    clip_range: float = _f(0.2, "PPO clip epsilon (initial value if scheduled)")
    clip_schedule: str = _f("constant", "clip-range schedule: constant or linear (to 0)")
    clip_range_vf: float | None = _f(None, "value clipping range around old values (none = off)")
    value_clip_mode: str = _f("max", "with clip_range_vf: max (pessimistic) or clipped (SB3)")
    ent_coef: float = _f(0.0, "entropy bonus coefficient")
    vf_coef: float = _f(0.5, "value-loss coefficient (the value loss is (V-R)^2, no 1/2)")
    max_grad_norm: float | None = _f(0.5, "global gradient-norm clip (none = off)")
    normalize_advantage: bool = _f(True, "whiten advantages (ddof 1)")
    advantage_norm_scope: str = _f("minibatch",
                                   "where advantages are whitened: minibatch or batch")
    target_kl: float | None = _f(None, "stop the update early when approx KL (k3) exceeds this")
    target_kl_check: str = _f("minibatch", "minibatch: before each step vs 1.5*target_kl (SB3); "
                              "epoch: after each epoch vs target_kl")
    kl_coef: float = _f(1.0, "kl_penalty: initial penalty coefficient beta")
    kl_target: float = _f(0.01, "kl_penalty: KL the adaptive beta aims for (x/÷2 outside 1.5x)")
    # policy network
    net_arch: tuple[int, ...] = _f((64, 64), "hidden layer sizes of the actor and critic MLPs")
    activation: str = _f("tanh", "hidden activation: tanh or relu")
    ortho_init: bool = _f(True, "orthogonal initialisation")
    log_std_init: float = _f(0.0, "initial log-std of Gaussian policies")
    policy: str = _f("auto", "observation encoder: auto (cnn for image Box, multi_input for "
                     "Dict, mlp otherwise), mlp, cnn (Nature-DQN trunk; under 36x36 pixels "
                     "three 3x3 convolutions) or multi_input (one encoder per Dict key)")
    cnn_channels: tuple[int, ...] = _f((32, 64, 64), "cnn: filters of the three "
                                       "convolutions (8x8/4, 4x4/2, 3x3/1; images under "
                                       "36x36: 3x3 each)")
    features_dim: int = _f(512, "cnn: features after the convolutions (a linear layer)")
    share_features: bool = _f(True, "cnn / multi_input: actor and critic share one encoder "
                              "(false: each has its own)")
    precision: str = _f("fp32", "cnn: number format of the convolutional trunk: fp32; "
                        "bf16 (convolutions and its linear layer in bfloat16 under autocast; "
                        "weights, heads, losses and optimiser in float32); auto (bf16 where "
                        "the hardware computes bfloat16 natively: CPUs with AMX or AVX-512 "
                        "BF16, else fp32; the Atari preset's value). See docs/pixels.md")
    recurrent: str = _f("none", "memory: none (MLP policy) or lstm (an LSTM between the "
                        "observation encoder and the actor's and critic's MLPs)")
    lstm_hidden_size: int = _f(256, "recurrent=lstm: units of each LSTM layer")
    n_lstm_layers: int = _f(1, "recurrent=lstm: stacked LSTM layers")
    shared_lstm: bool = _f(False, "recurrent=lstm: the critic reads the actor's LSTM output "
                           "(detached) instead of having its own")
    enable_critic_lstm: bool = _f(True, "recurrent=lstm: the critic has its own LSTM (false "
                                  "and shared_lstm false: a critic without memory)")
    # environment handling
    normalize_obs: bool = _f(False, "running observation normalisation")
    normalize_reward: bool = _f(False, "scale rewards by the running std of the discounted return")
    clip_obs: float = _f(10.0, "clip normalised observations to +-clip_obs")
    clip_reward: float = _f(10.0, "clip scaled rewards to +-clip_reward")
    vectorization: str = _f("auto", "auto, vector_entry_point, sync, async, ray (the "
                            "environments in Ray actors: num_workers, envs_per_worker), or "
                            "envpool (EnvPool's C++ environments, the envpool extra)")
    num_workers: int = _f(1, "vectorization=ray: Ray actors stepping environments (each its "
                          "own vector env and a copy of the actor)")
    envs_per_worker: int = _f(0, "vectorization=ray: environments per actor (0 = n_envs / "
                              "num_workers; else n_envs becomes num_workers * envs_per_worker)")
    autoreset_mode: str = _f("auto", "auto, same_step or next_step")
    # evaluation during training
    eval_every: int = _f(0, "evaluate the policy every this many iterations on separate "
                         "environments, deterministic actions, results in metrics.jsonl and "
                         "the best policy kept in best/ (0 = never)")
    eval_episodes: int = _f(5, "episodes of each evaluation during training (the same seeds "
                            "every time)")
    stop_at_return: float | None = _f(None, "end training (with a checkpoint) once an "
                                      "evaluation's mean return reaches this (needs "
                                      "eval_every; none = off)")
    # run directory
    checkpoint_every: int = _f(50, "write a checkpoint every this many iterations (and at the end)")
    keep_checkpoints: int = _f(2, "number of most recent checkpoints kept")
    tensorboard: bool = _f(True, "also write TensorBoard scalars when tensorboard is installed")
    track: str = _f("none", "experiment tracker besides metrics.jsonl: none or wandb (the "
                    "wandb extra; WANDB_MODE=offline works without an account)")
    wandb_project: str = _f("ppokit", "W&B project of the run (with track = wandb)")
    torch_threads: int = _f(1, "torch intra-op threads (0 = leave torch's default)")
    fast: bool = _f(True, "fast paths where the policy and loss allow them: the fused "
                    "minibatch step (compiled, hand-written backward, flat fused Adam) and "
                    "NumPy action sampling in rollouts; false: the eager autograd step and "
                    "policy.act per rollout step (the reference)")

    def __post_init__(self):
        if isinstance(self.net_arch, list):  # a list from Python or JSON is fine too
            object.__setattr__(self, "net_arch", tuple(self.net_arch))
        if isinstance(self.cnn_channels, list):
            object.__setattr__(self, "cnn_channels", tuple(self.cnn_channels))
        _validate(self)

    @property
    def rollout_size(self) -> int:
        return self.n_steps * self.n_envs

    @property
    def minibatch_size(self) -> int:
        return self.batch_size or self.rollout_size

    @property
    def num_iterations(self) -> int:
        """Rollouts to collect: enough to reach ``total_timesteps`` (as SB3 counts)."""
        return max(1, -(-self.total_timesteps // self.rollout_size))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["net_arch"] = list(self.net_arch)
        d["cnn_channels"] = list(self.cnn_channels)
        return d


CHOICES = {
    "algo": ("ppo", "a2c", "reinforce", "ppo-kl"),
    "advantage_estimator": ENV_ADVANTAGES,  # the registries: their names when checked
    "lr_schedule": ("constant", "linear"),
    "clip_schedule": ("constant", "linear"),
    "optimizer": ("adam", "rmsprop"),
    "policy_loss": POLICY_LOSSES,
    "value_clip_mode": ("max", "clipped"),
    "advantage_norm_scope": ("minibatch", "batch"),
    "target_kl_check": ("minibatch", "epoch"),
    "activation": ("tanh", "relu"),
    "recurrent": ("none", "lstm"),
    "policy": POLICIES,  # auto or a features extractor's name (policies/encoders.py)
    "precision": ("fp32", "bf16", "auto"),
    "vectorization": ("auto", "vector_entry_point", "sync", "async", "ray", "envpool"),
    "autoreset_mode": ("auto", "same_step", "next_step"),
    "env_source": ("id", "factory"),
    "track": ("none", "wandb"),
}


# Bounds of every numeric field: (low, high, low_is_open). Coefficients stay within
# COEF_MAX so that their products with the losses stay finite in float32; seeds within
# what NumPy's legacy seeding accepts (torch and ``random`` accept more).
SEED_MAX = 2**32 - 1
COEF_MAX = 1e6
LIMITS: dict[str, tuple[float, float, bool]] = {
    "total_timesteps": (1, 10**12, False),
    "seed": (0, SEED_MAX, False),
    "n_envs": (1, 65_536, False),
    "n_steps": (1, 2**24, False),
    "n_epochs": (1, 100_000, False),
    "batch_size": (0, 2**40, False),  # and at most the rollout (0 = the whole rollout)
    "gamma": (0.0, 1.0, False),
    "gae_lambda": (0.0, 1.0, False),
    "learning_rate": (0.0, 10.0, True),
    "optimizer_eps": (0.0, 1.0, True),
    "clip_range": (0.0, COEF_MAX, True),
    "clip_range_vf": (0.0, COEF_MAX, True),
    "ent_coef": (0.0, COEF_MAX, False),
    "vf_coef": (0.0, COEF_MAX, False),
    "max_grad_norm": (0.0, COEF_MAX, True),
    "target_kl": (0.0, COEF_MAX, True),
    "kl_coef": (0.0, COEF_MAX, False),
    "kl_target": (0.0, COEF_MAX, True),
    "log_std_init": (-20.0, 20.0, False),
    "lstm_hidden_size": (1, 65_536, False),
    "features_dim": (1, 65_536, False),
    "n_lstm_layers": (1, 64, False),
    "clip_obs": (0.0, COEF_MAX, True),
    "clip_reward": (0.0, COEF_MAX, True),
    "eval_every": (0, 10**9, False),
    "eval_episodes": (1, 10**6, False),
    "stop_at_return": (-1e12, 1e12, False),
    "checkpoint_every": (1, 10**9, False),
    "keep_checkpoints": (1, 10**6, False),
    "torch_threads": (0, 1024, False),  # and at most max_torch_threads() (0 = torch's default)
    "num_workers": (1, 4096, False),
    "envs_per_worker": (0, 65_536, False),
}
NET_ARCH_MAX_LAYERS = 64
NET_ARCH_MAX_WIDTH = 65_536
ENV_ID_MAX_LEN = 256
_ENV_ID = re.compile(r"[\w.:/-]+")

# the ``ppokit train`` flags that set a configuration key directly
FLAGS = {"env_id": "--env", "algo": "--algo", "total_timesteps": "--total-steps",
         "seed": "--seed", "n_envs": "--num-envs", "env_kwargs": "--env-kwargs",
         "track": "--track"}


def max_torch_threads() -> int:
    """The most torch threads a config may ask for: 4 per CPU core (at least 64, at most
    1024). Far more threads than that only crash or thrash."""
    return min(1024, max(64, 4 * (os.cpu_count() or 1)))


_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 8
_repr.maxlong = 40


def _brief(v: Any) -> str:
    """A short one-line repr of a user's value (long strings and lists are cut)."""
    return _repr.repr(v)


def _fail(name: str, what: str, value: Any = None, *, show: bool = True):
    err = UsageError(f"{name}: {what}, got {_brief(value)}" if show else f"{name}: {what}")
    err.field = name  # which key was wrong (resolve_config names the flag that set it)
    raise err




def _range_text(name: str, integer: bool, optional: bool) -> str:
    lo, hi, lo_open = LIMITS[name]
    if name == "torch_threads":
        hi = max_torch_threads()
    if name == "batch_size":
        text = "an integer in [0, n_steps * n_envs] (0 = the whole rollout)"
    elif integer:
        text = f"an integer in [{lo}, {hi}]"
    else:
        text = f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    return text + (" or none" if optional else "")


def _check_range(name: str, v: Any, integer: bool, optional: bool) -> None:
    lo, hi, lo_open = LIMITS[name]
    if name == "torch_threads":
        hi = max_torch_threads()
    if v is None and optional:
        return
    if not in_range(v, integer, lo, hi, lo_open):
        _fail(name, "expected " + _range_text(name, integer, optional), v)


_PROJECT = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def _validate(c: TrainConfig) -> None:
    hints = get_type_hints(TrainConfig)
    for f in fields(c):
        name, v, t = f.name, getattr(c, f.name), hints[f.name]
        optional = t == (float | None)
        if name in LIMITS:
            _check_range(name, v, integer=t is int, optional=optional)
            continue
        if t is bool:
            ok = isinstance(v, bool)
        elif t is str:
            ok = isinstance(v, str)
        elif name == "env_kwargs":
            from ppokit.envs.source import check_env_kwargs

            try:
                object.__setattr__(c, name, check_env_kwargs(v, name))
            except UsageError as exc:
                exc.field = name  # resolve_config names the flag that set it
                raise
            continue
        elif name == "cnn_channels":
            ok = (isinstance(v, tuple) and len(v) == 3 and all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 4096 for x in v))
        elif name == "net_arch":
            ok = (isinstance(v, tuple) and 0 <= len(v) <= NET_ARCH_MAX_LAYERS and all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= NET_ARCH_MAX_WIDTH
                for x in v))
        else:  # a field without a rule is a bug in this module
            raise AssertionError(f"no validation rule for {name}")
        if not ok:
            _fail(name, f"expected {_type_name(t, name)}", v)
        if name in CHOICES and v not in CHOICES[name] and not (
                isinstance(CHOICES[name], Registry) and isinstance(v, str) and v
                and not names_checked()):  # reading a run: its own parts need no import
            hint = " (memory is recurrent = lstm)" if name == "policy" and v == "lstm" else ""
            if isinstance(CHOICES[name], Registry) and not hint:
                hint = f" ({IMPORT_HINT})"
            _fail(name, f"expected one of {', '.join(CHOICES[name])}{hint}", v)
    if not (0 < len(c.env_id) <= ENV_ID_MAX_LEN and _ENV_ID.fullmatch(c.env_id)):
        _fail("env_id", "expected a Gymnasium environment id such as CartPole-v1", c.env_id)
    if not _PROJECT.fullmatch(c.wandb_project):
        _fail("wandb_project", "expected a W&B project name: 1 to 128 letters, digits, "
              "'-', '_' or '.'", c.wandb_project)
    if c.batch_size > c.rollout_size:
        _fail("batch_size", f"{c.batch_size} is larger than the rollout (n_steps * n_envs = "
              f"{c.n_steps} * {c.n_envs} = {c.rollout_size})", show=False)
    if c.total_timesteps < c.rollout_size:
        _fail("total_timesteps", f"{c.total_timesteps} is smaller than one rollout "
              f"(n_steps * n_envs = {c.rollout_size})", show=False)
    if c.stop_at_return is not None and c.eval_every == 0:
        _fail("stop_at_return", "needs eval_every > 0 (it is compared with the evaluations "
              "during training)", show=False)
    if c.vectorization != "ray" and (c.num_workers != 1 or c.envs_per_worker):
        _fail("num_workers" if c.num_workers != 1 else "envs_per_worker",
              "applies only with vectorization=ray (the environments in Ray actors)",
              show=False)
    if c.vectorization == "ray" and c.n_envs % c.num_workers:
        _fail("n_envs", f"{c.n_envs} environments do not split evenly over num_workers = "
              f"{c.num_workers} Ray actors (vectorization=ray)", show=False)
    if c.vectorization == "ray" and c.envs_per_worker \
            and c.n_envs != c.num_workers * c.envs_per_worker:
        _fail("n_envs", f"{c.n_envs} is not num_workers * envs_per_worker = "
              f"{c.num_workers} * {c.envs_per_worker} (vectorization=ray)", show=False)
    if c.recurrent == "lstm" and c.policy in ("cnn", "multi_input"):
        _fail("recurrent", f"lstm runs on the MLP encoder; policy={c.policy} with an LSTM "
              "is not supported yet", show=False)
    if c.shared_lstm and c.enable_critic_lstm:
        _fail("shared_lstm", "true shares the actor's LSTM with the critic, so it needs "
              "enable_critic_lstm = false (the critic's own LSTM)", show=False)
    if not c.use_critic and ENV_ADVANTAGES.entry(c.advantage_estimator)["needs_critic"]:
        _fail("use_critic", f"false needs an advantage estimator without a critic, e.g. "
              f"reward_to_go ({c.advantage_estimator} reads the critic's values)", show=False)
    check_memory(c)


def _type_name(t, name: str = "") -> str:
    if name == "net_arch":
        return (f"a list of 0 to {NET_ARCH_MAX_LAYERS} layer sizes, each an integer in "
                f"[1, {NET_ARCH_MAX_WIDTH}] (0 layers: linear heads on the features)")
    if name == "cnn_channels":
        return "a list of 3 filter counts, each an integer in [1, 4096]"
    if t == (float | None):
        return "a number or none"
    if name == "env_kwargs":
        return 'a JSON object such as {"size": 8}'
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(t, "a list of positive integers")


# ------------------------------------------------------------------------------ memory

def available_memory() -> int | None:
    """Bytes a new allocation can expect: ``MemAvailable`` (Linux), else the physical
    memory; the cgroup limit when that is smaller. ``None`` when neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            text = fh.read().strip()
        if text.isdigit():
            avail = min(avail, int(text))
    except OSError:
        pass
    return avail


def estimate_memory(c: TrainConfig, obs_size: int = 1, act_size: int = 1) -> dict[str, int]:
    """A lower bound of the bytes a run of ``c`` allocates, by part: ``parameters`` (actor
    and critic MLPs in float32 with gradients and Adam's two moments), ``rollout`` (one
    float32 observation, action and six per-step scalars per step) and ``minibatch`` (the
    hidden activations and their gradients of one minibatch). ``obs_size`` and
    ``act_size`` are the flat observation and action sizes (1 when not yet known)."""
    def mlp(sizes):
        return sum(a * b + b for a, b in zip(sizes, sizes[1:]))

    hidden = list(c.net_arch)
    n_params = mlp([obs_size, *hidden, act_size]) + mlp([obs_size, *hidden, 1])
    if c.recurrent == "lstm":  # the LSTMs' weights; their activations in the minibatch
        H, n_lstm = c.lstm_hidden_size, 1 + c.enable_critic_lstm
        n_params += n_lstm * 4 * H * (obs_size + H + 2 + (c.n_lstm_layers - 1) * (2 * H + 2))
        hidden = hidden + [6 * H * c.n_lstm_layers * n_lstm]
    return {"parameters": 4 * 4 * n_params,
            "rollout": 4 * c.rollout_size * (obs_size + act_size + 6),
            "minibatch": 4 * 2 * 2 * c.minibatch_size * sum(hidden)}


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_memory(c: TrainConfig, obs_size: int = 1, act_size: int = 1,
                 available: int | None = None) -> None:
    """Refuse a config whose :func:`estimate_memory` exceeds the available memory, naming
    the key responsible for the largest part. The trainer can call it again with the real
    observation and action sizes once the environment is built."""
    parts = estimate_memory(c, obs_size, act_size)
    total = sum(parts.values())
    avail = available_memory() if available is None else available
    if avail is None or total <= avail:
        return
    big = max(parts, key=parts.__getitem__)
    tail = f"; {_gib(total)} in all is more than the {_gib(avail)} of memory available"
    if big == "parameters":
        n = parts["parameters"] // 16
        _fail("net_arch", f"{_brief(list(c.net_arch))} makes about {n:,} parameters, "
              f"{_gib(parts['parameters'])} with gradients and optimiser state" + tail,
              show=False)
    name = "n_envs" if c.n_envs >= c.n_steps else "n_steps"
    if big == "minibatch" and c.batch_size:
        _fail("batch_size", f"a minibatch of {c.batch_size:,} samples through hidden layers "
              f"{_brief(list(c.net_arch))} needs at least {_gib(parts['minibatch'])}" + tail,
              show=False)
    _fail(name, f"a rollout of n_steps * n_envs = {c.n_steps} * {c.n_envs} = "
          f"{c.rollout_size:,} steps needs at least {_gib(parts['rollout'])}" + tail,
          show=False)


# ------------------------------------------------------------------------------ presets

ALGORITHMS: dict[str, dict[str, Any]] = {
    # PPO with Stable-Baselines3's defaults, 8 envs.
    "ppo": dict(n_steps=256, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5,
                max_grad_norm=0.5, policy_loss="clip"),
    # A2C: one vanilla-gradient step per 5-step rollout, RMSprop (SB3's defaults).
    "a2c": dict(n_steps=5, batch_size=0, n_epochs=1, learning_rate=7e-4, gamma=0.99,
                gae_lambda=1.0, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                policy_loss="vanilla", optimizer="rmsprop", normalize_advantage=False),
    # REINFORCE: reward-to-go with a learned value baseline (use_critic=false: none).
    "reinforce": dict(n_steps=512, batch_size=0, n_epochs=1, learning_rate=1e-3, gamma=0.99,
                      advantage_estimator="reward_to_go", policy_loss="vanilla",
                      normalize_advantage=True, advantage_norm_scope="batch",
                      max_grad_norm=None),
    # PPO with the adaptive KL penalty instead of clipping (PPO paper §4).
    "ppo-kl": dict(n_steps=256, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99,
                   gae_lambda=0.95, policy_loss="kl_penalty", kl_coef=1.0, kl_target=0.01,
                   max_grad_norm=0.5),
}

# Tuned PPO values from the RL Baselines3 Zoo (hyperparams/ppo.yml).
ENV_PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(n_envs=8, total_timesteps=100_000, n_steps=32, batch_size=256,
                        gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                        learning_rate=1e-3, lr_schedule="linear", clip_range=0.2,
                        clip_schedule="linear"),
    "Acrobot-v1": dict(n_envs=16, total_timesteps=1_000_000, normalize_obs=True,
                       normalize_reward=True, n_steps=256, gae_lambda=0.94, gamma=0.99,
                       n_epochs=4, ent_coef=0.0),
    "LunarLander-v3": dict(n_envs=16, total_timesteps=1_000_000, n_steps=1024, batch_size=64,
                           gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01),
    "Pendulum-v1": dict(n_envs=4, total_timesteps=100_000, normalize_obs=True,
                        normalize_reward=True, n_steps=1024, gae_lambda=0.95, gamma=0.9,
                        n_epochs=10, ent_coef=0.0, learning_rate=1e-3, clip_range=0.2),
    "HalfCheetah-v5": dict(n_envs=1, total_timesteps=1_000_000, normalize_obs=True,
                           normalize_reward=True, batch_size=64, n_steps=512, gamma=0.98,
                           learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
                           n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
                           log_std_init=-2.0, ortho_init=False, activation="relu",
                           net_arch=(256, 256)),
    # The velocity-hidden tasks (ppokit.envs.pomdp) with an LSTM policy. CartPole: the
    # RL-zoo's RecurrentPPO values for CartPoleNoVel-v1 (the PPO CartPole values, a 64-unit
    # LSTM for actor and critic, one 64-unit ReLU layer after it, observation
    # normalisation), trained for 200k steps (the zoo: 100k).
    "ppokit/CartPoleNoVel-v1": dict(n_envs=8, total_timesteps=200_000, n_steps=32,
                                    batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                                    ent_coef=0.0, learning_rate=1e-3, lr_schedule="linear",
                                    clip_range=0.2, clip_schedule="linear",
                                    normalize_obs=True, recurrent="lstm",
                                    lstm_hidden_size=64, net_arch=(64,), activation="relu",
                                    ortho_init=False),
    # Pendulum-v1's values above with the same LSTM policy.
    "ppokit/PendulumNoVel-v1": dict(n_envs=4, total_timesteps=200_000, normalize_obs=True,
                                    normalize_reward=True, n_steps=1024, batch_size=256,
                                    gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                                    learning_rate=1e-3, clip_range=0.2, recurrent="lstm",
                                    lstm_hidden_size=64, net_arch=(64,), activation="relu",
                                    ortho_init=False),
}

# Every Atari game (an ALE id, "ALE/Name-v5": ppokit.envs.atari preprocesses it) gets the
# PPO settings used for Atari since the PPO paper and in the RL-zoo (hyperparams/ppo.yml,
# "atari"): 8 envs x 128 steps, 4 epochs of minibatches of 256, learning rate 2.5e-4 and
# clip range 0.1 both decayed linearly to 0, entropy bonus 0.01, 10M steps; the Nature CNN
# with the actor's and critic's linear heads directly on its 512 features (net_arch empty,
# as SB3's CnnPolicy).
ATARI_PRESET: dict[str, Any] = dict(
    n_envs=8, total_timesteps=10_000_000, n_steps=128, n_epochs=4, batch_size=256,
    learning_rate=2.5e-4, lr_schedule="linear", clip_range=0.1, clip_schedule="linear",
    ent_coef=0.01, vf_coef=0.5, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5,
    policy="cnn", net_arch=(), precision="auto")
ATARI_PREFIX = "ALE/"

# MinAtar's games ("MinAtar/Breakout-v1", ...: the minatar extra, ppokit.envs.minatar):
# 10x10 boolean object planes through the small-image CNN (three 3x3 convolutions of 16,
# 32, 32 filters, 256 features; linear heads on them), and PPO's Atari settings otherwise,
# with the larger learning rate and clip range of PPO on MinAtar's small games: 8 envs x
# 128 steps, 4 epochs of minibatches of 256, learning rate 5e-4 and clip range 0.2 decayed
# linearly, entropy bonus 0.01, 1M steps (docs/pixels.md: Breakout's learning curve).
MINATAR_PRESET: dict[str, Any] = dict(
    n_envs=8, total_timesteps=1_000_000, n_steps=128, n_epochs=4, batch_size=256,
    learning_rate=5e-4, lr_schedule="linear", clip_range=0.2, clip_schedule="linear",
    ent_coef=0.01, vf_coef=0.5, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5,
    policy="cnn", cnn_channels=(16, 32, 32), features_dim=256, net_arch=())
MINATAR_PREFIX = "MinAtar/"


def env_preset(env_id: str) -> dict[str, Any]:
    """The tuned PPO values of ``env_id``: its entry of :data:`ENV_PRESETS`, else
    :data:`ATARI_PRESET` for an ALE id (``ALE/...``) and :data:`MINATAR_PRESET` for a
    MinAtar game (``MinAtar/...``), else none."""
    if env_id in ENV_PRESETS:
        return ENV_PRESETS[env_id]
    if env_id.startswith(ATARI_PREFIX):
        return ATARI_PRESET
    return MINATAR_PRESET if env_id.startswith(MINATAR_PREFIX) else {}


# ------------------------------------------------------------------------------ parsing

def valid_keys() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def config_help() -> str:
    lines = ["configuration keys (--set key=value, or in --config FILE.toml):"]
    hints = get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        bound = ""
        if f.name in LIMITS:
            t = hints[f.name]
            bound = "; " + _range_text(f.name, t is int, t == (float | None)).removeprefix(
                "a finite number ").removeprefix("an integer ")
        lines.append(f"  {f.name:<22} {f.metadata['help']} "
                     f"[default: {_show(_default(f))}{bound}]")
    return "\n".join(lines)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _show(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    if isinstance(v, dict):
        return "{}" if not v else str(v)
    return str(v)


# other libraries' names for ppokit's keys, for "did you mean"
_ALIASES = {"lr": "learning_rate", "num_envs": "n_envs", "envs": "n_envs", "env": "env_id",
            "clip_eps": "clip_range", "clip_epsilon": "clip_range", "epochs": "n_epochs",
            "lam": "gae_lambda", "lambda": "gae_lambda", "total_steps": "total_timesteps",
            "steps": "n_steps", "entropy_coef": "ent_coef", "value_coef": "vf_coef",
            "threads": "torch_threads", "hidden": "net_arch", "hidden_sizes": "net_arch",
            "minibatch_size": "batch_size", "eps": "optimizer_eps", "policy": "recurrent",
            "lstm": "recurrent", "lstm_layers": "n_lstm_layers",
            "critic_lstm": "enable_critic_lstm", "lstm_hidden": "lstm_hidden_size"}


def _suggest(key: Any) -> str | None:
    if not isinstance(key, str):
        return None
    k = key.strip().lower().replace("-", "_")
    keys = valid_keys()
    if k in keys:
        return k
    if k in _ALIASES:
        return _ALIASES[k]
    close = difflib.get_close_matches(k, keys, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_key(key: Any, where: str = "") -> UsageError:
    hint = _suggest(key)
    msg = f"{where + ': ' if where else ''}unknown key {_brief(key)}"
    if hint:
        msg += f"; did you mean {hint!r}?"
    return UsageError(msg + f" (valid keys: {', '.join(valid_keys())})")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE ...`` as ``{key: value}``, each value of its field's type."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        k = k.strip()
        out[k] = parse_value(k, v)
    return out


def parse_value(key: str, text: str) -> Any:
    """Convert the string ``text`` to the type of config field ``key``."""
    hints = get_type_hints(TrainConfig)
    if key not in hints:
        raise unknown_key(key, "--set")
    t = hints[key]
    s = text.strip()
    try:
        if t is bool:
            low = s.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if t is int:
            try:
                return int(s)
            except ValueError:
                f = float(s)  # allow 1e5
                if not f.is_integer():
                    raise
                return int(f)
        if t is float or t == (float | None):
            if s.lower() in ("none", "null", "off") and t is not float:
                return None
            return float(s)
        if t is str:
            return s
        if key == "env_kwargs":
            import json

            try:
                return json.loads(s)
            except (ValueError, RecursionError):
                raise ValueError from None
        return tuple(int(x) for x in s.strip("[]()").replace(" ", "").split(",") if x)
    except ValueError:
        _fail(key, f"expected {_type_name(t, key)}", text)


def _coerce(key: str, value: Any) -> Any:
    hints = get_type_hints(TrainConfig)
    if key not in hints:
        raise unknown_key(key)
    t = hints[key]
    if key == "net_arch" and isinstance(value, list):
        return tuple(value)
    if isinstance(value, str) and t is not str:
        return parse_value(key, value)
    if (t is float or t == (float | None)) and isinstance(value, int) \
            and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # left as it is: validation names the key
            return value
    return value


def _table(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(f"{where}: expected a table of configuration keys, got "
                         f"{type(value).__name__} {_brief(value)}")
    return dict(value)


def config_from_dict(d: dict[str, Any]) -> TrainConfig:
    """Build a validated config from a dict (unknown keys are an error listing valid ones)."""
    d = _table(d, "config")
    return TrainConfig(**{k: _coerce(k, v) for k, v in d.items()})


def _first(key: str, sources: tuple[dict, ...], *defaults: Any) -> Any:
    """The value of ``key`` in the first source that sets it (None counts as not set)."""
    for src in sources:
        if src.get(key) is not None:
            return src[key]
    for d in defaults:
        if d is not None:
            return d
    return None


def resolve_config(*, env_id: str | None = None, algo: str | None = None,
                   toml_values: dict[str, Any] | None = None,
                   overrides: dict[str, Any] | None = None,
                   flags: dict[str, Any] | None = None) -> TrainConfig:
    """Merge presets, a TOML file's values, ``--set`` overrides and flags (see module doc).

    Every error is a :class:`UsageError` naming the key; a key set by one of the
    ``ppokit train`` flags is named by the flag too (``--num-envs (n_envs): ...``)."""
    toml_values = _table(toml_values, "--config")
    overrides = _table(overrides, "--set")
    flags = {k: v for k, v in _table(flags, "flags").items() if v is not None}
    for where, src in (("--config", toml_values), ("--set", overrides), ("flags", flags)):
        for k in src:
            if k not in valid_keys():
                raise unknown_key(k, where)
    try:
        return _resolve(env_id, algo, toml_values, overrides, flags)
    except UsageError as exc:
        name = getattr(exc, "field", None)
        if name not in flags or name not in FLAGS:
            raise
        msg = str(exc)
        msg = (f"{FLAGS[name]} ({name}):{msg[len(name) + 1:]}" if msg.startswith(name + ":")
               else f"{FLAGS[name]}: {msg}")
        err = UsageError(msg)
        err.field = name
        raise err from None


def _ray_envs(merged: dict[str, Any], sources: tuple[dict, ...]) -> None:
    """vectorization=ray with envs_per_worker > 0: n_envs is num_workers * envs_per_worker
    unless the user set n_envs too (then the two must agree; validation says so)."""
    if merged.get("vectorization") != "ray" or not merged.get("envs_per_worker"):
        return
    if any(src.get("n_envs") is not None for src in sources):
        return
    try:
        merged["n_envs"] = int(merged.get("num_workers", 1)) * int(merged["envs_per_worker"])
    except (TypeError, ValueError, OverflowError):
        return  # validation names the key


def _resolve(env_id, algo, toml_values, overrides, flags) -> TrainConfig:
    sources = (flags, overrides, toml_values)
    algo = _first("algo", sources, algo, "ppo")
    env_id = _first("env_id", sources, env_id, "CartPole-v1")
    if not isinstance(algo, str):
        _fail("algo", "expected a string", algo)
    if algo not in ALGORITHMS:
        _fail("algo", f"unknown algorithm {_brief(algo)}; known: {', '.join(ALGORITHMS)}",
              show=False)
    if not isinstance(env_id, str):
        _fail("env_id", "expected a string", env_id)
    merged: dict[str, Any] = dict(ALGORITHMS[algo])
    preset = env_preset(env_id)
    if algo in ("ppo", "ppo-kl"):
        merged.update(preset)
    else:
        merged.update({k: preset[k] for k in ("total_timesteps", "normalize_obs",
                                               "normalize_reward") if k in preset})
    merged.update(toml_values)
    merged.update(overrides)
    merged.update(flags)
    _ray_envs(merged, sources)
    merged["algo"] = algo
    merged["env_id"] = env_id
    return config_from_dict(merged)
