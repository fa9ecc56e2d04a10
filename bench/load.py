"""Under load: is ppokit at its default thread count ever slower than at one thread?

    python -m bench.load [--rounds 5] [--ops token_gae,env_update,llm_update] [--quiet]

Another process keeps a core busy for the whole run (a Python busy loop; ``--quiet``
leaves it out, for the comparison). Every measurement is a fresh process
(``python -m bench.load --worker OP CONFIG``), the two configurations of an operation
alternate round by round, and the figures are medians over the rounds:

* ``token_gae``: :func:`ppokit.core.token_gae` on 64 x 4096 RLHF-like masks, at torch's
  default thread count (the machine's cores) and at one thread, alternating in each
  process on the same inputs (where they lie in memory moves the time more than anything
  else);
* ``env_update``: the environment trainer's fused minibatch step on CartPole-v1 (the
  zoo preset, one minibatch of 256) as the trainer builds it (one intra-op thread; the
  native step's critic beside the actor's on its worker thread while the worker keeps up,
  else before it — ``parallel="auto"``; the TorchScript kernel's ``FasterOfTwo`` where
  the extension is not built) against the serial kernel alone;
* ``llm_update``: a language model's training step (forward and backward of 8 sequences
  of 96 tokens, float32) at the thread count ``ppokit llm train --model`` picks
  (:func:`ppokit.llm.cli.set_threads`: the cores no other process keeps busy), at one
  thread, and at torch's own default (every core), which the row reports beside them;
  SmolLM2-135M-Instruct where ppokit's cache has it (``ppokit llm fetch
  smollm2-135m-instruct``), else the built-in architecture at the 10M size.

A row passes when the default's median is at most 5 % above one thread's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

OPS = ("token_gae", "env_update", "llm_update")
TOLERANCE = 1.05


def _median_time(fn, calls: int, repeats: int = 5) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        ts.append((time.perf_counter() - t) / calls)
    return statistics.median(ts)


def _token_gae(config: str) -> dict:
    import torch

    from bench.token_gae import _inputs
    from ppokit.core import token_gae

    # Where the inputs lie in memory alone moves this call between about 2 and 6 ms on
    # this machine (from one process to the next, at any thread count), so both thread
    # counts are timed here on the same inputs, alternating, and this run reports its own
    default = torch.get_num_threads()
    r, v, m = _inputs("rlhf", 64, 4096)
    times: dict[int, list[float]] = {default: [], 1: []}
    for _ in range(5):
        for n in (default, 1):
            torch.set_num_threads(n)
            times[n].append(_median_time(lambda: token_gae(r, v, m, 0.99, 0.95), 10, 1))
    return {"seconds": statistics.median(times[default]), "threads": default,
            "one": statistics.median(times[1])}


def _env_update(config: str) -> dict:
    import tempfile

    import torch

    torch.set_num_threads(1)
    from ppokit import kernels
    from ppokit.algos import Trainer, resolve_config

    cfg = resolve_config(env_id="CartPole-v1", overrides={"tensorboard": False})
    tr = Trainer(cfg, tempfile.mkdtemp() + "/run", log=lambda *x: None, fresh=True)
    roll = tr.collector.collect(cfg.n_steps)
    roll.compute_advantages(cfg.gamma, cfg.gae_lambda, cfg.advantage_estimator)
    mb = {k: v.detach()[:cfg.batch_size] for k, v in roll.flat().items()}
    tr._minibatch_step()
    fused = tr._fused
    if config == "one":
        fused.pick = None
        fused.parallel = False
    ways = []
    if fused.pick is not None:  # the TorchScript kernel's choice, timed here
        pick = fused.pick.next
        fused.pick.next = lambda: ways.append(pick()) or ways[-1]
    native = fused.backend == "native" and fused.parallel == "auto"
    before = kernels.auto_state() if native else None
    s = _median_time(lambda: fused.step(mb, 0.2), 200)
    if native:
        after = kernels.auto_state()
        steps = after["steps"] - before["steps"]
        share = (after["beside"] - before["beside"]) / max(steps, 1)
        threads = f"1 + native critic beside it in {share:.0%} of steps"
    elif ways:
        threads = f"1 + critic beside it in {sum(ways) / len(ways):.0%} of steps"
    else:
        threads = f"1 ({fused.backend} step, critic before the actor)"
    tr.close()
    return {"seconds": s, "threads": threads}


def _llm_update(config: str) -> dict:
    import torch

    from ppokit.llm.cli import set_threads

    path = os.path.join(os.environ.get("PPOKIT_CACHE", os.path.expanduser("~/.cache/ppokit")),
                        "models", "smollm2-135m-instruct")
    if config == "one":
        torch.set_num_threads(1)
    elif config == "all":
        from ppokit.threads import usable_cores

        torch.set_num_threads(usable_cores())  # torch's own default: every core
    else:
        set_threads(path)  # as `ppokit llm train --model` does
    if os.path.isdir(path):
        from transformers import AutoModelForCausalLM

        model, name = AutoModelForCausalLM.from_pretrained(path), "SmolLM2-135M-Instruct"
    else:
        from ppokit.llm.evaluation.bench import build_bench_model
        from ppokit.llm.modeling.models import build_char_tokenizer

        model, name = build_bench_model("10m", build_char_tokenizer()), "built-in 10m"
    ids = torch.randint(0, 40, (8, 96))

    def step():
        logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).mean().backward()
    return {"seconds": _median_time(step, 1, 3), "threads": torch.get_num_threads(),
            "model": name}


def _worker(op: str, config: str) -> None:
    out = {"_token_gae": _token_gae, "_env_update": _env_update,
           "_llm_update": _llm_update}["_" + op](config)
    print(json.dumps(out), flush=True)


def _run(op: str, config: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "bench.load", "--worker", op, config],
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{op} {config}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--quiet", action="store_true", help="no busy process (the comparison)")
    p.add_argument("--worker", nargs=2, metavar=("OP", "CONFIG"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        _worker(*a.worker)
        return 0
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error(f"--ops: unknown {', '.join(bad)}; known: {', '.join(OPS)}")
    # the busy process spins until this one ends, however it ends (it stops when it is
    # handed to another parent), and SIGTERM here runs the cleanup below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    burner = None if a.quiet else subprocess.Popen(
        [sys.executable, "-c", "import os\np = os.getppid()\nwhile os.getppid() == p: pass"])
    configs = {o: ("default", "one", "all") if o == "llm_update" else ("default", "one")
               for o in ops}
    rows = {(o, c): [] for o in ops for c in configs[o]}
    info: dict = {}
    try:
        time.sleep(1.0)
        for r in range(a.rounds):
            for op in ops:
                if op == "token_gae":  # both thread counts from one process
                    got = _run(op, "both")
                    rows[(op, "default")].append(got["seconds"])
                    rows[(op, "one")].append(got["one"])
                    info[(op, "default")] = got
                    continue
                order = configs[op] if r % 2 == 0 else configs[op][::-1]
                for c in order:
                    got = _run(op, c)
                    rows[(op, c)].append(got["seconds"])
                    info[(op, c)] = got
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    load = "quiet" if a.quiet else "another process keeping a core busy"
    print(f"\n{load}; medians of {a.rounds} fresh processes each, {os.cpu_count()} cores\n")
    print("| operation | default: threads | default ms | one thread ms | default ÷ one | |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for op in ops:
        d, o = statistics.median(rows[(op, "default")]), statistics.median(rows[(op, "one")])
        ok = d <= TOLERANCE * o
        failed += not ok
        extra = ""
        if op == "llm_update":
            a_ = statistics.median(rows[(op, "all")])
            extra = (f" ({info[(op, 'default')]['model']}; torch's default of every core: "
                     f"{a_ * 1e3:.0f} ms, {a_ / o:.2f}x one thread)")
        print(f"| {op}{extra} | {info[(op, 'default')]['threads']} | {d * 1e3:.2f} | "
              f"{o * 1e3:.2f} | {d / o:.2f} | {'ok' if ok else 'SLOWER'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
