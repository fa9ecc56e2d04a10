"""Direct preference optimisation against a frozen reference.

``loss = −log σ(β [(log π(y_c|x) − log π_ref(y_c|x)) − (log π(y_r|x) − log π_ref(y_r|x))])``
with sequence log-probs summed over completion tokens (EOS included). Held-out preference
accuracy is the share of held-out pairs whose implicit reward margin is positive.
"""

from __future__ import annotations

import random
import time

import torch
import torch.nn.functional as F

from ..modeling.models import frozen_copy
from ..modeling.pairs import encode_pairs
from ..modeling.rollout import sequence_logprobs
from ..modeling.tuning import check_finite_model
from .guards import check_dpo_args, check_pairs

__all__ = ["dpo_train", "dpo_margins"]


def _seq_logps(model, tok, prompts, completions):
    ids, attn, cmask = encode_pairs(tok, prompts, completions)
    lp = sequence_logprobs(model, ids, attn)["logp"]
    return (lp * cmask).sum(1)


def dpo_margins(policy, reference, tok, pairs, beta: float) -> torch.Tensor:
    prompts = [p["prompt"] for p in pairs]
    pc = _seq_logps(policy, tok, prompts, [p["chosen"] for p in pairs])
    pr = _seq_logps(policy, tok, prompts, [p["rejected"] for p in pairs])
    with torch.no_grad():
        rc = _seq_logps(reference, tok, prompts, [p["chosen"] for p in pairs])
        rr = _seq_logps(reference, tok, prompts, [p["rejected"] for p in pairs])
    return beta * ((pc - rc) - (pr - rr))


def dpo_train(policy, tok, train_pairs, eval_pairs, *, beta: float = 0.1, epochs: int = 2,
              batch_size: int = 32, lr: float = 3e-4, seed: int = 0, log=None) -> dict:
    """DPO of ``policy`` against a frozen copy of itself. Bad arguments raise a UsageError
    before any work; weights that end up NaN or infinite raise one after training (so the
    caller saves nothing)."""
    check_dpo_args(beta=beta, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed)
    check_pairs("train pairs (--data / --n-pairs)", train_pairs)
    check_pairs("held-out pairs (--eval-frac)", eval_pairs)
    reference = frozen_copy(policy)
    policy.eval()  # dropout off
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    t0 = time.perf_counter()

    def accuracy(pairs):
        with torch.no_grad():
            m = torch.cat([dpo_margins(policy, reference, tok, pairs[i:i + 128], beta)
                           for i in range(0, len(pairs), 128)])
        return float(((m > 0).float() + 0.5 * (m == 0).float()).mean())  # ties count half

    acc0 = accuracy(eval_pairs)
    loss_val = float("nan")
    for ep in range(epochs):
        order = list(range(len(train_pairs)))
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            batch = [train_pairs[j] for j in order[i:i + batch_size]]
            loss = -F.logsigmoid(dpo_margins(policy, reference, tok, batch, beta)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            loss_val = loss.item()
        if log is not None:
            log(f"epoch {ep + 1}/{epochs}: loss {loss_val:.4f}  held-out preference accuracy "
                f"{accuracy(eval_pairs):.3f}")
    check_finite_model(policy, "dpo")
    return {"train_loss": loss_val, "eval_accuracy_before": acc0,
            "eval_accuracy": accuracy(eval_pairs), "seconds": time.perf_counter() - t0,
            "n_train": len(train_pairs), "n_eval": len(eval_pairs), "beta": beta}
