"""DAPO's dynamic sampling and soft overlong punishment, and the rollout–training mismatch
(its metric and the truncated / masked importance-sampling corrections), each held to a
plain per-row reference on random inputs, then through the engine and the trainer."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _nostep import NoStep
from ppokit.core import masked_whiten
from ppokit.engine import Forward, UpdateSpec, eager_minibatch_step
from ppokit.errors import UsageError
from ppokit.llm.labelling.batching import collect_batch, spread_groups
from ppokit.llm.labelling.labels import overlong_penalty
from ppokit.llm.labelling.mismatch import correction, mismatch_stats
from ppokit.llm.modeling.rollout import TokenRollout, concat_rollouts
from ppokit.llm.training.config import LLMConfig

# ----------------------------------------------------------------- overlong punishment


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(1, 40),
       st.integers(0, 40), st.floats(0.0, 5.0))
def test_overlong_penalty_matches_its_definition(lengths, max_new, buffer, penalty):
    buffer = min(buffer, max_new)
    lengths = [min(n, max_new) for n in lengths]
    got = overlong_penalty(torch.tensor(lengths), max_new, buffer, penalty)
    for n, g in zip(lengths, got.tolist()):
        if buffer == 0 or n <= max_new - buffer:
            want = 0.0
        else:  # DAPO: ((L_max - L_cache) - |y|) / L_cache, times the penalty
            want = penalty * ((max_new - buffer) - n) / buffer
        assert g == pytest.approx(want, abs=1e-6)


# ------------------------------------------------------------------ dynamic sampling


@given(st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, math.nan]), min_size=3,
                         max_size=3), min_size=1, max_size=8))
def test_spread_groups_matches_a_loop(groups):
    scores = torch.tensor([x for g in groups for x in g])
    got = spread_groups(scores, 3).tolist()
    for g, ok in zip(groups, got):
        # equal means equal numbers: NaN equals nothing, so a group holding one has a spread
        assert ok == (not all(x == g[0] for x in g))


class FakeSampler:
    """Rows, rollouts and scores made up so that every row can be traced: each generated
    row's response ids are ``[uid, uid]`` with a unique ``uid``, its prompt and response
    lengths random; a group's scores are equal exactly when ``equal(group number)``."""

    def __init__(self, group_size, groups_per_round, equal, seed=0):
        self.g, self.n, self.equal = group_size, groups_per_round, equal
        self.rng = torch.Generator().manual_seed(seed)
        self.next_group = 0
        self.next_uid = 1
        self.made = {}  # uid -> (tokens attended, logps of the actions, score, group)

    def draw(self):
        rows = []
        for _ in range(self.n):
            rows += [{"group": self.next_group}] * self.g
            self.next_group += 1
        return rows

    def generate(self, prompts):
        b = len(prompts)
        plen = [int(torch.randint(1, 5, (1,), generator=self.rng)) for _ in prompts]
        rlen = [int(torch.randint(1, 6, (1,), generator=self.rng)) for _ in prompts]
        p, t = max(plen), max(rlen)
        ids = torch.zeros(b, p + t, dtype=torch.long)
        attn = torch.zeros(b, p + t, dtype=torch.long)
        act = torch.zeros(b, p + t, dtype=torch.bool)
        logp = torch.zeros(b, p + t)
        responses = []
        for i in range(b):
            uid = self.next_uid
            self.next_uid += 1
            ids[i, p - plen[i]:p + rlen[i]] = uid
            attn[i, p - plen[i]:p + rlen[i]] = 1
            act[i, p:p + rlen[i]] = True
            logp[i, p:p + rlen[i]] = -torch.rand(rlen[i], generator=self.rng)
            responses.append([uid, uid])
            self.made[uid] = (plen[i], rlen[i], logp[i, p:p + rlen[i]].clone())
        return TokenRollout(ids, attn, act, p, torch.tensor([r == 5 for r in rlen]),
                            responses, logp)

    def score(self, rows, roll):
        out = []
        for i, r in enumerate(rows):
            k = i % self.g
            out.append(0.5 if self.equal(r["group"]) else float(k))
        s = torch.tensor(out)
        return [f"c{ids[0]}" for ids in roll.response_ids], s, {"f": s * 2}


def _collect(fake, dynamic=True, rounds=4, first=None):
    return collect_batch(fake.draw, fake.generate, fake.score, group_size=fake.g,
                         dynamic=dynamic, max_rounds=rounds, any_rank=lambda f: f,
                         pad_token_id=0, render=lambda r: f"p{r['group']}", first=first)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 4), st.integers(1, 5), st.integers(1, 5),
       st.lists(st.booleans(), min_size=40, max_size=40), st.integers(0, 10**6))
def test_dynamic_sampling_keeps_whole_groups_with_a_spread(g, n, rounds, eq, seed):
    fake = FakeSampler(g, n, lambda k: eq[k % 40], seed)
    got = _collect(fake, rounds=rounds)
    # a reference: walk the groups in generation order over the rounds it generated
    drawn = got.stats["dynamic_generated"] // g
    assert drawn == got.stats["dynamic_rounds"] * n
    good = [k for k in range(drawn) if not eq[k % 40]]
    bad = [k for k in range(drawn) if eq[k % 40]]
    want = sorted(good[:n] + bad[:max(0, n - len(good))])
    assert [r["group"] for r in got.rows] == [k for k in want for _ in range(g)]
    assert got.prompts == [f"p{r['group']}" for r in got.rows]  # rendered once, kept in step
    rounds_needed = next((r + 1 for r in range(rounds)
                          if sum(not eq[k % 40] for k in range((r + 1) * n)) >= n), rounds)
    assert got.stats["dynamic_rounds"] == rounds_needed
    assert got.stats["dynamic_dropped_groups"] == len(bad)
    assert got.stats["dynamic_filled_groups"] == max(0, n - len(good))
    # every row still is the completion generated for it, laid out as one rollout
    roll = got.roll
    assert roll.input_ids.shape[0] == n * g == len(got.completions) == len(got.scores)
    assert roll.attention_mask[:, 0].any() and roll.attention_mask[:, -1].any()  # trimmed
    for i, resp in enumerate(roll.response_ids):
        uid = resp[0]
        plen, rlen, lp = fake.made[uid]
        row = roll.input_ids[i][roll.attention_mask[i].bool()]
        assert row.tolist() == [uid] * (plen + rlen)
        assert roll.action_mask[i].sum() == rlen
        assert roll.action_mask[i, roll.prompt_len:roll.prompt_len + rlen].all()
        torch.testing.assert_close(roll.logp[i][roll.action_mask[i]], lp)
        assert got.completions[i] == f"c{uid}"
        want_score = 0.5 if eq[got.rows[i]["group"] % 40] else float(i % g)
        assert float(got.scores[i]) == want_score
        assert float(got.per_func["f"][i]) == 2 * want_score


def test_without_dynamic_sampling_the_first_round_is_the_batch():
    fake = FakeSampler(2, 3, lambda k: True)
    got = _collect(fake, dynamic=False)
    assert got.stats == {} and len(got.rows) == 6 and fake.next_group == 3
    fake2 = FakeSampler(2, 3, lambda k: False)
    first = fake2.generate(fake2.draw())
    fake2.next_group = 0
    got2 = _collect(fake2, dynamic=True, first=first)
    assert got2.roll is first or torch.equal(got2.roll.input_ids, first.input_ids)
    assert got2.stats["dynamic_rounds"] == 1


def test_concat_rollouts_keeps_every_row():
    fake = FakeSampler(1, 3, lambda k: False, seed=3)
    a, b = fake.generate(fake.draw()), fake.generate(fake.draw())
    c = concat_rollouts([a, b], pad_token_id=0)
    assert c.prompt_len == max(a.prompt_len, b.prompt_len)
    for src, off in ((a, 0), (b, 3)):
        for i in range(3):
            x = c.input_ids[off + i][c.attention_mask[off + i].bool()]
            y = src.input_ids[i][src.attention_mask[i].bool()]
            assert torch.equal(x, y)
            torch.testing.assert_close(c.logp[off + i][c.action_mask[off + i]],
                                       src.logp[i][src.action_mask[i]])


# ---------------------------------------------------------------------- the mismatch

@st.composite
def token_batches(draw):
    b = draw(st.integers(1, 5))
    length = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 10**6))
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, length, generator=g) < draw(st.floats(0.0, 1.0))
    if draw(st.booleans()):
        mask[0] = False  # an empty row
    trainer = -torch.rand(b, length, generator=g) * 3
    sampler = trainer + torch.randn(b, length, generator=g) * draw(st.sampled_from(
        [0.0, 0.01, 0.5, 3.0]))  # agreeing, close, far, far outside any band
    return trainer, sampler, mask


@settings(max_examples=80, deadline=None)
@given(token_batches(), st.sampled_from([1.5, 2.0, 5.0]))
def test_mismatch_statistics_match_a_loop(batch, cap):
    trainer, sampler, mask = batch
    got = mismatch_stats(trainer, sampler, mask, 1 / cap, cap)
    k3s, outside = [], 0
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                rho = math.exp(float(trainer[b, t]) - float(sampler[b, t]))
                k3s.append(rho - 1 - math.log(rho))
                outside += not (1 / cap <= rho <= cap)
    if not k3s:
        assert got["mismatch_k3_mean"] == 0.0 and got["mismatch_frac_outside"] == 0.0
        return
    assert got["mismatch_k3_mean"] == pytest.approx(sum(k3s) / len(k3s), rel=1e-4, abs=1e-7)
    assert got["mismatch_k3_max"] == pytest.approx(max(k3s), rel=1e-4, abs=1e-7)
    assert got["mismatch_frac_outside"] == pytest.approx(outside / len(k3s))
    assert got["mismatch_k3_mean"] >= 0


@settings(max_examples=80, deadline=None)
@given(token_batches(), st.sampled_from(["token", "sequence"]), st.sampled_from([1.2, 2.0]))
def test_corrections_match_a_per_row_reference(batch, level, cap):
    trainer, sampler, mask = batch
    low = 1 / cap
    tis = correction("truncate", level, trainer, sampler, mask, low, cap)
    mis = correction("mask", level, trainer, sampler, mask, low, cap)
    assert torch.equal(tis.keep, mask)
    for b in range(mask.shape[0]):
        toks = [t for t in range(mask.shape[1]) if mask[b, t]]
        logr = [float(trainer[b, t]) - float(sampler[b, t]) for t in toks]
        if level == "sequence" and toks:  # the geometric mean of the row's token ratios
            logr = [sum(logr) / len(logr)] * len(toks)
        for t, lr in zip(toks, logr):
            rho = math.exp(lr)
            assert float(tis.weight[b, t]) == pytest.approx(min(rho, cap), rel=1e-5)
            assert bool(mis.keep[b, t]) == (low <= rho <= cap) or \
                abs(rho - cap) < 1e-5 or abs(rho - low) < 1e-5
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                assert not mis.keep[b, t] and float(tis.weight[b, t]) == 1.0


def test_truncated_weights_scale_each_tokens_policy_term():
    """Through the engine: an ``is_weight`` column gives the gradient of
    −mean_t w_t·min(ρ_t Â_t, clip(ρ_t) Â_t), Â whitened first (a per-token reference)."""
    g = torch.Generator().manual_seed(5)
    b, length, f = 4, 6, 3
    mask = torch.rand(b, length, generator=g) < 0.7
    mask[1] = False
    x = torch.randn(b, length, f, generator=g)
    w_true = torch.randn(f, generator=g)
    mb = {"x": x, "logp": -torch.rand(b, length, generator=g) - 0.1,
          "advantages": torch.randn(b, length, generator=g), "mask": mask,
          "is_weight": torch.rand(b, length, generator=g) * 2}
    for loss in ("clip", "cispo", "vanilla"):
        spec = UpdateSpec(policy_loss=loss, agg="token-mean", max_grad_norm=None,
                          use_critic=False,
                          normalize_advantage=True, clip_range=0.2,
                          clip_range_high=0.28 if loss == "cispo" else None)
        p = (w_true * 0.3).clone().requires_grad_()

        def fwd(rows, p=p):
            return Forward(-torch.nn.functional.softplus(rows["x"] @ p),
                           torch.zeros(rows["x"].shape[:2]), None)

        eager_minibatch_step(spec, fwd, NoStep([p]), [p], dict(mb))
        q = (w_true * 0.3).clone().requires_grad_()
        lp = -torch.nn.functional.softplus(x @ q)
        adv = masked_whiten(mb["advantages"], mask)
        terms = []
        for i in range(b):
            for t in range(length):
                if not mask[i, t]:
                    continue
                r = torch.exp(lp[i, t] - mb["logp"][i, t])
                a = adv[i, t]
                if loss == "clip":
                    term = -torch.minimum(r * a, r.clamp(0.8, 1.2) * a)
                elif loss == "cispo":
                    term = -r.detach().clamp(0.8, 1.28) * a * lp[i, t]
                else:
                    term = -a * lp[i, t]
                terms.append(mb["is_weight"][i, t] * term)
        torch.stack(terms).mean().backward()
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=loss)


# --------------------------------------------------------------------- configuration


def test_dapo_preset_and_the_new_fields():
    cfg = LLMConfig(algo="dapo").resolved()
    assert cfg.dynamic_sampling and cfg.truncation == "mask" and cfg.kl_mode == "none"
    assert cfg.clip_range == 0.2 and cfg.clip_range_high == 0.28 and cfg.agg == "token-mean"
    assert cfg.overlong_buffer == int(cfg.max_new_tokens * 0.2)
    plain = LLMConfig(algo="grpo").resolved()
    assert not plain.dynamic_sampling and plain.overlong_buffer == 0
    assert plain.truncation == "none" and plain.old_logprobs == "sampler"
    assert plain.sampler_precision == plain.precision == "fp32"
    tis = LLMConfig(algo="grpo", rollout_is="truncate").resolved()
    assert tis.old_logprobs == "recompute" and tis.rollout_is_threshold_lower == 0.5
    assert tis.resolved() == tis
    # each a field of any preset
    mixed = LLMConfig(algo="gspo", dynamic_sampling=True, overlong_buffer=3).resolved()
    assert mixed.dynamic_sampling and mixed.overlong_buffer == 3 and mixed.policy_loss == "gspo"


@pytest.mark.parametrize("kw, where", [
    ({"rollout_is": "truncate", "old_logprobs": "sampler"}, "rollout_is"),
    ({"rollout_is": "mask", "rollout_is_threshold_lower": 3.0}, "rollout_is_threshold_lower"),
    ({"overlong_buffer": 10**4}, "overlong_buffer"),
    ({"dynamic_sampling": True, "samples_per_prompt": 1}, "dynamic_sampling"),
    ({"rollout_is": "tis"}, "rollout_is"),
    ({"rollout_is_level": "row"}, "rollout_is_level"),
    ({"sampler_precision": "fp16"}, "sampler_precision"),
    ({"dynamic_sampling_rounds": 0}, "dynamic_sampling_rounds"),
    ({"rollout_is_threshold": 0.5}, "rollout_is_threshold"),
])
def test_bad_values_are_named(kw, where):
    with pytest.raises(UsageError, match=where):
        LLMConfig(algo="grpo", **kw).resolved()


# --------------------------------------------------------------------------- trainer


def _trainer(tmp_path, tok, name, **kw):
    from ppokit.llm.modeling.models import build_tiny_model
    from ppokit.llm.training.trainer import TokenTrainer

    base = {"prompts_per_iter": 4, "samples_per_prompt": 4, "iterations": 1,
            "checkpoint_every": 1000, "algo": "grpo"}
    return TokenTrainer(LLMConfig(**{**base, **kw}), str(tmp_path / name),
                        policy=build_tiny_model(tok, seed=0), tokenizer=tok,
                        log=lambda *a: None)


@pytest.fixture(scope="module")
def tok():
    from ppokit.llm.modeling.models import build_char_tokenizer

    return build_char_tokenizer()


def test_mismatch_is_shown_with_a_bf16_sampler_and_not_without(tmp_path, tok):
    same = _trainer(tmp_path, tok, "same", old_logprobs="recompute").train_iteration()
    probe = _trainer(tmp_path, tok, "probe").train_iteration()  # sampler's old log-probs
    bf16 = _trainer(tmp_path, tok, "bf16", sampler_precision="bf16",
                    old_logprobs="recompute").train_iteration()
    assert same["mismatch_k3_mean"] < 1e-9 and probe["mismatch_k3_mean"] < 1e-9
    assert bf16["mismatch_k3_mean"] > 1e-7
    assert bf16["mismatch_k3_max"] >= bf16["mismatch_k3_mean"]
    tis = _trainer(tmp_path, tok, "tis", sampler_precision="bf16",
                   rollout_is="truncate").train_iteration()
    assert tis["rollout_is_weight_mean"] != 1.0 and tis["rollout_is_weight_max"] <= 2.0
    mis = _trainer(tmp_path, tok, "mis", sampler_precision="bf16", rollout_is="mask",
                   rollout_is_threshold=1.0001).train_iteration()
    assert 0 < mis["rollout_is_masked_frac"] < 1


def test_dynamic_sampling_in_the_trainer(tmp_path, tok):
    tr = _trainer(tmp_path, tok, "dyn", algo="dapo", dynamic_sampling_rounds=3)
    rec = tr.train_iteration()
    assert 1 <= rec["dynamic_rounds"] <= 3
    assert rec["dynamic_generated"] == 16 * rec["dynamic_rounds"]
    if rec["dynamic_rounds"] < 3:  # it stopped because the batch was full of spread groups
        assert rec["zero_spread_frac"] == 0.0 and rec["dynamic_filled_groups"] == 0
    assert rec["reward/overlong"] <= 0
    assert "clipfrac" in rec and "kl_loss" in rec
