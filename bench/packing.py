"""Sequence packing against the padded pass on the 10M-parameter bench model
(``ppokit llm bench --model-size 10m``'s model): one minibatch's forward and backward
through ``sequence_logprobs`` (the update's pass: entropy, shared prompts, log-probs from
the prompt's last position on), ``packing = "off"`` and ``"on"`` alternately, one torch
thread, in float32 and under bfloat16 autocast.

    python -m bench.packing --reps 5

Batches: ``skewed`` (in each group of completions one runs to ``--long`` tokens, the others
4–24: a batch where a few long answers set the padded width), ``mid`` (lengths 55–100 %
of ``--long``) and ``even`` (every completion within 10 % of ``--long``: little padding).
Prints the median seconds of each and the ratio padded / packed (above 1: packing is
faster)."""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from ppokit.llm.evaluation.bench import build_bench_model
from ppokit.llm.modeling.models import build_char_tokenizer
from ppokit.llm.modeling.rollout import encode_prompts, sequence_logprobs


def _batch(tok, groups: int, per: int, long: int, kind: str, rng):
    prompts = ["".join(rng.choice("0123456789") for _ in range(rng.randint(10, 20))) + ">"
               for _ in range(groups)]
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(per)])
    b = ids.shape[0]
    if kind == "skewed":
        lens = [long if i % per == 0 else rng.randint(4, 24) for i in range(b)]
    else:
        low = 0.9 if kind == "even" else 0.55
        lens = [rng.randint(int(low * long), long) for _ in range(b)]
    lens = torch.tensor(lens)
    tail = torch.randint(3, len(tok), (b, long))
    tail_mask = (torch.arange(long)[None] < lens[:, None]).long()
    return torch.cat([ids, tail], 1), torch.cat([mask, tail_mask], 1), ids.shape[1]


def _step(model, ids, mask, p, packing):
    out = sequence_logprobs(model, ids, mask, prompt_len=p, actions_from=p, with_entropy=True,
                            packing=packing)
    act = torch.zeros_like(mask, dtype=torch.bool)
    act[:, p:] = mask[:, p:].bool()
    ((out["logp"] * act).sum() + 0.01 * (out["entropy"] * act).sum()).backward()
    model.zero_grad(set_to_none=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--per", type=int, default=4, help="completions per prompt")
    ap.add_argument("--long", type=int, default=100, help="the longest completion")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_bench_model("10m", tok)
    rng = random.Random(0)
    for kind in ("skewed", "mid", "even"):
        ids, mask, p = _batch(tok, args.groups, args.per, args.long, kind, rng)
        real = float(mask[:, p:].float().mean())
        for fmt in ("fp32", "bf16"):
            times = {"off": [], "on": []}
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fmt == "bf16"):
                for mode in ("off", "on"):  # warm-up
                    _step(model, ids, mask, p, mode)
                for _ in range(args.reps):
                    for mode in ("off", "on"):
                        t0 = time.perf_counter()
                        _step(model, ids, mask, p, mode)
                        times[mode].append(time.perf_counter() - t0)
            off, on = (statistics.median(times[m]) for m in ("off", "on"))
            print(f"{kind:6s} {fmt}  rows {ids.shape[0]}  width {ids.shape[1]}  "
                  f"real share after the prompt {real:.2f}  padded {off:.3f} s  "
                  f"packed {on:.3f} s  ratio {off / on:.2f}x", flush=True)


if __name__ == "__main__":
    main()
