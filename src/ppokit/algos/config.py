"""Training configuration: one frozen, typed dataclass, validated at construction.

Every field declares its help, bounds and allowed values in its metadata
(:mod:`ppokit.settings`); the update's and the advantage estimate's fields are the recipe
both trainers share (:mod:`ppokit.engine.recipe`). ``ppokit train --help`` prints them.
Keys follow Stable-Baselines3's names where one exists (``learning_rate``, ``n_steps``,
``batch_size``, ``n_epochs``, ``gamma``, ``gae_lambda``, ``clip_range``,
``clip_range_vf``, ``ent_coef``, ``vf_coef``, ``max_grad_norm``, ``target_kl``,
``normalize_advantage``, ``n_envs``, ``total_timesteps``).

Resolution order (later wins): field defaults < algorithm preset < environment preset
(PPO only) < ``--config FILE.toml`` < ``--set key=value`` < dedicated flags
(``--env``, ``--algo``, ``--total-steps``, ``--seed``, ``--num-envs``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ppokit.core.registry import ENV_ADVANTAGES
from ppokit.engine.recipe import COEF_MAX, recipe
from ppokit.errors import UsageError
from ppokit.policies.encoders import POLICIES
from ppokit.selfplay.settings import SelfPlaySettings
from ppokit.settings import (
    bounds_of,
    brief,
    choices_of,
    fail,
    help_table,
    kind_of,
    merge_values,
    parse_text,
    resolve_key,
    setting,
    unknown_key_error,
)
from ppokit.settings import parse_sets as parse_set_items

from .config_checks import NET_ARCH_MAX_LAYERS, NET_ARCH_MAX_WIDTH, max_torch_threads, validate
from .memory import available_memory, check_memory, estimate_memory  # noqa: F401 (re-exported)
from .presets import (  # noqa: F401 (re-exported)
    ALGORITHMS,
    ATARI_PREFIX,
    ATARI_PRESET,
    ENV_PRESETS,
    MINATAR_PREFIX,
    MINATAR_PRESET,
    env_preset,
    image_preset,
)

__all__ = ["TrainConfig", "ALGORITHMS", "ENV_PRESETS", "ATARI_PRESET", "MINATAR_PRESET",
           "env_preset",
           "resolve_config", "config_help",
           "parse_value", "parse_sets", "config_from_dict", "saved_config", "LIMITS", "SEED_MAX",
           "FLAGS",
           "available_memory", "estimate_memory", "check_memory", "max_torch_threads"]

# seeds within what NumPy's legacy seeding accepts (torch and ``random`` accept more)
SEED_MAX = 2**32 - 1


@dataclass(frozen=True)
class TrainConfig(SelfPlaySettings):  # (the self-play keys: ppokit.selfplay.settings)
    # what to train
    env_id: str = setting("CartPole-v1", "Gymnasium environment id (module:Id imports module "
                          "first; it is never imported because a run directory names it)")
    env_kwargs: dict[str, Any] = setting(
        help="keyword arguments of the environment's constructor (a table of plain values)",
        default_factory=dict, expected='a JSON object such as {"size": 8}')
    env_source: str = setting("id", "id (env_id is a Gymnasium id) or factory (trained from "
                              "Python on a factory; env_id is only its label)",
                              choices=("id", "factory"))
    agent_id: bool = setting(False, "multi-agent environments: append a one-hot agent index "
                             "to each agent's observation (docs/multiagent.md)")
    centralised_critic: bool = setting(False, "multi-agent environments: the critic reads the "
                                       "environment's global state (PettingZoo's state(); "
                                       "with agent_id, and the agent index), the actor its "
                                       "own observation (MAPPO; docs/multiagent.md)")
    agent_groups: str = setting("shared", "multi-agent environments: shared (one policy for "
                                "all agents), prefix (one policy per group of agents named "
                                "GROUP_N, PettingZoo's convention) or agent (one per agent); "
                                "groups may differ in observation size and Discrete action "
                                "count (docs/multiagent.md)",
                                choices=("shared", "prefix", "agent"))
    critic_state_norm: str = setting("layer", "centralised_critic: the critic's input (the "
                                     "state) normalised per row by a LayerNorm (layer, "
                                     "MAPPO's feature normalisation) or read as it is "
                                     "(none: runs from before this setting)",
                                     choices=("layer", "none"))
    algo: str = setting("ppo", "algorithm preset the values came from (ppo, a2c, reinforce, "
                        "ppo-kl)",
                        choices=("ppo", "a2c", "reinforce", "ppo-kl"))
    total_timesteps: int = setting(100_000, "environment steps to train for (all envs together)",
                                   bounds=(1, 10**12, False))
    seed: int = setting(0, "seed of envs, network initialisation and sampling",
                        bounds=(0, SEED_MAX, False))
    n_envs: int = setting(8, "number of parallel environments", bounds=(1, 65_536, False))
    # rollout
    n_steps: int = setting(256, "steps per env per rollout (rollout size = n_steps * n_envs)",
                           bounds=(1, 2**24, False))
    gamma: float = recipe("gamma", 0.99)
    gae_lambda: float = recipe("gae_lambda", 0.95)
    advantage_estimator: str = recipe("advantage_estimator", "gae", choices=ENV_ADVANTAGES)
    use_critic: bool = recipe("use_critic", True)
    # update
    n_epochs: int = recipe("n_epochs", 10)
    batch_size: int = setting(64, "minibatch size (0 = the whole rollout in one minibatch)",
                              bounds=(0, 2**40, False))
    learning_rate: float = recipe("learning_rate", 3e-4)
    lr_schedule: str = setting("constant", "learning-rate schedule: constant or linear (to 0)",
                               choices=("constant", "linear"))
    optimizer: str = setting("adam", "adam or rmsprop", choices=("adam", "rmsprop"))
    optimizer_eps: float = setting(1e-5, "epsilon of the optimiser's denominator",
                                   bounds=(0.0, 1.0, True))
    policy_loss: str = recipe("policy_loss", "clip")
    clip_range: float = recipe("clip_range", 0.2)
    clip_schedule: str = setting("constant", "clip-range schedule: constant or linear (to 0)",
                                 choices=("constant", "linear"))
    clip_range_vf: float | None = recipe("clip_range_vf", None)
    value_clip_mode: str = recipe("value_clip_mode", "max")
    ent_coef: float = recipe("ent_coef", 0.0)
    vf_coef: float = recipe("vf_coef", 0.5)
    max_grad_norm: float | None = recipe("max_grad_norm", 0.5)
    normalize_advantage: bool = recipe("normalize_advantage", True)
    advantage_norm_scope: str = recipe("advantage_norm_scope", "minibatch")
    target_kl: float | None = recipe("target_kl", None)
    target_kl_check: str = recipe("target_kl_check", "minibatch")
    kl_coef: float = recipe("kl_coef", 1.0)
    kl_target: float = recipe("kl_target", 0.01)
    loss_options: dict[str, Any] = recipe("loss_options", {})
    advantage_options: dict[str, Any] = recipe("advantage_options", {})
    # policy network
    net_arch: tuple[int, ...] = setting(
        (64, 64), "hidden layer sizes of the actor and critic MLPs",
        expected=f"a list of 0 to {NET_ARCH_MAX_LAYERS} layer sizes, each an integer in "
                 f"[1, {NET_ARCH_MAX_WIDTH}] (0 layers: linear heads on the features)")
    activation: str = setting("tanh", "hidden activation: tanh or relu", choices=("tanh", "relu"))
    ortho_init: bool = setting(True, "orthogonal initialisation")
    log_std_init: float = setting(0.0, "initial log-std of Gaussian policies",
                                  bounds=(-20.0, 20.0, False))
    policy: str = setting("auto", "observation encoder: auto (cnn for image Box, multi_input for "
                          "Dict, mlp otherwise), mlp, cnn (Nature-DQN trunk; under 36x36 pixels "
                          "three 3x3 convolutions) or multi_input (one encoder per Dict key)",
                          choices=POLICIES)
    cnn_channels: tuple[int, ...] = setting((32, 64, 64), "cnn: filters of the three "
                                            "convolutions (8x8/4, 4x4/2, 3x3/1; images under "
                                            "36x36: 3x3 each)",
                                            expected="a list of 3 filter counts, each an integer "
                                            "in [1, 4096]")
    features_dim: int = setting(512, "cnn: features after the convolutions (a linear layer)",
                                bounds=(1, 65_536, False))
    share_features: bool = setting(True, "cnn / multi_input: actor and critic share one encoder "
                                   "(false: each has its own)")
    precision: str = setting("fp32", "cnn: number format of the convolutional trunk: fp32; "
                             "bf16 (convolutions and its linear layer in bfloat16 under autocast; "
                             "weights, heads, losses and optimiser in float32); auto (bf16 where "
                             "the hardware computes bfloat16 natively: CPUs with AMX or AVX-512 "
                             "BF16, else fp32; the Atari preset's value). See docs/pixels.md",
                             choices=("fp32", "bf16", "auto"))
    recurrent: str = setting("none", "memory: none (MLP policy) or lstm (an LSTM between the "
                             "observation encoder and the actor's and critic's MLPs)",
                             choices=("none", "lstm"))
    lstm_hidden_size: int = setting(256, "recurrent=lstm: units of each LSTM layer",
                                    bounds=(1, 65_536, False))
    n_lstm_layers: int = setting(1, "recurrent=lstm: stacked LSTM layers", bounds=(1, 64, False))
    shared_lstm: bool = setting(False, "recurrent=lstm: the critic reads the actor's LSTM output "
                                "(detached) instead of having its own")
    enable_critic_lstm: bool = setting(True, "recurrent=lstm: the critic has its own LSTM (false "
                                       "and shared_lstm false: a critic without memory)")
    # environment handling
    normalize_obs: bool = setting(False, "running observation normalisation")
    normalize_reward: bool = setting(False, "scale rewards by the running std of the "
                                     "discounted return")
    clip_obs: float = setting(10.0, "clip normalised observations to +-clip_obs",
                              bounds=(0.0, COEF_MAX, True))
    clip_reward: float = setting(10.0, "clip scaled rewards to +-clip_reward",
                                 bounds=(0.0, COEF_MAX, True))
    vectorization: str = setting("auto", "auto, vector_entry_point, sync, async, ray (the "
                                 "environments in Ray actors: num_workers, envs_per_worker), or "
                                 "envpool (EnvPool's C++ environments, the envpool extra)",
                                 choices=("auto", "vector_entry_point", "sync", "async",
                                 "ray", "envpool"))
    num_workers: int = setting(1, "vectorization=ray: Ray actors stepping environments (each "
                               "its own vector env and a copy of the actor)",
                               bounds=(1, 4096, False))
    envs_per_worker: int = setting(0, "vectorization=ray: environments per actor (0 = n_envs "
                                   "/ num_workers; else n_envs becomes num_workers * "
                                   "envs_per_worker)", bounds=(0, 65_536, False))
    autoreset_mode: str = setting("auto", "auto, same_step or next_step",
                                  choices=("auto", "same_step", "next_step"))
    # evaluation during training
    eval_every: int = setting(0, "evaluate the policy every this many iterations on separate "
                              "environments (actions as eval_deterministic says), results in "
                              "metrics.jsonl and the best policy kept in best/ (0 = never)",
                              bounds=(0, 10**9, False))
    eval_episodes: int = setting(5, "episodes of each evaluation during training (the same seeds "
                                 "every time)", bounds=(1, 10**6, False))
    eval_deterministic: bool = setting(True, "evaluations during training take the most likely "
                                       "(or mean) action; false samples actions, as Atari and "
                                       "MinAtar evaluations usually do")
    stop_at_return: float | None = setting(None, "end training (with a checkpoint) once an "
                                           "evaluation's mean return reaches this (needs "
                                           "eval_every; none = off)", bounds=(-1e12, 1e12, False))
    # run directory
    checkpoint_every: int = setting(50, "write a checkpoint every this many iterations (and "
                                    "at the end)",
                                    bounds=(1, 10**9, False))
    keep_checkpoints: int = setting(2, "number of most recent checkpoints kept",
                                    bounds=(1, 10**6, False))
    tensorboard: bool = setting(True, "also write TensorBoard scalars when tensorboard is "
                                "installed")
    track: str = setting("none", "experiment tracker besides metrics.jsonl: none or wandb (the "
                         "wandb extra; WANDB_MODE=offline works without an account)",
                         choices=("none", "wandb"))
    wandb_project: str = setting("ppokit", "W&B project of the run (with track = wandb)")
    torch_threads: int = setting(1, "torch intra-op threads (0 = leave torch's default)",
                                 bounds=(0, 1024, False))
    fast: bool = setting(True, "fast paths where the policy and loss allow them: the fused "
                         "minibatch step (compiled, hand-written backward, flat fused Adam) and "
                         "NumPy action sampling in rollouts; false: the eager autograd step and "
                         "policy.act per rollout step (the reference)")


    def __post_init__(self):
        if isinstance(self.net_arch, list):  # a list from Python or JSON is fine too
            object.__setattr__(self, "net_arch", tuple(self.net_arch))
        if isinstance(self.cnn_channels, list):
            object.__setattr__(self, "cnn_channels", tuple(self.cnn_channels))
        validate(self)

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


# Bounds of every numeric field, (low, high, low_is_open), and the allowed values of the
# fields with a closed set: both from the fields' metadata
LIMITS = bounds_of(TrainConfig)
CHOICES = choices_of(TrainConfig)

# the ``ppokit train`` flags that set a configuration key directly
FLAGS = {"env_id": "--env", "algo": "--algo", "total_timesteps": "--total-steps",
         "seed": "--seed", "n_envs": "--num-envs", "env_kwargs": "--env-kwargs",
         "track": "--track"}


# ------------------------------------------------------------------------------ parsing

def valid_keys() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def config_help() -> str:
    title, *rows = help_table(TrainConfig, "configuration keys (--set key=value, or in "
                                           "--config FILE.toml):")
    sp = [r for r in rows if r.startswith("  selfplay")]  # (a base's fields: listed last)
    return "\n".join([title, *[r for r in rows if r not in sp], *sp])


# other libraries' names for ppokit's keys, for "did you mean"
ALIASES = {"lr": "learning_rate", "num_envs": "n_envs", "envs": "n_envs", "env": "env_id",
           "clip_eps": "clip_range", "clip_epsilon": "clip_range", "epochs": "n_epochs",
           "lam": "gae_lambda", "lambda": "gae_lambda", "total_steps": "total_timesteps",
           "steps": "n_steps", "entropy_coef": "ent_coef", "value_coef": "vf_coef",
           "threads": "torch_threads", "hidden": "net_arch", "hidden_sizes": "net_arch",
           "minibatch_size": "batch_size", "eps": "optimizer_eps", "policy": "recurrent",
           "lstm": "recurrent", "lstm_layers": "n_lstm_layers",
           "critic_lstm": "enable_critic_lstm", "lstm_hidden": "lstm_hidden_size",
           "centralized_critic": "centralised_critic", "central_critic": "centralised_critic",
           "mappo": "centralised_critic"}


def unknown_key(key: Any, where: str = "") -> UsageError:
    """The error for ``key``, which is not a configuration key (with the closest one)."""
    return unknown_key_error(key, valid_keys(), where, ALIASES)


def _key(key: Any, where: str) -> str:
    return resolve_key(key, valid_keys(), where, aliases=ALIASES)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE ...`` as ``{key: value}``, each value of its field's type."""
    return parse_set_items(items, lambda k, v: (k, parse_value(k, v)))


def parse_value(key: str, text: str) -> Any:
    """Convert the string ``text`` to the type of config field ``key``."""
    return parse_text(TrainConfig, _key(key, "--set"), text)


def _coerce(key: str, value: Any) -> Any:
    kind = kind_of(TrainConfig, _key(key, ""))
    if kind.base is tuple and isinstance(value, list):
        return tuple(value)
    if isinstance(value, str) and kind.base is not str:
        return parse_value(key, value)
    if kind.base is float and isinstance(value, int) and not isinstance(value, bool):
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
                         f"{type(value).__name__} {brief(value)}")
    return dict(value)


def config_from_dict(d: dict[str, Any]) -> TrainConfig:
    """Build a validated config from a dict (unknown keys are an error listing valid ones)."""
    d = _table(d, "config")
    return TrainConfig(**{k: _coerce(k, v) for k, v in d.items()})


def saved_config(d: dict[str, Any]) -> TrainConfig:
    """A checkpoint's configuration (:func:`config_from_dict`), with the values that keys
    added since mean for runs written before them: a centralised critic without
    ``critic_state_norm`` read the bare state (``none``)."""
    if isinstance(d, dict) and d.get("centralised_critic") is True \
            and "critic_state_norm" not in d:
        d = {**d, "critic_state_norm": "none"}
    return config_from_dict(d)


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
        fail("algo", "expected a string", algo)
    if algo not in ALGORITHMS:
        fail("algo", f"unknown algorithm {brief(algo)}; known: {', '.join(ALGORITHMS)}",
              show=False)
    if not isinstance(env_id, str):
        fail("env_id", "expected a string", env_id)
    preset = env_preset(env_id)
    cfg = _merge(algo, env_id, preset, sources)
    if preset or algo not in ("ppo", "ppo-kl"):
        return cfg
    family = image_preset(space) if (space := _observation_space(cfg)) is not None else {}
    return _merge(algo, env_id, family, sources) if family else cfg


def _merge(algo: str, env_id: str, preset: dict[str, Any], sources) -> TrainConfig:
    flags, overrides, toml_values = sources
    merged: dict[str, Any] = dict(ALGORITHMS[algo])
    if algo in ("ppo", "ppo-kl"):
        merged.update(preset)
    else:
        merged.update({k: preset[k] for k in ("total_timesteps", "normalize_obs",
                                               "normalize_reward") if k in preset})
    for layer in (toml_values, overrides, flags):
        merge_values(merged, layer)  # (an option table option by option)
    _ray_envs(merged, sources)
    merged["algo"] = algo
    merged["env_id"] = env_id
    return config_from_dict(merged)


def _observation_space(cfg: TrainConfig):
    """The observation space of a registered environment without a preset of its own (for
    the image family's settings, :func:`ppokit.algos.presets.image_preset`), from one
    instance built and closed here; None when it cannot be built here -- building the run's
    environments reports why, where the error belongs."""
    import gymnasium as gym

    from ppokit.envs.source import gym_id

    if cfg.env_source != "id":
        return None
    try:
        gym.spec(gid := gym_id(cfg.env_id))
        env = gym.make(gid, **cfg.env_kwargs)
    except (Exception, SystemExit):  # noqa: BLE001 (reported when the run builds it)
        return None
    try:
        return env.observation_space
    finally:
        try:
            env.close()
        except Exception:  # noqa: BLE001 (a close that fails changes nothing here)
            pass
