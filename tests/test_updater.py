"""The engine's Updater: schedules, the KL controller, the observers, and an update that is
the plain engine's (run_update) at the scheduled and controlled values; both trainers hold
one and log its values under one vocabulary."""

from __future__ import annotations

import copy
import tempfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppokit.core.kl import AdaptiveKLController, FixedKLController
from ppokit.engine import Forward, LabelledBatch, UpdateSpec, run_update
from ppokit.engine.updater import Schedule, Updater, kl_controller

F = 3


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(F, 3)


def _forward(model):
    def forward(rows: dict) -> Forward:
        out = model(rows["x"])
        return Forward(-torch.nn.functional.softplus(out[:, 0]), torch.sigmoid(out[:, 1]),
                       out[:, 2])
    return forward


def _batch(n: int = 24, seed: int = 0) -> LabelledBatch:
    g = torch.Generator().manual_seed(seed)
    return LabelledBatch.build({"x": torch.randn(n, F, generator=g),
                                "logp": -torch.rand(n, generator=g) - 0.1,
                                "advantages": torch.randn(n, generator=g),
                                "returns": torch.randn(n, generator=g),
                                "values": torch.randn(n, generator=g)})


def _spec(**kw) -> UpdateSpec:
    base = dict(n_epochs=2, minibatch_size=8, clip_range=0.2, vf_coef=0.5, ent_coef=0.01,
                max_grad_norm=0.5, kl_anchor="old", kl_coef=0.0)
    return UpdateSpec(**{**base, **kw})


def test_schedules():
    assert Schedule(0.3).at(0.25) == 0.3
    assert Schedule(0.3, "linear").at(0.25) == pytest.approx(0.075)
    assert Schedule(0.3, "linear").at(1.5) == 0.3 and Schedule(0.3, "linear").at(-1) == 0.0
    with pytest.raises(ValueError, match="constant, linear"):
        Schedule(0.3, "cosine")
    assert isinstance(kl_controller(0.1, 0.02), AdaptiveKLController)
    assert isinstance(kl_controller(0.1, None), FixedKLController)


def test_begin_sets_each_groups_rate_in_proportion_and_leaves_them_without_a_schedule():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.Adam([{"params": a.parameters(), "lr": 1e-3},
                            {"params": b.parameters(), "lr": 4e-3}])
    upd = Updater(_spec(), lr=Schedule(1e-3, "linear"), clip=Schedule(0.2, "linear"))
    knobs = upd.begin(opt, 0.5)
    assert knobs == {"learning_rate": pytest.approx(5e-4), "clip_range": pytest.approx(0.1),
                     "kl_coef": None}
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(5e-4), pytest.approx(2e-3)]
    assert upd.clip_range == pytest.approx(0.1)
    fixed = Updater(None, lr=None, clip=None, kl=FixedKLController(0.05))
    opt.param_groups[0]["lr"] = 7e-4  # (e.g. halved by a guard): left alone
    assert fixed.begin(opt, 0.1) == {"learning_rate": None, "clip_range": None,
                                     "kl_coef": 0.05}
    assert opt.param_groups[0]["lr"] == 7e-4 and fixed.clip_range is None


@settings(max_examples=15, deadline=None)
@given(remaining=st.floats(0.05, 1.0), beta=st.floats(0.0, 2.0), seed=st.integers(0, 99),
       clip_kind=st.sampled_from(["constant", "linear"]))
def test_update_is_run_update_at_the_scheduled_clip_and_controlled_beta(remaining, beta,
                                                                        seed, clip_kind):
    """The reference: run_update called by hand with the values the updater should pass."""
    spec, batch = _spec(), _batch(seed=seed)
    mine, ref = _model(seed), _model(seed)
    ref.load_state_dict(mine.state_dict())
    opt_m = torch.optim.Adam(mine.parameters(), lr=1e-2)
    opt_r = torch.optim.Adam(ref.parameters(), lr=1e-2)
    upd = Updater(spec, lr=Schedule(1e-2), clip=Schedule(0.3, clip_kind),
                  kl=FixedKLController(beta))
    upd.begin(opt_m, remaining)
    got = upd.update(batch, _forward(mine), opt_m, list(mine.parameters()),
                     generator=torch.Generator().manual_seed(seed))
    clip = 0.3 * remaining if clip_kind == "linear" else 0.3
    want = run_update(spec, batch, _forward(ref), opt_r, list(ref.parameters()),
                      generator=torch.Generator().manual_seed(seed), clip_range=clip,
                      kl_coef=beta)
    for p, q in zip(mine.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    assert got["kl_coef"] == beta
    for k in ("policy_loss", "value_loss", "approx_kl", "clipfrac", "n_updates"):
        assert got[k] == want[k], k


def test_observers_see_every_minibatch_and_the_labels_the_losses_receive():
    spec, batch = _spec(), _batch()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    seen_mb, seen_labels = [], []
    upd = Updater(spec, kl=None)
    upd.observers.append(lambda mb: seen_mb.append(len(mb["x"])))
    upd.loss_observers.append(lambda label, t: seen_labels.append(label))
    out = upd.update(batch, _forward(model), opt, list(model.parameters()),
                     generator=torch.Generator().manual_seed(0))
    assert seen_mb == [8] * 6 and out["n_updates"] == 6 and out["kl_coef"] is None
    assert seen_labels == ["logp_old", "advantages", "returns", "values_old"] * 6
    # without a critic the value labels are not among the loss inputs
    seen_labels.clear()
    upd.spec = _spec(use_critic=False, vf_coef=0.0)
    upd.update(batch, _forward(model), opt, list(model.parameters()),
               generator=torch.Generator().manual_seed(0))
    assert seen_labels == ["logp_old", "advantages"] * 6


def test_adapt_moves_an_adaptive_beta_only():
    ada = Updater(_spec(), kl=AdaptiveKLController(0.1, 0.01))
    ada.adapt(1.0)
    assert ada.kl_coef == pytest.approx(0.2)  # KL 1.0 > 0.01 · 1.5: doubled
    fixed = Updater(_spec(), kl=FixedKLController(0.1))
    fixed.adapt(1.0, 64)
    assert fixed.kl_coef == 0.1
    Updater(_spec()).adapt(1.0)  # no KL term: nothing to adapt
    state = ada.state_dict()
    again = Updater(_spec(), kl=AdaptiveKLController(0.1, 0.01))
    again.load_state_dict(copy.deepcopy(state))
    assert again.kl_coef == pytest.approx(0.2)
    with pytest.raises(ValueError, match="spec"):
        Updater(None).update(_batch(), None, None, [], generator=torch.Generator())


def test_the_environment_trainer_updates_through_its_updater_and_logs_its_values():
    from ppokit.algos.config import resolve_config
    from ppokit.algos.trainer import Trainer

    cfg = resolve_config(env_id="CartPole-v1", overrides={
        "n_envs": 2, "n_steps": 16, "batch_size": 16, "n_epochs": 2, "total_timesteps": 64,
        "policy_loss": "kl_penalty", "kl_coef": 0.5, "kl_target": 1e-6,
        "clip_schedule": "linear", "lr_schedule": "linear", "tensorboard": False})
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(cfg, tmp, log=lambda m: None)
        try:
            calls = []
            tr.updater.observers.append(lambda mb: calls.append(1))
            r1, r2 = tr.iterate(), tr.iterate()
        finally:
            tr.close()
            tr.metrics.close()
    assert tr.kl_ctl is tr.updater.kl and len(calls) == 8
    assert r1["kl_coef"] == 0.5 and r2["kl_coef"] == pytest.approx(1.0)  # adapted up
    assert r1["learning_rate"] == pytest.approx(cfg.learning_rate)
    assert r2["learning_rate"] == pytest.approx(cfg.learning_rate * 0.5)


def test_one_stop_verdict_for_both_trainers_callbacks():
    from ppokit.io.lifecycle import STOP, asks_to_stop

    assert asks_to_stop(STOP, stops_on=False) and asks_to_stop("stop", stops_on=True)
    assert asks_to_stop(False, stops_on=False) and not asks_to_stop(True, stops_on=False)
    assert asks_to_stop(True, stops_on=True) and not asks_to_stop(False, stops_on=True)
    for keep_going in (None, "go on", 0, 1, 0.0):
        assert not asks_to_stop(keep_going, stops_on=False)
        assert not asks_to_stop(keep_going, stops_on=True)
