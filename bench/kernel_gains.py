"""What each compiled kernel buys on the work it serves: a whole training run (or, for the
decoder, whole language-model iterations) with the kernel on, with it off
(``PPOKIT_NATIVE_OFF=NAME``: the caller's torch or NumPy path), and, with
``--no-avx512``, in the form a CPU without AVX-512 would run (the extension built with
``PPOKIT_ISA=avx2``, its 16-float-vector kernels forced on with ``PPOKIT_NATIVE_WIDE=1``:
ppokit turns those off on such a CPU, ``ppokit.kernels.WIDE``, and this column is why).

    python -m bench.kernel_gains [--workloads cartpole,lstm,decoder] [--rounds 3]
                                 [--no-avx512] [--compiled]

``--compiled`` adds, for the decoder, its elementwise steps as ``torch.compile`` makes them
(inductor's CPU code) in place of the C kernel: the alternative a hand-written kernel must
beat to stay.

Every measurement is a fresh process (one torch thread) doing the same fixed work; the
variants alternate round by round so that drift in the machine's speed falls on all of
them. What is timed is the process's CPU seconds (user + system, its threads and any
environment subprocesses included): on a machine shared with other jobs that counts the
work itself, where wall time counts the other jobs too (each row also gives the wall
seconds). Prints one row per (workload, kernel): the median CPU seconds of each variant and
the median of the per-round ratios ``off ÷ on`` (the gain: above 1 the kernel pays) and
``no-AVX-512 ÷ on``. ``ppokit.kernels`` lists the kernels (and, in ``REMOVED``, those
removed for buying less than 1.10× here); docs/performance.md keeps the table. The
decoder's figure on a real model (SmolLM2-135M) is ``python -m bench.decoder_gain``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# workload -> (what it runs, the kernels whose gain it measures)
WORKLOADS = {
    "cartpole": ("ppokit.train('CartPole-v1'), 100k steps (MLP 64x64, the preset)",
                 ("step", "actor")),
    "lstm": ("ppokit.train('ppokit/CartPoleNoVel-v1'), 20k steps (the LSTM preset)",
             ("lstm",)),
    "decoder": ("ppokit llm bench's trainer, GRPO on the 10M-parameter model, 2 iterations",
                ("decoder",)),
}


def _work(name: str) -> dict:
    """Run one workload in this process: its CPU and wall seconds."""
    t = os.times()
    w0 = time.perf_counter()
    _run(name)
    u = os.times()
    return {"cpu": (u.user - t.user) + (u.system - t.system) + (u.children_user - t.children_user)
            + (u.children_system - t.children_system), "wall": time.perf_counter() - w0}


def _run(name: str) -> None:
    import torch

    torch.set_num_threads(1)
    if name.startswith("decoder"):
        from ppokit.llm.evaluation.bench import bench_trainer

        if name == "decoder-compiled":
            _compile_decoder_steps()  # (its compilation is part of the work timed)
        bench_trainer("grpo", iterations=3, model_size="10m")
        return
    import ppokit

    env, steps = {"cartpole": ("CartPole-v1", 100_000),
                  "lstm": ("ppokit/CartPoleNoVel-v1", 20_000)}[name]
    with tempfile.TemporaryDirectory() as d:
        ppokit.train(env, total_steps=steps, run_dir=Path(d) / "run", seed=0, progress=False)


def _compile_decoder_steps() -> None:
    """The fused forward's RMS norm, rotary split and gated product as their torch formulas
    under ``torch.compile`` (the C kernels off for this process)."""
    import torch
    import torch.nn.functional as F

    from ppokit.llm.modeling import fused_layers as fused

    os.environ["PPOKIT_NATIVE_OFF"] = "decoder"

    def rms(h, w, eps):
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))

    def gated(gu):
        gate, up = gu.chunk(2, -1)
        return F.silu(gate) * up

    rms_c, gated_c = torch.compile(rms, dynamic=True), torch.compile(gated, dynamic=True)
    rot_c = torch.compile(fused._rotate, dynamic=True)

    def split_rotate(qkv, cos, sin, heads, att):
        n_q, n_kv, hd = heads
        q, k, v = qkv.view(*qkv.shape[:-1], n_q + 2 * n_kv, hd).split([n_q, n_kv, n_kv], -2)
        return rot_c(q, cos, sin).to(att), rot_c(k, cos, sin).to(att), v.to(att)

    fused._norm = lambda h, n, act: fused.cast(rms_c(h, n.weight, n.variance_epsilon), act)
    fused._gated = lambda gu, act: fused.cast(gated_c(gu), act)
    fused._split_rotate = split_rotate


def _avx2_tree(tmp: Path) -> Path:
    """A copy of the package with the extension built without AVX-512 (AVX2 and the
    baseline, chosen at load time); returns its src folder."""
    env = {**os.environ, "PPOKIT_ISA": "avx2"}
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
                    str(tmp / "lib"), "--build-temp", str(tmp / "tmp")], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    built = list((tmp / "lib" / "ppokit" / "kernels").glob("_c.*"))
    if len(built) != 1:
        raise SystemExit("bench.kernel_gains: the AVX2 build failed")
    src = tmp / "src"
    shutil.copytree(ROOT / "src" / "ppokit", src / "ppokit",
                    ignore=shutil.ignore_patterns("_c.*.so", "_c.*.pyd", "__pycache__"))
    shutil.copy(built[0], src / "ppokit" / "kernels")
    return src


def _measure(workload: str, off: str | None, src: Path | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PPOKIT_NATIVE", None)
    env.pop("PPOKIT_NATIVE_OFF", None)
    if off:
        env["PPOKIT_NATIVE_OFF"] = off
    if src is not None:
        env["PYTHONPATH"] = str(src)
        env["PPOKIT_NATIVE_WIDE"] = "1"
    out = subprocess.run([sys.executable, "-m", "bench.kernel_gains", "--worker", workload],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench.kernel_gains: {workload} (off: {off}) failed:\n"
                         f"{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cols(xs: list[dict], on: list[dict]) -> str:
    """``median CPU seconds | median per-round ratio to on``, or dashes when not
    measured."""
    if not xs:
        return "— | —"
    return (f"{statistics.median(x['cpu'] for x in xs):.2f} | "
            f"{statistics.median(x['cpu'] / n['cpu'] for x, n in zip(xs, on)):.2f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-avx512", action="store_true",
                    help="also time the extension built without its AVX-512 paths")
    ap.add_argument("--compiled", action="store_true",
                    help="also time the decoder's steps compiled by torch.compile")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(_work(a.worker)))
        return
    from ppokit import kernels

    if not kernels.available():
        raise SystemExit(f"bench.kernel_gains: {kernels.why_not()}")
    names = [w for w in a.workloads.split(",") if w]
    for w in names:
        if w not in WORKLOADS:
            raise SystemExit(f"--workloads: unknown {w!r} (expected {', '.join(WORKLOADS)})")
    print(f"kernels: {kernels.build()}; {a.rounds} rounds; one torch thread; "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        src = _avx2_tree(Path(tmp)) if a.no_avx512 else None
        print("| workload | kernel | on: CPU s (wall s) | off: CPU s | off ÷ on | AVX2 form: "
              "CPU s | ÷ on | compiled: CPU s | ÷ on |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for w in names:
            what, kernels_of = WORKLOADS[w]
            for k in kernels_of:
                on, off, gen, comp = [], [], [], []
                for _ in range(a.rounds):
                    on.append(_measure(w, None, None))
                    off.append(_measure(w, k, None))
                    if src is not None:
                        gen.append(_measure(w, None, src))
                    if a.compiled and w == "decoder":
                        comp.append(_measure("decoder-compiled", None, None))
                print(f"| {w} | {k} | {statistics.median(x['cpu'] for x in on):.2f} "
                      f"({statistics.median(x['wall'] for x in on):.2f}) | "
                      f"{_cols(off, on)} | {_cols(gen, on)} | {_cols(comp, on)} |", flush=True)
        print("\nworkloads: " + "; ".join(f"{w}: {WORKLOADS[w][0]}" for w in names))


if __name__ == "__main__":
    main()
