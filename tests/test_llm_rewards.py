"""ppokit.llm: reward functions in TRL's calling convention, prompt datasets (plain and
chat), the explicit eval split, the scale warnings and the Python ``train`` API (tiny
models, a few iterations; the learning test of the quick start is in
test_llm_quickstart.py)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ppokit.cli import main
from ppokit.errors import UsageError
from ppokit.llm.inputs.data import load_rows, render_prompt
from ppokit.llm.inputs.rewards import RewardSet, check_scores
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy
from ppokit.llm.training.trainer import LLMConfig, TokenTrainer

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} | {% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture
def chat_tok():
    t = build_char_tokenizer()
    t.chat_template = TEMPLATE
    return t


def _rows(n=10, chat=False):
    out = []
    for i in range(n):
        q = f"what is {i % 5}+1"
        out.append({"prompt": [{"role": "user", "content": q}] if chat else q,
                    "answer": str(i % 5 + 1), "level": i % 3})
    return out


def _trainer(tmp_path, tok, rows, rewards, name="run", **kw):
    base = {"algo": "grpo", "prompts_per_iter": 4, "samples_per_prompt": 2, "iterations": 1,
            "checkpoint_every": 1000, "max_new_tokens": 4, "prompts": "<list>",
            "reward": tuple(rewards)}
    log = kw.pop("log", lambda *a: None)
    base.update(kw)
    return TokenTrainer(LLMConfig(**base), str(tmp_path / name),
                        policy=build_tiny_model(tok, seed=0), tokenizer=tok, log=log,
                        train_rows=rows)


# ------------------------------------------------------------------ calling convention

def test_reward_functions_receive_trl_keyword_arguments(tmp_path, chat_tok):
    seen = []

    def spy(prompts, completions, completion_ids, answer, level, **kwargs):
        seen.append(dict(prompts=prompts, completions=completions, ids=completion_ids,
                         answer=answer, level=level, extra=kwargs))
        return [float(len(c[0]["content"])) for c in completions]

    tr = _trainer(tmp_path, chat_tok, _rows(chat=True), [spy])
    recs = tr.train(progress=False)
    tr.close()
    assert len(seen) == 2  # the probe before training, then iteration 1
    call = seen[-1]
    n = 8
    assert all(len(call[k]) == n for k in ("prompts", "completions", "ids", "answer",
                                           "level"))
    assert call["extra"] == {}
    assert all(isinstance(p, list) and p[0]["role"] == "user" for p in call["prompts"])
    for c, ids in zip(call["completions"], call["ids"]):
        assert c == [{"role": "assistant", "content": chat_tok.decode(
            ids, skip_special_tokens=True)}]
    # rows repeat per group: the answer column travels with its prompt
    for p, a in zip(call["prompts"], call["answer"]):
        assert str(int(p[0]["content"][8]) + 1) == a
    assert recs[0]["reward/spy"] == pytest.approx(recs[0]["score_mean"])
    assert "reward/spy_std" in recs[0]


def test_plain_prompts_are_used_as_they_are_and_chat_prompts_through_the_template(chat_tok):
    assert render_prompt(chat_tok, "12+3=") == "12+3="
    text = render_prompt(chat_tok, [{"role": "user", "content": "hi"}])
    assert text == "user: hi | assistant: "


def test_a_tokenizer_without_a_chat_template_is_a_clear_error_before_training(tmp_path,
                                                                               tok):
    with pytest.raises(UsageError, match="chat template") as e:
        _trainer(tmp_path, tok, _rows(chat=True), [lambda completions, **k: [0.0]
                                                   * len(completions)])
    assert len(str(e.value).splitlines()) == 1
    assert not (tmp_path / "run").exists()  # a failed start leaves nothing behind


def test_weighted_sum_skips_none_and_logs_each_function(tmp_path, tok):
    def half(completions, **kwargs):
        return [1.0 if i % 2 else None for i in range(len(completions))]

    def const(prompts, completions):  # the earlier two-argument form still works
        return [0.25] * len(completions)

    msgs = []
    tr = _trainer(tmp_path, tok, _rows(), [half, const], reward_weights=(2.0, -1.0),
                  log=msgs.append)
    rows = tr.sample_rows(4)
    roll = tr.rollout([tr.prompt_text(r) for r in rows])
    _, total, per = tr.score_rows(rows, roll)
    assert total.tolist() == [-0.25, 1.75, -0.25, 1.75]
    assert torch.isnan(per["half"][0]) and per["half"][1] == 1.0
    recs = tr.train(progress=False)
    tr.close()
    assert recs[0]["reward/half"] == 1.0 and recs[0]["reward/const"] == 0.25


def test_a_completion_no_function_scored_gets_zero_with_a_warning():
    msgs = []
    rs = RewardSet([lambda completions, **k: [None, 1.0]], log=msgs.append)
    total, _ = rs(["a", "b"], ["x", "y"])
    assert total.tolist() == [0.0, 1.0]
    assert len(msgs) == 1 and "None" in msgs[0]


@pytest.mark.parametrize("ret, match", [
    (lambda n: [0.0] * (n - 1), "returned 7 values, expected 8"),
    (lambda n: [math.nan] * n, "element 0 is nan"),
    (lambda n: ["1"] * n, "element 0 is str"),
    (lambda n: 1.0, "returned float"),
    (lambda n: torch.full((n,), math.inf), "NaN or inf"),
])
def test_a_wrong_return_value_stops_the_run_before_training(tmp_path, tok, ret, match):
    def bad_reward(completions, **kwargs):
        return ret(len(completions) * 4)  # the probe scores 2: make every count wrong

    def bad(completions, **kwargs):
        return ret(8) if len(completions) == 8 else [0.0] * len(completions)

    # the probe (2 completions) catches it before any update
    with pytest.raises(UsageError, match="'bad_reward'") as e:
        _trainer(tmp_path, tok, _rows(), [bad_reward])
    assert len(str(e.value).splitlines()) == 1
    # a function that goes wrong only later is named all the same
    tr = _trainer(tmp_path, tok, _rows(), [bad], name="later")
    with pytest.raises(UsageError, match=f"'bad'.*{match}"):
        tr.train(progress=False)
    tr.close()


@pytest.mark.parametrize("fn, match", [
    (lambda x, completions: [0.0], "required parameter 'x' is not passed"),
    (lambda: [0.0], "takes none of the keyword arguments"),
    (eval("lambda prompts, /, completions: [0.0]"), "positional-only"),  # noqa: S307
])
def test_a_wrong_signature_is_one_line_naming_the_function(tmp_path, tok, fn, match):
    with pytest.raises(UsageError, match=match) as e:
        _trainer(tmp_path, tok, _rows(), [fn])
    assert "'<lambda>'" in str(e.value) and len(str(e.value).splitlines()) == 1


@given(st.lists(st.lists(st.one_of(st.none(), st.floats(-1e3, 1e3)), min_size=5,
                         max_size=5), min_size=1, max_size=4),
       st.lists(st.floats(-10, 10), min_size=4, max_size=4))
def test_reward_set_total_equals_a_plain_weighted_sum(values, weights):
    fns = [lambda completions, v=v, **k: list(v) for v in values]
    rs = RewardSet(fns, weights[:len(fns)], log=lambda m: None)
    total, _ = rs(["p"] * 5, ["c"] * 5)
    for j in range(5):
        ref = sum(w * v[j] for v, w in zip(values, weights) if v[j] is not None)
        assert total[j].item() == pytest.approx(ref, rel=1e-5, abs=1e-3)


def test_check_scores_accepts_numbers_none_and_arrays():
    import numpy as np

    assert check_scores([1, 2.5, None, np.float32(3)], 4)[:2].tolist() == [1.0, 2.5]
    assert check_scores(np.array([1.0, 2.0]), 2).tolist() == [1.0, 2.0]
    with pytest.raises(UsageError, match="'f': element 1 is bool"):
        check_scores([1.0, True], 2, "f")


# ------------------------------------------------------------------ datasets

def test_datasets_load_from_jsonl_json_csv_lists_and_datasets(tmp_path):
    rows = _rows(4, chat=True)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "a.csv").write_text("prompt,answer\nwhat is 1+1,2\nwhat is 2+2,4\n")
    (tmp_path / "a.txt").write_text("first prompt\n\nsecond prompt\n")
    assert load_rows(str(tmp_path / "a.jsonl")) == rows
    assert load_rows(str(tmp_path / "a.json")) == rows
    assert load_rows(str(tmp_path / "a.csv")) == [{"prompt": "what is 1+1", "answer": "2"},
                                                  {"prompt": "what is 2+2", "answer": "4"}]
    assert load_rows(str(tmp_path / "a.txt")) == [{"prompt": "first prompt"},
                                                  {"prompt": "second prompt"}]
    assert load_rows(["a", {"prompt": "b", "x": 1}]) == [{"prompt": "a"},
                                                         {"prompt": "b", "x": 1}]
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(rows)
    assert load_rows(ds) == rows
    ds.to_parquet(str(tmp_path / "a.parquet"))
    assert load_rows(str(tmp_path / "a.parquet")) == rows
    with pytest.raises(UsageError, match="DatasetDict"):
        load_rows(datasets.DatasetDict({"train": ds}))


@pytest.mark.parametrize("rows, match", [
    ([], "holds no rows"),
    ([{"question": "x"}], "row 0 has no 'prompt' column"),
    ([{"prompt": ""}], "empty string"),
    ([{"prompt": [{"role": "user"}]}], "list of {'role': str, 'content': str}"),
    ([{"prompt": 3}], "must be a string or a list"),
    ([{"prompt": "a", "x": object()}], "JSON values"),
    ([3], "row 0 is a int"),
])
def test_bad_rows_are_refused_naming_the_row(rows, match):
    with pytest.raises(UsageError, match=match):
        load_rows(rows, "train_dataset")


# ------------------------------------------------------------------ defaults and warnings

def test_the_eval_split_is_said_and_a_penalty_that_dwarfs_the_rewards_is_warned(tmp_path,
                                                                                tok):
    msgs = []

    def tiny(completions, **kwargs):  # a reward of size ~0.03, as in the issue
        return [0.03 * len(c) / 4 for c in completions]

    tr = _trainer(tmp_path, tok, _rows(), [tiny], truncation="penalty", log=msgs.append,
                  iterations=2)
    tr.train(progress=False)
    tr.close()
    assert any("9 rows for training, 1 held out" in m and "eval_fraction=0.1" in m
               for m in msgs)
    assert sum("truncation_penalty 0.5 is" in m for m in msgs) == 1
    # the default scores a cut completion like any other: no penalty, no warning
    assert LLMConfig().resolved().truncation == "none"


def test_a_kl_term_that_dwarfs_the_rewards_is_warned_once(tmp_path, tok):
    msgs = []
    tr = _trainer(tmp_path, tok, _rows(), [lambda completions, **k: [0.0] * len(completions)],
                  log=msgs.append)
    rec = {"score_std": 0.01, "kl_coef": 0.5, "kl_ref": 2.0, "truncated_frac": 0.0}
    tr._check_scales(rec)
    tr._check_scales(rec)
    tr._check_scales({**rec, "kl_ref": 0.1})
    tr.close()
    warned = [m for m in msgs if "the KL term" in m]
    assert len(warned) == 1 and "100x the spread" in warned[0]
    msgs.clear()
    tr = _trainer(tmp_path, tok, _rows(), [lambda completions, **k: [0.0] * len(completions)],
                  name="small", log=msgs.append)
    tr._check_scales({**rec, "kl_ref": 0.1})  # 0.05 vs 0.01: not ten times
    tr.close()
    assert not [m for m in msgs if "warning" in m]


# ------------------------------------------------------------------ command line

def test_cli_rewards_from_the_current_directory_repeatable_and_named_again(tmp_path,
                                                                           monkeypatch,
                                                                           capsys, tok):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(__import__("sys").modules, "qs_rewards", raising=False)
    (tmp_path / "qs_rewards.py").write_text(
        "def length(completions, **kwargs):\n    return [len(c) / 4 for c in completions]\n"
        "def has_answer(completions, answer, **kwargs):\n"
        "    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]\n")
    save_policy(build_tiny_model(tok, seed=0), tok, str(tmp_path / "m"))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    argv = ["llm", "train", "--model", "m", "--prompts", "p.jsonl", "--algo", "grpo",
            "--reward", "qs_rewards:length", "--reward", "qs_rewards:has_answer",
            "--reward-weights", "0.5,1", "--iterations", "2", "--prompts-per-iter", "4",
            "--max-new-tokens", "4", "--run-dir", "r", "--no-progress", "--no-eval"]
    assert main(argv) == 0
    recs = [json.loads(x) for x in open(tmp_path / "r" / "metrics.jsonl")]
    assert {"reward/length", "reward/has_answer"} <= set(recs[0])
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["reward"] == "qs_rewards:length,qs_rewards:has_answer"
    assert cfg["reward_weights"] == [0.5, 1.0]
    capsys.readouterr()
    # the run directory is data: evaluation names the rewards again
    assert main(["llm", "eval", "r", "--n-prompts", "1"]) == 2
    err = capsys.readouterr().err
    assert "--reward qs_rewards:length --reward qs_rewards:has_answer again" in err
    assert main(["llm", "eval", "r", "--n-prompts", "1", "--reward", "qs_rewards:length",
                 "--reward", "qs_rewards:has_answer"]) == 0
    ev = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert {"reward/length", "reference_reward/has_answer"} <= set(ev)
    # the environment commands on a language-model run: work, or point to `ppokit llm`
    capsys.readouterr()
    assert main(["eval", "r"]) == 2
    err = capsys.readouterr().err
    assert "ppokit llm eval r" in err and len(err.splitlines()) == 1
    assert main(["plot", "r", "--out", "curves.png"]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert main(["report", "r"]) == 0
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return
    assert any((tmp_path / "r" / "tb").iterdir())  # TensorBoard scalars, as env runs


# ------------------------------------------------------------------ Python API

def test_train_api_with_a_loaded_model_list_data_callbacks_and_the_run_object(tmp_path,
                                                                              chat_tok):
    import ppokit.llm as llm

    calls = []

    def stop_after_two(rec):
        calls.append(rec["iteration"])
        return "stop" if rec["iteration"] >= 2 else None  # (as in the env trainer)

    def correct(completions, answer, **kwargs):
        return [1.0 if c[0]["content"].strip() == a else 0.0
                for c, a in zip(completions, answer)]

    run = llm.train(build_tiny_model(chat_tok, seed=0), correct, _rows(10, chat=True),
                    eval_dataset=_rows(3, chat=True), tokenizer=chat_tok,
                    run_dir=tmp_path / "api", callbacks=[stop_after_two], iterations=5,
                    prompts_per_iter=4, max_new_tokens=4, log=lambda *a: None)
    assert calls == [1, 2] and len(run.history) == 2
    assert "reward/correct" in run.history[0]
    ev = run.evaluate()
    assert ev["n"] == 3 and {"score_mean", "reference_score_mean", "reward/correct"} <= set(ev)
    out = run.generate([[{"role": "user", "content": "what is 1+1"}], "plain"])
    assert len(out) == 2 and all(isinstance(s, str) for s in out)
    run.save(tmp_path / "saved")
    assert (tmp_path / "saved" / "config.json").is_file()
    assert (tmp_path / "api" / "checkpoints").is_dir()
    cfg = json.loads((tmp_path / "api" / "config.json").read_text())
    assert cfg["reward"].startswith("python:") and cfg["reward"].endswith("correct")
    # resuming names the reward again: nothing in the run directory is imported
    with pytest.raises(UsageError, match="reward functions again"):
        TokenTrainer(LLMConfig(iterations=6), str(tmp_path / "api"), resume=True,
                     log=lambda *a: None)


@pytest.mark.parametrize("kw, match", [
    (dict(learning_rat=1e-3), "did you mean 'learning_rate'"),
    (dict(prompts="x.jsonl"), "give it as train\\(train_dataset="),
    (dict(callbacks=[3]), "callbacks: expected functions"),
    (dict(reward_weights=[1.0, 2.0]), "reward_weights: expected 1 weights"),
])
def test_train_api_refuses_bad_arguments_in_one_line(tmp_path, monkeypatch, kw, match):
    import ppokit.llm as llm

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=match) as e:
        llm.train(str(tmp_path / "nowhere"), lambda completions, **k: [], ["a", "b"],
                  log=lambda *a: None, **kw)
    assert len(str(e.value).splitlines()) == 1
    assert not os.path.exists(tmp_path / "runs")


def test_unreadable_prompt_files_are_one_line_errors(tmp_path):
    (tmp_path / "extra.csv").write_text("prompt,answer\nhi,1,surplus\n")
    with pytest.raises(UsageError, match="row 0 has a value without a column name"):
        load_rows(str(tmp_path / "extra.csv"))
    (tmp_path / "latin.jsonl").write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(UsageError, match="is not UTF-8 text"):
        load_rows(str(tmp_path / "latin.jsonl"))


def test_a_reward_model_beside_python_reward_functions_is_refused():
    from ppokit.llm.training.trainer import LLMConfig, reward_set

    with pytest.raises(UsageError, match="reward_model: give it in reward_funcs"):
        reward_set(LLMConfig(reward_model="somewhere"), reward_fn=lambda completions,
                   **kw: [0.0] * len(completions))
