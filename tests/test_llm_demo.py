"""ppokit.llm: the reward-hacking demo and the benchmark run end to end (tiny budgets)."""

import json
import os

from ppokit.llm.evaluation.bench import bench_token_gae
from ppokit.llm.evaluation.demo import run_reward_hacking_demo


def test_reward_hacking_demo_runs_and_writes_its_figure(tmp_path):
    out = str(tmp_path / "rh")
    s = run_reward_hacking_demo(out, iterations=2, n_pairs=64, sft_steps=10,
                                log=lambda *a: None)
    assert set(s["runs"]) == {"beta0", "beta0.5"}
    for run in s["runs"].values():
        assert {"score_mean", "true_score_mean", "response_length_mean", "kl_ref"} <= set(run)
    assert os.path.exists(s["figure"])
    assert json.load(open(os.path.join(out, "summary.json")))["rm"]["n_eval"] > 0
    rec = json.loads(open(os.path.join(out, "beta0", "metrics.jsonl")).readline())
    assert "true_score_mean" in rec and rec["kl_coef"] == 0.0


def test_token_gae_benchmark_agrees_with_the_loop():
    g = bench_token_gae(batch=4, length=256, repeats=1)
    assert g["max_abs_diff"] < 1e-4


def test_trainer_benchmark_reports_each_phase():
    from ppokit.llm.evaluation.bench import bench_trainer

    t = bench_trainer("grpo", iterations=1, prompts_per_iter=2)
    assert t["sequences_per_iter"] == 8
    for phase in ("generation", "scoring", "training"):
        assert t[f"tokens_per_s_{phase}"] > 0
    assert t["cpu_seconds_per_iteration"] > 0


def test_benchmark_side_runs_in_its_own_process_and_the_table_gives_trl_over_ppokit():
    from ppokit.llm.evaluation.bench import in_own_process
    from ppokit.llm.evaluation.bench_trl import comparison_table

    t = in_own_process("bench_trainer", algo="grpo", iterations=1, prompts_per_iter=2)
    assert t["sequences_per_iter"] == 8 and t["peak_rss_mb"] >= t["rss_start_mb"] > 0
    trl = {**t, "time_generation": 2 * t["time_generation"],
           "seconds_per_iteration": 3 * t["seconds_per_iteration"],
           "tokens_per_s_total": t["tokens_per_s_total"] / 3,
           "completion_tokens_per_iteration": t["tokens_per_s_total"] * t["seconds_per_iteration"]}
    ckpt = {**trl, "seconds_per_iteration": 4 * t["seconds_per_iteration"],
            "tokens_per_s_total": t["tokens_per_s_total"] / 4}
    table = comparison_table(t, {"TRL": trl, "TRL ckpt": ckpt})
    assert "2.00x" in table.splitlines()[2]  # generation: TRL took twice as long
    end = next(x for x in table.splitlines() if "end to end" in x)
    assert end.split()[-3:] == ["3.00x", f"{ckpt['seconds_per_iteration']:.3f}", "4.00x"]
    assert next(x for x in table.splitlines() if "tokens per s" in x).endswith(
        "TRL 3.00x, TRL ckpt 4.00x")


def test_bench_rounds_tabulate_each_figures_median():
    from ppokit.llm.evaluation.bench import median_record
    from ppokit.llm.evaluation.bench_trl import comparison_table

    runs = [{"algo": "grpo", "seconds_per_iteration": s, "time_training": s / 2,
             "tokens_per_s_total": 100 / s, "cpu_seconds_per_iteration": s}
            for s in (1.0, 3.0, 1.5)]
    m = median_record(runs)
    assert m["algo"] == "grpo" and m["seconds_per_iteration"] == 1.5
    assert m["time_training"] == 0.75 and m["tokens_per_s_total"] == 100 / 1.5
    trl = {**m, "seconds_per_iteration": 3.0, "completion_tokens_per_iteration": 100}
    table = comparison_table(m, {"TRL": trl}, rounds=3)
    assert "medians of 3 runs" in table.splitlines()[0]
    assert next(x for x in table.splitlines() if "end to end" in x).endswith("2.00x")


def test_the_10m_benchmark_model_is_a_qwen2_of_about_ten_million_parameters():
    from ppokit.llm.evaluation.bench import build_bench_model
    from ppokit.llm.modeling.models import build_char_tokenizer, count_parameters

    m = build_bench_model("10m", build_char_tokenizer())
    assert type(m).__name__ == "Qwen2ForCausalLM"
    assert 9e6 < count_parameters(m) < 12e6
