"""What the decoder kernel (``ppokit.kernels.decoder``) buys on a real model: ppokit's
sampler and whole token-trainer iterations on SmolLM2-135M-Instruct (LoRA, GRPO, as
``ppokit llm train --model smollm2-135m-instruct`` runs it), with the kernel on and off.

    python -m bench.decoder_gain [--precision fp32,bf16] [--rounds 3]

Needs the model cached (``ppokit llm fetch smollm2-135m-instruct``). One process per
precision, one torch thread: the kernel is turned off and on between calls
(``PPOKIT_NATIVE_OFF=decoder`` is read at every call), in the order on, off, off, on, on,
off, … so that drift in the machine's speed falls on both. Timed are the process's CPU
seconds (on a machine shared with other jobs they count the work itself; the wall seconds
are printed too) of

* ``generate``: 16 completions (4 chat prompts × 4) of exactly 32 tokens each (no end of
  sequence), the same seed each call;
* ``iteration``: one ``TokenTrainer.train_iteration`` of 4 prompts × 4 completions of at
  most 32 tokens — sampling, scoring, the reference's and the update's passes (the model
  trains on, so the completions differ from one iteration to the next).

Prints each call, then per precision and kind the median CPU seconds on and off and the
median of the per-pair ratios ``off ÷ on`` (above 1 the kernel pays; docs/performance.md,
"What each compiled kernel buys", keeps a kernel at 1.10× on the whole iteration).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

QUESTIONS = ["Name three prime numbers below twenty.", "What is 17 times 3?",
             "Write a short sentence about the sea.", "List the days of the week."]


def _switch(on: bool) -> None:
    if on:
        os.environ.pop("PPOKIT_NATIVE_OFF", None)
    else:
        os.environ["PPOKIT_NATIVE_OFF"] = "decoder"


def _timed(fn) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def _measure(precision: str, rounds: int, run_dir: str) -> list[dict]:
    import torch

    from ppokit.llm.modeling.rollout import encode_prompts, generate
    from ppokit.llm.training.config import LLMConfig
    from ppokit.llm.training.trainer import TokenTrainer

    cfg = LLMConfig(model="smollm2-135m-instruct", iterations=10_000, prompts_per_iter=4,
                    samples_per_prompt=4, max_new_tokens=32, precision=precision,
                    checkpoint_every=100_000, seed=0)
    tr = TokenTrainer(cfg, run_dir, log=lambda *a: None)
    prompts = [tr.tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                          add_generation_prompt=True) for q in QUESTIONS]
    ids, mask = encode_prompts(tr.tok, [p for p in prompts for _ in range(4)])

    def sample():
        with tr.autocast():
            generate(tr.policy, ids, mask, max_new_tokens=32, eos_token_id=-1,
                     pad_token_id=tr.tok.pad_token_id, temperature=0.7,
                     generator=torch.Generator().manual_seed(0))

    order = ([True, False, False, True] * rounds)[:2 * rounds]
    out = []
    for what, fn in (("generate", sample), ("iteration", tr.train_iteration)):
        for on in (True, False):  # warm-up, untimed
            _switch(on)
            fn()
        for on in order:
            _switch(on)
            cpu, wall = _timed(fn)
            rec = {"precision": precision, "what": what, "kernel": "on" if on else "off",
                   "cpu": round(cpu, 3), "wall": round(wall, 3),
                   "load": round(os.getloadavg()[0], 1)}
            print(json.dumps(rec), flush=True)
            out.append(rec)
    tr.close()
    _switch(True)
    return out


def _summary(recs: list[dict]) -> None:
    for prec in dict.fromkeys(r["precision"] for r in recs):
        for what in ("generate", "iteration"):
            rs = [r for r in recs if r["precision"] == prec and r["what"] == what]
            on = [r["cpu"] for r in rs if r["kernel"] == "on"]
            off = [r["cpu"] for r in rs if r["kernel"] == "off"]
            ratios = [b / a for a, b in zip(on, off)]  # the i-th on with the i-th off
            print(f"{prec} {what}: on {statistics.median(on):.2f} CPU s, off "
                  f"{statistics.median(off):.2f}, off ÷ on {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}); load "
                  f"{min(r['load'] for r in rs)}–{max(r['load'] for r in rs)}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from ppokit import kernels

    if not kernels.has_decoder():
        sys.exit(f"bench.decoder_gain: the decoder kernel cannot run here: "
                 f"{kernels.why_not('decoder')}")
    recs = []
    for prec in a.precision.split(","):
        with tempfile.TemporaryDirectory() as d:
            recs += _measure(prec, a.rounds, os.path.join(d, "run"))
    _summary(recs)


if __name__ == "__main__":
    main()
