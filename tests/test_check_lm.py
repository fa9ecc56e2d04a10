"""ppokit check on language models: the token-layout checks pass on the built-in tiny model
and on a model directory, and catch a mask counting padding as actions and a model that
ignores the attention mask."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from ppokit.checks.labels import check_token_labels_frozen  # noqa: E402
from ppokit.checks.token_checks import make_token_batch, run_token_checks  # noqa: E402
from ppokit.cli import main  # noqa: E402
from ppokit.llm.modeling.models import build_char_tokenizer, build_tiny_model, save_policy  # noqa: E402
from ppokit.llm.modeling.rollout import sequence_logprobs, shift_to_tokens  # noqa: E402
from ppokit.llm.training.trainer import TokenTrainer  # noqa: E402

TOKEN_CHECKS = ["token-action-mask", "token-ratio-identity", "padding-invariance",
                "zero-advantage-gradient", "flipped-advantage-direction",
                "surrogate-finite-difference", "token-labels-frozen"]


@pytest.fixture(scope="module")
def lm():
    tok = build_char_tokenizer()
    return build_tiny_model(tok, seed=0), tok


class IgnoresAttentionMask(nn.Module):
    """Bug: forwards everything except the attention mask, so padding is attended to."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                **kw):
        if cache is not None:
            kw["cache"] = cache
        return self.model(input_ids=input_ids, position_ids=position_ids, **kw)


def padding_as_actions(batch):
    """Bug: every position after the prompt counts as an action, right padding included."""
    cols = torch.arange(batch.input_ids.shape[1])
    return (cols >= batch.prompt_len).expand_as(batch.input_ids)


def test_batch_has_every_kind_of_position(lm):
    model, tok = lm
    b = make_token_batch(model, tok)
    cols = torch.arange(b.input_ids.shape[1])
    left_pad = (b.attention_mask == 0) & (cols < b.prompt_len)
    right_pad = (b.attention_mask == 0) & (cols >= b.prompt_len)
    assert left_pad.any() and right_pad.any() and b.action_mask.any()


def test_tiny_lm_passes(lm):
    model, tok = lm
    rep = run_token_checks(model, tok)
    assert rep.names() == TOKEN_CHECKS
    assert rep.ok, [(r.name, r.measured) for r in rep.results]
    assert rep["padding-invariance"].values["loss_change"] <= 1e-6


def test_gpt2_architecture_passes():
    tok = build_char_tokenizer()
    rep = run_token_checks(build_tiny_model(tok, arch="gpt2", seed=1), tok, labels=False)
    assert rep.ok, [(r.name, r.measured) for r in rep.results]


def test_model_ignoring_attention_mask(lm):
    model, tok = lm
    rep = run_token_checks(IgnoresAttentionMask(model), tok, labels=False)
    assert rep.failed == ["padding-invariance"]
    assert rep["padding-invariance"].values["max_logp_change"] > 1e-3


def test_mask_counting_padding_as_actions(lm):
    model, tok = lm
    rep = run_token_checks(model, tok, mask_fn=padding_as_actions, labels=False)
    assert set(rep.failed) == {"token-action-mask", "padding-invariance"}
    assert rep["token-action-mask"].values["on_padding"] > 0


def test_sign_error_in_token_surrogate(lm):
    from ppokit.checks.token_checks import token_surrogate

    good = token_surrogate()
    rep = run_token_checks(lm[0], lm[1], labels=False,
                           surrogate=lambda lp, lpo, a, mask=None: -good(lp, lpo, a, mask))
    assert rep.failed == ["flipped-advantage-direction"]


CONFIG_CHECKS = ["lm-group-size", "lm-kl-reference", "lm-chat-template",
                 "lm-reward-constant", "lm-truncation", "lm-prompt-length"]


def test_cli_builtin_lm(capsys):
    # the token layout on the built-in model, then the default run's configuration on the
    # model after its warm start
    assert main(["check", "--lm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and [r["name"] for r in out["results"]] == TOKEN_CHECKS + CONFIG_CHECKS
    assert {r["status"] for r in out["results"]} == {"PASS"}
    assert main(["check", "--lm", "--no-config", "--no-labels", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["results"]] == TOKEN_CHECKS[:-1]


def test_cli_model_dir(lm, tmp_path, capsys):
    model, tok = lm
    save_policy(model, tok, str(tmp_path / "m"))
    assert main(["check", "--model", str(tmp_path / "m"), "--task", "reverse"]) == 0
    assert "all checks passed" in capsys.readouterr().out
    assert main(["check", "--model", str(tmp_path / "missing")]) == 2


class RecomputedOldLogp(TokenTrainer):
    """Bug: old log-probs recomputed from the current policy in every minibatch."""

    def update(self, roll, lab):
        self._roll = roll
        return super().update(roll, lab)

    def update_minibatch(self, mb, *args, **kwargs):
        sub = self._roll.select(mb["row"])
        with torch.no_grad():
            fresh = sequence_logprobs(self.policy, sub.input_ids, sub.attention_mask)["logp"]
        return super().update_minibatch({**mb, "logp": fresh}, *args, **kwargs)


class AdvantagesFromLiveCritic(TokenTrainer):
    """Bug: advantages re-derived from the critic being trained (gradient flows into them)."""

    def update(self, roll, lab):
        self._roll = roll
        return super().update(roll, lab)

    def update_minibatch(self, mb, *args, **kwargs):
        sub = self._roll.select(mb["row"])
        v = self.critic(sub.input_ids, sub.attention_mask, sub.position_ids)
        adv = mb["returns"] - shift_to_tokens(v[:, :-1])
        return super().update_minibatch({**mb, "advantages": adv}, *args, **kwargs)


def test_token_labels_frozen_catches_recomputed_old_logp(lm):
    r = check_token_labels_frozen(*lm, trainer_cls=RecomputedOldLogp)
    assert r.passed is False and r.values["diffs"]["logp_old"] > 1e-4
    assert r.values["diffs"]["returns"] == 0.0


def test_token_labels_frozen_catches_gradient_through_advantages(lm):
    r = check_token_labels_frozen(*lm, trainer_cls=AdvantagesFromLiveCritic)
    assert r.passed is False and r.values["with_grad"] == ["advantages"]


def test_cli_language_model_run_dir(lm, tmp_path, capsys):
    # a token-level run directory: reference/ and, once finished, policy/
    model, tok = lm
    run = tmp_path / "run"
    save_policy(model, tok, str(run / "reference"))
    assert main(["check", str(run), "--no-labels"]) == 2      # not finished: no policy/
    save_policy(model, tok, str(run / "policy"))
    capsys.readouterr()
    assert main(["check", str(run), "--no-labels", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target"].endswith("policy") and out["ok"]
    assert [r["name"] for r in out["results"]] == TOKEN_CHECKS[:-1]


class _Config:
    num_hidden_layers, hidden_size = 30, 576   # SmolLM2-135M's


class _BatchDependent(torch.nn.Module):
    """A model whose log-probs differ between a whole-batch pass and micro-batches by
    ``dev`` (as float32 kernels of other shapes and thread splits round differently)."""

    def __init__(self, dtype=torch.float32, dev=1.43e-5):
        super().__init__()
        self.config = _Config()
        self.w = torch.nn.Parameter(torch.zeros(2, dtype=dtype))
        self.dev = dev

    def logprobs(self, model, ids, attn):
        lp = torch.full(ids.shape, -1.0, dtype=torch.float64)
        return lp if ids.shape[0] > 2 else lp + self.dev


def _ratio_identity(model):
    from ppokit.checks.token_checks import TokenBatch, _check_ratio_identity

    ids = torch.ones(6, 60, dtype=torch.long)
    act = torch.zeros(6, 60, dtype=torch.bool)
    act[:, 50:] = True
    batch = TokenBatch(ids, torch.ones_like(ids), act, 50)
    return _check_ratio_identity(model, batch, act, model.logprobs)


def test_ratio_identity_tolerance_follows_the_dtype():
    """float32 SmolLM2 gave max|ρ−1| 1.43e-5 between whole-batch and micro-batch passes
    with two threads: rounding, within eps · layers · (√d + √L); dropout-sized
    deviations still fail, and float64 is held to 1e-6."""
    from ppokit.checks.token_checks import RATIO_TOL_CAP, ratio_tolerance

    r = _ratio_identity(_BatchDependent())
    assert r.passed is True, (r.measured, r.criterion)
    tol = r.values["tolerance"]
    eps = torch.finfo(torch.float32).eps
    assert tol == pytest.approx(eps * 30 * (576 ** 0.5 + 60 ** 0.5))
    assert 1.43e-5 < tol < 1e-3
    assert _ratio_identity(_BatchDependent(dev=0.05)).passed is False
    assert _ratio_identity(_BatchDependent(torch.float64)).passed is False
    assert ratio_tolerance(_BatchDependent(torch.float64), 60) == 1e-6
    assert ratio_tolerance(_BatchDependent(torch.bfloat16), 60) == RATIO_TOL_CAP
