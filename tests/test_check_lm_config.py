"""ppokit check --lm / --model: the run's configuration, checked before any training. Each
check is caught on a configuration that has its problem and quiet on the presets."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("transformers")

from ppokit.checks.codes import CHECKS  # noqa: E402
from ppokit.checks.lm_config import run_config_checks  # noqa: E402
from ppokit.cli import main  # noqa: E402
from ppokit.llm.inputs.task import make_task  # noqa: E402
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy  # noqa: E402
from ppokit.llm.training.config import LLMConfig  # noqa: E402
from ppokit.llm.training.sft import builtin_sft  # noqa: E402

CONFIG_CHECKS = ["lm-group-size", "lm-kl-reference", "lm-chat-template",
                 "lm-reward-constant", "lm-truncation", "lm-prompt-length"]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def warm(tok):
    """The built-in model after the warm start ppokit llm train gives it."""
    model = build_tiny_model(tok, seed=0)
    builtin_sft(make_task("reverse"), model, tok, steps=150, seed=0)
    return model


def statuses(results) -> dict[str, str]:
    return {r.name: r.status for r in results}


def flagged(results) -> dict[str, str]:
    return {r.name: r.status for r in results if r.status in ("WARN", "FAIL")}


@pytest.mark.parametrize("algo", ["ppo", "grpo", "dr-grpo", "rloo", "reinforce++", "gspo",
                                  "cispo", "dapo"])
def test_presets_pass(warm, tok, algo):
    res = run_config_checks(LLMConfig(algo=algo), warm, tok)
    assert [r.name for r in res] == CONFIG_CHECKS and set(CONFIG_CHECKS) <= set(CHECKS)
    assert flagged(res) == {}, [(r.name, r.measured) for r in res]


@pytest.mark.parametrize("algo", ["grpo", "dr-grpo", "rloo", "gspo", "cispo", "dapo"])
def test_group_estimator_with_one_sample(warm, tok, algo):
    res = run_config_checks(LLMConfig(algo=algo, samples_per_prompt=1), warm, tok)
    assert flagged(res) == {"lm-group-size": "FAIL"}
    r = res[0]
    assert r.values["samples_per_prompt"] == 1 and "--samples-per-prompt" in r.fix
    # REINFORCE++ takes one sample per prompt by design
    ok = run_config_checks(LLMConfig(algo="reinforce++", samples_per_prompt=1), warm, tok)
    assert statuses(ok)["lm-group-size"] == "PASS"


def test_kl_coefficient_without_a_kl_term(warm, tok):
    res = run_config_checks(LLMConfig(kl_coef=0.1, kl_mode="none"), warm, tok)
    assert flagged(res) == {"lm-kl-reference": "FAIL"}
    assert "kl_coef = 0.1" in res[1].measured
    res = run_config_checks(LLMConfig(algo="grpo", kl_target=1.0, kl_mode="none"), warm, tok)
    assert flagged(res) == {"lm-kl-reference": "FAIL"}
    # the preset's coefficient with the KL switched off: nothing was asked for
    res = run_config_checks(LLMConfig(algo="grpo", kl_mode="none"), warm, tok)
    assert flagged(res) == {}


def constant_reward(completions, **kwargs):
    return [0.5 for _ in completions]


def prompt_parity(prompts, completions, **kwargs):
    """Bug: scores the prompt, not the completion."""
    return [float(len(p) % 2) for p in prompts]


def test_reward_constant_on_sampled_completions(warm, tok):
    from ppokit.llm.inputs.task import reverse_score

    res = run_config_checks(LLMConfig(algo="grpo"), warm, tok,
                            reward_fn=[reverse_score, constant_reward])
    assert flagged(res) == {"lm-reward-constant": "FAIL"}
    r = {x.name: x for x in res}["lm-reward-constant"]
    assert "constant_reward returned 0.5 for all 32" in r.detail
    assert r.values["ranges"]["constant_reward"] == (0.5, 0.5)


def test_rewards_equal_within_groups(warm, tok):
    res = run_config_checks(LLMConfig(algo="grpo"), warm, tok, reward_fn=prompt_parity)
    assert flagged(res) == {"lm-reward-constant": "WARN"}
    r = {x.name: x for x in res}["lm-reward-constant"]
    assert r.values["zero_spread_frac"] == 1.0
    # with one sample per prompt (PPO) the groups do not matter
    res = run_config_checks(LLMConfig(algo="ppo"), warm, tok, reward_fn=prompt_parity)
    assert flagged(res) == {}


def test_max_length_that_truncates_most_responses(warm, tok):
    res = run_config_checks(LLMConfig(max_new_tokens=3), warm, tok)
    assert flagged(res) == {"lm-truncation": "WARN"}
    r = {x.name: x for x in res}["lm-truncation"]
    assert r.values["truncated_frac"] > 0.5 and "max_new_tokens = 3" in r.measured


def _prompts_file(tmp_path, rows) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _digit_rows(n=40, seed=0):
    rng = random.Random(seed)
    return [{"prompt": "".join(rng.choice("0123456789") for _ in range(4)) + ">"}
            for _ in range(n)]


def chat_reverse(prompts, completions, **kwargs):
    """The reverse task's score on conversations (the last message, the assistant's)."""
    from ppokit.llm.inputs.task import score_one

    return [score_one(p[-1]["content"], c[0]["content"]) for p, c in zip(prompts, completions)]


def test_conversation_prompts_need_a_chat_template(warm, tok, tmp_path):
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in _digit_rows()]
    # max_new_tokens 9 as the built-in task's (a prompts file's default, 64, fills the
    # tiny model's whole context: lm-prompt-length says so)
    cfg = LLMConfig(algo="grpo", prompts=_prompts_file(tmp_path, rows), reward=chat_reverse,
                    max_new_tokens=9)
    res = run_config_checks(cfg, warm, tok)
    assert statuses(res) == {"lm-group-size": "PASS", "lm-kl-reference": "PASS",
                             "lm-chat-template": "FAIL", "lm-reward-constant": "SKIP",
                             "lm-truncation": "SKIP", "lm-prompt-length": "SKIP"}
    import copy

    with_template = copy.deepcopy(tok)
    with_template.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    res = run_config_checks(cfg, warm, with_template)
    assert flagged(res) == {}
    assert "conversations, chat template present" in res[2].measured
    # the reverse task's own reward reads plain-text prompts: it raises on conversations,
    # and that is said before any training, in one line
    from dataclasses import replace

    res = run_config_checks(replace(cfg, reward="ppokit.llm.inputs.task:reverse_score"), warm,
                            with_template)
    r = {x.name: x for x in res}["lm-reward-constant"]
    assert r.status == "FAIL" and "raised AttributeError" in r.detail


def test_prompts_longer_than_the_context(warm, tok, tmp_path):
    rows = _digit_rows()
    rows[7] = {"prompt": "1" * 60 + ">"}          # 62 tokens with BOS; the context is 64
    cfg = LLMConfig(algo="grpo", prompts=_prompts_file(tmp_path, rows),
                    reward="ppokit.llm.inputs.task:reverse_score", max_new_tokens=9)
    res = run_config_checks(cfg, warm, tok)
    assert flagged(res) == {"lm-prompt-length": "FAIL"}
    r = {x.name: x for x in res}["lm-prompt-length"]
    assert r.values["over"] == 1 and r.values["longest"] == 62 and r.values["context"] == 64
    assert statuses(res)["lm-reward-constant"] == "SKIP"
    # the default max_new_tokens of a prompts file (64) leaves no room at all
    cfg = LLMConfig(algo="grpo", prompts=cfg.prompts, reward="ppokit.llm.inputs.task:reverse_score")
    r = {x.name: x for x in run_config_checks(cfg, warm, tok)}["lm-prompt-length"]
    assert r.status == "FAIL" and r.values["over"] == len(rows)
    rows[7] = {"prompt": "1" * 40 + ">"}
    cfg = LLMConfig(algo="grpo", prompts=_prompts_file(tmp_path, rows),
                    reward="ppokit.llm.inputs.task:reverse_score", max_new_tokens=9)
    assert statuses(run_config_checks(cfg, warm, tok))["lm-prompt-length"] == "PASS"


# -- command line ----------------------------------------------------------------------

def test_cli_with_the_train_flags(warm, tok, tmp_path, capsys):
    # (--lm runs the same after the warm start: tests/test_check_lm.py::test_cli_builtin_lm)
    save_policy(warm, tok, str(tmp_path / "m"))
    argv = ["check", "--model", str(tmp_path / "m"), "--algo", "grpo", "--task", "reverse",
            "--samples-per-prompt", "1", "--no-labels", "--json"]
    assert main(argv) == 1
    out = json.loads(capsys.readouterr().out)
    res = {r["name"]: r["status"] for r in out["results"]}
    assert not out["ok"] and {k for k, v in res.items() if v != "PASS"} == {"lm-group-size"}
    assert res["lm-group-size"] == "FAIL" and res["padding-invariance"] == "PASS"


def test_cli_model_dir_with_prompts_and_reward(warm, tok, tmp_path, capsys):
    save_policy(warm, tok, str(tmp_path / "m"))
    rows = _digit_rows()
    rows[3] = {"prompt": "9" * 60 + ">"}
    argv = ["check", "--model", str(tmp_path / "m"), "--prompts",
            _prompts_file(tmp_path, rows), "--reward", "ppokit.llm.inputs.task:reverse_score",
            "--algo", "grpo", "--max-new-tokens", "9", "--no-labels", "--json"]
    assert main(argv) == 1
    res = {r["name"]: r["status"] for r in json.loads(capsys.readouterr().out)["results"]}
    assert res["lm-prompt-length"] == "FAIL" and res["lm-chat-template"] == "PASS"


@pytest.mark.parametrize("argv,flag", [
    (["--algo", "grpo"], "--algo"), (["--set", "kl_coef=0.1"], "--set"),
    (["--lm", "--no-config", "--kl-coef", "0.1"], "--kl-coef"),
    (["--lm", "--lm-prompts", "0"], "--lm-prompts"),
    (["--lm", "--algo", "nope"], "algo"),
    (["--lm", "--env", "CartPole-v1"], "--env")])
def test_cli_bad_lm_arguments_exit_2(argv, flag, capsys):
    assert main(["check", *argv, "--no-labels"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ppokit check: error: {flag}") and err.count("\n") == 1


def test_reward_of_weight_zero_is_not_judged(warm, tok):
    """A reward weighted 0 adds nothing to the score (the pretrained numbers task's
    answer_only is one by default): its constant values are logged, never a FAIL."""
    from ppokit.llm.inputs.task import reverse_score

    res = run_config_checks(LLMConfig(algo="grpo", reward_weights=(1.0, 0.0)), warm, tok,
                            reward_fn=[reverse_score, constant_reward])
    assert flagged(res) == {}, [(r.name, r.measured) for r in res]
    r = {x.name: x for x in res}["lm-reward-constant"]
    assert r.values["weight_zero"] == ["constant_reward"]
    assert "weight 0, logged only: constant_reward" in r.measured
    # weighted 1, the same function is still the FAIL it was
    res = run_config_checks(LLMConfig(algo="grpo", reward_weights=(1.0, 1.0)), warm, tok,
                            reward_fn=[reverse_score, constant_reward])
    assert flagged(res) == {"lm-reward-constant": "FAIL"}


@pytest.mark.parametrize("model, algo, est, g", [
    (None, None, "gae", None), ("some/model-dir", None, "grpo", 4),
    ("some/model-dir", "rloo", "rloo", 4), (None, "grpo", "grpo", 4)])
def test_group_size_reads_the_resolved_recipe(model, algo, est, g):
    """`check --model` with no --algo: the recipe is the pretrained default (grpo, 4
    samples per prompt), not 'None estimator, None sample(s)'."""
    from ppokit.checks.lm_config import check_group_size
    from ppokit.llm.training.config import PRESETS

    r = check_group_size(LLMConfig(model=model, algo=algo))
    assert "None" not in r.measured, r.measured
    assert r.values["estimator"] == (est if est != "gae" else
                                     PRESETS["ppo"]["advantage_estimator"])
    if g is not None:
        assert r.values["samples_per_prompt"] == g and f"{g} samples per prompt" in r.measured


def test_chat_template_that_drops_the_prompt(tok):
    """A template that renders the system message only: the user's question never
    reaches the model."""
    import copy

    from ppokit.checks.lm_config import check_chat_template

    rows = [{"prompt": [{"role": "system", "content": "Reverse the digits."},
                        {"role": "user", "content": r["prompt"]}]} for r in _digit_rows()]
    dropping = copy.deepcopy(tok)
    dropping.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                              "{{ m['content'] }}{% endif %}{% endfor %}")
    r = check_chat_template(rows, dropping)
    assert r.status == "FAIL" and r.values["role"] == "user", r.measured
    keeping = copy.deepcopy(tok)
    keeping.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert check_chat_template(rows, keeping).status == "PASS"
