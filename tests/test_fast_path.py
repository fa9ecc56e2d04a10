"""The fused minibatch step against the eager (autograd) reference on random minibatches:
same parameters after several optimiser steps, same statistics, same early stop; its
``supports`` derived from the update spec; no side effect on a policy it is not given flat
storage for; and the fallback of an unsupported setting (an image observation) training."""

import dataclasses

import pytest
import torch
from gymnasium import spaces
from hypothesis import example, given, settings
from hypothesis import strategies as st

from _policy_setup import at_a_clip_edge, setup_policy  # noqa: E402 - tests/ helper
from ppokit.algos.config import TrainConfig
from ppokit.algos.optim import Adam
from ppokit.algos.trainer import Trainer, update_spec
from ppokit.engine import UpdateSpec
from ppokit.engine.flat import FlatParameters
from ppokit.engine.fused import FusedStep, reference_step, supports
from ppokit.policies import make_policy


def _setup(kind, activation, seed, cfg):
    return setup_policy(kind, activation, (16, 16), 5, 3 if kind == "categorical" else 2,
                        seed, cfg)


def _minibatch(kind, n, gen, policy):
    obs = torch.randn(n, 5, generator=gen)
    with torch.no_grad():
        if kind == "categorical":
            actions = torch.randint(0, 3, (n,), generator=gen)
        else:
            actions = torch.randn(n, 2, generator=gen)
        logp = policy.log_prob(obs, actions) + 0.3 * torch.randn(n, generator=gen)
    return {"obs": obs, "actions": actions, "logp": logp,
            "advantages": torch.randn(n, generator=gen) * 2,
            "returns": torch.randn(n, generator=gen),
            "values": torch.randn(n, generator=gen) * 0.1}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["categorical", "gaussian"]),
       activation=st.sampled_from(["tanh", "relu"]),
       n=st.integers(1, 80), seed=st.integers(0, 10_000),
       policy_loss=st.sampled_from(["clip", "vanilla"]),
       clip=st.floats(0.05, 0.3),
       clip_range_vf=st.sampled_from([None, 0.1]),
       value_clip_mode=st.sampled_from(["max", "clipped"]),
       ent_coef=st.sampled_from([0.0, 0.01]),
       normalize_advantage=st.booleans(),
       max_grad_norm=st.sampled_from([None, 0.5]),
       backend=st.sampled_from(["script", "python", "auto"]))
# a minibatch whose ratio sits 4e-9 from 1 - clip (at_a_clip_edge)
@example(kind="categorical", activation="tanh", n=6, seed=6, policy_loss="clip",
         clip=0.16277738184450763, clip_range_vf=None, value_clip_mode="max", ent_coef=0.0,
         normalize_advantage=False, max_grad_norm=None, backend="script")
def test_fused_step_equals_eager_step(kind, activation, n, seed, policy_loss, clip,
                                      clip_range_vf, value_clip_mode, ent_coef,
                                      normalize_advantage, max_grad_norm, backend):
    """Compiled (TorchScript), as plain Python and by default (the native step where it is
    built: tests/test_native_step.py tests it on more shapes), the kernel matches the eager
    step."""
    cfg = TrainConfig(policy_loss=policy_loss, clip_range_vf=clip_range_vf,
                      value_clip_mode=value_clip_mode, ent_coef=ent_coef,
                      normalize_advantage=normalize_advantage, max_grad_norm=max_grad_norm,
                      learning_rate=3e-3, vf_coef=0.7, tensorboard=False)
    pol, flat, opt, pol_ref, opt_ref = _setup(kind, activation, seed, cfg)
    spec = update_spec(cfg)
    fused = FusedStep(spec, pol, flat, opt, backend=backend)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        mb = _minibatch(kind, n, gen, pol_ref)
        if at_a_clip_edge(pol_ref, mb, clip, clip_range_vf):
            continue  # neither stepped: the next minibatch starts from equal parameters
        want = reference_step(spec, pol_ref, opt_ref, mb, clip_range=clip)
        got = fused(mb, clip)
        assert set(got) == set(want) - {"kl_loss"}
        assert torch.isnan(want["kl_loss"])  # no KL term in this spec
        for key in got:
            torch.testing.assert_close(got[key].float(), want[key].float(), rtol=2e-4,
                                       atol=2e-5, msg=key)
        # the gradients (after clipping), computed at the same parameters: equal to float
        # rounding of sums over the minibatch
        for (name, p), p_ref in zip(pol.named_parameters(), pol_ref.parameters()):
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5,
                                       msg=f"{name} gradient")
        # the parameters after the optimiser step. Adam divides by (sqrt(v) + eps): where a
        # gradient element is near 0 (|g| ~ eps), float rounding of g (up to ~1e-7 for the
        # larger gradients here) moves the step by up to lr * rounding / eps (3e-5 with
        # lr 3e-3, eps 1e-5). A wrong gradient or optimiser moves it by ~lr, 100x more.
        for (name, p), p_ref in zip(pol.named_parameters(), pol_ref.parameters()):
            torch.testing.assert_close(p, p_ref, rtol=1e-4, atol=3e-5, msg=name)
        # the next step from the same parameters, so that such rounding, amplified by the
        # next gradient, does not accumulate across steps (a fused/eager difference then
        # shows as a gradient difference at the same point)
        with torch.no_grad():
            for p, p_ref in zip(pol.parameters(), pol_ref.parameters()):
                p.copy_(p_ref)


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_the_serial_kernel_is_the_parallel_one_bit_for_bit(kind):
    """``parallel=False`` (the critic's branch before the actor's, for a busy machine) runs
    the same arithmetic: the same statistics and parameters, exactly."""
    cfg = TrainConfig(tensorboard=False, clip_range_vf=0.1, ent_coef=0.01)
    spec = update_spec(cfg)
    runs = []
    for parallel in (True, False, None):  # None: whichever is faster now
        pol, flat, opt, _, _ = _setup(kind, "tanh", 3, cfg)
        fused = FusedStep(spec, pol, flat, opt, parallel=parallel, backend="script")
        gen = torch.Generator().manual_seed(3)
        stats = [fused.step(_minibatch(kind, 64, gen, pol), 0.2) for _ in range(4)]
        runs.append((torch.stack(stats), flat.data.clone()))
    for stats, data in runs[1:]:
        assert torch.equal(runs[0][0], stats) and torch.equal(runs[0][1], data)


def test_faster_of_two_runs_the_faster_way_and_looks_at_the_other_now_and_then():
    from ppokit.engine.fused import FasterOfTwo

    cost = {True: 2.0, False: 1.0}
    pick = FasterOfTwo(skip=3, window=5, every=50, trials=3)
    ways = []
    for i in range(400):
        if i == 200:
            cost = {True: 0.5, False: 1.0}  # the load went away: parallel is faster now
        way = pick.next()
        ways.append(way)
        pick.took(way, cost[way] * (50.0 if i < 6 else 1.0))  # warm-up calls: slow
    assert ways[:16] == [True, False] * 8  # warm-up, then both timed
    after = ways[16:200]
    assert after.count(True) == sum(1 for i in range(16, 200) if i % 50 < 3)
    assert ways[-150:].count(True) >= 140  # switched back at the first look


def test_fused_step_early_stop_matches_eager():
    cfg = TrainConfig(tensorboard=False)
    pol, flat, opt, pol_ref, opt_ref = _setup("categorical", "tanh", 0, cfg)
    spec = update_spec(cfg)
    fused = FusedStep(spec, pol, flat, opt)
    mb = _minibatch("categorical", 32, torch.Generator().manual_seed(1), pol_ref)
    before = [p.clone() for p in pol.parameters()]
    assert reference_step(spec, pol_ref, opt_ref, mb, clip_range=0.2, kl_limit=1e-6) is None
    assert fused(mb, 0.2, kl_limit=1e-6) is None
    assert all(torch.equal(a, b) for a, b in zip(before, pol.parameters()))


def test_supports_names_what_it_cannot_do():
    spec = UpdateSpec()
    pol = make_policy(spaces.Box(-1, 1, (3,)), spaces.MultiDiscrete([2, 3]))
    assert "multicategorical" in supports(spec, pol)
    pol = make_policy(spaces.Discrete(4), spaces.Discrete(2))
    assert "one-hot" in supports(spec, pol)
    pol = make_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    assert supports(spec, pol) is None
    for change, word in (({"policy_loss": "kl_penalty"}, "policy_loss"),
                         ({"kl_anchor": "old"}, "kl_anchor"),
                         ({"agg": "seq-mean-token-sum"}, "agg"),
                         ({"grad_accum": 2}, "grad_accum"),
                         ({"dual_clip": 3.0}, "dual_clip"),
                         ({"use_critic": False}, "use_critic")):
        assert word in supports(dataclasses.replace(spec, **change), pol)
    flat = FlatParameters(pol.parameters())
    with pytest.raises(ValueError, match="does not support"):
        FusedStep(UpdateSpec(policy_loss="kl_penalty"), pol, flat,
                  Adam(pol.parameters(), flat=flat))
    pol2 = make_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    with pytest.raises(ValueError, match="FlatParameters"):
        FusedStep(spec, pol2, flat, Adam(pol2.parameters()))


def test_a_new_spec_field_fails_loudly_until_the_backend_covers_it():
    @dataclasses.dataclass(frozen=True)
    class Wider(UpdateSpec):
        new_knob: float = 1.0

    pol = make_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    import ppokit.engine.fused as fused_mod

    orig = fused_mod.spec_fields
    fused_mod.spec_fields = lambda: tuple(f.name for f in dataclasses.fields(Wider))
    try:
        with pytest.raises(RuntimeError, match="new_knob"):
            supports(Wider(), pol)
    finally:
        fused_mod.spec_fields = orig


def test_building_the_fused_step_has_no_side_effect_on_the_policy():
    """The flat storage is created explicitly; the step itself re-homes nothing."""
    pol = make_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    flat = FlatParameters(pol.parameters())
    opt = Adam(pol.parameters(), flat=flat)
    ptrs = [(p.data_ptr(), p.grad.data_ptr()) for p in pol.parameters()]
    state = {k: v.clone() for k, v in pol.state_dict().items()}
    FusedStep(UpdateSpec(), pol, flat, opt)
    assert ptrs == [(p.data_ptr(), p.grad.data_ptr()) for p in pol.parameters()]
    assert all(torch.equal(v, pol.state_dict()[k]) for k, v in state.items())


@pytest.mark.parametrize("multi", [False, True])
def test_an_image_observation_trains_by_default(tmp_path, multi):
    """A 3-D image observation through the MLP (policy=mlp; auto gives an image this small
    the small-image CNN) trains with the default settings otherwise: on the fused step
    (observations flattened, as the eager forward does) and, where the fused step does
    not apply (MultiDiscrete actions), on the eager step — said once."""
    import gymnasium as gym

    act = spaces.MultiDiscrete([2, 3]) if multi else spaces.Discrete(2)

    class Pixels(gym.Env):
        observation_space = spaces.Box(0, 255, (3, 8, 8), dtype=float)
        action_space = act

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.random((3, 8, 8)), {}

        def step(self, a):
            self.t += 1
            return self.np_random.random((3, 8, 8)), 1.0, False, self.t >= 10, {}

    env_id = f"ppokit-test/Pixels{int(multi)}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=lambda **kw: Pixels())
    from ppokit.algos import resolve_config

    cfg = resolve_config(overrides=dict(env_id=env_id, n_envs=2, n_steps=16,
                                        batch_size=16, n_epochs=2, total_timesteps=64,
                                        tensorboard=False, vectorization="sync",
                                        policy="mlp"))
    msgs = []
    tr = Trainer(cfg, tmp_path / "px", log=msgs.append)
    said = sum("fused minibatch step not used" in m for m in msgs)
    if multi:
        assert tr.flat is None and tr._minibatch_step() == tr.update_minibatch
        assert said == 1 and "multicategorical" in msgs[0]
    else:
        assert isinstance(tr._minibatch_step().__self__, FusedStep) and said == 0
    tr.train()
    tr.close()
    assert tr.iteration == 2


def test_fast_and_eager_training_runs_agree(tmp_path):
    """A few CartPole iterations with the fused step and with the eager step: the same
    trajectory of losses and returns (to float tolerance)."""
    from ppokit.algos import resolve_config

    recs = {}
    for fast in (True, False):
        cfg = resolve_config(overrides=dict(total_timesteps=256 * 6, tensorboard=False,
                                            fast=fast))
        tr = Trainer(cfg, tmp_path / f"fast{fast}", log=lambda m: None)
        step = tr._minibatch_step()
        assert isinstance(getattr(step, "__self__", None), FusedStep) is fast
        recs[fast] = [tr.iterate() for _ in range(6)]
        tr.close()
    for a, b in zip(recs[True], recs[False]):
        for key in ("policy_loss", "value_loss", "approx_kl", "clipfrac", "grad_norm",
                    "explained_variance", "episode_return_mean"):
            if a[key] is None:
                assert b[key] is None
                continue
            assert abs(a[key] - b[key]) <= 1e-3 * max(1.0, abs(b[key])), key


def test_the_kernel_is_compiled_on_this_torch():
    """The fast path is the TorchScript kernel here, not the plain-Python fallback."""
    pol = make_policy(spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    flat = FlatParameters(pol.parameters())
    step = FusedStep(UpdateSpec(), pol, flat, Adam(pol.parameters(), flat=flat))
    assert isinstance(step.kernel, torch.jit.ScriptFunction)


_EXIT_RIGHT_AFTER = """
import torch
torch._C._jit_set_profiling_executor(False)  # makes the race at exit near certain
from ppokit.engine.fused import kernel

kernel()  # compiles the step (and arranges for the exit)


def slow_branch(x: torch.Tensor) -> torch.Tensor:
    return (x @ x).sum()


@torch.jit.script
def step(x: torch.Tensor) -> torch.Tensor:  # the fused step's shape: a forked branch
    fut = torch.jit.fork(slow_branch, x)    # that the caller ends up waiting for
    return (x * 2).sum() + torch.jit.wait(fut)


x = torch.randn(64, 64)
for _ in range(9):
    step(x)
"""


def test_a_process_that_exits_right_after_a_parallel_step_exits_cleanly(tmp_path):
    """The critic's thread takes the GIL once more after delivering its result; a process
    ending right then aborted ("terminate called without an active exception", exit 134)
    before ppokit gave the GIL up at exit. Four tries of a forked branch the caller waits
    for, as the fused step's critic: without the pause at exit, about three in four
    aborted (all four passing by luck: ~0.4 %)."""
    import subprocess
    import sys

    script = tmp_path / "exit_now.py"
    script.write_text(_EXIT_RIGHT_AFTER)
    codes = [subprocess.run([sys.executable, str(script)], capture_output=True,
                            timeout=120).returncode for _ in range(4)]
    assert codes == [0] * 4
