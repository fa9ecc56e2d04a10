"""``ppokit llm bench`` against TRL does the same work on both sides: per timed iteration,
as many completions generated and as many optimiser steps taken by TRL's ``GRPOTrainer``
as by ppokit, for every configuration the bench runs (the built-in and 10M models in
bf16 and fp32, the pretrained-model bench at 8 and 4 prompts, TRL with gradient
checkpointing off and on), read from the bench's own configuration objects."""

import dataclasses
import types

import pytest

pytest.importorskip("trl")

from ppokit.llm.evaluation.bench import TRL_MATCH, bench_trl_grpo, trainer_config  # noqa: E402
from ppokit.llm.evaluation.bench_real import real_config  # noqa: E402
from ppokit.llm.evaluation.bench_trl import (  # noqa: E402
    TRL_RUNS,
    check_geometry,
    differences,
    ppokit_geometry,
    precision_notes,
    trl_args,
    trl_geometry,
    trl_record,
)

ITERATIONS = 3
# (the configuration, completions and optimiser steps per iteration it must give)
CONFIGS = {
    "builtin bf16": (lambda: trainer_config("grpo", ITERATIONS, precision="bf16",
                                            **TRL_MATCH), 64, 4),
    "builtin fp32": (lambda: trainer_config("grpo", ITERATIONS, precision="fp32",
                                            **TRL_MATCH), 64, 4),
    "pretrained 8x4": (lambda: real_config("/a/model/dir", "numbers", ITERATIONS), 32, 2),
    "pretrained 4x4": (lambda: real_config("/a/model/dir", "numbers", ITERATIONS, 4), 16, 2),
}


@pytest.mark.parametrize("ckpt", [c for _, c in TRL_RUNS])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_side_generates_and_steps_alike_in_a_timed_iteration(name, ckpt, tmp_path):
    make, completions, steps = CONFIGS[name]
    cfg = make().resolved()
    args = trl_args(cfg, str(tmp_path), ITERATIONS, ckpt)
    assert ppokit_geometry(cfg) == trl_geometry(args) == {"completions": completions,
                                                          "optimizer_steps": steps}
    # TRL generates once every steps_per_generation x num_iterations optimiser steps: the
    # timed window is exactly one generation, and the run is a warm-up plus ITERATIONS
    assert args.generation_batch_size == cfg.prompts_per_iter * cfg.samples_per_prompt
    assert args.steps_per_generation * args.num_iterations == steps
    assert args.max_steps == steps * (ITERATIONS + 1)
    assert args.gradient_checkpointing is ckpt
    assert args.bf16 is (cfg.precision == "bf16")
    assert cfg.kl_estimator == "k3"  # TRL's KL term on both sides


def test_a_pair_that_would_do_different_work_is_refused(tmp_path):
    cfg = real_config("/a/model/dir").resolved()
    args = trl_args(cfg, str(tmp_path), ITERATIONS, False)
    other = real_config("/a/model/dir", prompts_per_iter=4).resolved()
    with pytest.raises(RuntimeError, match="geometry differs"):
        check_geometry(other, args)


def _fake_trainer(steps_per_generation, num_iterations, cycles):
    args = types.SimpleNamespace(generation_batch_size=32,
                                 steps_per_generation=steps_per_generation,
                                 num_iterations=num_iterations)
    log = [{"completions/mean_length": 10.0}] * cycles
    return types.SimpleNamespace(args=args, state=types.SimpleNamespace(log_history=log))


@pytest.mark.parametrize("generations, expected", [(3, 1.0), (6, 2.0)])
def test_the_record_counts_trls_generations_per_timed_window(generations, expected):
    # 3 cycles of 2 optimiser steps; a trainer that generated every step shows 2 per cycle
    tr = _fake_trainer(2, 1, 3)
    ends = [float(i) for i in range(7)]
    calls = {"_generate": [0.1] * generations,
             "_generate_and_score_completions": [0.2] * generations}
    rec = trl_record(tr, ends, ends, calls, 0.0)
    assert rec["generations_per_iteration"] == expected
    assert rec["optimizer_steps_per_iteration"] == 2 and rec["seconds_per_iteration"] == 2.0


def test_trl_run_generates_once_per_timed_iteration_counted():
    r = bench_trl_grpo(iterations=1, prompts_per_iter=4, samples_per_prompt=2)
    cfg = trainer_config("grpo", 1, precision="bf16", prompts_per_iter=4,
                         samples_per_prompt=2, **TRL_MATCH).resolved()
    assert r["generations_per_iteration"] == 1.0
    assert r["sequences_per_iter"] == 8 and r["tokens_per_s_total"] > 0
    assert r["cpu_seconds_per_iteration"] > 0
    # two passes over 8 completions in minibatches of 4
    assert r["optimizer_steps_per_iteration"] == ppokit_geometry(cfg)["optimizer_steps"] == 4


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_printed_differences_name_what_each_side_does_its_own_way(name, tmp_path):
    cfg = CONFIGS[name][0]().resolved()
    lines = differences(cfg, trl_args(cfg, str(tmp_path), ITERATIONS, False))
    names = [x.split(" - ")[0].strip() for x in lines]
    assert names[:2] == ["gradient checkpointing", "old log-probs"]
    assert "TRL: a separate no-grad pass" in lines[1]  # 2 steps per generation, 1 accumulated
    assert "KL loss estimator" not in names  # k3 on both sides
    # with LoRA both take the reference as the adapters switched off: not a difference
    assert ("reference log-probs" in names) is (cfg.lora_r == 0)
    assert ("divergence guard" in names) is (cfg.guard_kl > 0)
    notes = precision_notes(cfg.precision)
    if cfg.precision == "bf16":  # one line per side, each saying what runs in which format
        assert [x.split(" (")[0] for x in notes] == ["bf16 in TRL", "bf16 in ppokit"]
        assert "sdpa attention in bfloat16" in notes[0]
        assert "generate on the unwrapped model) outside it, in float32" in notes[0]
        assert "and attention in float32" in notes[1]
    else:
        assert notes == [x for x in notes if "float32 on both sides" in x] and notes
    other = dataclasses.replace(cfg, kl_estimator="k2")
    assert "  KL loss estimator - ppokit: k2; TRL: k3" in differences(
        other, trl_args(other, str(tmp_path), ITERATIONS, False))
