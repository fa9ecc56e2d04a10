"""The policy's weights as an engine with its own copy serves them, and the probe that
proves it does.

:func:`served_weights` names the policy's tensors as the model's own checkpoint does
(transformers' names), with LoRA adapters merged in (``W + scale · B A``, computed per
layer; the policy itself is left as it is). An engine loads them in place.
:func:`lora_adapter` is a LoRA policy's adapter alone (peft's names and configuration),
for an engine that serves it as an adapter on the base weights it holds.

The probe: one fixed short token sequence, scored by the engine and by the trainer's
policy after each push. Two tests, and training stops with :class:`EngineOutOfSync` when
either fails (:func:`check_probe`):

* **gap** (:func:`probe_gap`): the engine's log-probs of its tokens agree with the
  trainer's within :data:`PROBE_TOLERANCE` — a gross fault (another model, weights
  loaded into the wrong places, a reload that kept part of the old copy) is far beyond
  it;
* **follow** (:func:`probe_follow`): since the last check that passed, the engine's
  log-probs moved with the trainer's. An engine that kept its older copy of the weights
  — a push that never arrived, adapters that never reached the sampler, a cache computed
  under the old weights — returns the very same log-probs as before while the trainer's
  moved. In bfloat16 the gap alone cannot see that: one small update moves the probe by
  less than the engine's rounding, and the rounding error itself grows as a policy
  sharpens (docs/real_models.md, "The probe").
"""

from __future__ import annotations

import json

import torch

from ..modeling.rollout import sequence_logprobs

__all__ = ["served_weights", "lora_adapter", "engine_lora_rank", "probe_ids",
           "trainer_probe_logprobs", "probe_gap", "check_probe", "EngineOutOfSync",
           "probe_follow", "PROBE_TEXT", "PROBE_TOLERANCE", "FOLLOW_MIN"]

PROBE_TEXT = ("A rollout engine must serve the weights the trainer holds: "
              "12 + 30 = 42, and the quick brown fox jumps over the lazy dog.")
# (mean, max) of |log p_engine − log p_trainer| over the probe's tokens, in nats, by the
# looser of the engine's and the trainer's number formats (None: no bound). On
# SmolLM2-135M a bfloat16 vLLM differs from the trainer by rounding alone by 0.03–0.07 on
# average, and by 0.13–0.54 on its worst token, growing as training sharpens the policy
# (docs/real_models.md#rollout-engines): no bound on one token's gap tells that from a
# fault, so bfloat16 has none, and its bound on the average is for gross faults (a stale
# engine is the follow test's). A float32 engine on the tiny test model differs by less
# than 1e-6.
PROBE_TOLERANCE = {"bf16": (0.25, None), "fp32": (0.01, 0.1)}
# the follow test: when the trainer's probe log-probs moved since the last check, the
# engine's must have moved by at least this share of that (mean absolute change); an
# engine that kept its weights moves by 0
FOLLOW_MIN = 0.25


class EngineOutOfSync(RuntimeError):
    """The engine does not serve the policy's current weights."""


def served_weights(policy, dtype: torch.dtype | None = None) -> list[tuple[str, torch.Tensor]]:
    """``[(name, tensor)]``: every weight of ``policy`` under its checkpoint name, LoRA
    adapters merged (a peft model's base layers carry the merged value under the plain
    layer's name), in ``dtype`` (default: as they are). No gradient; the policy is not
    changed."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    deltas = {}
    for name, module in base.named_modules():
        get = getattr(module, "get_delta_weight", None)
        adapters = getattr(module, "active_adapters", None)
        if get is not None and adapters and not getattr(module, "merged", False):
            with torch.no_grad():
                deltas[f"{name}.base_layer.weight"] = sum(
                    get(a) for a in adapters if a in getattr(module, "lora_A", {}))
    out = []
    with torch.no_grad():
        for name, p in base.named_parameters():
            if ".lora_" in name:
                continue
            t = p.detach()
            if name in deltas:
                t = t + deltas[name].to(t.dtype)
            out.append((name.replace(".base_layer.", "."),
                        t if dtype is None else t.to(dtype)))
    return out


# the adapter ranks vLLM's engine is offered (its ``max_lora_rank``): the policy's rank is
# served by the smallest at or above it
ENGINE_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def engine_lora_rank(r: int) -> int:
    """The engine's ``max_lora_rank`` for a policy of LoRA rank ``r``."""
    for rank in ENGINE_LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"lora_r: {r} is above the largest adapter rank a rollout engine "
                     f"serves ({ENGINE_LORA_RANKS[-1]}); use engine_lora=merged")


def lora_adapter(policy, dtype: torch.dtype | None = None) -> tuple[str, list]:
    """A peft policy's active adapter as an engine loads it: its configuration as JSON
    and ``[(name, tensor)]`` of its weights under peft's saved names
    (``base_model.model.<module>.lora_A.weight``), in ``dtype``; no gradient."""
    from peft import get_peft_model_state_dict

    name = policy.active_adapter
    config = policy.peft_config[name].to_dict()
    state = get_peft_model_state_dict(policy, adapter_name=name)
    with torch.no_grad():
        named = [(k, v.detach() if dtype is None else v.detach().to(dtype))
                 for k, v in state.items()]
    return json.dumps(config, default=_jsonable, sort_keys=True), named


def _jsonable(value):
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def probe_ids(tokenizer) -> list[int]:
    """The probe's token ids (BOS first when the tokenizer has one)."""
    ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None and (not ids or ids[0] != bos) else []) + list(ids)


@torch.no_grad()
def trainer_probe_logprobs(tr, ids: list[int], precision: str | None = None) -> torch.Tensor:
    """``[len(ids) - 1]``: the policy's log-prob of each probe token after the first (at
    temperature 1; in ``precision``, default the trainer's own)."""
    x = torch.tensor([ids], dtype=torch.long)
    with tr.autocast(precision):
        lp = sequence_logprobs(tr.policy, x, torch.ones_like(x))["logp"]
    return lp[0, 1:].float()


def probe_gap(engine_logp, trainer_logp) -> dict:
    """``engine_probe_abs_mean`` / ``_max``: how far the engine's log-probs of the probe's
    tokens are from the trainer's (nats)."""
    gap = (torch.as_tensor(engine_logp, dtype=torch.float32) - trainer_logp.detach().float()).abs()
    return {"engine_probe_abs_mean": float(gap.mean()), "engine_probe_abs_max": float(gap.max())}


def probe_follow(last, engine_logp, trainer_logp) -> dict:
    """How the probe's log-probs moved since ``last`` (``(engine, trainer)`` at the last
    check that passed; None: none yet, an empty dict): ``engine_probe_trainer_moved``, the
    trainer's mean absolute change (nats per token); ``engine_probe_followed``, the
    engine's mean absolute change as a share of it (about 1 when the engine took the
    update, 0 when it kept its weights); ``engine_probe_along``, the engine's change
    projected on the trainer's, ``<Δe, Δt> / <Δt, Δt>`` (about 1; 0 for a stale engine)."""
    if last is None:
        return {}
    e0, t0 = (torch.as_tensor(x, dtype=torch.float32) for x in last)
    de = torch.as_tensor(engine_logp, dtype=torch.float32) - e0
    dt = trainer_logp.detach().float() - t0
    moved = float(dt.abs().mean())
    if moved == 0.0:  # (no update since: nothing to follow)
        return {"engine_probe_trainer_moved": 0.0}
    return {"engine_probe_trainer_moved": moved,
            "engine_probe_followed": float(de.abs().mean()) / moved,
            "engine_probe_along": float((de * dt).sum() / (dt * dt).sum())}


def check_probe(stats: dict, precision: str, engine: str) -> None:
    """:class:`EngineOutOfSync` when the probe's gap (:func:`probe_gap`) is beyond
    :data:`PROBE_TOLERANCE` for an engine running in ``precision``, or when the engine's
    log-probs did not follow the trainer's (:func:`probe_follow`, :data:`FOLLOW_MIN`)."""
    mean_tol, max_tol = PROBE_TOLERANCE[precision]
    mean, worst = stats["engine_probe_abs_mean"], stats["engine_probe_abs_max"]
    if mean > mean_tol or (max_tol is not None and worst > max_tol):
        bound = f"{mean_tol:g} on average" + ("" if max_tol is None else f", {max_tol:g} at most")
        raise EngineOutOfSync(
            f"rollout engine {engine}: the engine does not serve the updated weights: its "
            f"log-probs of the probe sequence differ from the trainer's by {mean:.4f} nats "
            f"per token on average (at most {worst:.4f}), beyond the {precision} tolerance "
            f"({bound})")
    followed = stats.get("engine_probe_followed")
    if followed is not None and followed < FOLLOW_MIN:
        raise EngineOutOfSync(
            f"rollout engine {engine}: the engine does not serve the updated weights: since "
            f"the last check the trainer's log-probs of the probe sequence moved by "
            f"{stats['engine_probe_trainer_moved']:.2e} nats per token on average and the "
            f"engine's by {followed:.3f} of that (at least {FOLLOW_MIN:g} expected): the "
            f"engine kept weights the trainer has since updated")
