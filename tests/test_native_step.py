"""The native (C) minibatch step against the eager (autograd) reference on many random
minibatches and network shapes; its early stop, determinism and choice by the fused step;
and that this install has it built."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from _policy_setup import at_a_clip_edge, setup_policy  # noqa: E402 - tests/ helper
from ppokit import kernels
from ppokit.algos.config import TrainConfig
from ppokit.algos.trainer import update_spec
from ppokit.engine import UpdateSpec, native
from ppokit.engine.fused import FusedStep, reference_step

needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native step unavailable: {native.why_not()}")


def test_the_native_step_is_built_where_a_c_compiler_is():
    """``pip install -e .`` compiles the extension wherever a C compiler is found; an
    install that silently lost it would run the slower kernel without a word."""
    if sys.platform == "win32" or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine")
    assert native.available() is True and native.why_not() is None


def test_kernels_available_reads_as_an_answer(monkeypatch):
    """``print(ppokit.kernels.available())`` prints True or False (never None); why_not()
    says why not, and every caller follows the same switch."""
    built = kernels.why_not() is None
    assert kernels.available() is built and native.available() is built
    monkeypatch.setenv("PPOKIT_NATIVE", "0")
    assert kernels.available() is False and native.available() is False
    assert kernels.why_not() == native.why_not() == "PPOKIT_NATIVE=0"
    assert kernels.available("step") is False and kernels.available("lstm") is False
    with pytest.raises(RuntimeError, match="PPOKIT_NATIVE=0"):
        kernels.auto_state()
    out = subprocess.run([sys.executable, "-c", "import ppokit.kernels as k; "
                          "print(k.available())"], capture_output=True, text=True,
                         env={**os.environ, "PPOKIT_NATIVE": "0"}, check=True).stdout
    assert out.strip() == "False"


_setup = setup_policy


def _minibatch(kind, n, obs_dim, n_act, obs_scale, gen, policy):
    obs = torch.randn(n, obs_dim, generator=gen) * obs_scale
    with torch.no_grad():
        if kind == "categorical":
            actions = torch.randint(0, n_act, (n,), generator=gen)
        else:
            actions = torch.randn(n, n_act, generator=gen)
        logp = policy.log_prob(obs, actions) + 0.3 * torch.randn(n, generator=gen)
    return {"obs": obs, "actions": actions, "logp": logp,
            "advantages": torch.randn(n, generator=gen) * 2,
            "returns": torch.randn(n, generator=gen),
            "values": torch.randn(n, generator=gen) * 0.1}


@needs_native
@settings(max_examples=80, deadline=None)
@example(kind="gaussian", activation="relu", hidden=(64, 64, 80), obs_dim=40, n_act=4, n=66,
         seed=66, obs_scale=30.0, policy_loss="clip", clip=0.25, clip_range_vf=None,
         value_clip_mode="max", ent_coef=0.0, normalize_advantage=True, max_grad_norm=None)
@given(kind=st.sampled_from(["categorical", "gaussian"]),
       activation=st.sampled_from(["tanh", "relu"]),
       # widths below 16, between the vector blocks (16, 32) and above, one to three layers
       hidden=st.lists(st.sampled_from([3, 16, 24, 32, 48, 64, 80]), min_size=1,
                       max_size=3).map(tuple),
       obs_dim=st.sampled_from([1, 4, 17, 40]), n_act=st.integers(1, 5),
       n=st.integers(1, 70), seed=st.integers(0, 10_000),
       obs_scale=st.sampled_from([1.0, 30.0]),  # 30: saturated tanh units
       policy_loss=st.sampled_from(["clip", "vanilla"]), clip=st.floats(0.05, 0.3),
       clip_range_vf=st.sampled_from([None, 0.1]),
       value_clip_mode=st.sampled_from(["max", "clipped"]),
       ent_coef=st.sampled_from([0.0, 0.01]), normalize_advantage=st.booleans(),
       max_grad_norm=st.sampled_from([None, 0.5]))
def test_native_step_equals_eager_step(kind, activation, hidden, obs_dim, n_act, n, seed,
                                       obs_scale, policy_loss, clip, clip_range_vf,
                                       value_clip_mode, ent_coef, normalize_advantage,
                                       max_grad_norm):
    """Statistics, clipped gradients and parameters after Adam equal the eager step's (the
    same tolerances as the TorchScript kernel's test, tests/test_fast_path.py)."""
    if kind == "categorical" and n_act == 1:
        n_act = 2
    cfg = TrainConfig(policy_loss=policy_loss, clip_range_vf=clip_range_vf,
                      value_clip_mode=value_clip_mode, ent_coef=ent_coef,
                      normalize_advantage=normalize_advantage, max_grad_norm=max_grad_norm,
                      learning_rate=3e-3, vf_coef=0.7, tensorboard=False)
    pol, flat, opt, pol_ref, opt_ref = _setup(kind, activation, hidden, obs_dim, n_act, seed,
                                              cfg)
    spec = update_spec(cfg)
    step = FusedStep(spec, pol, flat, opt, backend="native")
    assert step.backend == "native"
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        mb = _minibatch(kind, n, obs_dim, n_act, obs_scale, gen, pol_ref)
        if at_a_clip_edge(pol_ref, mb, clip, clip_range_vf):
            continue  # neither stepped: the next minibatch starts from equal parameters
        want = reference_step(spec, pol_ref, opt_ref, mb, clip_range=clip)
        got = step(mb, clip)
        assert set(got) == set(want) - {"kl_loss"}
        for key in got:
            torch.testing.assert_close(got[key].float(), want[key].float(), rtol=2e-4,
                                       atol=2e-5, msg=key)
        for (name, p), p_ref in zip(pol.named_parameters(), pol_ref.parameters()):
            if obs_scale == 1.0:
                torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5,
                                           msg=f"{name} gradient")
            else:  # saturated units (see below), or ReLU outputs in the hundreds whose
                # float32 rounding (sums in another order) the Gaussian head's z^2 scales
                # up: the error relative to the tensor's size, 1e-3 (a wrong gradient is off
                # by its own size)
                err = float((p.grad - p_ref.grad).norm())
                assert err <= 1e-3 * max(float(p_ref.grad.norm()), 1e-2), (name, err)
        # Adam: near-zero gradient elements move by up to lr * rounding / eps (see
        # test_fused_step_equals_eager_step); a wrong update moves them by ~lr (3e-3).
        # Saturated tanh units (obs_scale 30) are left out of this check: there h lies
        # within a float's spacing (6e-8) of 1 in either implementation, 1 - h^2 is 0 in
        # one and 1.2e-7 in the other — times inputs up to 30x larger and value errors as
        # large — and Adam turns a gradient of 0 against one of 1e-6 into steps of 0 and
        # ~lr/10. Their gradients are compared above, relative to each tensor's norm;
        # Adam itself is held to the reference by the unsaturated cases, and the tanh
        # kernel to torch's over its whole range by test_native_tanh_is_torchs.
        if obs_scale == 1.0:
            for (name, p), p_ref in zip(pol.named_parameters(), pol_ref.parameters()):
                torch.testing.assert_close(p, p_ref, rtol=1e-4, atol=3e-5, msg=name)
        assert float(opt.step_t) == float(opt_ref.state[pol_ref.actor[0].weight]["step"])
        with torch.no_grad():
            for p, p_ref in zip(pol.parameters(), pol_ref.parameters()):
                p.copy_(p_ref)


@needs_native
@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
@pytest.mark.parametrize("parallel", [False, True])
def test_native_early_stop_leaves_the_parameters_untouched(kind, parallel):
    cfg = TrainConfig(tensorboard=False)
    pol, flat, opt, pol_ref, opt_ref = _setup(kind, "tanh", (64, 64), 4, 2, 0, cfg)
    step = FusedStep(update_spec(cfg), pol, flat, opt, backend="native", parallel=parallel)
    mb = _minibatch(kind, 32, 4, 2, 1.0, torch.Generator().manual_seed(0), pol)
    mb["logp"] = mb["logp"] - 1.0  # a KL of about 0.5
    before = (flat.data.clone(), opt.exp_avg.clone(), opt.exp_avg_sq.clone(),
              float(opt.step_t))
    assert step.step(mb, 0.2, kl_limit=0.01) is None
    # (the gradient buffer is scratch until a step: the critic's part is written)
    assert torch.equal(before[0], flat.data) and torch.equal(before[1], opt.exp_avg)
    assert torch.equal(before[2], opt.exp_avg_sq) and before[3] == float(opt.step_t)
    # the reference stops too, and with a loose limit both step
    assert reference_step(update_spec(cfg), pol_ref, opt_ref, mb, clip_range=0.2,
                          kl_limit=0.01) is None
    assert step.step(mb, 0.2, kl_limit=10.0) is not None


@needs_native
@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_native_step_is_deterministic_with_its_critic_beside_or_before(kind):
    """The same inputs give the same bits (a resumed run computes what the original did),
    whether the critic's branch runs on the worker thread beside the actor's, before it on
    the calling thread, or whichever is faster now."""
    cfg = TrainConfig(tensorboard=False, ent_coef=0.01, clip_range_vf=0.2)
    runs = []
    for parallel in (True, False, None, "auto", True):
        pol, flat, opt, _, _ = _setup(kind, "tanh", (64, 64), 4, 2, 5, cfg)
        step = FusedStep(update_spec(cfg), pol, flat, opt, backend="native",
                         parallel=parallel)
        gen = torch.Generator().manual_seed(5)
        stats = [step.step(_minibatch(kind, 256, 4, 2, 1.0, gen, pol), 0.2)
                 for _ in range(25)]
        runs.append((torch.stack(stats), flat.data.clone(), opt.exp_avg_sq.clone()))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


@needs_native
def test_auto_picks_native_for_narrow_networks_and_script_for_wide_ones(monkeypatch):
    cfg = TrainConfig(tensorboard=False)
    for hidden, want in (((64, 64), "native"),
                         ((native.NATIVE_MAX_WIDTH + 1, 8), "script")):
        pol, flat, opt, _, _ = _setup("gaussian", "tanh", hidden, 4, 2, 0, cfg)
        step = FusedStep(update_spec(cfg), pol, flat, opt)
        assert step.backend == want, step.native_reason
    # switched off from the environment
    monkeypatch.setenv("PPOKIT_NATIVE", "0")
    pol, flat, opt, _, _ = _setup("gaussian", "tanh", (64, 64), 4, 2, 0, cfg)
    step = FusedStep(update_spec(cfg), pol, flat, opt)
    assert step.backend == "script" and step.native_reason == "PPOKIT_NATIVE=0"
    with pytest.raises(ValueError, match="PPOKIT_NATIVE=0"):
        FusedStep(update_spec(cfg), pol, flat, opt, backend="native")


@needs_native
def test_native_refuses_what_it_cannot_run():
    cfg = TrainConfig(tensorboard=False)
    pol, flat, opt, _, _ = _setup("categorical", "tanh", (16,), 4, 2, 0, cfg)
    # an optimiser that is not ppokit's flat Adam
    other = torch.optim.SGD(pol.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="flat buffers"):
        FusedStep(UpdateSpec(), pol, flat, other, backend="native")
    assert FusedStep(UpdateSpec(), pol, flat, other).backend == "script"
    with pytest.raises(ValueError, match="backend must be one of"):
        FusedStep(UpdateSpec(), pol, flat, opt, backend="c")
    step = FusedStep(UpdateSpec(), pol, flat, opt, backend="native")
    mb = _minibatch("categorical", 8, 4, 2, 1.0, torch.Generator().manual_seed(0), pol)
    with pytest.raises(ValueError, match=r"observations of shape \(8, 5\)"):
        step.step(dict(mb, obs=torch.randn(8, 5)), 0.2)
    with pytest.raises(ValueError, match="float32"):
        step.step(dict(mb, returns=mb["returns"].double()), 0.2)
    with pytest.raises(ValueError, match="per-sample input"):
        step.step(dict(mb, values=mb["values"][:4]), 0.2)


@needs_native
def test_the_trainer_runs_the_native_step_by_default(tmp_path):
    from ppokit.algos import Trainer, resolve_config

    cfg = resolve_config(overrides=dict(total_timesteps=512, tensorboard=False))
    tr = Trainer(cfg, tmp_path / "run", log=lambda m: None)
    tr.iterate()
    assert tr._fused is not None and tr._fused.backend == "native"
    tr.close()


@needs_native
def test_native_tanh_is_torchs():
    """The step's tanh (1 - 2 / (1 + e^{2u}) on a polynomial e^x) is torch's within 2e-7
    absolutely over the whole float range it meets, saturation and clamping included."""
    x = torch.cat([torch.linspace(-100, 100, 400_001), torch.randn(100_000) * 3,
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 44.0, 44.2, -44.2, 1e4, -1e4])])
    got = kernels.tanh_(x.clone())
    assert float((got - torch.tanh(x)).abs().max()) < 2e-7
    assert float(got.abs().max()) <= 1.0


@needs_native
def test_a_forked_child_runs_the_parallel_step_with_a_worker_of_its_own(tmp_path):
    """The worker thread does not survive a fork; a child started by fork after the
    parent used it starts its own (else it would wait for a thread that is not there)."""
    import multiprocessing as mp

    cfg = TrainConfig(tensorboard=False)
    pol, flat, opt, _, _ = _setup("categorical", "tanh", (64, 64), 4, 2, 0, cfg)
    step = FusedStep(update_spec(cfg), pol, flat, opt, backend="native", parallel=True)
    mb = _minibatch("categorical", 64, 4, 2, 1.0, torch.Generator().manual_seed(0), pol)
    step.step(mb, 0.2)
    want = step.step(mb, 0.2)  # parent: stats of the second step...
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        pol2, flat2, opt2, _, _ = _setup("categorical", "tanh", (64, 64), 4, 2, 0, cfg)
        s2 = FusedStep(update_spec(cfg), pol2, flat2, opt2, backend="native", parallel=True)
        s2.step(mb, 0.2)
        q.put(s2.step(mb, 0.2).tolist())

    p = ctx.Process(target=child)
    p.start()
    got = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0 and got == want.tolist()  # ...and the child's, the same


@needs_native
def test_the_native_default_chooses_where_its_critic_runs(monkeypatch):
    """By default the native step times nothing in Python: its critic runs beside the
    actor while the extension's worker keeps up ("auto", decided in C), and before it on
    the caller's thread when there is one CPU to run on."""
    from ppokit.engine import fused as fused_mod

    cfg = TrainConfig(tensorboard=False)
    pol, flat, opt, _, _ = _setup("categorical", "tanh", (64, 64), 4, 2, 0, cfg)
    monkeypatch.setattr(fused_mod, "usable_cores", lambda: 2)
    step = FusedStep(update_spec(cfg), pol, flat, opt)
    assert step.backend == "native" and step.parallel == "auto" and step.pick is None
    monkeypatch.setattr(fused_mod, "usable_cores", lambda: 1)
    step = FusedStep(update_spec(cfg), pol, flat, opt)
    assert step.parallel is False and step.pick is None
    step = FusedStep(update_spec(cfg), pol, flat, opt, parallel=True)
    assert step.parallel is True


@needs_native
def test_auto_falls_back_to_the_serial_step_when_the_worker_cannot_keep_up():
    """In a process pinned to one CPU the worker is never running when a job is posted:
    the automatic choice sees it miss and runs the serial step (the worker asleep) for a
    back-off of steps; every step computes the serial step's bits."""
    import multiprocessing as mp
    import os

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        cfg = TrainConfig(tensorboard=False, ent_coef=0.01)
        out = {}
        for way in ("auto", False):
            pol, flat, opt, _, _ = _setup("categorical", "tanh", (64, 64), 4, 2, 3, cfg)
            step = FusedStep(update_spec(cfg), pol, flat, opt, backend="native", parallel=way)
            gen = torch.Generator().manual_seed(1)
            before = kernels.auto_state()
            stats = [step.step(_minibatch("categorical", 128, 4, 2, 1.0, gen, pol), 0.2)
                     for _ in range(40)]
            after = kernels.auto_state()
            out[way] = (torch.stack(stats).tolist(), flat.data.tolist(),
                        {k: after[k] - before[k] for k in ("steps", "beside", "missed")},
                        after["serial_left"])
        q.put(out)

    p = ctx.Process(target=child)
    p.start()
    got = q.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0
    stats, params, counts, serial_left = got["auto"]
    assert counts["steps"] == 40
    # three misses in the last 16 switch it off: at most a few steps were posted at all
    assert counts["missed"] >= 3 and counts["beside"] <= 8, counts
    assert serial_left > 0
    assert stats == got[False][0] and params == got[False][1]  # the same bits


@needs_native
def test_auto_state_counts_only_the_automatic_choice():
    cfg = TrainConfig(tensorboard=False)
    pol, flat, opt, _, _ = _setup("categorical", "tanh", (32,), 4, 2, 0, cfg)
    mb = _minibatch("categorical", 32, 4, 2, 1.0, torch.Generator().manual_seed(0), pol)
    before = kernels.auto_state()
    for way in (True, False):
        FusedStep(update_spec(cfg), pol, flat, opt, backend="native", parallel=way).step(mb, 0.2)
    assert kernels.auto_state()["steps"] == before["steps"]
    FusedStep(update_spec(cfg), pol, flat, opt, backend="native", parallel="auto").step(mb, 0.2)
    assert kernels.auto_state()["steps"] == before["steps"] + 1


