"""Token-level RLHF settings (:class:`LLMConfig`), the algorithm presets and prompt files."""

from __future__ import annotations

import os
import reprlib
from dataclasses import asdict, dataclass, field, fields, replace

from ppokit.algos.config import SEED_MAX
from ppokit.cliutil import in_range
from ppokit.core.kl import DEFAULT_KL_LOSS_ESTIMATOR, KL_LOSS_ESTIMATORS
from ppokit.core.losses import AGGREGATION_MODES
from ppokit.core.registry import ADVANTAGES, GROUP_ADVANTAGES, IMPORT_HINT, POLICY_LOSSES, Registry
from ppokit.errors import UsageError
from ppokit.plugins import names_checked

from ..inputs.task import TASKS, make_task
from .presets import (  # noqa: F401 (re-exported)
    ALGOS,
    DEFAULT_MAX_NEW_TOKENS,
    LEARNING_RATES,
    MODEL_DEFAULTS,
    OVERLONG_BUFFER,
    PRESETS,
    TRUNCATION,
)

__all__ = ["ALGOS", "TRUNCATION", "PRESETS", "DEPRECATED", "ADVANTAGE_ESTIMATORS",
           "LLMConfig", "prompt_sets", "load_prompts", "config_help", "config_from_values",
           "parse_sets", "read_toml", "config_dict"]

# how the advantage is estimated: any estimator of the registry (token-level GAE with a
# critic, REINFORCE++'s whitened token returns, the group estimators, the user's own);
# the names are the config values, checked when the configuration is
ADVANTAGE_ESTIMATORS = ADVANTAGES

# Names of earlier versions, accepted on the command line, in --set and in TOML with a
# deprecation message (minibatches was a count; batch_size is sequences per minibatch).
DEPRECATED = {"lr": "learning_rate", "epochs": "n_epochs", "clip_eps": "clip_range",
              "lam": "gae_lambda", "whiten_advantages": "normalize_advantage",
              "minibatches": "batch_size"}


# TRL's names (GRPOConfig) with one ppokit key of the same meaning, accepted as they are
# (--set, TOML, ppokit.llm.train keywords); and TRL's names that have no one-to-one
# ppokit key, refused with what to use instead (docs/from_trl.md)
TRL_NAMES = {"num_generations": "samples_per_prompt", "max_completion_length": "max_new_tokens",
             "beta": "kl_coef", "num_iterations": "n_epochs", "epsilon": "clip_range",
             "epsilon_high": "clip_range_high", "gradient_accumulation_steps": "grad_accum"}
TRL_REFUSED = {
    "per_device_train_batch_size": "batch_size is the sequences of one optimiser step (TRL's "
                                   "per_device_train_batch_size x gradient_accumulation_steps "
                                   "x processes)",
    "loss_type": "agg sets the aggregation (TRL's grpo: seq-mean-token-mean, dr_grpo: "
                 "seq-mean-token-sum-norm, dapo: token-mean), or --algo dr-grpo / dapo",
    "scale_rewards": "normalize_std (true: divide by the group's standard deviation)",
    "importance_sampling_level": "policy_loss=gspo (sequence) or the default clip (token)",
    "max_prompt_length": "prompts are never cut; a prompt that leaves no room for the "
                         "completion in the model's context is refused before training",
}


def _f(default, help: str):  # noqa: A002 - the metadata key users read
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class LLMConfig:
    """Token-level RLHF settings, with the names Stable-Baselines3 and the environment
    trainer use for every shared quantity. ``None`` means "the algorithm preset's value";
    each field's ``metadata["help"]`` is its documentation (and the ``--help`` text)."""

    algo: str | None = _f(None, "algorithm preset: ppo | grpo | dr-grpo | rloo | reinforce++ "
                                "| gspo | cispo | dapo (docs/llm_algorithms.md; default: ppo "
                                "on the built-in model and task, grpo with --model or "
                                "--prompts)")
    model: str | None = _f(None, "local HF causal LM dir (None: built-in tiny model + warm "
                                 "start)")
    task: str | None = _f(None, "built-in task when no prompts are given: reverse | "
                                "arithmetic (the built-in model); numbers | "
                                "reasoning-gym:NAME (a pretrained chat --model; default: "
                                "reverse for the built-in model, numbers with --model)")
    task_options: str | None = _f(None, "a reasoning-gym task's dataset settings, a JSON "
                                        "object (e.g. '{\"max_terms\": 2}')")
    prompts: str | None = _f(None, "prompt dataset: JSONL/JSON/CSV/Parquet rows with a "
                                   "'prompt' column (None: the built-in task)")
    eval_prompts: str | None = _f(None, "held-out prompt dataset (default: eval_fraction "
                                        "of prompts)")
    eval_fraction: float = _f(0.1, "share of the prompt rows held out for evaluation when "
                                   "no eval_prompts are given (0: none)")
    reward: str | None = _f(None, "reward function(s) module:function, comma-separated or "
                                  "repeated --reward; in Python also callables (None: the "
                                  "built-in task's rewards)")
    reward_weights: tuple | None = _f(None, "one weight per reward function, "
                                            "comma-separated (None: all 1)")
    reward_model: str | None = _f(None, "dir saved by `ppokit llm rm`")
    iterations: int = _f(400, "training iterations (rollout + update)")
    time_limit: float | None = _f(480.0, "stop training after this many seconds (<= 0: no "
                                         "limit)")
    prompts_per_iter: int | None = _f(None, "distinct prompts per iteration")
    samples_per_prompt: int | None = _f(None, "completions per prompt (group size G)")
    max_new_tokens: int | None = _f(None, "generation cap in tokens (default: the built-in "
                                          "task's; 64 with --prompts)")
    temperature: float | None = _f(None, "sampling temperature (log-probs use the same "
                                         "scaling; default 1 for the built-in model, 0.7 "
                                         "for a pretrained --model)")
    old_logprobs: str | None = _f(None, "PPO's old log-probs: sampler (those the sampler "
                                        "drew each token with; no extra forward pass) | "
                                        "recompute (the trainer's forward pass over the "
                                        "batch after sampling; default: recompute with "
                                        "rollout_is, else sampler)")
    precision: str = _f("fp32", "number format of the models' matrix products: fp32 | "
                                "bf16 (policy, reference and critic run under bfloat16 "
                                "autocast, as TRL's default bf16=True; weights, optimiser, "
                                "log-softmax, values and losses stay float32)")
    sampler_precision: str | None = _f(None, "number format of sampling alone: fp32 | bf16 "
                                             "(default: precision); a sampler in another "
                                             "format than the trainer is the rollout-"
                                             "training mismatch that rollout_is corrects")
    learning_rate: float | None = _f(None, "policy learning rate (AdamW; default: 2e-4 for "
                                           "the built-in model; a pretrained --model: "
                                           "1e-4 with LoRA, 1e-6 fully fine-tuned)")
    critic_lr: float = _f(1e-3, "critic learning rate")
    n_epochs: int | None = _f(None, "passes over each rollout batch (default 2 for the "
                                    "built-in model, 1 for a pretrained --model)")
    batch_size: int | None = _f(None, "sequences per minibatch, one optimiser step each "
                                      "(None: half the iteration's sequences)")
    grad_accum: int = _f(1, "micro-batches per minibatch (gradient accumulation)")
    agg: str | None = _f(None, "loss aggregation mode (ppokit.core.aggregate)")
    policy_loss: str | None = _f(None, "the surrogate: clip (PPO-Clip; the default), "
                                       "vanilla, gspo, gspo_token, cispo, or your own")
    clip_range: float | None = _f(None, "clip epsilon, the lower one with clip_range_high "
                                        "(default: the preset's; 0.2)")
    clip_range_high: float | None = _f(None, "upper clip epsilon (None: clip_range)")
    clip_range_vf: float | None = _f(0.2, "value clipping around V_old (None: off)")
    vf_coef: float = _f(0.5, "value-loss coefficient")
    ent_coef: float = _f(0.0, "entropy bonus coefficient")
    max_grad_norm: float = _f(1.0, "global gradient-norm clip over every trained "
                                   "parameter (policy and critic)")
    target_kl: float | None = _f(None, "early stop: a minibatch whose approx_kl exceeds "
                                       "1.5 x target_kl is not stepped")
    gamma: float = _f(1.0, "discount per action token")
    gae_lambda: float = _f(0.95, "GAE lambda (advantage_estimator gae)")
    advantage_estimator: str | None = _f(None, "gae | reinforce_pp | grpo | dr_grpo | rloo | "
                                               "reward_to_go | one registered with "
                                               "ppokit.register_advantage_estimator")
    use_critic: bool | None = _f(None, "learn a value model (needed by gae)")
    kl_mode: str | None = _f(None, "where the reference KL enters: reward (k1 per token) | "
                                   "loss (a term, kl_estimator) | none")
    kl_estimator: str = _f(DEFAULT_KL_LOSS_ESTIMATOR,
                           "kl_mode=loss: the term's per-token estimator: k2 (1/2 (log pi - "
                           "log pi_ref)^2; expected gradient that of KL(pi || pi_ref), the KL "
                           "penalised) | k3 (GRPO's pi_ref/pi - 1 - log(pi_ref/pi); unbiased "
                           "value, but expected gradient that of KL(pi_ref || pi))")
    kl_coef: float | None = _f(None, "beta: the weight of the KL to the reference")
    kl_target: float | None = _f(None, "adaptive beta (PPO paper rule) on the sequence KL")
    normalize_advantage: bool | None = _f(None, "whiten token advantages over the batch")
    normalize_std: bool | None = _f(None, "grpo: divide by the group std")
    score_norm: str = _f("none", "none | batch: whiten scores over the batch first")
    score_clip: float | None = _f(None, "clip scores to [-c, c] after normalisation")
    truncation: str | None = _f(None, "a response cut at max_new_tokens: none (scored as "
                                      "it is) | penalty | mask (left out of the loss: "
                                      "DAPO's overlong filtering) | bootstrap "
                                      "(docs/theory.md#truncated-responses; default: "
                                      "mask with algo dapo, else none)")
    truncation_penalty: float = _f(0.5, "truncation=penalty: subtracted from a truncated "
                                        "response's score")
    overlong_buffer: int | None = _f(None, "soft overlong punishment (DAPO): a completion "
                                           "longer than max_new_tokens - overlong_buffer "
                                           "tokens loses up to overlong_penalty, linearly "
                                           "in its length, reaching it at max_new_tokens "
                                           "(0: off; default: max_new_tokens / 5 with algo "
                                           "dapo, else 0)")
    overlong_penalty: float = _f(1.0, "soft overlong punishment: the penalty at "
                                      "max_new_tokens")
    dynamic_sampling: bool | None = _f(None, "DAPO's dynamic sampling: groups whose scores "
                                             "are all equal (no advantage) are dropped and "
                                             "more prompts sampled until the batch is full "
                                             "(default: on with algo dapo)")
    dynamic_sampling_rounds: int = _f(4, "dynamic sampling: most generation rounds per "
                                         "iteration; a batch still short after them is "
                                         "filled with dropped groups")
    rollout_is: str = _f("none", "rollout-training mismatch correction: none | truncate "
                                 "(token weight min(pi_old/pi_sampler, threshold)) | mask "
                                 "(tokens or sequences whose ratio leaves [threshold_lower, "
                                 "threshold] leave the loss); docs/llm_algorithms.md")
    rollout_is_level: str = _f("token", "rollout_is: per token | sequence (the geometric "
                                        "mean of its tokens' ratios)")
    rollout_is_threshold: float = _f(2.0, "rollout_is: the ratio's cap (truncate) or upper "
                                          "bound (mask); also the bound of the logged "
                                          "mismatch_frac_outside")
    rollout_is_threshold_lower: float | None = _f(None, "rollout_is=mask: the lower bound "
                                                        "(default: 1 / threshold)")
    critic: str = _f("separate", "separate backbone copy | shared policy backbone")
    lora_r: int | None = _f(None, "LoRA rank for the policy (0: full fine-tuning; default: 16 "
                                  "for a pretrained --model, 0 for the built-in model)")
    fsdp: bool = _f(False, "with several ranks (torchrun / --nproc): shard the policy, "
                    "reference and critic across them with FSDP2 (docs/llm_distributed.md)")
    lora_alpha: float | None = _f(None, "LoRA scaling alpha (default: 2 x lora_r)")
    guard_kl: float | None = _f(None, "divergence guard: an update that moves the policy more "
                                      "than this many nats per token (k3 of old vs new on "
                                      "its samples) is undone and retried at half the "
                                      "learning rate (0: off; default 0.5 for a pretrained "
                                      "--model, off for the built-in model)")
    guard_grad_norm: float | None = _f(None, "divergence guard: likewise for a gradient norm "
                                             "above this (before clipping; 0: off; default "
                                             "off)")
    guard_retries: int = _f(3, "divergence guard: halvings of the learning rate within one "
                                "iteration before training stops")
    sft_steps: int | None = _f(None, "warm-start SFT steps for the built-in model (None: "
                                     "the task's, 150 for reverse, 600 for arithmetic)")
    sft_lr: float = _f(3e-3, "warm-start SFT learning rate")
    seed: int = _f(0, "seed for everything")
    n_eval_prompts: int = _f(128, "held-out prompts for `ppokit llm eval` (and eval_every)")
    eval_every: int = _f(0, "score the policy on n_eval_prompts held-out prompts every N "
                            "iterations while training, logged as eval/score_mean, "
                            "eval/reward/NAME, ... (0: never)")
    checkpoint_every: int = _f(25, "iterations between checkpoints (and at the end)")
    samples_logged: int = _f(4, "completions written to samples.jsonl per iteration")

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
            _fail("algo", f"unknown algorithm {_brief(cfg.algo)}; known: {', '.join(ALGOS)}")
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
        if cfg.old_logprobs is None:
            cfg = replace(cfg, old_logprobs="sampler" if cfg.rollout_is == "none"
                          else "recompute")
        if cfg.rollout_is_threshold_lower is None and isinstance(
                cfg.rollout_is_threshold, (int, float)) and cfg.rollout_is_threshold > 0:
            cfg = replace(cfg, rollout_is_threshold_lower=1.0 / cfg.rollout_is_threshold)
        if cfg.clip_range is None:
            cfg = replace(cfg, clip_range=0.2)
        if cfg.batch_size is None:
            cfg = replace(cfg, batch_size=max(1, cfg.prompts_per_iter
                                              * cfg.samples_per_prompt // 2))
        _check_fields(cfg)
        if cfg.time_limit is not None and cfg.time_limit <= 0:
            cfg = replace(cfg, time_limit=None)
        if cfg.rollout_is != "none" and cfg.old_logprobs != "recompute":
            raise UsageError("rollout_is: a mismatch correction weighs the trainer's old "
                             "log-probs against the sampler's, so it needs "
                             "old_logprobs=recompute (its default with rollout_is)")
        if cfg.rollout_is_threshold_lower >= cfg.rollout_is_threshold:
            raise UsageError(f"rollout_is_threshold_lower: expected a bound below "
                             f"rollout_is_threshold={cfg.rollout_is_threshold:g}, got "
                             f"{cfg.rollout_is_threshold_lower:g}")
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
        cfg = replace(cfg, reward_weights=_weights(cfg.reward_weights))
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
        _check_memory(cfg)
        return cfg


# Bounds of the numeric fields: (integer, low, high, low_is_open). A field whose default
# is None may also be None. Coefficients stay within COEF_MAX so that their products with
# the losses stay finite in float32.
COEF_MAX = 1e6
MAX_SEQUENCES = 2**20  # prompts_per_iter * samples_per_prompt
LIMITS: dict[str, tuple[bool, float, float, bool]] = {
    "iterations": (True, 1, 10**9, False),
    "time_limit": (False, -1e12, 1e12, False),  # seconds; <= 0: no limit
    "prompts_per_iter": (True, 1, 65_536, False),
    "samples_per_prompt": (True, 1, 4096, False),
    "max_new_tokens": (True, 1, 65_536, False),
    "temperature": (False, 0.01, 100.0, False),
    "learning_rate": (False, 0.0, 10.0, True),
    "critic_lr": (False, 0.0, 10.0, True),
    "n_epochs": (True, 1, 10_000, False),
    "batch_size": (True, 1, MAX_SEQUENCES, False),
    "grad_accum": (True, 1, MAX_SEQUENCES, False),
    "clip_range": (False, 0.0, COEF_MAX, True),
    "clip_range_high": (False, 0.0, COEF_MAX, True),
    "clip_range_vf": (False, 0.0, COEF_MAX, True),
    "vf_coef": (False, 0.0, COEF_MAX, False),
    "ent_coef": (False, 0.0, COEF_MAX, False),
    "max_grad_norm": (False, 0.0, COEF_MAX, True),
    "target_kl": (False, 0.0, COEF_MAX, True),
    "gamma": (False, 0.0, 1.0, False),
    "gae_lambda": (False, 0.0, 1.0, False),
    "kl_coef": (False, 0.0, COEF_MAX, False),
    "kl_target": (False, 0.0, COEF_MAX, True),
    "score_clip": (False, 0.0, COEF_MAX, True),
    "truncation_penalty": (False, 0.0, COEF_MAX, False),
    "overlong_buffer": (True, 0, 65_536, False),
    "overlong_penalty": (False, 0.0, COEF_MAX, False),
    "dynamic_sampling_rounds": (True, 1, 1000, False),
    "rollout_is_threshold": (False, 1.0, COEF_MAX, False),
    "rollout_is_threshold_lower": (False, 0.0, 1.0, False),
    "lora_r": (True, 0, 65_536, False),
    "lora_alpha": (False, 0.0, COEF_MAX, True),
    "guard_kl": (False, 0.0, COEF_MAX, False),
    "guard_grad_norm": (False, 0.0, COEF_MAX, False),
    "guard_retries": (True, 0, 20, False),
    "sft_steps": (True, 1, 10**7, False),
    "sft_lr": (False, 0.0, 10.0, True),
    "seed": (True, 0, SEED_MAX, False),
    "n_eval_prompts": (True, 1, 10**6, False),
    "eval_every": (True, 0, 10**9, False),
    "eval_fraction": (False, 0.0, 0.99, False),
    "checkpoint_every": (True, 1, 10**9, False),
    "samples_logged": (True, 0, 10**6, False),
}
CHOICES = {"agg": AGGREGATION_MODES, "old_logprobs": ("sampler", "recompute"),
           "precision": ("fp32", "bf16"), "sampler_precision": ("fp32", "bf16"),
           "rollout_is": ("none", "truncate", "mask"),
           "rollout_is_level": ("token", "sequence"),
           "kl_mode": ("reward", "loss", "none"), "truncation": TRUNCATION,
           "kl_estimator": tuple(KL_LOSS_ESTIMATORS),
           "critic": ("separate", "shared"),
           "score_norm": ("none", "batch"),
           # the registries: their names when the configuration is checked
           "advantage_estimator": ADVANTAGE_ESTIMATORS, "policy_loss": POLICY_LOSSES}
PATHS = ("model", "prompts", "eval_prompts", "reward_model")
# checked by their own rules: reward entries (module:function, a directory or a callable)
# in _check_fields, reward_weights (finite numbers, one per reward) in resolved()
# task (a built-in name or reasoning-gym:NAME) and task_options in _check_task
SPECIAL = ("reward", "reward_weights", "task", "task_options")
FLAGS_BOOL = ("normalize_advantage", "normalize_std", "use_critic", "fsdp",
              "dynamic_sampling")

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlong = 40


def _brief(v) -> str:
    return _repr.repr(v)


def _fail(name: str, what: str, value=None, *, show: bool = False):
    err = UsageError(f"{name}: {what}, got {_brief(value)}" if show else f"{name}: {what}")
    err.field = name
    raise err




def range_text(name: str) -> str:
    integer, lo, hi, lo_open = LIMITS[name]
    if name == "time_limit":
        return "a finite number of seconds (0 or less: no limit)"
    if integer:
        return f"an integer in [{lo}, {hi}]"
    return f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"


def _check_fields(cfg: LLMConfig) -> None:
    optional = {f.name for f in fields(LLMConfig) if "None" in str(f.type)}
    for name, (integer, lo, hi, lo_open) in LIMITS.items():
        v = getattr(cfg, name)
        if v is None and name in optional:
            continue
        if not in_range(v, integer, lo, hi, lo_open):
            _fail(name, "expected " + range_text(name), v, show=True)
    for name, options in CHOICES.items():
        v = getattr(cfg, name)
        if isinstance(options, Registry) and isinstance(v, str) and v and not names_checked():
            continue  # reading a run: a part of the user's needs no import to be read
        if not isinstance(v, str) or v not in options:
            hint = f" ({IMPORT_HINT})" if isinstance(options, Registry) else ""
            _fail(name, f"expected one of {', '.join(options)}{hint}", v, show=True)
    for name in PATHS:
        v = getattr(cfg, name)
        if v is not None and not (isinstance(v, str) and v.strip() and "\0" not in v):
            _fail(name, "expected a non-empty path or name", v, show=True)
    if isinstance(cfg.model, str):  # a known model's name: fetched? (before any work)
        from ..modeling.fetch import resolve_model

        resolve_model(cfg.model)
    for name in FLAGS_BOOL:
        if not isinstance(getattr(cfg, name), bool):
            _fail(name, "expected true or false", getattr(cfg, name), show=True)
    from ..inputs.rewards import reward_entries

    for e in reward_entries(cfg.reward):
        if not callable(e) and not (isinstance(e, str) and "\0" not in e and (
                ":" in e.strip(":") or os.path.isdir(e))):
            _fail("reward", "expected 'module:function', a reward-model directory or a "
                  "callable", e, show=True)


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


def _weights(w):
    """``reward_weights`` as a tuple of finite floats (from a list or '1,0.5')."""
    import math

    if w is None:
        return None
    if isinstance(w, str):
        try:
            w = [float(x) for x in w.split(",") if x.strip()]
        except ValueError:
            _fail("reward_weights", "expected comma-separated numbers", w, show=True)
    if isinstance(w, (int, float)) and not isinstance(w, bool):
        w = [w]
    if not isinstance(w, (list, tuple)) or not w or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            and abs(x) <= COEF_MAX for x in w):
        _fail("reward_weights", "expected a non-empty list of finite numbers", w, show=True)
    return tuple(float(x) for x in w)


def _check_memory(cfg: LLMConfig) -> None:
    """Refuse a rollout whose per-token buffers alone (token ids, old, reference and new
    log-probs, values, advantages, returns, masks: at least 64 bytes a token) exceed the
    available memory, naming the largest of its three factors."""
    from ppokit.algos.config import available_memory

    tokens = cfg.prompts_per_iter * cfg.samples_per_prompt * (cfg.max_new_tokens or 1)
    need, avail = 64 * tokens, available_memory()
    if avail is None or need <= avail:
        return
    factors = {"prompts_per_iter": cfg.prompts_per_iter,
               "samples_per_prompt": cfg.samples_per_prompt,
               "max_new_tokens": cfg.max_new_tokens or 1}
    name = max(factors, key=factors.__getitem__)
    _fail(name, f"prompts_per_iter * samples_per_prompt * max_new_tokens = "
          f"{' * '.join(map(str, factors.values()))} = {tokens:,} tokens per iteration need "
          f"at least {need / 2**30:.1f} GiB, more than the {avail / 2**30:.1f} GiB of memory "
          "available")


def prompt_sets(cfg: LLMConfig) -> tuple[list[dict] | None, list[dict]]:
    """``(train_rows, held_out_rows)``. Built-in task: train rows are drawn on the fly
    (``None``) and the held-out set is fixed. A prompts dataset without ``eval_prompts``
    holds out its last ``eval_fraction`` of rows (:func:`ppokit.llm.inputs.data.split_rows`)."""
    from ..inputs.data import load_rows, split_rows

    if cfg.prompts is None:
        task = make_task(cfg.task, cfg.task_options)
        return None, [task.row(p) for p in task.heldout_prompts(cfg.n_eval_prompts)]
    rows = load_rows(cfg.prompts, "prompts")
    if cfg.eval_prompts:
        return rows, load_rows(cfg.eval_prompts, "eval_prompts")
    return split_rows(rows, cfg.eval_fraction, "prompts")


def load_prompts(path: str) -> list:
    """The prompts of a dataset file (strings, or message lists for conversations)."""
    from ..inputs.data import load_rows

    return [r["prompt"] for r in load_rows(path, "prompts")]


def config_dict(cfg: LLMConfig) -> dict:
    """The configuration as JSON values: a callable reward is recorded by its name
    (``python:module.function``), never as something to import."""
    from ..inputs.rewards import reward_entries, reward_label

    d = asdict(cfg)
    if cfg.reward is not None and not isinstance(cfg.reward, str):
        d["reward"] = ",".join(reward_label(e) for e in reward_entries(cfg.reward))
    if d.get("reward_weights") is not None:
        d["reward_weights"] = list(d["reward_weights"])
    return d


# ------------------------------------------------------------------ resolution and help

def _parse_value(name: str, text: str):
    """A ``--set`` value for field ``name``, typed by the field's annotation."""
    ann = str(next(f.type for f in fields(LLMConfig) if f.name == name))
    t = text.strip()
    if "None" in ann and t.lower() in ("none", "null", ""):
        return None
    base = ann.split("|")[0].strip()
    try:
        if base == "bool":
            low = t.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if base == "int":
            v = float(t)
            if not v.is_integer():
                raise ValueError
            return int(v)
        if base == "float":
            return float(t)
    except (ValueError, OverflowError):
        _fail(name, f"expected {base}", text, show=True)
    return t


def _known(name: str, where: str, log) -> str:
    """``name`` itself, or its current name for a deprecated one (said through ``log``)."""
    known = {f.name for f in fields(LLMConfig)}
    if name in known:
        return name
    if name in TRL_NAMES:
        return TRL_NAMES[name]
    if name in TRL_REFUSED:
        _fail(name, f"TRL's name, with no one-to-one ppokit key: {TRL_REFUSED[name]}")
    if name in DEPRECATED:
        new = DEPRECATED[name]
        if log is not None:
            extra = (" (a minibatch size in sequences, where minibatches was a count)"
                     if name == "minibatches" else "")
            log(f"{where}: '{name}' is deprecated; use '{new}'{extra}")
        return name  # resolved by config_from_values (minibatches needs the batch size)
    import difflib

    close = difflib.get_close_matches(name, sorted(known | set(DEPRECATED)), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    _fail(name, f"unknown key in {where}{hint}")
    return name


def config_from_values(*layers: tuple[str, dict], log=None) -> LLMConfig:
    """One :class:`LLMConfig` from layers of values, later layers winning (the order the
    command line uses: ``("--config FILE", toml), ("--set", sets), ("flags", flags)``; the
    algorithm preset fills what none of them sets). Deprecated names are accepted with a
    message through ``log``; an unknown name is an error with a suggestion."""
    merged: dict = {}
    for where, values in layers:
        for k, v in values.items():
            merged[_known(k, where, log)] = v
    minibatches = merged.pop("minibatches", None)
    for old, new in DEPRECATED.items():
        if old in merged:
            merged.setdefault(new, merged.pop(old))
            merged.pop(old, None)
    try:
        cfg = LLMConfig(**merged)
    except TypeError as exc:
        raise UsageError(f"config: {exc}") from None
    if minibatches is not None and "batch_size" not in merged:
        if isinstance(minibatches, bool) or not isinstance(minibatches, int) \
                or minibatches < 1:
            _fail("minibatches", "expected an integer >= 1", minibatches, show=True)
        r = replace(cfg, batch_size=None).resolved()
        total = r.prompts_per_iter * r.samples_per_prompt
        if total % minibatches:
            _fail("minibatches", f"the {total} sequences of an iteration do not split into "
                  f"{minibatches} minibatches", minibatches, show=True)
        cfg = replace(cfg, batch_size=total // minibatches)
    return cfg


def parse_sets(items: list[str], log=None) -> dict:
    """``["KEY=VALUE", ...]`` → typed values (deprecated keys kept for
    :func:`config_from_values` to rename)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        k = _known(k.strip(), "--set", log)
        out[k] = _parse_value(DEPRECATED.get(k, k), v) if k != "minibatches" else \
            _parse_value("batch_size", v)
    return out


def read_toml(path: str) -> dict:
    """The values of a TOML file (top level, or its ``[llm]`` table)."""
    from ppokit.cliutil import read_toml as _read

    return _read(path, "llm")


def config_help() -> str:
    """The keys of ``--set`` / ``--config`` with their defaults and documentation, from
    the fields' metadata."""
    lines = ["configuration keys (--set KEY=VALUE, --config FILE.toml, or --key VALUE):"]
    for f in fields(LLMConfig):
        default = "preset" if f.default is None and f.name in _PRESET_KEYS else f.default
        lines.append(f"  {f.name + ' = ' + str(default):<34} {f.metadata.get('help', '')}")
    lines.append("deprecated names (still accepted, with a message):")
    lines.append("  " + ", ".join(f"{o} -> {n}" for o, n in DEPRECATED.items()))
    return "\n".join(lines)


_PRESET_KEYS = {k for p in (*PRESETS.values(), *MODEL_DEFAULTS.values()) for k in p} | {
    "algo", "learning_rate", "lora_alpha", "max_new_tokens"}
