"""Invalid-action masking: the masked heads against a plain reference on random logits and
masks (log-probabilities, entropies, exactly zero gradient on masked logits; Discrete and
MultiDiscrete), sampling and the most likely action never forbidden, the mask stored with
each step and used by the update, the three ways an env gives masks, the fast paths
bypassed by name, predict / evaluation / MaskablePPO, broken masks named in one line."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import _mask_envs as M
import ppokit
from ppokit.algos import Trainer, resolve_config
from ppokit.engine.fused import supports
from ppokit.errors import UsageError, UserCodeError
from ppokit.io import WALL_CLOCK_FIELDS, read_metrics
from ppokit.policies.masking import MASKED_LOGIT, mask_logits, sample_masked
from ppokit.policies.mlp import MLPActorCritic

CHOICE = "ppokit/MaskedChoice-v0"


def identity_policy(kind: str, nvec: tuple[int, ...]) -> MLPActorCritic:
    """A policy whose logits are its observation (one linear layer, the identity)."""
    width = sum(nvec)
    pol = MLPActorCritic(width, kind, len(nvec) if kind == "multicategorical" else width,
                         nvec=nvec if kind == "multicategorical" else None, hidden=())
    with torch.no_grad():
        pol.actor[0].weight.copy_(torch.eye(width))
        pol.actor[0].bias.zero_()
    return pol


@st.composite
def masked_heads(draw, multi: bool):
    nvec = tuple(draw(st.lists(st.integers(2, 6), min_size=1, max_size=3))) if multi \
        else (draw(st.integers(2, 10)),)
    b = draw(st.integers(1, 5))
    width = sum(nvec)
    logits = np.array(draw(st.lists(st.floats(-20, 20), min_size=b * width,
                                    max_size=b * width)), np.float32).reshape(b, width)
    mask = np.array(draw(st.lists(st.booleans(), min_size=b * width, max_size=b * width)),
                    bool).reshape(b, width)
    actions = np.zeros((b, len(nvec)), np.int64)
    at = 0
    for h, k in enumerate(nvec):
        for i in range(b):  # every head allows at least one action; the action is allowed
            keep = draw(st.integers(0, k - 1))
            mask[i, at + keep] = True
            actions[i, h] = draw(st.sampled_from(np.flatnonzero(mask[i, at:at + k]).tolist()))
        at += k
    return nvec, logits, mask, actions


def reference(nvec, logits, mask, actions):
    """log π(a) and entropy over the allowed actions only, in float64, head by head."""
    b = logits.shape[0]
    logp, ent = np.zeros(b), np.zeros(b)
    at = 0
    for h, k in enumerate(nvec):
        for i in range(b):
            z = logits[i, at:at + k].astype(np.float64)
            ok = mask[i, at:at + k]
            lse = np.log(np.exp(z[ok] - z[ok].max()).sum()) + z[ok].max()
            logp[i] += z[actions[i, h]] - lse
            p = np.exp(z[ok] - lse)
            ent[i] -= (p * (z[ok] - lse)).sum()
        at += k
    return logp, ent


def _check_against_reference(multi, case):
    nvec, logits, mask, actions = case
    kind = "multicategorical" if multi else "categorical"
    pol = identity_policy(kind, nvec)
    x = torch.tensor(logits, requires_grad=True)
    a = torch.from_numpy(actions if multi else actions[:, 0])
    logp, ent, _ = pol.evaluate(x, a, torch.from_numpy(mask))
    ref_logp, ref_ent = reference(nvec, logits, mask, actions)
    np.testing.assert_allclose(logp.detach().numpy(), ref_logp, rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(ent.detach().numpy(), ref_ent, rtol=1e-5, atol=2e-5)
    w = torch.linspace(-1.0, 2.0, len(logp))
    ((logp * w).sum() + (ent * w.flip(0)).sum()).backward()
    g = x.grad.numpy()
    assert np.isfinite(g).all()
    assert (g[~mask] == 0.0).all()  # exactly 0, not merely small
    assert (pol.log_prob(x, a, torch.from_numpy(mask)).detach() == logp.detach()).all()


@given(masked_heads(multi=False))
def test_discrete_masked_head_matches_the_reference(case):
    _check_against_reference(False, case)


@given(masked_heads(multi=True))
def test_multidiscrete_masked_head_matches_the_reference(case):
    _check_against_reference(True, case)


@given(masked_heads(multi=True), st.integers(0, 2**31 - 1))
def test_sampling_and_the_mode_pick_allowed_actions_only(case, seed):
    nvec, logits, mask, _ = case
    pol = identity_policy("multicategorical", nvec)
    gen = torch.Generator().manual_seed(seed)
    x, m = torch.from_numpy(logits), torch.from_numpy(mask)
    picks = [pol.act(x, gen, m)[0] for _ in range(20)] + [pol.deterministic_action(x, m)]
    starts = np.cumsum((0,) + nvec[:-1])
    for a in picks:
        idx = a.numpy() + starts  # the column of each head's pick in the mask
        assert np.take_along_axis(mask, idx, 1).all()


def test_a_uniform_of_exactly_zero_still_picks_an_allowed_action(monkeypatch):
    logp = torch.log_softmax(mask_logits(torch.zeros(2, 4), torch.tensor(
        [[False, False, True, True], [False, True, False, False]])), -1)
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.zeros(shape))
    assert sample_masked(logp, None).squeeze(1).tolist() == [2, 1]


def test_masked_logits_are_finite_and_take_no_probability():
    out = mask_logits(torch.tensor([[3.0, 1.0, -2.0]]), torch.tensor([[1, 0, 1]]))
    assert out.tolist() == [[3.0, MASKED_LOGIT, -2.0]]
    p = out.softmax(-1)
    assert p[0, 1] == 0.0 and math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)
    with pytest.raises(ValueError, match="expected shape"):
        mask_logits(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))


# -- collection and update -----------------------------------------------------------------

def _cfg(**over):
    base = dict(env_id=CHOICE, n_envs=4, n_steps=32, batch_size=64, n_epochs=2,
                total_timesteps=128 * 3, tensorboard=False, seed=5, checkpoint_every=1000)
    return resolve_config(overrides={**base, **over})


def _trainer(tmp_path, name="run", **over):
    msgs: list[str] = []
    tr = Trainer(_cfg(**over), tmp_path / name, log=msgs.append)
    return tr, msgs


def test_rollout_stores_the_mask_each_action_was_sampled_under(tmp_path):
    tr, _ = _trainer(tmp_path, env_kwargs={"masks": "info"})
    try:
        ro = tr.collector.collect(32)
        m, a = ro.action_masks, ro.actions
        assert m.shape == (32, 4, 32) and m.dtype == torch.bool
        assert m.gather(-1, a.unsqueeze(-1)).all()  # every action allowed by its mask
        assert (m.sum(-1) == 4).all()  # four choices in every state, a new set each step
        assert not (m[1:] == m[:-1]).all(-1).all()
        with torch.no_grad():  # the stored log-probs are the masked ones (ratio 1)
            obs = ro.obs.reshape(128, -1)
            logp = tr.policy.evaluate(obs, a.reshape(-1), m.reshape(128, -1))[0]
            plain = tr.policy.evaluate(obs, a.reshape(-1))[0]
        assert torch.allclose(logp, ro.logp.reshape(-1), atol=1e-6)
        assert (plain < logp - 1.0).all()  # 4 of 32 allowed: the unmasked differ clearly
        ro.compute_advantages(0.99, 0.95)
        assert tr.collector.pop_finished() is not None
        assert ro.flat()["action_masks"].shape == (128, 32)
    finally:
        tr.close()


def test_the_fused_step_and_the_numpy_actor_are_bypassed_by_name(tmp_path):
    tr, msgs = _trainer(tmp_path)
    try:
        assert tr.fused_reason == "action masks (the masked logits run in the eager step)"
        assert tr.flat is None and tr._minibatch_step() == tr.update_minibatch
        assert tr.collector._numpy_sampler() is None
        assert supports(tr.spec, tr.policy) is None  # the same policy, unmasked: fused
        assert any("action masks from action_masks()" in m for m in msgs)
        assert any("fused minibatch step not used (action masks" in m for m in msgs)
    finally:
        tr.close()
    plain, msgs = _trainer(tmp_path, "plain", env_kwargs={"masks": "none"})
    try:
        assert plain.fused_reason is None and plain.collector._numpy_sampler() is not None
        assert not any("action masks" in m for m in msgs)
    finally:
        plain.close()


def _metrics(run):
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS}
            for r in read_metrics(run)]


def test_the_three_ways_of_giving_masks_train_identically(tmp_path):
    runs = {}
    for way in ("method", "info", "obs"):
        tr, _ = _trainer(tmp_path, way, env_kwargs={"masks": way})
        tr.train()
        tr.close()
        runs[way] = _metrics(tmp_path / way)
    assert len(runs["method"]) == 3
    assert runs["method"] == runs["info"] == runs["obs"]
    tr, _ = _trainer(tmp_path, "obs2", env_kwargs={"masks": "obs"})
    try:  # the Dict's mask key is not an input of the encoder
        assert tr.policy.encoder.features_dim == 4
    finally:
        tr.close()


def test_multidiscrete_masks_train_and_every_action_taken_is_allowed(tmp_path):
    # MultiPick raises on a forbidden action: training at all shows none was sent
    tr = Trainer(_cfg(env_id="x", env_source="factory"), tmp_path / "md",
                 env=M.MultiPick, log=lambda m: None)
    try:
        tr.train()
        assert tr.global_step == 128 * 3
    finally:
        tr.close()


@pytest.mark.parametrize("env, match", [
    (M.EmptyMask, r"the mask of env \d allows no action \(entry 1\)"),
    (M.ShortMask, r"expected 4 x 8 booleans .* got an array of shape \(4, 7\)"),
])
def test_a_broken_mask_stops_training_with_one_line(tmp_path, env, match):
    with pytest.raises(UserCodeError, match=match) as err:
        tr = Trainer(_cfg(env_id="x", env_source="factory"), tmp_path / "bad", env=env,
                     log=lambda m: None)
        try:
            tr.train()
        finally:
            tr.close()
    assert "\n" not in str(err.value) and "action masks from action_masks()" in str(err.value)


def test_masks_need_a_discrete_head_and_no_lstm(tmp_path):
    with pytest.raises(UsageError, match="recurrent: the environment gives action masks"):
        _trainer(tmp_path, recurrent="lstm")


# -- acting ---------------------------------------------------------------------------------

def test_predict_takes_action_masks_and_reads_a_dict_key(tmp_path):
    agent = ppokit.train(CHOICE, "ppo", 256, run_dir=tmp_path / "a", n_envs=2, n_steps=64,
                         env_kwargs={"masks": "obs"}, progress=False)
    obs = {"obs": np.eye(4, dtype=np.float32)[[1] * 6],
           "action_mask": np.zeros((6, 32), np.int8)}
    for i, k in enumerate((3, 7, 20, 31, 0, 12)):
        obs["action_mask"][i, k] = 1
    for det in (True, False):  # the observation's own mask, one allowed action per row
        a, _ = agent.predict(obs, deterministic=det)
        assert a.tolist() == [3, 7, 20, 31, 0, 12]
    given = np.zeros((6, 32), bool)
    given[:, 5] = True  # an explicit mask wins over the observation's
    assert agent.predict(obs, action_masks=given)[0].tolist() == [5] * 6
    with pytest.raises(UsageError, match="action_masks: expected 6 x 32 booleans"):
        agent.predict(obs, action_masks=np.ones(31, bool))


def test_evaluation_applies_the_masks_unless_told_not_to(tmp_path):
    model = ppokit.MaskablePPO("MlpPolicy", CHOICE, seed=2, n_envs=4, n_steps=64,
                               run_dir=tmp_path / "m")
    model.learn(512)
    with_masks = ppokit.evaluate_policy(model, CHOICE, n_eval_episodes=4)[0]
    without, lengths = ppokit.evaluate_policy(model, CHOICE, n_eval_episodes=4,
                                              use_masking=False, return_episode_rewards=True)
    assert with_masks > 8 and np.mean(without) < 2 and min(lengths) < 20
    with pytest.raises(AssertionError, match="below the threshold"):
        ppokit.evaluate_policy(model, CHOICE, n_eval_episodes=2, reward_threshold=21)
    obs = np.eye(4, dtype=np.float32)[2]
    mask = np.zeros(32, bool)
    mask[[1, 9, 17]] = True
    for _ in range(5):
        assert mask[int(model.predict(obs, action_masks=mask)[0])]


def test_info_masks_on_a_discrete_space_with_a_start(tmp_path):
    # DiscreteInfoMask raises on a forbidden action; its actions start at 1. Evaluation's
    # episodes end at different steps: the envs that finished play on, masked too
    agent = ppokit.train(lambda: M.DiscreteInfoMask(), "ppo", 256, run_dir=tmp_path / "d",
                         n_envs=2, n_steps=64, progress=False)
    assert agent.num_timesteps == 256
    rets, lengths = ppokit.evaluate_policy(agent, lambda: M.DiscreteInfoMask(),
                                           n_eval_episodes=8, return_episode_rewards=True,
                                           deterministic=False)
    assert rets == [float(n) for n in lengths] and len(set(lengths)) > 1


@pytest.mark.parametrize("way", ["method", "info"])
def test_async_envs_give_their_masks_as_sync_ones_do(tmp_path, way):
    runs = {}
    for mode in ("sync", "async"):
        tr, _ = _trainer(tmp_path, mode, vectorization=mode, n_envs=2, total_timesteps=128,
                         env_kwargs={"masks": way})
        try:
            assert tr.mask_source.kind == way
            tr.train()
        finally:
            tr.close()
        runs[mode] = _metrics(tmp_path / mode)
    assert len(runs["sync"]) == 2 and runs["sync"] == runs["async"]


# -- ppokit check --env ---------------------------------------------------------------------

@pytest.mark.parametrize("env, status, detail", [
    (M.MultiPick, "PASS", ""),
    (M.EmptyMask, "FAIL", "allows no action (entry 1)"),
    (M.ShortMask, "FAIL", "expected 1 x 8 booleans"),
    (M.LyingMask, "FAIL", "is not allowed"),
    (M.DiscreteInfoMask, "PASS", ""),
])
def test_check_env_verifies_the_masks(env, status, detail):
    rep = ppokit.check_env(env, steps=400, seconds=10.0)
    r = rep["action-mask"]
    assert r.status == status, (r.measured, r.detail)
    assert detail in r.detail and "\n" not in r.detail
    if status == "PASS":  # the probe sent allowed actions only: no exception
        assert rep["env-exception"].status == "PASS"
    assert ppokit.check_env("CartPole-v1", steps=200)["action-mask"].status == "SKIP"


def test_check_env_cli_reports_a_broken_mask_in_one_line(tmp_path, capsys):
    from ppokit.cli import main

    mod = tmp_path / "broken_mask_env.py"
    mod.write_text("import gymnasium as gym\nfrom _mask_envs import EmptyMask\n"
                   "gym.register('BrokenMask-v0', entry_point=EmptyMask)\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        code = main(["check", "--env", "broken_mask_env:BrokenMask-v0", "--no-policy",
                     "--env-steps", "300"])
    finally:
        sys.path.remove(str(tmp_path))
    out = capsys.readouterr().out
    assert code == 1
    line = [x for x in out.splitlines() if x.startswith("FAIL  action-mask")]
    assert len(line) == 1 and "a broken mask at step 2" in line[0]
    assert "allows no action (entry 1)" in out


# -- what masking changes --------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_masking_is_what_makes_the_choice_task_learnable(tmp_path, seed):
    # with masks: from about 9 (sampling among the allowed actions) to near the most
    # there is, 20; without: any action is forbidden 7 times in 8, episodes end at once
    got = {}
    for way in ("method", "none"):
        agent = ppokit.train(CHOICE, "ppo", 20_000, run_dir=tmp_path / way, seed=seed,
                             n_envs=8, n_steps=64, env_kwargs={"masks": way}, progress=False)
        # (each run's evaluation envs are its own: with and without masks)
        got[way] = ppokit.evaluate_policy(agent, CHOICE, n_eval_episodes=20)[0]
    assert got["method"] >= 17.0, got
    assert got["none"] <= 1.0, got


def test_train_cli_names_a_broken_mask_in_one_line_with_exit_2(tmp_path, capsys, monkeypatch):
    from ppokit.cli import main

    (tmp_path / "empty_mask_env.py").write_text(
        "import gymnasium as gym\nfrom _mask_envs import EmptyMask\n"
        "gym.register('EmptyMask-v0', entry_point=EmptyMask)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["train", "--env", "empty_mask_env:EmptyMask-v0", "--total-steps", "2048",
                 "--no-progress", "--run-dir", str(tmp_path / "run")])
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert code == 2 and len(err) == 1
    assert "env 'empty_mask_env:EmptyMask-v0': action masks from action_masks(): the mask " \
        "of env 0 allows no action (entry 1)" in err[0]
    assert not (tmp_path / "run").exists()  # nothing was saved: nothing left behind


@pytest.mark.parametrize("env_cls, kind", [(M.MultiPick, "action_masks()"),
                                           (M.DiscreteInfoMask, 'info["action_mask"]')])
def test_ray_actors_refuse_an_env_that_gives_masks(env_cls, kind):
    """Ray's actors collect without masks: an env giving them by method or by info is
    refused in one line (seen on one local copy), not trained as if it gave none."""
    from types import SimpleNamespace

    from ppokit.algos.masks import mask_source_for
    from ppokit.envs.vec import training_vec

    cfg = SimpleNamespace(vectorization="ray", seed=0, autoreset_mode="auto", env_kwargs=None)
    env = training_vec(env_cls, 2, vectorization="sync")
    try:
        with pytest.raises(UsageError, match=rf"vectorization: .*{re.escape(kind)}.* Ray "
                                             r"actors' collection applies no action masks"):
            mask_source_for(cfg, env, env_cls, print)
    finally:
        env.close()
    import gymnasium as gym

    def plain():
        return gym.make("CartPole-v1")

    env = training_vec(plain, 2, vectorization="sync")
    try:
        assert mask_source_for(cfg, env, plain, print) is None  # no masks: Ray as before
    finally:
        env.close()
