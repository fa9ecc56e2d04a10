"""The rollout engines side by side: ppokit's sampler and vLLM generating completions of the
same prompts, with the same lengths, in one run, each on one CPU core.

    python -m bench.rollout_engines [--model smollm2-135m-instruct] [--prompts 16]
                                    [--samples 4] [--max-new-tokens 48] [--rounds 2]

Needs vLLM (``make vllm``; run with .venv-vllm/bin/python). Prompts: the built-in
``numbers`` task's held-out questions through the model's chat template; temperature 0.7,
as a pretrained --model trains. For each engine and round: completions, generated tokens
(EOS included), seconds and tokens/s; ppokit samples in float32 (the trainer's default)
and in bfloat16 autocast, vLLM in bfloat16. Then the probe (ppokit.llm.engines.weights):
vLLM's log-probs of its fixed sequence against the float32 trainer's, after vLLM's start
and after a push of LoRA-adapted weights (``--rounds 0``: the probe alone) — the gap the
probe's bf16 tolerance must allow, and the one it must catch.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from types import SimpleNamespace

import torch


def _prompts(tok, n: int, samples: int) -> list[str]:
    from ppokit.llm.inputs.data import render_prompt
    from ppokit.llm.inputs.task import make_task

    task = make_task("numbers", None)
    rows = [task.row(p) for p in task.heldout_prompts(n)]
    return [render_prompt(tok, r["prompt"]) for r in rows for _ in range(samples)]


def _time(engine, ids, mask, args, seed: int, context=contextlib.nullcontext):
    t = time.perf_counter()
    with context():
        roll = engine.generate(ids, mask, generator=torch.Generator().manual_seed(seed), **args)
    return time.perf_counter() - t, roll


def _line(name: str, rnd: int, dt: float, roll) -> None:
    ntok = int(roll.action_mask.sum())
    print(f"{name:<22} round {rnd}  {roll.input_ids.shape[0]:>3} completions  "
          f"{ntok:>5} tokens  {dt:7.2f} s  {ntok / dt:7.1f} tokens/s", flush=True)


def _probe(policy, engine) -> None:
    from ppokit.llm.engines.weights import probe_gap, trainer_probe_logprobs
    from ppokit.llm.modeling.models import wrap_lora

    tr = SimpleNamespace(policy=policy, autocast=lambda precision: torch.autocast(
        "cpu", dtype=torch.bfloat16, enabled=precision == "bf16"))

    def gap_to(precision):
        return probe_gap(engine.probe_logprobs(),
                         trainer_probe_logprobs(tr, engine.probe, precision))

    for precision in ("fp32", "bf16"):
        gap = gap_to(precision)
        print(f"probe after start, trainer in {precision}: |dlogp| mean "
              f"{gap['engine_probe_abs_mean']:.4f}, max {gap['engine_probe_abs_max']:.4f} nats")
    lora = wrap_lora(policy, r=16, alpha=32.0)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.copy_(0.01 * torch.randn(p.shape, generator=g))
    tr.policy = lora
    stale = gap_to("bf16")
    t = time.perf_counter()
    engine.push(lora)
    dt = time.perf_counter() - t
    gap = gap_to("bf16")
    print(f"probe (trainer in bf16), LoRA-adapted policy not pushed: mean "
          f"{stale['engine_probe_abs_mean']:.4f}, max {stale['engine_probe_abs_max']:.4f}; "
          f"pushed ({dt:.2f} s): mean "
          f"{gap['engine_probe_abs_mean']:.4f}, max {gap['engine_probe_abs_max']:.4f} nats")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    from ppokit.llm.engines import PpokitEngine
    from ppokit.llm.engines.vllm_engine import VllmEngine
    from ppokit.llm.modeling.catalog import resolve_model
    from ppokit.llm.modeling.models import load_lm
    from ppokit.llm.modeling.rollout import encode_prompts

    torch.set_num_threads(1)  # ppokit on one core; vLLM's worker binds one core of its own
    path = resolve_model(a.model)
    policy, tok = load_lm(path)
    policy.eval()
    ids, mask = encode_prompts(tok, _prompts(tok, a.prompts, a.samples))
    args = dict(max_new_tokens=a.max_new_tokens, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, temperature=0.7)
    t = time.perf_counter()
    vllm = VllmEngine(path, precision="bf16", seed=0, tokenizer=tok)
    print(f"vLLM started in {time.perf_counter() - t:.1f} s; prompts {ids.shape[0]} rows, "
          f"up to {ids.shape[1]} tokens; max_new_tokens {a.max_new_tokens}", flush=True)
    ours = PpokitEngine(lambda: policy)
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    for rnd in range(1, a.rounds + 1):  # alternating, so that both see the same machine
        _line("vllm (bf16)", rnd, *_time(vllm, ids, mask, args, rnd))
        _line("ppokit (fp32)", rnd, *_time(ours, ids, mask, args, rnd))
        _line("ppokit (bf16 autocast)", rnd, *_time(ours, ids, mask, args, rnd, bf16))
    _probe(policy, vllm)
    vllm.close()


if __name__ == "__main__":
    main()
