"""Token-level RLHF settings (:class:`LLMConfig`), the algorithm presets and prompt files."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace

from ppokit.core.losses import AGGREGATION_MODES
from ppokit.errors import UsageError

from .task import ReverseTask

__all__ = ["ALGOS", "TRUNCATION", "PRESETS", "LLMConfig", "prompt_sets", "load_prompts",
           "config_from_run"]

ALGOS = ("ppo", "grpo", "dr-grpo", "rloo", "reinforce++")
TRUNCATION = ("bootstrap", "penalty", "mask")

# Preset defaults applied where a field is left at None.
PRESETS = {
    "ppo": {"prompts_per_iter": 64, "samples_per_prompt": 1, "kl_mode": "reward", "kl_coef": 0.02,
            "agg": "token-mean", "whiten_advantages": True},
    "grpo": {"prompts_per_iter": 16, "samples_per_prompt": 4, "kl_mode": "loss", "kl_coef": 0.02,
             "agg": "seq-mean-token-mean", "whiten_advantages": False},
    "dr-grpo": {"prompts_per_iter": 16, "samples_per_prompt": 4, "kl_mode": "loss", "kl_coef": 0.02,
                "agg": "seq-mean-token-sum-norm", "whiten_advantages": False},
    "rloo": {"prompts_per_iter": 16, "samples_per_prompt": 4, "kl_mode": "reward", "kl_coef": 0.02,
             "agg": "token-mean", "whiten_advantages": False},
    "reinforce++": {"prompts_per_iter": 64, "samples_per_prompt": 1, "kl_mode": "reward",
                    "kl_coef": 0.02, "agg": "token-mean", "whiten_advantages": False},
}


@dataclass(frozen=True)
class LLMConfig:
    """Token-level RLHF settings. ``None`` means "the algorithm preset's default"."""

    algo: str = "ppo"  # ppo | grpo | dr-grpo | rloo | reinforce++
    model: str | None = None  # local HF causal LM dir; None: built-in tiny model + warm start
    prompts: str | None = None  # JSONL with {"prompt": ...}; None: the built-in task
    eval_prompts: str | None = None  # JSONL of held-out prompts (with --prompts)
    reward: str | None = None  # module:function; None: the built-in task's rule
    reward_model: str | None = None  # dir saved by `ppokit llm rm`
    iterations: int = 400  # training iterations (rollout + update)
    time_limit: float | None = 480.0  # stop training after this many seconds (<= 0: no limit)
    prompts_per_iter: int | None = None  # distinct prompts per iteration
    samples_per_prompt: int | None = None  # completions per prompt (group size G)
    max_new_tokens: int | None = None  # generation cap (default: the task's)
    temperature: float = 1.0  # sampling temperature (log-probs use the same scaling)
    lr: float = 2e-4  # policy learning rate (AdamW)
    critic_lr: float = 1e-3  # critic learning rate
    epochs: int = 2  # passes over each rollout batch
    minibatches: int = 2  # minibatches per epoch (one optimiser step each)
    grad_accum: int = 1  # micro-batches per minibatch (gradient accumulation)
    agg: str | None = None  # loss aggregation mode (ppokit.core.aggregate)
    clip_eps: float = 0.2  # PPO-Clip epsilon
    clip_range_vf: float | None = 0.2  # value clipping around V_old (None: off)
    vf_coef: float = 0.5  # value-loss weight
    ent_coef: float = 0.0  # entropy bonus weight
    max_grad_norm: float = 1.0  # gradient clipping (per model)
    target_kl: float | None = None  # early stop when a minibatch's approx_kl exceeds it
    gamma: float = 1.0  # discount per action token
    lam: float = 0.95  # GAE lambda (ppo)
    kl_mode: str | None = None  # reward (k1 per token) | loss (k3 term) | none
    kl_coef: float | None = None  # beta
    kl_target: float | None = None  # adaptive beta (PPO paper rule) on the sequence KL
    whiten_advantages: bool | None = None  # batch-scope whitening of token advantages
    normalize_std: bool = True  # grpo: divide by the group std
    score_norm: str = "none"  # none | batch: whiten scores over the batch first
    score_clip: float | None = None  # clip scores to [-c, c] after normalisation
    truncation: str = "penalty"  # bootstrap | penalty | mask
    truncation_penalty: float = 0.5  # subtracted from a truncated response's score
    critic: str = "separate"  # separate backbone copy | shared policy backbone
    lora_r: int = 0  # LoRA rank for the policy (0: full fine-tuning; needs peft)
    lora_alpha: float = 16.0  # LoRA scaling alpha
    sft_steps: int = 150  # warm-start SFT steps for the built-in model
    sft_lr: float = 3e-3  # warm-start SFT learning rate
    seed: int = 0  # seed for everything
    n_eval_prompts: int = 128  # held-out prompts for `ppokit llm eval`
    checkpoint_every: int = 25  # iterations between checkpoints (and at the end)
    samples_logged: int = 4  # completions written to samples.jsonl per iteration

    def resolved(self) -> LLMConfig:
        """Fill preset defaults and validate; errors name the field."""
        if self.algo not in ALGOS:
            raise UsageError(f"algo: unknown algorithm {self.algo!r}; known: {', '.join(ALGOS)}")
        preset = PRESETS[self.algo]
        upd = {k: v for k, v in preset.items() if getattr(self, k) is None}
        cfg = replace(self, **upd)
        if cfg.algo == "dr-grpo":
            cfg = replace(cfg, normalize_std=False)
        if cfg.time_limit is not None and cfg.time_limit <= 0:
            cfg = replace(cfg, time_limit=None)
        if cfg.agg not in AGGREGATION_MODES:
            raise UsageError(f"agg: unknown mode {cfg.agg!r}; known: "
                             f"{', '.join(AGGREGATION_MODES)}")
        if cfg.kl_mode not in ("reward", "loss", "none"):
            raise UsageError(f"kl_mode: expected reward, loss or none, got {cfg.kl_mode!r}")
        if cfg.truncation not in TRUNCATION:
            raise UsageError(f"truncation: expected one of {', '.join(TRUNCATION)}, got "
                             f"{cfg.truncation!r}")
        if cfg.truncation == "bootstrap" and cfg.algo != "ppo":
            raise UsageError("truncation: 'bootstrap' needs a critic (algo ppo); use "
                             "'penalty' or 'mask'")
        if cfg.algo in ("grpo", "dr-grpo", "rloo") and cfg.samples_per_prompt < 2:
            raise UsageError(f"samples_per_prompt: {cfg.algo} needs at least 2, got "
                             f"{cfg.samples_per_prompt}")
        if cfg.lora_r < 0:
            raise UsageError(f"lora_r: expected an integer >= 0, got {cfg.lora_r}")
        if cfg.lora_r > 0:
            import importlib.util

            if importlib.util.find_spec("peft") is None:
                raise UsageError("lora_r: LoRA needs peft (pip install peft)")
        if cfg.critic not in ("separate", "shared"):
            raise UsageError(f"critic: expected separate or shared, got {cfg.critic!r}")
        if cfg.score_norm not in ("none", "batch"):
            raise UsageError(f"score_norm: expected none or batch, got {cfg.score_norm!r}")
        if cfg.reward and cfg.reward_model:
            raise UsageError("reward: give --reward or --reward-model, not both")
        for name in ("iterations", "prompts_per_iter", "samples_per_prompt", "epochs",
                     "minibatches", "grad_accum"):
            if int(getattr(cfg, name)) < 1:
                raise UsageError(f"{name}: expected an integer >= 1, got {getattr(cfg, name)}")
        batch = cfg.prompts_per_iter * cfg.samples_per_prompt
        if batch % cfg.minibatches or (batch // cfg.minibatches) % cfg.grad_accum:
            raise UsageError(f"minibatches/grad_accum: the batch of {batch} sequences must split "
                             f"into {cfg.minibatches} minibatches of {cfg.grad_accum} equal "
                             "micro-batches")
        if cfg.kl_coef < 0:
            raise UsageError(f"kl_coef: expected a number >= 0, got {cfg.kl_coef}")
        if cfg.kl_target is not None and cfg.kl_coef == 0:
            raise UsageError("kl_target: an adaptive beta needs kl_coef > 0 to start from")
        if cfg.temperature <= 0:
            raise UsageError(f"temperature: expected a number > 0, got {cfg.temperature}")
        return cfg


def prompt_sets(cfg: LLMConfig) -> tuple[list[str] | None, list[str]]:
    """``(train_prompts, held_out_prompts)``. Built-in task: train prompts are drawn on the
    fly (``None``) and the held-out set is fixed. A prompts file without ``eval_prompts``
    keeps its last ``min(n_eval_prompts, 10 %)`` lines (at least one) out of training."""
    if cfg.prompts is None:
        return None, ReverseTask().heldout_prompts(cfg.n_eval_prompts)
    prompts = load_prompts(cfg.prompts)
    if cfg.eval_prompts:
        return prompts, load_prompts(cfg.eval_prompts)
    if len(prompts) < 2:
        raise UsageError("prompts: need at least 2 prompts to hold one out (or give "
                         "--eval-prompts)")
    n = max(1, min(cfg.n_eval_prompts, len(prompts) // 10))
    return prompts[:-n], prompts[-n:]


def load_prompts(path: str) -> list[str]:
    """Prompts from JSONL (one ``{"prompt": ...}`` object a line) or plain text lines."""
    if not os.path.exists(path):
        raise UsageError(f"prompts: no such file {path!r}")
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"prompts: {path}:{i}: bad JSON: {exc}") from None
                if "prompt" not in obj:
                    raise UsageError(f"prompts: {path}:{i}: no 'prompt' key")
                out.append(str(obj["prompt"]))
            else:
                out.append(line)
    if not out:
        raise UsageError(f"prompts: {path!r} holds no prompts")
    return out


def config_from_run(run_dir: str, **overrides) -> LLMConfig:
    p = os.path.join(run_dir, "config.json")
    if not os.path.exists(p):
        raise UsageError(f"run dir: {run_dir!r} has no config.json")
    with open(p) as f:
        data = json.load(f)
    known = {f.name for f in fields(LLMConfig)}
    data = {k: v for k, v in data.items() if k in known}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return LLMConfig(**data)
