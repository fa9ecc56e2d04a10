"""Bradley–Terry reward models: a sequence-classification head (one output) trained on
preference pairs with ``loss = −log σ(r(chosen) − r(rejected))``; held-out pair accuracy
is the share of held-out pairs where ``r(chosen) > r(rejected)``.

The reward of a sequence is the head's output at its last token
(:func:`ppokit.llm.modeling.pairs.reward_forward`, importable from here). Sequences are laid out
``[BOS] prompt completion EOS`` and left padded, so the last column is always that EOS.
"""

from __future__ import annotations

import json
import math
import os
import random
import time

import torch
import torch.nn.functional as F

from ppokit.errors import UsageError

from ..modeling.models import load_tokenizer, quiet_transformers
from ..modeling.pairs import encode_pairs, reward_forward
from ..modeling.tuning import check_finite_model
from .guards import check_pairs, check_rm_args

__all__ = ["reward_forward", "build_reward_model", "train_reward_model", "pair_accuracy"]


def build_reward_model(model_path: str | None = None, *, seed: int = 0, **tiny_kwargs):
    """``(model, tokenizer)``: a one-label sequence classifier from a local causal-LM
    directory's body (new head), or the built-in tiny architecture."""
    from transformers import AutoModelForSequenceClassification, LlamaForSequenceClassification

    from ..modeling.models import build_char_tokenizer, build_tiny_model

    quiet_transformers()
    torch.manual_seed(seed)
    if model_path is None:
        tok = build_char_tokenizer()
        lm = build_tiny_model(tok, seed=seed, **tiny_kwargs)
        cfg = lm.config
        cfg.num_labels = 1
        model = LlamaForSequenceClassification(cfg)
        return model, tok
    tok = load_tokenizer(model_path)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            model_path, num_labels=1, trust_remote_code=False, use_safetensors=True)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"--model: cannot build a reward model from {model_path!r}: "
                         f"{exc}") from None
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id
    return model, tok


def _pair_rewards(model, tok, batch):
    prompts = [p["prompt"] for p in batch]
    ids_c, attn_c, _ = encode_pairs(tok, prompts, [p["chosen"] for p in batch])
    ids_r, attn_r, _ = encode_pairs(tok, prompts, [p["rejected"] for p in batch])
    return reward_forward(model, ids_c, attn_c), reward_forward(model, ids_r, attn_r)


@torch.no_grad()
def pair_accuracy(model, tok, pairs, batch_size: int = 128) -> float:
    model.eval()
    hits = 0
    for i in range(0, len(pairs), batch_size):
        rc, rr = _pair_rewards(model, tok, pairs[i:i + batch_size])
        hits += int((rc > rr).sum())
    return hits / max(len(pairs), 1)


def train_reward_model(model, tok, train_pairs, eval_pairs, *, epochs: int = 3,
                       batch_size: int = 32, lr: float = 1e-3, seed: int = 0, log=None) -> dict:
    """Bradley–Terry training; returns train loss, held-out accuracy, seconds. Bad
    arguments raise a UsageError before any work; weights that end up NaN or infinite
    raise one after training."""
    check_rm_args(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed)
    check_pairs("train pairs (--data / --n-pairs)", train_pairs)
    check_pairs("held-out pairs (--eval-frac)", eval_pairs)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    t0 = time.perf_counter()
    loss_val = float("nan")
    for ep in range(epochs):
        order = list(range(len(train_pairs)))
        rng.shuffle(order)
        model.train()
        for i in range(0, len(order), batch_size):
            batch = [train_pairs[j] for j in order[i:i + batch_size]]
            rc, rr = _pair_rewards(model, tok, batch)
            loss = -F.logsigmoid(rc - rr).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss_val = loss.item()
        acc = pair_accuracy(model, tok, eval_pairs)
        if log is not None:
            log(f"epoch {ep + 1}/{epochs}: loss {loss_val:.4f}  held-out pair accuracy {acc:.3f}")
    model.eval()
    check_finite_model(model, "rm")
    return {"train_loss": loss_val, "eval_accuracy": pair_accuracy(model, tok, eval_pairs),
            "train_accuracy": pair_accuracy(model, tok, train_pairs[:512]),
            "n_train": len(train_pairs), "n_eval": len(eval_pairs),
            "seconds": time.perf_counter() - t0}


def save_reward_model(model, tok, out: str, summary: dict) -> None:
    """Save the model (refused when a weight is not finite) and ``rm_summary.json``
    (strict JSON: a non-finite number is written as null)."""
    from ppokit.io.atomic import atomic_write_text

    from ..modeling.models import save_policy

    check_finite_model(model, "rm")
    save_policy(model, tok, out)
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v
             for k, v in summary.items()}
    atomic_write_text(os.path.join(out, "rm_summary.json"), json.dumps(clean, indent=2))
