"""ppokit report on language-model runs: recorded metrics of real short runs of the token
trainer (tests/data/README.md) — healthy runs get no finding; each provoked failure gets
its code — plus synthetic records for the sampler/trainer mismatch at a level a float32
trainer never shows, and for the clip statistics of GSPO and CISPO."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ppokit.cli import main
from ppokit.diagnose import CODES, MetricsTable, diagnose, report

DATA = Path(__file__).parent / "data"
LM_CODES = {"lm-entropy-collapse", "length-explosion", "length-collapse", "reward-hacking",
            "kl-ref-blowup", "zero-spread-groups", "sampler-mismatch", "reward-flat"}


def codes(run) -> set[str]:
    return {f.code for f in report(DATA / f"{run}.metrics.jsonl")}


def finding(run, code):
    (f,) = [f for f in report(DATA / f"{run}.metrics.jsonl") if f.code == code]
    return f


def summary(f, metric) -> dict:
    (ev,) = [e for e in f.evidence if e["metric"] == metric]
    return ev["summary"]


def test_codes_are_registered():
    assert LM_CODES <= set(CODES)


@pytest.mark.parametrize("run", ["llm_grpo_healthy", "llm_ppo_healthy"])
def test_healthy_runs_have_no_finding(run):
    assert codes(run) == set()


def test_length_hacking_run():
    # GRPO, reward = reverse_score + 0.1 per character, max_new_tokens 24: the length
    # goes to the cap within 17 iterations, the task's own reward falls to ~0.04
    assert codes("llm_length_hacking") == {
        "length-explosion", "truncation-high", "reward-hacking",
        # at the cap nothing more can be bought: updates stop moving the policy
        "clipfrac-zero"}
    f = finding("llm_length_hacking", "length-explosion")
    s = summary(f, "response_length_mean")
    assert s["start"] < 6 and s["end"] > 20
    assert "buying reward with length" in f.message and "dr-grpo" in f.message
    f = finding("llm_length_hacking", "reward-hacking")
    assert summary(f, "reward/reverse_score")["end"] < 0.1
    assert {e["metric"] for e in f.evidence} >= {"score_mean", "reward/reverse_score"}


def test_learning_rate_too_high():
    # GRPO at lr 5e-3 without a KL term: the score falls, the entropy collapses, the KL
    # to the reference jumps to ~2.4 nats per token, most groups end all-equal
    assert codes("llm_lr_too_high") == {
        "lm-entropy-collapse", "kl-ref-blowup", "zero-spread-groups", "kl-high",
        "length-collapse"}
    f = finding("llm_lr_too_high", "lm-entropy-collapse")
    s = summary(f, "entropy")
    assert s["end"] <= 0.2 * s["start"]
    assert summary(f, "score_mean")["end"] < summary(f, "score_mean")["start"]
    f = finding("llm_lr_too_high", "kl-ref-blowup")
    assert summary(f, "kl_ref_token")["end"] > 1.0


def test_clipping_saturated():
    # GRPO with 8 epochs at lr 1e-3: a third of the tokens' ratios leave the clip range
    assert codes("llm_clip_saturated") == {"clipfrac-high", "kl-high"}
    f = finding("llm_clip_saturated", "clipfrac-high")
    assert "saturated" in f.message and "action tokens" in f.message


@pytest.mark.parametrize("unit", ["sequence", "weight"])
def test_gspo_and_cispo_clip_shares_are_not_token_clip_fractions(unit):
    """GSPO clips whole sequences with a range of a few 1e-4, and CISPO's capped weights
    keep their gradient: neither share is judged as PPO-Clip's token clip fraction."""
    with open(DATA / "llm_clip_saturated.metrics.jsonl") as f:
        recs = [json.loads(x) for x in f]
    for r in recs:
        r[f"clipfrac_{unit}"] = r.pop("clipfrac")
    assert "clipfrac-high" not in {f.code for f in diagnose(MetricsTable(recs))}


def test_reward_that_never_pays():
    # a reward no completion earns: every group all-equal, no update moves the policy
    assert codes("llm_reward_never_pays") == {"zero-spread-groups", "clipfrac-zero",
                                              "reward-flat"}
    f = finding("llm_reward_never_pays", "reward-flat")
    assert "never moves" in f.message and "max_new_tokens" in f.message
    assert summary(finding("llm_reward_never_pays", "zero-spread-groups"),
                   "zero_spread_frac")["end"] == 1.0


def test_brevity_reward():
    # reverse_score − 0.3 per character: answers shrink to the EOS alone
    assert codes("llm_brevity") == {"length-collapse", "reward-hacking", "kl-ref-blowup",
                                    "zero-spread-groups"}
    s = summary(finding("llm_brevity", "length-collapse"), "response_length_mean")
    assert s["end"] < 1.5 < 5 < s["start"]


# -- the rules one by one on the healthy recording, with one series changed --------------

def healthy() -> list[dict]:
    with open(DATA / "llm_ppo_healthy.metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def diag(records) -> set[str]:
    return {f.code for f in diagnose(MetricsTable(records))}


def test_held_out_score_falling_while_training_reward_rises():
    recs = healthy()
    evals = [r for r in recs if "eval/score_mean" in r]
    for i, r in enumerate(evals):
        r["eval/score_mean"] = 0.6 - 0.3 * i / len(evals)
    assert diag(recs) == {"reward-hacking"}
    f = [f for f in diagnose(MetricsTable(recs)) if f.code == "reward-hacking"][0]
    assert "held-out score fell" in f.message
    # the same fall without a rising training reward is not hacking
    for r in recs:
        r["score_mean"] = 0.6
    assert "reward-hacking" not in diag(recs)


def test_one_reward_function_alone_is_not_a_component():
    # with a single reward function, reward/NAME is the score itself
    recs = healthy()
    assert all("reward/reverse_score" in r for r in recs)
    assert diag(recs) == set()


def test_sampler_mismatch_synthetic():
    recs = healthy()
    rng = np.random.default_rng(0)
    for r in recs:     # what a bf16 inference engine against a float32 trainer might show
        r["mismatch_k3_mean"] = float(abs(rng.normal(3e-3, 5e-4)))
    found = [f for f in diagnose(MetricsTable(recs)) if f.code == "sampler-mismatch"]
    assert len(found) == 1 and "old_logprobs = recompute" in found[0].message
    for r in recs:     # ppokit's sampler and trainer agree to float rounding
        r["mismatch_k3_mean"] = float(abs(rng.normal(1e-6, 1e-7)))
    assert diag(recs) == set()
    recs[40]["mismatch_k3_mean"] = 0.5            # one spike
    assert diag(recs) == set()


def test_kl_acceleration_without_a_high_level():
    recs = healthy()
    n = len(recs)
    for i, r in enumerate(recs):    # flat, then ×8 in the last third (per token still < 1)
        r["kl_ref"] = 0.3 if i < 2 * n // 3 else 0.3 * (1 + 7 * (3 * i / n - 2))
        r["kl_ref_token"] = r["kl_ref"] / 5.5
    assert "kl-ref-blowup" in diag(recs)


def test_single_spikes_do_not_trigger_lm_rules():
    recs = healthy()
    recs[30]["response_length_mean"] = 60.0
    recs[31]["response_length_mean"] = 0.5
    recs[50]["kl_ref_token"] = 9.0
    recs[60]["entropy"] = 0.0
    recs[70]["zero_spread_frac"] = 1.0
    assert diag(recs) == set()


def test_cli_names_the_provoked_run(capsys):
    assert main(["report", str(DATA / "llm_length_hacking.metrics.jsonl"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {f["code"] for f in out} >= {"length-explosion", "reward-hacking"}
    assert main(["report", "--list-codes"]) == 0
    listed = capsys.readouterr().out
    assert all(code in listed for code in LM_CODES)
