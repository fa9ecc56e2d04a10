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
import math
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from ppokit.errors import UsageError

__all__ = ["TrainConfig", "ALGORITHMS", "ENV_PRESETS", "resolve_config", "config_help",
           "parse_value", "config_from_dict"]


def _f(default, help: str, **kw):  # noqa: A002
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class TrainConfig:
    # what to train
    env_id: str = _f("CartPole-v1", "Gymnasium environment id")
    algo: str = _f("ppo", "algorithm preset the values came from (ppo, a2c, reinforce, ppo-kl)")
    total_timesteps: int = _f(100_000, "environment steps to train for (all envs together)")
    seed: int = _f(0, "seed of envs, network initialisation and sampling")
    n_envs: int = _f(8, "number of parallel environments")
    # rollout
    n_steps: int = _f(256, "steps per env per rollout (rollout size = n_steps * n_envs)")
    gamma: float = _f(0.99, "discount factor")
    gae_lambda: float = _f(0.95, "GAE lambda (1 = Monte-Carlo advantage with bootstrap)")
    advantage_estimator: str = _f("gae", "gae, or reward_to_go (REINFORCE)")
    use_critic: bool = _f(True, "learn a value function and use it as baseline/bootstrap")
    # update
    n_epochs: int = _f(10, "passes over each rollout")
    batch_size: int = _f(64, "minibatch size (0 = the whole rollout in one minibatch)")
    learning_rate: float = _f(3e-4, "optimiser learning rate (initial value if scheduled)")
    lr_schedule: str = _f("constant", "learning-rate schedule: constant or linear (to 0)")
    optimizer: str = _f("adam", "adam or rmsprop")
    optimizer_eps: float = _f(1e-5, "epsilon of the optimiser's denominator")
    policy_loss: str = _f("clip", "clip (PPO-Clip), vanilla (-logp*A), "
                          "kl_penalty (ratio*A - beta*KL)")
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
    # environment handling
    normalize_obs: bool = _f(False, "running observation normalisation")
    normalize_reward: bool = _f(False, "scale rewards by the running std of the discounted return")
    clip_obs: float = _f(10.0, "clip normalised observations to +-clip_obs")
    clip_reward: float = _f(10.0, "clip scaled rewards to +-clip_reward")
    vectorization: str = _f("auto", "auto, vector_entry_point, sync or async")
    autoreset_mode: str = _f("auto", "auto, same_step or next_step")
    # run directory
    checkpoint_every: int = _f(50, "write a checkpoint every this many iterations (and at the end)")
    keep_checkpoints: int = _f(2, "number of most recent checkpoints kept")
    tensorboard: bool = _f(True, "also write TensorBoard scalars when tensorboard is installed")
    torch_threads: int = _f(1, "torch intra-op threads (0 = leave torch's default)")
    fast: bool = _f(True, "fast paths where the policy and loss allow them: the fused "
                    "minibatch step (compiled, hand-written backward, flat fused Adam) and "
                    "NumPy action sampling in rollouts; false: the eager autograd step and "
                    "policy.act per rollout step (the reference)")

    def __post_init__(self):
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
        return d


CHOICES = {
    "algo": ("ppo", "a2c", "reinforce", "ppo-kl"),
    "advantage_estimator": ("gae", "reward_to_go"),
    "lr_schedule": ("constant", "linear"),
    "clip_schedule": ("constant", "linear"),
    "optimizer": ("adam", "rmsprop"),
    "policy_loss": ("clip", "vanilla", "kl_penalty"),
    "value_clip_mode": ("max", "clipped"),
    "advantage_norm_scope": ("minibatch", "batch"),
    "target_kl_check": ("minibatch", "epoch"),
    "activation": ("tanh", "relu"),
    "vectorization": ("auto", "vector_entry_point", "sync", "async"),
    "autoreset_mode": ("auto", "same_step", "next_step"),
}


def _validate(c: TrainConfig) -> None:
    hints = get_type_hints(TrainConfig)
    for f in fields(c):
        v = getattr(c, f.name)
        t = hints[f.name]
        ok = True
        if t is bool:
            ok = isinstance(v, bool)
        elif t is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        elif t is float or t == (float | None):
            ok = (v is None and t is not float) or (
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
        elif t is str:
            ok = isinstance(v, str)
        elif f.name == "net_arch":
            ok = isinstance(v, tuple) and len(v) > 0 and all(
                isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
        if not ok:
            raise UsageError(f"{f.name}: expected {_type_name(t)}, got {v!r}")
        if f.name in CHOICES and v not in CHOICES[f.name]:
            raise UsageError(f"{f.name}: expected one of {', '.join(CHOICES[f.name])}, got {v!r}")

    def need(cond: bool, name: str, what: str):
        if not cond:
            raise UsageError(f"{name}: expected {what}, got {getattr(c, name)!r}")

    need(c.total_timesteps > 0, "total_timesteps", "an integer > 0")
    need(c.n_envs > 0, "n_envs", "an integer > 0")
    need(c.n_steps > 0, "n_steps", "an integer > 0")
    need(c.n_epochs > 0, "n_epochs", "an integer > 0")
    need(c.batch_size >= 0, "batch_size", "an integer >= 0 (0 = whole rollout)")
    if c.batch_size > c.rollout_size:
        raise UsageError(f"batch_size: {c.batch_size} is larger than the rollout "
                         f"(n_steps * n_envs = {c.n_steps} * {c.n_envs} = {c.rollout_size})")
    if c.total_timesteps < c.rollout_size:
        raise UsageError(f"total_timesteps: {c.total_timesteps} is smaller than one rollout "
                         f"(n_steps * n_envs = {c.rollout_size})")
    need(0 <= c.gamma <= 1, "gamma", "a number in [0, 1]")
    need(0 <= c.gae_lambda <= 1, "gae_lambda", "a number in [0, 1]")
    need(c.learning_rate > 0, "learning_rate", "a number > 0")
    need(c.optimizer_eps > 0, "optimizer_eps", "a number > 0")
    need(c.clip_range > 0, "clip_range", "a number > 0")
    need(c.clip_range_vf is None or c.clip_range_vf > 0, "clip_range_vf", "a number > 0 or none")
    need(c.ent_coef >= 0, "ent_coef", "a number >= 0")
    need(c.vf_coef >= 0, "vf_coef", "a number >= 0")
    need(c.max_grad_norm is None or c.max_grad_norm > 0, "max_grad_norm",
         "a number > 0 or none")
    need(c.target_kl is None or c.target_kl > 0, "target_kl", "a number > 0 or none")
    need(c.kl_coef >= 0, "kl_coef", "a number >= 0")
    need(c.kl_target > 0, "kl_target", "a number > 0")
    need(c.clip_obs > 0, "clip_obs", "a number > 0")
    need(c.clip_reward > 0, "clip_reward", "a number > 0")
    need(c.checkpoint_every > 0, "checkpoint_every", "an integer > 0")
    need(c.keep_checkpoints > 0, "keep_checkpoints", "an integer > 0")
    need(c.torch_threads >= 0, "torch_threads", "an integer >= 0")
    need(c.seed >= 0, "seed", "an integer >= 0")
    if not c.use_critic and c.advantage_estimator == "gae":
        raise UsageError("use_critic: false needs advantage_estimator = reward_to_go "
                         "(GAE is defined through the critic)")


def _type_name(t) -> str:
    if t == (float | None):
        return "a number or none"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(t, "a list of positive integers")


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
}


# ------------------------------------------------------------------------------ parsing

def valid_keys() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def config_help() -> str:
    lines = ["configuration keys (--set key=value, or in --config FILE.toml):"]
    for f in fields(TrainConfig):
        lines.append(f"  {f.name:<22} {f.metadata['help']} [default: {_show(f.default)}]")
    return "\n".join(lines)


def _show(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    return str(v)


def parse_value(key: str, text: str) -> Any:
    """Convert the string ``text`` to the type of config field ``key``."""
    hints = get_type_hints(TrainConfig)
    if key not in hints:
        raise UsageError(f"--set: unknown key {key!r}; valid keys: {', '.join(valid_keys())}")
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
        return tuple(int(x) for x in s.strip("[]()").replace(" ", "").split(",") if x)
    except ValueError:
        raise UsageError(f"{key}: expected {_type_name(t)}, got {text!r}") from None


def _coerce(key: str, value: Any) -> Any:
    hints = get_type_hints(TrainConfig)
    if key not in hints:
        raise UsageError(f"unknown key {key!r}; valid keys: {', '.join(valid_keys())}")
    t = hints[key]
    if key == "net_arch" and isinstance(value, list):
        return tuple(value)
    if isinstance(value, str) and t is not str:
        return parse_value(key, value)
    if (t is float or t == (float | None)) and isinstance(value, int) \
            and not isinstance(value, bool):
        return float(value)
    return value


def config_from_dict(d: dict[str, Any]) -> TrainConfig:
    """Build a validated config from a dict (unknown keys are an error listing valid ones)."""
    return TrainConfig(**{k: _coerce(k, v) for k, v in d.items()})


def resolve_config(*, env_id: str | None = None, algo: str | None = None,
                   toml_values: dict[str, Any] | None = None,
                   overrides: dict[str, Any] | None = None,
                   flags: dict[str, Any] | None = None) -> TrainConfig:
    """Merge presets, a TOML file's values, ``--set`` overrides and flags (see module doc)."""
    toml_values = dict(toml_values or {})
    overrides = dict(overrides or {})
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    for src in (toml_values, overrides):
        for k in src:
            if k not in valid_keys():
                raise UsageError(f"unknown key {k!r}; valid keys: {', '.join(valid_keys())}")
    algo = flags.get("algo") or overrides.get("algo") or toml_values.get("algo") or algo or "ppo"
    env_id = (flags.get("env_id") or overrides.get("env_id") or toml_values.get("env_id")
              or env_id or "CartPole-v1")
    if algo not in ALGORITHMS:
        raise UsageError(f"algo: unknown algorithm {algo!r}; known: {', '.join(ALGORITHMS)}")
    merged: dict[str, Any] = dict(ALGORITHMS[algo])
    preset = ENV_PRESETS.get(env_id, {})
    if algo in ("ppo", "ppo-kl"):
        merged.update(preset)
    else:
        merged.update({k: preset[k] for k in ("total_timesteps", "normalize_obs",
                                               "normalize_reward") if k in preset})
    merged.update(toml_values)
    merged.update(overrides)
    merged.update(flags)
    merged["algo"] = algo
    merged["env_id"] = env_id
    return config_from_dict(merged)
