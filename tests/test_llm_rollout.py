"""ppokit.llm: tokenizer, models, rollouts and the frozen labels of one rollout."""

import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ppokit.errors import UsageError
from ppokit.llm.inputs.task import ReverseTask, reverse_score, score_one
from ppokit.llm.modeling.models import (
    build_char_tokenizer,
    build_tiny_model,
    count_parameters,
    load_lm,
    load_tokenizer,
    save_policy,
)
from ppokit.llm.modeling.rollout import TokenRollout, encode_prompts, generate, sequence_logprobs
from ppokit.llm.training.trainer import LLMConfig, compute_labels


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=0).eval()


class EosBias(nn.Module):
    """Wraps a causal LM and adds a constant to the EOS logit (to get EOS and truncation)."""

    def __init__(self, lm, eos, bias):
        super().__init__()
        self.lm, self.eos, self.bias = lm, eos, bias

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, **kw):
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, cache=cache, use_cache=use_cache, **kw)
        out.logits[..., self.eos] += self.bias
        return out


def test_tokenizer_round_trip_and_save_load(tok, tmp_path):
    text = "3817>7183"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_token_id] + ids + [tok.eos_token_id, tok.pad_token_id],
                      skip_special_tokens=True) == text
    model = build_tiny_model(tok)
    save_policy(model, tok, str(tmp_path))
    tok2 = load_tokenizer(str(tmp_path))
    assert tok2(text, add_special_tokens=False)["input_ids"] == ids
    assert tok2.decode(ids) == text
    assert (tok2.pad_token_id, tok2.bos_token_id, tok2.eos_token_id) == (0, 1, 2)
    assert tok2.padding_side == "left"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tiny_model_saved_to_disk_loads_as_a_local_hf_dir(tok, tmp_path, arch):
    model = build_tiny_model(tok, arch=arch).eval()
    assert count_parameters(model) <= 2_000_000
    save_policy(model, tok, str(tmp_path))
    loaded, tok2 = load_lm(str(tmp_path))
    ids, mask = encode_prompts(tok2, ["123>", "45>"])
    a = sequence_logprobs(model, ids, mask)["logp"]
    b = sequence_logprobs(loaded.eval(), ids, mask)["logp"]
    assert torch.equal(a, b)


def test_loading_a_missing_model_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="--model"):
        load_lm(str(tmp_path / "nope"))


def test_task_score_partial_credit():
    assert score_one("123>", "321") == 1.0
    assert score_one("123>", "320") == pytest.approx(2 / 3)
    assert score_one("123>", "3210") == pytest.approx(3 / 4)  # extra character costs
    assert score_one("123>", "32") == pytest.approx(2 / 3)
    assert score_one("123>", "") == 0.0
    assert reverse_score(["12>", "9>"], ["21", "8"]) == [1.0, 0.0]
    task = ReverseTask()
    held = set(task.heldout_prompts(200))
    train = set(task.train_prompts(2000, random.Random(0)))
    assert not held & train


def _roll(model, tok, prompts, bias=0.0, max_new=6, seed=0):
    ids, mask = encode_prompts(tok, prompts)
    m = EosBias(model, tok.eos_token_id, bias) if bias else model
    return generate(m, ids, mask, max_new_tokens=max_new, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id, generator=torch.Generator().manual_seed(seed))


def test_action_mask_marks_generated_tokens_up_to_and_including_eos(model, tok):
    prompts = ["1>", "123456>", "98>", "5555>"] * 4
    roll = _roll(model, tok, prompts, bias=3.0)
    eos = tok.eos_token_id
    p = roll.prompt_len
    assert not roll.action_mask[:, :p].any()  # prompt and left padding never actions
    assert roll.truncated.any() and (~roll.truncated).any()  # both cases exercised
    for b in range(len(prompts)):
        gen = roll.input_ids[b, p:]
        act = roll.action_mask[b, p:]
        n = int(act.sum())
        assert act[:n].all() and not act[n:].any()  # contiguous from the first generated token
        if roll.truncated[b]:
            assert n == gen.shape[0] and not (gen == eos).any()
        else:
            assert gen[n - 1] == eos and not (gen[:n - 1] == eos).any()
            assert (gen[n:] == tok.pad_token_id).all()
        # attention covers exactly the real tokens
        real = roll.attention_mask[b].bool()
        assert torch.equal(real[p:], act)
        assert int(real[:p].sum()) == len(prompts[b]) + 1  # BOS + prompt characters


def test_kv_cache_sampling_matches_full_forward_greedy(model, tok):
    prompts = ["12>", "34567>", "9>"]
    ids, mask = encode_prompts(tok, prompts)
    roll = generate(model, ids, mask, max_new_tokens=5, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id, temperature=0.0)
    # greedy: every generated token is the argmax of a full forward over its prefix
    lp = sequence_logprobs(model, roll.input_ids, roll.attention_mask)
    pos = torch.arange(roll.input_ids.shape[1])
    out = model(input_ids=roll.input_ids, attention_mask=roll.attention_mask,
                position_ids=roll.position_ids).logits
    pred = F.pad(out[:, :-1].argmax(-1), (1, 0))
    assert torch.equal(pred[roll.action_mask], roll.input_ids[roll.action_mask])
    assert torch.isfinite(lp["logp"][roll.action_mask]).all()
    assert pos.numel() == roll.input_ids.shape[1]


def test_left_padding_invariance_of_logprobs(model, tok):
    roll = _roll(model, tok, ["12>", "34567>", "9>"], bias=1.0)
    base = sequence_logprobs(model, roll.input_ids, roll.attention_mask)["logp"]
    for extra in (1, 5):
        ids = F.pad(roll.input_ids, (extra, 0), value=tok.pad_token_id)
        att = F.pad(roll.attention_mask, (extra, 0))
        lp = sequence_logprobs(model, ids, att)["logp"][:, extra:]
        am = roll.action_mask
        assert torch.allclose(lp[am], base[am], atol=1e-5)
    # changing the *contents* of padding (same mask) changes nothing either
    ids = roll.input_ids.clone()
    ids[roll.attention_mask == 0] = 7
    lp = sequence_logprobs(model, ids, roll.attention_mask)["logp"]
    assert torch.allclose(lp[roll.action_mask], base[roll.action_mask], atol=1e-5)


# ----------------------------------------------------------------- labels on a hand-made rollout


def _hand_rollout():
    """Two rows, P = 3, T = 4. Row 0: 2 tokens + EOS. Row 1: truncated (4 tokens, no EOS)."""
    E, PAD = 2, 0
    ids = torch.tensor([[0, 1, 5, 7, 8, E, PAD],
                        [1, 5, 6, 7, 8, 9, 10]])
    att = torch.tensor([[0, 1, 1, 1, 1, 1, 0],
                        [1, 1, 1, 1, 1, 1, 1]])
    am = torch.tensor([[0, 0, 0, 1, 1, 1, 0],
                       [0, 0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    return TokenRollout(ids, att, am, 3, torch.tensor([False, True]), [[7, 8], [7, 8, 9, 10]])


def _labels(trunc, beta=0.0, algo="ppo", old=None, ref=None, values_after=None, **kw):
    roll = _hand_rollout()
    cfg = LLMConfig(algo=algo, truncation=trunc, gamma=1.0, gae_lambda=1.0,
                    normalize_advantage=False, truncation_penalty=0.25, **kw).resolved()
    shape = roll.input_ids.shape
    old = torch.zeros(shape) if old is None else old
    ref = torch.zeros(shape) if ref is None else ref
    if values_after is None and algo == "ppo":
        values_after = torch.zeros(shape)
    return roll, compute_labels(cfg, roll, torch.tensor([0.8, 0.6]), old, ref, beta,
                                values_after)


def test_score_lands_on_the_eos_token():
    roll, lab = _labels("penalty")
    tr = lab.token_rewards
    assert tr[0, 5] == pytest.approx(0.8) and roll.input_ids[0, 5] == 2  # the EOS column
    assert torch.count_nonzero(tr[0]) == 1
    # prompt and padding carry no reward, advantage or loss weight
    assert not lab.loss_mask[:, :3].any() and not lab.loss_mask[0, 6]
    assert (lab.advantages[~roll.action_mask] == 0).all()


def test_truncation_penalty_places_the_penalised_score_on_the_last_token():
    _, lab = _labels("penalty")
    assert lab.token_rewards[1, 6] == pytest.approx(0.6 - 0.25)
    assert lab.loss_mask[1].sum() == 4


def test_truncation_mask_drops_the_row_from_the_losses():
    _, lab = _labels("mask")
    assert not lab.loss_mask[1].any() and lab.loss_mask[0].sum() == 3
    assert (lab.advantages[1] == 0).all()


def test_truncation_bootstrap_uses_the_critic_instead_of_the_score():
    va = torch.zeros(2, 7)
    va[1, 6] = 0.9  # value of the state after the truncated row's last token
    _, lab = _labels("bootstrap", values_after=va)
    assert lab.token_rewards[1].abs().sum() == 0  # no score placed on a cut response
    # lam = gamma = 1, other values 0: every action's return is the bootstrap value
    assert torch.allclose(lab.returns[1, 3:], torch.full((4,), 0.9))
    assert torch.allclose(lab.returns[0, 3:6], torch.full((3,), 0.8))
    with pytest.raises(UsageError, match="critic"):
        LLMConfig(algo="grpo", truncation="bootstrap").resolved()


def test_kl_reward_is_k1_per_action_token_and_not_clamped():
    old = torch.zeros(2, 7)
    ref = torch.zeros(2, 7)
    old[0, 3], ref[0, 3] = -0.5, -0.1   # k1 = -0.4 (negative: kept)
    old[0, 4], ref[0, 4] = -0.1, -0.6   # k1 = +0.5
    old[0, 1], ref[0, 1] = -3.0, 0.0    # a prompt position: never counted
    _, lab = _labels("penalty", beta=0.1, old=old, ref=ref)
    assert lab.kl_tokens[0, 3] == pytest.approx(-0.4)
    assert lab.kl_tokens[0, 1] == 0
    assert lab.token_rewards[0, 3] == pytest.approx(0.04)
    assert lab.token_rewards[0, 4] == pytest.approx(-0.05)
    assert lab.stats["non_score_reward"] == pytest.approx((0.04 - 0.05) / 2)
    assert lab.stats["kl_ref"] == pytest.approx(0.1 / 2)
    assert lab.stats["score_mean"] == pytest.approx(0.7)  # score kept apart from KL


def _group_labels(algo, scores, **kw):
    # four rows of the same shape, two prompts x two samples
    r = _hand_rollout()
    roll = TokenRollout(r.input_ids[[0, 0, 0, 0]], r.attention_mask[[0, 0, 0, 0]],
                   r.action_mask[[0, 0, 0, 0]], 3, torch.zeros(4, dtype=torch.bool), [[]] * 4)
    cfg = LLMConfig(algo=algo, samples_per_prompt=2, prompts_per_iter=2, kl_mode="none",
                    **kw).resolved()
    z = torch.zeros(4, 7)
    return roll, compute_labels(cfg, roll, torch.tensor(scores), z, z, 0.0)


def test_grpo_advantages_hand_computed_on_tokens():
    roll, lab = _group_labels("grpo", [1.0, 0.0, 0.5, 0.5])
    s = (0.5**2 * 2 / 1) ** 0.5  # std (ddof 1) of {1, 0}: sqrt(0.5)
    expect = torch.tensor([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.0, 0.0])
    for b in range(4):
        assert torch.allclose(lab.advantages[b, 3:6], expect[b].expand(3), atol=1e-5)
        assert (lab.advantages[b, :3] == 0).all() and lab.advantages[b, 6] == 0
    _, lab = _group_labels("dr-grpo", [1.0, 0.0, 0.5, 0.25])
    assert torch.allclose(lab.advantages[:, 3], torch.tensor([0.5, -0.5, 0.125, -0.125]))


def test_zero_spread_frac_counts_groups_with_equal_scores():
    # the share of groups whose scores are all equal: their group advantage is 0
    assert _group_labels("grpo", [1.0, 0.0, 0.5, 0.5])[1].stats["zero_spread_frac"] == 0.5
    assert _group_labels("rloo", [0.0, 0.0, 1.0, 1.0])[1].stats["zero_spread_frac"] == 1.0
    assert _group_labels("grpo", [0.0, 1e-7, 1.0, 0.9])[1].stats["zero_spread_frac"] == 0.0
    _, lab = _labels("penalty")                # ppo: one sample per prompt, no groups
    assert "zero_spread_frac" not in lab.stats


def test_rloo_advantages_hand_computed_on_tokens():
    _, lab = _group_labels("rloo", [1.0, 0.0, 0.5, 0.25])
    # r_i - mean of the others (G = 2: the other sample)
    assert torch.allclose(lab.advantages[:, 4], torch.tensor([1.0, -1.0, 0.25, -0.25]))


def test_reinforce_pp_whitens_token_returns_over_the_batch():
    roll, lab = _group_labels("reinforce++", [1.0, 0.0, 0.5, 0.5])
    a = lab.advantages[lab.loss_mask]
    assert a.mean().abs() < 1e-6 and (a.std() - 1).abs() < 1e-3
