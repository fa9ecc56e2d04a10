"""Pre-flight checks for language-model policies in the ``[B, L]`` token layout.

A batch of left-padded prompts is completed by the model (plain sampling), and some rows are
ended early with EOS and right-padded, so the batch holds prompt tokens, left padding, action
tokens and right padding. Then:

* ``token-action-mask``: the action mask marks generated tokens only (never a prompt or a
  padding position) and every row has at least one action;
* ``token-ratio-identity``: old log-probs from one forward pass over the whole batch and new
  log-probs from an identical copy run on micro-batches give ratio 1 on every action token;
* ``padding-invariance``: replacing the *contents* of every padding position, with the
  attention mask, the valid tokens and their positions unchanged, changes neither the loss
  nor any action token's log-prob (a model that ignores the attention mask, or a mask that
  counts padding as actions, fails here);
* ``zero-advantage-gradient``, ``flipped-advantage-direction`` and
  ``surrogate-finite-difference`` as for environment policies, on the action tokens (the
  finite differences with respect to the tokens' log-probs only).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from ppokit.core import clipped_surrogate_loss

from .policy_checks import (
    Batch,
    check_finite_difference,
    check_flipped_direction,
    check_zero_advantage,
)
from .result import CheckReport, CheckResult

__all__ = ["run_token_checks", "TokenBatch", "make_token_batch", "token_surrogate",
           "default_prompts", "ratio_tolerance"]

Tensor = torch.Tensor
PAD_TOL = 1e-5
# up to this many parameters the direction check runs on a float64 copy and the label
# check trains every weight; a larger model steps in its own dtype (a normalised step of
# 1e-4 moves log-probs by ~1e-3, far above float32 rounding) and the label check trains
# LoRA adapters, as ppokit llm train does a pretrained model by default, rather than
# spend seconds copying gigabytes
FLOAT64_PARAMS = 20_000_000
RATIO_TOL_FLOOR = 1e-6    # float64 models, and the tightest a float32 model is held to
RATIO_TOL_CAP = 0.05      # above it a dtype cannot tell rounding from a bug (bf16's own)


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def ratio_tolerance(model, seq_len: int) -> float:
    """How far ``exp(logp_new − logp_old)`` may stray from 1 between a whole-batch pass
    and micro-batch passes of the same weights from rounding alone: the two passes sum
    the same products in different orders (other matrix shapes, other kernels, other
    thread splits). A sum of ``n`` rounded terms moves by about ``eps·√n`` of its size; each
    of the model's ``layers`` adds its hidden-size sums (``d``) and its attention sums over
    the sequence (``seq_len``), so ``tol = eps · layers · (√d + √seq_len)``, ``eps`` the
    machine epsilon of the parameters' dtype, at least :data:`RATIO_TOL_FLOOR` and at most
    :data:`RATIO_TOL_CAP`. SmolLM2-135M in float32 (30 layers, d 576, ~60 tokens):
    1.2e-7 · 30 · (24 + 7.7) = 1.1e-4, against the 1.4e-5 seen with two threads; dropout
    left on moves ratios by 0.1 and more."""
    conf = getattr(model, "config", None)
    layers = next((v for k in ("num_hidden_layers", "n_layer", "num_layers")
                   if isinstance(v := getattr(conf, k, None), int) and v > 0), 1)
    d = next((v for k in ("hidden_size", "n_embd", "d_model")
              if isinstance(v := getattr(conf, k, None), int) and v > 0), 1)
    p = next(model.parameters(), None)
    dtype = p.dtype if p is not None and p.dtype.is_floating_point else torch.float32
    tol = torch.finfo(dtype).eps * layers * (d ** 0.5 + max(seq_len, 1) ** 0.5)
    return float(min(max(tol, RATIO_TOL_FLOOR), RATIO_TOL_CAP))


def token_surrogate(clip_eps: float = 0.2):
    """PPO-Clip over action tokens, token-mean: ``(logp, logp_old, adv, mask=None) -> loss``
    for ``[B, L]`` (with mask) or ``[M]`` inputs."""

    def surrogate(logp, logp_old, advantages, mask=None):
        return clipped_surrogate_loss(logp, logp_old, advantages, mask, clip_eps=clip_eps,
                                      agg="token-mean").loss

    return surrogate


def _default_logprobs(model, input_ids, attention_mask):
    from ppokit.llm.modeling.rollout import sequence_logprobs

    return sequence_logprobs(model, input_ids, attention_mask)["logp"]


def _logprobs_native(model, input_ids, attention_mask):
    """The same token-convention log-probs as ppokit's default, kept in the model's own
    dtype (the default casts logits to float32, too coarse for finite differences)."""
    from ppokit.llm.modeling.rollout import position_ids_from_mask, shift_to_tokens

    pos = position_ids_from_mask(attention_mask)
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=pos).logits[:, :-1, :]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return shift_to_tokens(lp)


def default_prompts(tokenizer) -> list[str]:
    """Prompts of different lengths (so left padding occurs) in the tokenizer's alphabet."""
    from ppokit.llm.modeling.models import is_builtin

    if is_builtin(tokenizer):
        return ["381>", "90417>", "5>", "662014>", "27>", "1234>"]
    return ["Hello", "The weather today is", "1 2 3", "Once upon a time there was a",
            "Q:", "A list of colours: red, green,"]


class TokenBatch:
    """``input_ids``, ``attention_mask`` and the rollout's ``action_mask`` (``[B, L]``),
    plus the prompt width ``prompt_len``."""

    def __init__(self, input_ids, attention_mask, action_mask, prompt_len: int):
        self.input_ids = input_ids
        self.attention_mask = attention_mask
        self.action_mask = action_mask
        self.prompt_len = prompt_len


def make_token_batch(model, tokenizer, prompts: list[str] | None = None, *,
                     max_new_tokens: int = 8, seed: int = 0) -> TokenBatch:
    """Sample completions and end every other row early (EOS + right padding)."""
    from ppokit.llm.modeling.rollout import encode_prompts, generate

    prompts = prompts or default_prompts(tokenizer)
    gen = torch.Generator().manual_seed(seed)
    ids, mask = encode_prompts(tokenizer, prompts)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    with torch.no_grad():
        roll = generate(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=eos,
                        pad_token_id=pad, temperature=1.0, generator=gen)
    input_ids = roll.input_ids.clone()
    attn = roll.attention_mask.clone()
    act = roll.action_mask.clone()
    p = roll.prompt_len
    width = input_ids.shape[1] - p
    for b in range(0, input_ids.shape[0], 2):
        n_act = int(act[b].sum())
        cut = min(n_act, max(1, width // 2)) - 1  # the EOS goes here; later positions: pad
        if cut < 0 or width < 2:
            continue
        input_ids[b, p + cut] = eos
        input_ids[b, p + cut + 1:] = pad
        attn[b, p + cut + 1:] = 0
        act[b, p + cut + 1:] = False
    return TokenBatch(input_ids, attn, act, p)


class _TokenAdapter(nn.Module):
    """Presents a causal LM on a fixed token batch as a policy whose "observations" are row
    indices and whose per-sample log-probs are the action tokens of those rows (row-major),
    so the environment-policy gradient checks apply unchanged."""

    def __init__(self, model, batch: TokenBatch, mask: Tensor, logprob_fn):
        super().__init__()
        self.model = model
        self.batch = batch
        self.mask = mask
        self.logprob_fn = logprob_fn

    def evaluate(self, obs, actions):
        rows = obs.long()
        lp = self.logprob_fn(self.model, self.batch.input_ids[rows],
                             self.batch.attention_mask[rows])
        return lp[self.mask[rows]], None, None


def _check_action_mask(batch: TokenBatch, mask: Tensor) -> CheckResult:
    cols = torch.arange(mask.shape[1])
    on_prompt = int((mask & (cols < batch.prompt_len)).sum())
    on_pad = int((mask & (batch.attention_mask == 0)).sum())
    empty = int((mask.sum(1) == 0).sum())
    ok = on_prompt == 0 and on_pad == 0 and empty == 0
    return CheckResult(
        "token-action-mask", ok,
        f"{int(mask.sum())} action tokens; {on_prompt} on prompt, {on_pad} on padding, "
        f"{empty} rows without action",
        "0 on prompt or padding, none empty",
        "" if ok else "the action mask marks positions that the policy did not generate: "
        "prompt and padding must never count as actions.",
        {"on_prompt": on_prompt, "on_padding": on_pad, "empty_rows": empty})


def _check_ratio_identity(model, batch: TokenBatch, mask: Tensor, logprob_fn,
                          micro: int = 2) -> CheckResult:
    with torch.no_grad():
        old = logprob_fn(model, batch.input_ids, batch.attention_mask)
        new_model = copy.deepcopy(model)
        parts = []
        for start in range(0, batch.input_ids.shape[0], micro):
            sl = slice(start, start + micro)
            parts.append(logprob_fn(new_model, batch.input_ids[sl], batch.attention_mask[sl]))
        new = torch.cat(parts)
    lr = (new.double() - old.double())[mask]
    dev = float((torch.exp(lr) - 1).abs().max()) if lr.numel() else 0.0
    k3 = float((torch.expm1(lr) - lr).mean()) if lr.numel() else 0.0
    tol = ratio_tolerance(model, batch.input_ids.shape[1])
    ok = dev <= tol and k3 <= tol * tol / 2  # k3 ≈ (ρ−1)²/2 for small deviations
    return CheckResult(
        "token-ratio-identity", ok,
        f"max|ρ−1| {dev:.3g}, approx_kl {k3:.3g} over {int(mask.sum())} action tokens",
        f"max|ρ−1| ≤ {tol:.2g}, k3 ≤ {tol * tol / 2:.2g} (the dtype's rounding over the "
        "model's layers and sequence, docs/checks.md)",
        "" if ok else "log-probs of the same tokens differ between a whole-batch pass and "
        "micro-batch passes of an identical model: look for dropout (train mode), "
        "batch-dependent padding or positions, or a sampling temperature applied on one side.",
        {"max_ratio_dev": dev, "approx_kl": k3, "tolerance": tol})


def _check_padding(model, batch: TokenBatch, mask: Tensor, logprob_fn, surrogate,
                   seed: int) -> CheckResult:
    gen = torch.Generator().manual_seed(seed + 3)
    pad = batch.attention_mask == 0
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or
                int(batch.input_ids.max()) + 1)
    changed = batch.input_ids.clone()
    noise = torch.randint(0, vocab, changed.shape, generator=gen)
    noise = torch.where(noise == changed, (noise + 1) % vocab, noise)
    changed[pad] = noise[pad]
    with torch.no_grad():
        lp1 = logprob_fn(model, batch.input_ids, batch.attention_mask)
        lp2 = logprob_fn(model, changed, batch.attention_mask)
        old = lp1 + 0.1 * torch.randn(lp1.shape, generator=gen)
        adv = torch.randn(lp1.shape, generator=gen)
        l1 = float(surrogate(lp1, old, adv, mask))
        l2 = float(surrogate(lp2, old, adv, mask))
    dlp = float((lp1 - lp2)[mask].abs().max()) if bool(mask.any()) else 0.0
    dl = abs(l1 - l2)
    ok = dl <= PAD_TOL * (1 + abs(l1)) and dlp <= PAD_TOL
    return CheckResult(
        "padding-invariance", ok,
        f"|Δloss| {dl:.3g}, max|Δlogp| on actions {dlp:.3g} ({int(pad.sum())} padding "
        "positions changed)",
        f"both ≤ {PAD_TOL:g}",
        "" if ok else "changing what sits in padding positions changed the loss: either the "
        "model reads padding (the attention mask is not applied) or the loss mask counts "
        "padding positions as actions.",
        {"loss_change": dl, "max_logp_change": dlp})


def run_token_checks(model, tokenizer, *, prompts: list[str] | None = None,
                     max_new_tokens: int = 8, surrogate=None, clip_eps: float = 0.2,
                     logprob_fn: Callable | None = None,
                     mask_fn: Callable[[TokenBatch], Tensor] | None = None,
                     batch: TokenBatch | None = None, seed: int = 0,
                     labels: bool = True, trainer_cls=None,
                     target: str | None = None, log: Callable | None = None) -> CheckReport:
    """Run the token-layout checks on a causal LM (``transformers`` model or any module with
    the same ``forward(input_ids, attention_mask, position_ids)``).

    Args:
        logprob_fn: ``(model, input_ids, attention_mask) -> [B, L]`` log-probs in the token
            convention; default ppokit's :func:`ppokit.llm.modeling.rollout.sequence_logprobs`.
        mask_fn: ``TokenBatch -> [B, L]`` bool action mask; default the rollout's own.
        surrogate: ``(logp, logp_old, adv, mask=None) -> loss``, called with ``[B, L]`` and
            a mask, or with ``[M]`` action tokens; default PPO-Clip, token-mean.
        labels: also run ``token-labels-frozen``: one iteration of ppokit's token trainer
            (``trainer_cls``, default :class:`ppokit.llm.training.trainer.TokenTrainer`) on the
            built-in task with a copy of ``model``.
        log: called with a progress line before each step (``ppokit check`` prints them
            on stderr: on a pretrained model the checks take tens of seconds).
    """
    logprob_fn = logprob_fn or _default_logprobs
    surrogate = surrogate or token_surrogate(clip_eps)

    def step(what: str) -> None:
        if log is not None:
            log(f"check: {what}")

    was_training = model.training
    model.eval()
    try:
        if batch is None:
            step("sampling the token batch")
            batch = make_token_batch(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                     seed=seed)
        mask = (mask_fn(batch) if mask_fn is not None else batch.action_mask).bool()
        step("token-ratio-identity, padding-invariance")
        results = [
            _check_action_mask(batch, mask),
            _check_ratio_identity(model, batch, mask, logprob_fn),
            _check_padding(model, batch, mask, logprob_fn, surrogate, seed),
        ]
        adapter = _TokenAdapter(model, batch, mask, logprob_fn)
        rows = torch.arange(batch.input_ids.shape[0], dtype=torch.float32)
        with torch.no_grad():
            logp_old = adapter.evaluate(rows, None)[0].detach()
        tb = Batch(rows, torch.zeros(len(rows), dtype=torch.long), logp_old)
        fd_adapter = adapter if logprob_fn is not _default_logprobs else _TokenAdapter(
            model, batch, mask, _logprobs_native)
        # Only with respect to the action tokens' log-probs: transformer layers often run
        # parts of their maths in float32 even in a float64 model (e.g. RMSNorm), so a
        # finite difference through the parameters would measure that rounding.
        step("zero-advantage-gradient")
        results.append(check_zero_advantage(adapter, tb, surrogate, seed=seed))
        step("flipped-advantage-direction (two optimiser steps)")
        results.append(check_flipped_direction(adapter, tb, surrogate, seed=seed,
                                               float64=_n_params(model) <= FLOAT64_PARAMS))
        step("surrogate-finite-difference")
        results.append(check_finite_difference(fd_adapter, tb, surrogate, seed=seed,
                                               samples=4, directions=0))
        if labels:
            from ppokit.llm.training.config import MODEL_DEFAULTS

            from .labels import check_token_labels_frozen

            large = _n_params(model) > FLOAT64_PARAMS
            step("token-labels-frozen (one trainer iteration"
                 + (", LoRA as for a pretrained model)" if large else ")"))
            lora = MODEL_DEFAULTS["pretrained"]["lora_r"] if large else 0
            results.append(check_token_labels_frozen(model, tokenizer, trainer_cls=trainer_cls,
                                                     seed=seed, lora_r=lora))
    finally:
        model.train(was_training)
    return CheckReport(target or type(model).__name__, results)
