"""Token-level RLHF settings (:class:`LLMConfig`), the algorithm presets and prompt files."""

from __future__ import annotations

import json
import math
import os
import reprlib
from dataclasses import dataclass, fields, replace

from ppokit.algos.config import SEED_MAX
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
        """Fill preset defaults and validate every field; errors name the field (the flag
        of ``ppokit llm train`` is the field with dashes: ``kl_coef`` is ``--kl-coef``)."""
        if not isinstance(self.algo, str) or self.algo not in ALGOS:
            _fail("algo", f"unknown algorithm {_brief(self.algo)}; known: {', '.join(ALGOS)}")
        preset = PRESETS[self.algo]
        upd = {k: v for k, v in preset.items() if getattr(self, k) is None}
        cfg = replace(self, **upd)
        if cfg.algo == "dr-grpo":
            cfg = replace(cfg, normalize_std=False)
        _check_fields(cfg)
        if cfg.time_limit is not None and cfg.time_limit <= 0:
            cfg = replace(cfg, time_limit=None)
        if cfg.truncation == "bootstrap" and cfg.algo != "ppo":
            raise UsageError("truncation: 'bootstrap' needs a critic (algo ppo); use "
                             "'penalty' or 'mask'")
        if cfg.algo in ("grpo", "dr-grpo", "rloo") and cfg.samples_per_prompt < 2:
            raise UsageError(f"samples_per_prompt: {cfg.algo} needs at least 2, got "
                             f"{cfg.samples_per_prompt}")
        if cfg.lora_r > 0:
            import importlib.util

            if importlib.util.find_spec("peft") is None:
                raise UsageError("lora_r: LoRA needs peft (pip install peft)")
        if cfg.reward and cfg.reward_model:
            raise UsageError("reward: give --reward or --reward-model, not both")
        batch = cfg.prompts_per_iter * cfg.samples_per_prompt
        if batch > MAX_SEQUENCES:
            raise UsageError(f"prompts_per_iter: prompts_per_iter * samples_per_prompt = "
                             f"{cfg.prompts_per_iter} * {cfg.samples_per_prompt} = {batch} "
                             f"sequences per iteration; at most {MAX_SEQUENCES}")
        if batch % cfg.minibatches or (batch // cfg.minibatches) % cfg.grad_accum:
            raise UsageError(f"minibatches/grad_accum: the batch of {batch} sequences must split "
                             f"into {cfg.minibatches} minibatches of {cfg.grad_accum} equal "
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
    "lr": (False, 0.0, 10.0, True),
    "critic_lr": (False, 0.0, 10.0, True),
    "epochs": (True, 1, 10_000, False),
    "minibatches": (True, 1, MAX_SEQUENCES, False),
    "grad_accum": (True, 1, MAX_SEQUENCES, False),
    "clip_eps": (False, 0.0, COEF_MAX, True),
    "clip_range_vf": (False, 0.0, COEF_MAX, True),
    "vf_coef": (False, 0.0, COEF_MAX, False),
    "ent_coef": (False, 0.0, COEF_MAX, False),
    "max_grad_norm": (False, 0.0, COEF_MAX, True),
    "target_kl": (False, 0.0, COEF_MAX, True),
    "gamma": (False, 0.0, 1.0, False),
    "lam": (False, 0.0, 1.0, False),
    "kl_coef": (False, 0.0, COEF_MAX, False),
    "kl_target": (False, 0.0, COEF_MAX, True),
    "score_clip": (False, 0.0, COEF_MAX, True),
    "truncation_penalty": (False, 0.0, COEF_MAX, False),
    "lora_r": (True, 0, 65_536, False),
    "lora_alpha": (False, 0.0, COEF_MAX, True),
    "sft_steps": (True, 1, 10**7, False),
    "sft_lr": (False, 0.0, 10.0, True),
    "seed": (True, 0, SEED_MAX, False),
    "n_eval_prompts": (True, 1, 10**6, False),
    "checkpoint_every": (True, 1, 10**9, False),
    "samples_logged": (True, 0, 10**6, False),
}
CHOICES = {"agg": AGGREGATION_MODES, "kl_mode": ("reward", "loss", "none"),
           "truncation": TRUNCATION, "critic": ("separate", "shared"),
           "score_norm": ("none", "batch")}
PATHS = ("model", "prompts", "eval_prompts", "reward", "reward_model")
FLAGS_BOOL = ("whiten_advantages", "normalize_std")

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlong = 40


def _brief(v) -> str:
    return _repr.repr(v)


def _fail(name: str, what: str, value=None, *, show: bool = False):
    err = UsageError(f"{name}: {what}, got {_brief(value)}" if show else f"{name}: {what}")
    err.field = name
    raise err


def _finite(v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


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
        if integer:
            ok = isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
        else:
            ok = _finite(v) and (lo < v if lo_open else lo <= v) and v <= hi
        if not ok:
            _fail(name, "expected " + range_text(name), v, show=True)
    for name, options in CHOICES.items():
        v = getattr(cfg, name)
        if not isinstance(v, str) or v not in options:
            _fail(name, f"expected one of {', '.join(options)}", v, show=True)
    for name in PATHS:
        v = getattr(cfg, name)
        if v is not None and not (isinstance(v, str) and v.strip() and "\0" not in v):
            _fail(name, "expected a non-empty path or name", v, show=True)
    for name in FLAGS_BOOL:
        if not isinstance(getattr(cfg, name), bool):
            _fail(name, "expected true or false", getattr(cfg, name), show=True)


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
