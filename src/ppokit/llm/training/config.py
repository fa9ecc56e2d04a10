"""Token-level RLHF settings (:class:`LLMConfig`): its fields, their resolution from the
algorithm presets and their checks (the off-policy section: :mod:`.offpolicy`; merging
``--set``, TOML files and flags, and ``--help``: :mod:`.config_values`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ppokit import settings
from ppokit.algos.config import SEED_MAX
from ppokit.core.kl import DEFAULT_KL_LOSS_ESTIMATOR
from ppokit.core.registry import ADVANTAGES, GROUP_ADVANTAGES, POLICY_LOSSES
from ppokit.engine.recipe import COEF_MAX, checked_options, recipe
from ppokit.errors import UsageError
from ppokit.settings import (
    check_fields,
    fail,
    setting,
)

from ..engines.settings import EngineSettings
from ..inputs.task import TASKS, make_task
from ..modeling.packing import PackingSettings
from .guards import check_rollout_memory, reward_weights
from .offpolicy import OffPolicySettings, check_off_policy, resolve_off_policy
from .presets import (  # noqa: F401 (re-exported)
    ALGOS,
    DEFAULT_MAX_NEW_TOKENS,
    DEPRECATED,
    LEARNING_RATES,
    MODEL_DEFAULTS,
    OVERLONG_BUFFER,
    PRESETS,
    TRL_NAMES,
    TRL_REFUSED,
    TRUNCATION,
)

__all__ = ["ALGOS", "TRUNCATION", "PRESETS", "DEPRECATED", "ADVANTAGE_ESTIMATORS",
           "LLMConfig", "config_dict"]

# how the advantage is estimated: any estimator of the registry (token-level GAE with a
# critic, REINFORCE++'s whitened token returns, the group estimators, the user's own);
# the names are the config values, checked when the configuration is
ADVANTAGE_ESTIMATORS = ADVANTAGES

MAX_SEQUENCES = 2**20  # prompts_per_iter * samples_per_prompt
AGENT_TURN_TOKENS = {"builtin": 8, "pretrained": 128}  # an agent run's max_new_tokens


@dataclass(frozen=True)
class LLMConfig(EngineSettings, PackingSettings, OffPolicySettings):
    """Token-level RLHF settings, with the names Stable-Baselines3 and the environment
    trainer use for every shared quantity (sections: :class:`EngineSettings`,
    :class:`PackingSettings`, :class:`OffPolicySettings`).
    ``None``: the preset's value; ``metadata["help"]``: a field's documentation (--help)."""

    algo: str | None = setting(None, "algorithm preset: ppo | grpo | dr-grpo | rloo | "
                               "reinforce++ | gspo | cispo | dapo (docs/llm_algorithms.md; "
                               "default: ppo on the built-in model and task, grpo with --model "
                               "or --prompts)")
    model: str | None = setting(None, "local HF causal LM dir (None: built-in tiny model + "
                                "warm start)")
    task: str | None = setting(None, "built-in task when no prompts are given: reverse | "
                               "arithmetic (the built-in model); numbers | reasoning-gym:NAME "
                               "(a pretrained chat --model; default: reverse for the built-in "
                               "model, numbers with --model)")
    task_options: str | None = setting(None, "a reasoning-gym task's dataset settings, a JSON "
                                       "object (e.g. '{\"max_terms\": 2}')")
    prompts: str | None = setting(None, "prompt dataset: JSONL/JSON/CSV/Parquet rows with a "
                                  "'prompt' column (None: the built-in task)")
    eval_prompts: str | None = setting(None, "held-out prompt dataset (default: eval_fraction "
                                       "of prompts)")
    eval_fraction: float = setting(0.1, "share of the prompt rows held out for evaluation when "
                                   "no eval_prompts are given (0: none)",
                                   bounds=(0.0, 0.99, False))
    reward: str | None = setting(None, "reward function(s) module:function, comma-separated or "
                                 "repeated --reward; in Python also callables (None: the "
                                 "built-in task's rewards)")
    reward_weights: tuple | None = setting(None, "one weight per reward function, "
                                           "comma-separated (None: all 1)")
    reward_model: str | None = setting(None, "dir saved by `ppokit llm rm`")
    iterations: int = setting(400, "training iterations (rollout + update)",
                              bounds=(1, 10**9, False))
    time_limit: float | None = setting(480.0, "stop training after this many seconds (<= 0: no "
                                       "limit)", bounds=(-1e12, 1e12, False))
    prompts_per_iter: int | None = setting(None, "distinct prompts per iteration",
                                           bounds=(1, 65_536, False))
    samples_per_prompt: int | None = setting(None, "completions per prompt (group size G)",
                                             bounds=(1, 4096, False))
    max_new_tokens: int | None = setting(None, "generation cap in tokens (default: the "
                                         "built-in task's; 64 with --prompts)",
                                         bounds=(1, 65_536, False))
    temperature: float | None = setting(None, "sampling temperature (log-probs use the same "
                                        "scaling; default 1 for the built-in model, 0.7 for a "
                                        "pretrained --model)", bounds=(0.01, 100.0, False))
    precision: str = setting("fp32", "number format of the models' matrix products: fp32 | "
                             "bf16 (policy, reference and critic run under bfloat16 autocast, "
                             "as TRL's default bf16=True; weights, optimiser, log-softmax, "
                             "values and losses stay float32)", choices=("fp32", "bf16"))
    sampler_precision: str | None = setting(None, "number format of sampling alone: fp32 | "
                                            "bf16 (default: precision); a sampler in another "
                                            "format than the trainer is the rollout-training "
                                            "mismatch that rollout_is corrects",
                                            choices=("fp32", "bf16"))
    learning_rate: float | None = recipe("learning_rate", None, "policy; AdamW; default: 2e-4 "
                                         "for the built-in model; a pretrained --model: 1e-4 "
                                         "with LoRA, 1e-6 fully fine-tuned")
    critic_lr: float = setting(1e-3, "critic learning rate", bounds=(0.0, 10.0, True))
    n_epochs: int | None = recipe("n_epochs", None, "default 2 for the built-in model, 1 for a "
                                  "pretrained --model")
    batch_size: int | None = setting(None, "sequences per minibatch, one optimiser step each "
                                     "(None: half the iteration's sequences)",
                                     bounds=(1, MAX_SEQUENCES, False))
    grad_accum: int = recipe("grad_accum", 1)
    agg: str | None = recipe("agg", None, "default: the preset's")
    policy_loss: str | None = recipe("policy_loss", None, "default: clip")
    clip_range: float | None = recipe("clip_range", None, "default: the preset's; 0.2")
    clip_range_high: float | None = recipe("clip_range_high", None)
    clip_range_vf: float | None = recipe("clip_range_vf", 0.2)
    vf_coef: float = recipe("vf_coef", 0.5)
    ent_coef: float = recipe("ent_coef", 0.0)
    max_grad_norm: float | None = recipe("max_grad_norm", 1.0)
    target_kl_check: str = recipe("target_kl_check", "minibatch")
    value_clip_mode: str = recipe("value_clip_mode", "max")
    advantage_norm_scope: str = recipe("advantage_norm_scope", "batch")
    target_kl: float | None = recipe("target_kl", None, "a minibatch above 1.5 x target_kl is "
                                     "not stepped")
    gamma: float = recipe("gamma", 1.0)
    gae_lambda: float = recipe("gae_lambda", 0.95)
    advantage_estimator: str | None = recipe("advantage_estimator", None, "default: the "
                                             "preset's")
    use_critic: bool | None = recipe("use_critic", None, "default: the preset's; gae needs one")
    kl_mode: str | None = setting(None, "where the reference KL enters: reward (k1 per token) "
                                  "| loss (a term, kl_estimator) | none",
                                  choices=("reward", "loss", "none"))
    kl_estimator: str = recipe("kl_estimator", DEFAULT_KL_LOSS_ESTIMATOR, "with kl_mode=loss")
    kl_coef: float | None = recipe("kl_coef", None, "of the KL to the reference; default: the "
                                   "preset's")
    kl_target: float | None = recipe("kl_target", None, "an adaptive beta on the sequence KL; "
                                     "none: a fixed beta")
    normalize_advantage: bool | None = recipe("normalize_advantage", None, "default: the "
                                              "preset's")
    normalize_std: bool | None = setting(None, "grpo: divide by the group std")
    loss_options: dict[str, Any] = recipe("loss_options", {})
    advantage_options: dict[str, Any] = recipe("advantage_options", {})
    score_norm: str = setting("none", "none | batch: whiten scores over the batch first",
                              choices=("none", "batch"))
    score_clip: float | None = setting(None, "clip scores to [-c, c] after normalisation",
                                       bounds=(0.0, COEF_MAX, True))
    truncation: str | None = setting(None, "a response cut at max_new_tokens: none (scored as "
                                     "it is) | penalty | mask (left out of the loss: DAPO's "
                                     "overlong filtering) | bootstrap "
                                     "(docs/theory.md#truncated-responses; default: mask with "
                                     "algo dapo, else none)", choices=TRUNCATION)
    truncation_penalty: float = setting(0.5, "truncation=penalty: subtracted from a truncated "
                                        "response's score", bounds=(0.0, COEF_MAX, False))
    overlong_buffer: int | None = setting(None, "soft overlong punishment (DAPO): a completion "
                                          "longer than max_new_tokens - overlong_buffer tokens "
                                          "loses up to overlong_penalty, linearly in its "
                                          "length, reaching it at max_new_tokens (0: off; "
                                          "default: max_new_tokens / 5 with algo dapo, else 0)",
                                          bounds=(0, 65_536, False))
    overlong_penalty: float = setting(1.0, "soft overlong punishment: the penalty at "
                                      "max_new_tokens", bounds=(0.0, COEF_MAX, False))
    dynamic_sampling: bool | None = setting(None, "DAPO's dynamic sampling: groups whose "
                                            "scores are all equal (no advantage) are dropped "
                                            "and more prompts sampled until the batch is full "
                                            "(default: on with algo dapo)")
    dynamic_sampling_rounds: int = setting(4, "dynamic sampling: most generation rounds per "
                                           "iteration; a batch still short after them is "
                                           "filled with dropped groups", bounds=(1, 1000, False))
    critic: str = setting("separate", "separate backbone copy | shared policy backbone",
                          choices=("separate", "shared"))
    lora_r: int | None = setting(None, "LoRA rank for the policy (0: full fine-tuning; "
                                 "default: 16 for a pretrained --model, 0 for the built-in "
                                 "model)", bounds=(0, 65_536, False))
    fsdp: bool = setting(False, "with several ranks (torchrun / --nproc): shard the policy, "
                         "reference and critic across them with FSDP2 (docs/llm_distributed.md)")
    lora_alpha: float | None = setting(None, "LoRA scaling alpha (default: 2 x lora_r)",
                                       bounds=(0.0, COEF_MAX, True))
    guard_kl: float | None = setting(None, "divergence guard: an update that moves the policy "
                                     "more than this many nats per token (k3 of old vs new on "
                                     "its samples) is undone and retried at half the learning "
                                     "rate (0: off; default 0.5 for a pretrained --model, off "
                                     "for the built-in model)", bounds=(0.0, COEF_MAX, False))
    guard_grad_norm: float | None = setting(None, "divergence guard: likewise for a gradient "
                                            "norm above this (before clipping; 0: off; default "
                                            "off)", bounds=(0.0, COEF_MAX, False))
    guard_retries: int = setting(3, "divergence guard: halvings of the learning rate within "
                                 "one iteration before training stops", bounds=(0, 20, False))
    sft_steps: int | None = setting(None, "warm-start SFT steps for the built-in model (None: "
                                    "the task's, 150 for reverse, 600 for arithmetic)",
                                    bounds=(1, 10**7, False))
    sft_lr: float = setting(3e-3, "warm-start SFT learning rate", bounds=(0.0, 10.0, True))
    seed: int = setting(0, "seed for everything", bounds=(0, SEED_MAX, False))
    n_eval_prompts: int = setting(128, "held-out prompts for `ppokit llm eval` (and eval_every)",
                                  bounds=(1, 10**6, False))
    eval_every: int = setting(0, "score the policy on n_eval_prompts held-out prompts every N "
                              "iterations while training and at its last (iteration count "
                              "or time limit), logged as eval/score_mean, "
                              "eval/reward/NAME, ... (0: never)", bounds=(0, 10**9, False))
    checkpoint_every: int = setting(25, "iterations between checkpoints (and at the end)",
                                    bounds=(1, 10**9, False))
    samples_logged: int = setting(4, "completions written to samples.jsonl per iteration",
                                  bounds=(0, 10**6, False))
    # agents: multi-turn episodes in a text environment (docs/agents.md)
    env: str | None = setting(None, "a text environment to act in over several turns: "
                              "ppokit/GuessNumber-v0, a registered Gymnasium id, module:Id or "
                              "verifiers:NAME (in Python also a factory or an instance); "
                              "each prompt is then "
                              "an episode's seed, samples_per_prompt episodes per seed, "
                              "max_new_tokens the cap of one turn")
    env_kwargs: str | None = setting(None, "keyword arguments of the environment, a JSON "
                                     "object (e.g. '{\"n\": 16}')")
    max_turns: int = setting(8, "most model turns in an episode (tool calls included); an "
                             "episode still going then is truncated",
                             bounds=(1, 1000, False))
    tools: str | None = setting(None, "tool functions the model may call, module:function, "
                                "comma-separated (in Python also callables; docs/agents.md)")
    tool_format: str = setting("json", "how a tool call is written: json (<tool_call>{...}"
                               "</tool_call>) or compact (NAME:ARGS, for the built-in model)",
                               choices=("json", "compact"))
    tool_time_limit: float = setting(5.0, "seconds one tool call may take",
                                     bounds=(0.0, 3600.0, True))

    @property
    def minibatch_size(self) -> int | None:
        """Sequences per minibatch (the update recipe's name for ``batch_size``)."""
        return self.batch_size

    def resolved(self, pretrained: bool | None = None) -> LLMConfig:
        """Fill preset defaults and validate every field; errors name the field (the flag
        of ``ppokit llm train`` is the field with dashes: ``kl_coef`` is ``--kl-coef``).

        ``pretrained``: the policy is a pretrained checkpoint given as an object (a
        ``model`` path always is one), not the built-in tiny model; the defaults of
        :data:`MODEL_DEFAULTS` follow it. Resolving a resolved configuration changes
        nothing."""
        cfg = self
        if cfg.algo is None:
            cfg = replace(cfg, algo="ppo" if cfg.model is None and cfg.prompts is None
                          and not pretrained else "grpo")
        if not isinstance(cfg.algo, str) or cfg.algo not in ALGOS:
            _fail("algo", f"unknown algorithm {settings.brief(cfg.algo)}; known: "
                  f"{', '.join(ALGOS)}")
        kind = "pretrained" if cfg.model is not None or pretrained else "builtin"
        preset = {**MODEL_DEFAULTS[kind], **PRESETS[cfg.algo]}
        upd = {k: v for k, v in preset.items() if getattr(cfg, k) is None}
        cfg = replace(cfg, **upd)
        if cfg.learning_rate is None:
            cfg = replace(cfg, learning_rate=LEARNING_RATES[kind if kind == "builtin" else (
                "lora" if cfg.lora_r else "full")])
        if cfg.lora_alpha is None:
            cfg = replace(cfg, lora_alpha=float(2 * cfg.lora_r) if cfg.lora_r else 16.0)
        if cfg.task is None:
            cfg = replace(cfg, task="reverse" if kind == "builtin" else "numbers")
        _check_task(cfg, kind)
        if cfg.max_new_tokens is None and cfg.env is not None:  # one turn's cap
            cfg = replace(cfg, max_new_tokens=AGENT_TURN_TOKENS[kind])
        if cfg.max_new_tokens is None:
            cfg = replace(cfg, max_new_tokens=make_task(cfg.task, cfg.task_options)
                          .max_new_tokens if cfg.prompts is None else DEFAULT_MAX_NEW_TOKENS)
        if cfg.normalize_std is None:
            cfg = replace(cfg, normalize_std=True)
        if cfg.policy_loss is None:
            cfg = replace(cfg, policy_loss="clip")
        if cfg.truncation is None:
            cfg = replace(cfg, truncation="none")
        if cfg.dynamic_sampling is None:
            cfg = replace(cfg, dynamic_sampling=False)
        if cfg.overlong_buffer is None:
            cfg = replace(cfg, overlong_buffer=int(cfg.max_new_tokens
                                                   * OVERLONG_BUFFER.get(cfg.algo, 0.0)))
        if cfg.sampler_precision is None:
            cfg = replace(cfg, sampler_precision=cfg.precision)
        cfg = resolve_off_policy(cfg)
        if cfg.clip_range is None:
            cfg = replace(cfg, clip_range=0.2)
        if cfg.batch_size is None:
            cfg = replace(cfg, batch_size=max(1, cfg.prompts_per_iter
                                              * cfg.samples_per_prompt // 2))
        _check_fields(cfg)
        cfg = replace(cfg, **checked_options(cfg))  # typed by the parts' declarations
        if cfg.time_limit is not None and cfg.time_limit <= 0:
            cfg = replace(cfg, time_limit=None)
        cfg = replace(cfg, reward_weights=reward_weights(cfg.reward_weights))
        _check_combinations(cfg)
        return cfg


def _check_combinations(cfg: LLMConfig) -> None:
    """The checks of a resolved configuration that read several fields."""
    check_off_policy(cfg)
    if cfg.overlong_buffer > cfg.max_new_tokens:
        raise UsageError(f"overlong_buffer: expected at most max_new_tokens="
                         f"{cfg.max_new_tokens} tokens, got {cfg.overlong_buffer}")
    if cfg.dynamic_sampling and cfg.samples_per_prompt < 2:
        raise UsageError("dynamic_sampling: drops groups whose completions score alike, "
                         "so it needs samples_per_prompt >= 2")
    if cfg.truncation == "bootstrap" and not cfg.use_critic:
        raise UsageError("truncation: 'bootstrap' needs a critic (use_critic, as in "
                         "algo ppo); use 'penalty' or 'mask'")
    est, loss = cfg.advantage_estimator, cfg.policy_loss  # unregistered: reading a run
    if est in ADVANTAGES and ADVANTAGES.entry(est)["needs_critic"] and not cfg.use_critic:
        raise UsageError(f"advantage_estimator: {cfg.advantage_estimator!r} needs a "
                         f"critic (use_critic=true)")
    if loss in POLICY_LOSSES and POLICY_LOSSES.entry(loss)["kl_anchor"] != "none":
        raise UsageError(f"policy_loss: {cfg.policy_loss!r} carries a KL penalty to the "
                         f"old policy, which language-model training does not use; its "
                         f"KL term is kl_mode (reward or loss, against the reference)")
    if cfg.advantage_estimator in GROUP_ADVANTAGES and cfg.samples_per_prompt < 2:
        raise UsageError(f"samples_per_prompt: the {cfg.advantage_estimator} estimator "
                         f"needs at least 2 completions per prompt, got "
                         f"{cfg.samples_per_prompt}")
    if cfg.lora_r > 0:
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            raise UsageError("lora_r: LoRA needs peft (pip install 'ppokit[lora]')")
    if cfg.fsdp and "bf16" in (cfg.precision, cfg.sampler_precision):
        raise UsageError("precision: bf16 is not offered with fsdp (sharded parameters "
                         "are gathered in float32); use precision=fp32")
    if cfg.fsdp and cfg.eval_every:
        raise UsageError("eval_every: not with fsdp (the sharded policy generates only "
                         "with every rank taking part); evaluate after training with "
                         "ppokit llm eval")
    if cfg.fsdp and cfg.lora_r > 0:
        raise UsageError("fsdp: not with LoRA (lora_r > 0): the adapters are small, "
                         "plain data parallelism replicates them")
    if cfg.reward_weights is not None:
        from ..inputs.rewards import reward_entries

        n = len(reward_entries(cfg.reward)) + bool(cfg.reward_model)
        if n and len(cfg.reward_weights) != n:
            _fail("reward_weights", f"expected {n} weights (one per reward function)",
                  cfg.reward_weights, show=True)
    batch = cfg.prompts_per_iter * cfg.samples_per_prompt
    if batch > MAX_SEQUENCES:
        raise UsageError(f"prompts_per_iter: prompts_per_iter * samples_per_prompt = "
                         f"{cfg.prompts_per_iter} * {cfg.samples_per_prompt} = {batch} "
                         f"sequences per iteration; at most {MAX_SEQUENCES}")
    if batch % cfg.batch_size or cfg.batch_size % cfg.grad_accum:
        raise UsageError(f"batch_size/grad_accum: the {batch} sequences of an iteration "
                         f"must split into minibatches of batch_size={cfg.batch_size} "
                         f"sequences, each into grad_accum={cfg.grad_accum} equal "
                         "micro-batches")
    if cfg.kl_target is not None and cfg.kl_coef == 0:
        raise UsageError("kl_target: an adaptive beta needs kl_coef > 0 to start from")
    check_rollout_memory(cfg)

# The bounds of the numeric fields as (integer, low, high, low_is_open) and the allowed
# values of the fields with a closed set, from the fields' metadata (a field whose default
# is None may also be None)
LIMITS: dict[str, tuple[bool, float, float, bool]] = {
    name: (isinstance(lo, int) and isinstance(hi, int), lo, hi, lo_open)
    for name, (lo, hi, lo_open) in settings.bounds_of(LLMConfig).items()}
CHOICES = settings.choices_of(LLMConfig)
PATHS = ("model", "prompts", "eval_prompts", "reward_model")
# checked by their own rules: reward entries (module:function, a directory or a callable)
# in _check_fields, reward_weights (finite numbers, one per reward) in resolved()
# task (a built-in name or reasoning-gym:NAME) and task_options in _check_task; env,
# env_kwargs and tools (names or, in Python, objects) in _check_agent
SPECIAL = ("reward", "reward_weights", "task", "task_options", "env", "env_kwargs", "tools")
FLAGS_BOOL = tuple(f.name for f in fields(LLMConfig) if f.type in ("bool", "bool | None"))


def _fail(name: str, what: str, value=None, *, show: bool = False):
    fail(name, what, value, show=show)


def _check_fields(cfg: LLMConfig) -> None:
    check_fields(cfg, skip=("algo", *PATHS, *SPECIAL), texts={
        "time_limit": "a finite number of seconds (0 or less: no limit)"})
    for name in (*CHOICES, *FLAGS_BOOL):  # every one has its value once resolved
        if getattr(cfg, name) is None:
            fail(name, "expected a value once the preset is applied", None)
    for name in PATHS:
        v = getattr(cfg, name)
        if v is not None and not (isinstance(v, str) and v.strip() and "\0" not in v):
            fail(name, "expected a non-empty path or name", v)
    if isinstance(cfg.model, str):  # a known model's name: fetched? (before any work)
        from ..modeling.fetch import resolve_model

        resolve_model(cfg.model)
    from ..inputs.rewards import reward_entries

    for e in reward_entries(cfg.reward):
        if not callable(e) and not (isinstance(e, str) and "\0" not in e and (
                ":" in e.strip(":") or os.path.isdir(e))):
            fail("reward", "expected 'module:function', a reward-model directory or a "
                 "callable", e)
    _check_agent(cfg)


def _check_agent(cfg: LLMConfig) -> None:
    if cfg.env is not None and not (isinstance(cfg.env, str) and cfg.env.strip()
                                    and "\0" not in cfg.env):
        fail("env", "expected a text environment id or module:Id", cfg.env)
    if cfg.env_kwargs is not None:
        env_kwargs_of(cfg)
        if cfg.env is None:
            fail("env_kwargs", "applies only with env (a text environment)", show=False)
    if cfg.tools is not None:
        entries = cfg.tools.split(",") if isinstance(cfg.tools, str) else cfg.tools
        if not isinstance(entries, (list, tuple)) or not entries or not all(
                callable(e) or (isinstance(e, str) and ":" in e.strip(":"))
                for e in entries):
            fail("tools", "expected 'module:function' entries (or, in Python, functions)",
                 cfg.tools)
        if cfg.env is None:
            fail("tools", "apply only with env (a text environment)", show=False)


def env_kwargs_of(cfg: LLMConfig) -> dict:
    """``env_kwargs`` as a dict (from its JSON text)."""
    import json

    if cfg.env_kwargs is None:
        return {}
    if isinstance(cfg.env_kwargs, dict):
        return dict(cfg.env_kwargs)
    try:
        value = json.loads(cfg.env_kwargs) if isinstance(cfg.env_kwargs, str) else None
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        fail("env_kwargs", 'expected a JSON object such as {"n": 16}', cfg.env_kwargs)
    return value


def _check_task(cfg: LLMConfig, kind: str) -> None:
    """``task`` names a built-in task that fits the model: the toy tasks' character-level
    prompts for the built-in model, the chat tasks for a pretrained chat model."""
    from ..inputs.chat_tasks import CHAT_TASKS, is_chat_task

    if not isinstance(cfg.task, str) or not (cfg.task in TASKS or is_chat_task(cfg.task)):
        _fail("task", f"expected one of {', '.join([*TASKS, *CHAT_TASKS])} or "
              "reasoning-gym:NAME", cfg.task, show=True)
    if cfg.prompts is None and kind == "builtin" and is_chat_task(cfg.task):
        _fail("task", f"{cfg.task!r} is a task for a pretrained chat model (its prompts go "
              "through a chat template): give --model, e.g. --model smollm2-135m-instruct "
              "(ppokit llm fetch smollm2-135m-instruct)")
    if cfg.task_options is not None and not (isinstance(cfg.task_options, str)
                                             and cfg.task.startswith("reasoning-gym:")):
        _fail("task_options", "only a reasoning-gym task takes options", cfg.task_options,
              show=True)


def config_dict(cfg: LLMConfig) -> dict:
    """The configuration as JSON values: a callable reward is recorded by its name
    (``python:module.function``), never as something to import."""
    from ..inputs.rewards import reward_entries, reward_label

    d = asdict(cfg)
    if cfg.reward is not None and not isinstance(cfg.reward, str):
        d["reward"] = ",".join(reward_label(e) for e in reward_entries(cfg.reward))
    if cfg.tools is not None and not isinstance(cfg.tools, str):
        d["tools"] = ",".join(reward_label(e) for e in cfg.tools)
    if d.get("reward_weights") is not None:
        d["reward_weights"] = list(d["reward_weights"])
    return d
