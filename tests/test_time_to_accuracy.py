"""``bench.time_to_accuracy``: both sides do the same work per generation and are scored
on the same held-out rows by the same function; the table's arithmetic."""

import json

import pytest
from bench import _tta_worker as worker
from bench import time_to_accuracy as tta


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The built-in tiny model saved with a chat template: a pretrained chat model's
    stand-in (the numbers task needs one)."""
    from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy

    d = tmp_path_factory.mktemp("model") / "chat"
    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} | "
                         "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    save_policy(build_tiny_model(tok), tok, str(d))
    return str(d)


def _cfg(model, seed=0):
    from ppokit.llm.training.config import LLMConfig

    # SmolLM2's geometry (16 prompts x 4, two minibatches) on the stand-in model
    return LLMConfig(algo="grpo", model=model, task="numbers", seed=seed,
                     prompts_per_iter=16, samples_per_prompt=4, batch_size=32,
                     **tta.SHARED).resolved()


def test_trl_generates_and_steps_as_ppokit_does(tmp_path, chat_model):
    pytest.importorskip("trl")
    cfg = _cfg(chat_model)
    args = worker.trl_config(cfg, str(tmp_path), 0, "fp32", 60.0)
    n = cfg.prompts_per_iter * cfg.samples_per_prompt
    assert args.generation_batch_size == n
    assert args.num_generations == cfg.samples_per_prompt
    assert args.per_device_train_batch_size * args.steps_per_generation == n
    assert args.steps_per_generation == n // cfg.batch_size  # minibatches per generation
    assert args.num_iterations == cfg.n_epochs
    assert args.max_completion_length == cfg.max_new_tokens
    assert (args.temperature, args.top_k, args.top_p) == (cfg.temperature, 0, 1.0)
    assert args.learning_rate == cfg.learning_rate
    assert getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type) == "constant"
    assert args.beta == cfg.kl_coef == 0.0
    assert (args.epsilon, args.max_grad_norm) == (cfg.clip_range, cfg.max_grad_norm)
    assert not args.bf16 and not args.gradient_checkpointing


def test_the_worker_scores_the_rows_ppokits_trainer_scores(tmp_path, chat_model):
    from ppokit.llm.training.trainer import TokenTrainer

    cfg = _cfg(chat_model, seed=3)
    rows, rewards, _ = worker.heldout(cfg)
    tr = TokenTrainer(cfg, str(tmp_path / "run"), log=lambda *a, **k: None)
    assert rows == tr.eval_rows[: cfg.n_eval_prompts]
    assert len(rows) == tta.SHARED["n_eval_prompts"]
    assert rewards.labels == tr.rewards.labels


def test_ppokit_rows_run_the_trainer_with_the_shared_settings(tmp_path):
    cmd = tta.ppokit_command("ppokit-async-vllm", "py", "M", 2, 600.0, tmp_path / "r")
    assert cmd[:5] == ["py", "-m", "ppokit", "llm", "train"]
    assert cmd[cmd.index("--seed") + 1] == "2" and cmd[cmd.index("--time-limit") + 1] == "600.0"
    sets = cmd[cmd.index("--set") + 1:]
    assert {"kl_coef=0.0", "n_eval_prompts=128", "max_staleness=1",
            "sampler_precision=bf16", "rollout_is=truncate", "precision=bf16"} <= set(sets)
    assert cmd.count("--set") == 1
    fp32 = tta.ppokit_command("ppokit-vllm", "py", "M", 2, 600.0, tmp_path / "r", "fp32")
    assert {"precision=fp32", "sampler_precision=fp32"} <= set(fp32[fp32.index("--set") + 1:])
    (tmp_path / "r" / "checkpoints").mkdir(parents=True)
    assert tta.ppokit_command("ppokit", "py", "M", 2, 600.0, tmp_path / "r")[-2:] == [
        "--resume", str(tmp_path / "r")]
    # every side runs the bench's thread count, whatever the machine's load at its start
    env = tta._env(3)
    assert env["PPOKIT_THREADS"] == env["OMP_NUM_THREADS"] == "3"


def test_the_curve_is_read_from_the_trainers_metrics(tmp_path):
    lines = [{"iteration": 1, "wall_time": 10.0},
             {"iteration": 2, "wall_time": 21.0, "eval/score_mean": 0.25},
             {"iteration": 4, "wall_time": 40.0, "eval/score_mean": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert tta.ppokit_curve(tmp_path) == [
        {"train_s": 21.0, "iteration": 2, "accuracy": 0.25, "n": 128},
        {"train_s": 40.0, "iteration": 4, "accuracy": 0.5, "n": 128}]


EPYC = {"cpu": "AMD EPYC", "avx512": True, "avx512_bf16": True, "cores": 2}


def _result(results, row, seed, curve, budget=100.0, threads=2, precision="bf16",
            machine=EPYC):
    p = tta.result_path(row, seed, results)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"row": row, "seed": seed, "budget_s": budget, "notes": {},
                             "threads": threads, "precision": precision, "machine": machine,
                             "curve": [{"train_s": t, "accuracy": a} for t, a in curve]}))


def test_time_to_target_and_the_table(tmp_path):
    assert tta.time_to([{"train_s": 0, "accuracy": 0.2}, {"train_s": 9, "accuracy": 0.5},
                        {"train_s": 12, "accuracy": 0.7}], 0.5) == 9
    assert tta.time_to([{"train_s": 0, "accuracy": 0.2}], 0.5) is None
    _result(tmp_path, "ppokit", 0, [(0, 0.2), (10, 0.6)])
    _result(tmp_path, "ppokit", 1, [(0, 0.2), (10, 0.3), (20, 0.55)])
    _result(tmp_path, "trl", 0, [(0, 0.2), (45, 0.5), (100, 0.52)])
    s = tta.summarise(tmp_path, 0.5)
    assert s["ppokit"]["times"] == [10, 20] and s["trl"]["times"] == [45]
    text = tta.table(s, 0.5)
    # two seeds: 15 ± 12.7 × 5 s, the interval's lower end cut at 0 s
    assert "| ppokit | 2 | 15 [0, 79] (2 of 2)" in text
    assert "3.00×" in text  # TRL's 45 s over ppokit's mean 15 s
    assert tta.write_table(tmp_path, 0.5).startswith(
        "Budget 100 s of training per run, 2 torch threads, bf16, on AMD EPYC (AVX-512 with "
        "BF16, 2 cores).")
    _result(tmp_path, "trl", 0, [(0, 0.2), (100, 0.4)])
    assert "> 6.67× (TRL did not reach it)" in tta.table(tta.summarise(tmp_path, 0.5), 0.5)


def test_the_intervals_stay_within_what_the_quantity_can_take():
    from bench.learning_table import t_interval

    xs = [0.6, 0.95]  # mean 0.775, t interval 0.775 ± 12.7 × 0.175: about [-1.45, 3.00]
    assert t_interval(xs)[1] < 0 and t_interval(xs)[2] > 1
    m, lo, hi = tta.mean_ci(xs, 0.0, 1.0)
    assert m == pytest.approx(0.775) and (lo, hi) == (0.0, 1.0)
    m, lo, hi = tta.mean_ci([500.0, 520.0, 540.0])  # narrow enough: nothing cut
    assert (m, lo, hi) == pytest.approx(t_interval([500.0, 520.0, 540.0]))
    assert tta.mean_ci([7.0]) == (7.0, 7.0, 7.0)


def test_one_table_holds_runs_of_one_budget_thread_count_number_format_and_machine(tmp_path):
    _result(tmp_path, "ppokit", 0, [(0, 0.2), (10, 0.6)])
    _result(tmp_path, "trl", 0, [(0, 0.2), (45, 0.5)], budget=200.0)
    with pytest.raises(SystemExit, match="budget 200 s, 2 threads, bf16"):
        tta.summarise(tmp_path, 0.5)
    _result(tmp_path, "trl", 0, [(0, 0.2), (45, 0.5)], threads=1)
    with pytest.raises(SystemExit, match="1 threads"):
        tta.summarise(tmp_path, 0.5)
    _result(tmp_path, "trl", 0, [(0, 0.2), (45, 0.5)], precision="fp32")
    with pytest.raises(SystemExit, match="fp32"):
        tta.summarise(tmp_path, 0.5)
    # another CPU: one without AVX-512 runs bf16 and ppokit's kernels at other speeds
    _result(tmp_path, "trl", 0, [(0, 0.2), (45, 0.5)],
            machine={**EPYC, "avx512": False, "avx512_bf16": False})
    with pytest.raises(SystemExit, match=r"on AMD EPYC \(AVX2, 2 cores\), but .* on AMD "
                                         r"EPYC \(AVX-512 with BF16, 2 cores\)"):
        tta.summarise(tmp_path, 0.5)
    _result(tmp_path, "trl", 0, [(0, 0.2), (45, 0.5)])
    assert tta.summarise(tmp_path, 0.5)["trl"]["times"] == [45]


def test_a_run_directory_is_resumed_only_with_its_own_budget_and_format(tmp_path):
    run = tmp_path / "r"
    tta.check_resumable(run, 1200.0, "bf16")  # nothing there: a fresh start
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"time_limit": 2400.0, "precision": "fp32"}))
    with pytest.raises(SystemExit, match="time_limit 2400.0 and precision fp32") as got:
        tta.check_resumable(run, 1200.0, "bf16")
    assert got.value.code == 2  # as a bad argument's
    (run / "config.json").write_text(json.dumps({"time_limit": 1200.0, "precision": "bf16"}))
    tta.check_resumable(run, 1200.0, "bf16")
    (run / "config.json").write_text("{")
    with pytest.raises(SystemExit, match="no readable config.json"):
        tta.check_resumable(run, 1200.0, "bf16")


def test_a_result_records_the_machine_it_ran_on():
    m = tta.machine()
    assert set(m) == {"cpu", "avx512", "avx512_bf16", "cores"} and m["cores"] >= 1
    assert isinstance(m["avx512"], bool) and m["cpu"]
    assert tta.machine_label(m).startswith(m["cpu"])
    assert tta.machine_label(None) == "a machine not recorded"
