"""The readable minibatch step compiled, against the fused kernel, on CartPole's update.

    python -m bench.compile_step [--steps 400] [--repeats 3]

One process, one torch thread, the CartPole-v1 preset's update (256 samples a minibatch,
the MLP actor-critic, clip and value losses): seconds per minibatch step of

* ``eager``: :func:`ppokit.engine.eager_minibatch_step` as the trainer runs it;
* ``compiled``: the same step with its forward pass and loss assembly given to
  ``torch.compile`` (the backward pass comes compiled with it; gradient clipping and the
  optimiser step stay as they are);
* ``fused``: the TorchScript kernel (:class:`ppokit.engine.fused.FusedStep`).

Rows alternate between the variants so that a drift of the machine's speed shows in every
column alike; the figures are medians. docs/architecture.md records the result.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400, help="minibatch steps per timing")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    from ppokit.algos import Trainer, resolve_config
    from ppokit.core import LossTerms, entropy_bonus, value_loss
    from ppokit.core.registry import POLICY_LOSSES
    from ppokit.engine.update import clip_grad_norm_, eager_minibatch_step

    cfg = resolve_config(env_id="CartPole-v1", overrides={"tensorboard": False})
    tr = Trainer(cfg, tempfile.mkdtemp() + "/run", log=lambda *x: None, fresh=True)
    roll = tr.collector.collect(cfg.n_steps)
    roll.compute_advantages(cfg.gamma, cfg.gae_lambda, cfg.advantage_estimator)
    mb = {k: v.detach() for k, v in roll.flat().items()}
    mb["advantages"] = (mb["advantages"] - mb["advantages"].mean()) / (
        mb["advantages"].std() + 1e-8)
    spec = tr.spec
    policy, opt = tr.policy, tr.opt
    params = [q for q in policy.parameters() if q.requires_grad]
    surrogate = POLICY_LOSSES.get(spec.policy_loss)

    def loss_of(obs, actions, logp_old, adv, returns, values_old):
        logp, ent, v = policy.evaluate(obs, actions)
        pl = surrogate(spec, logp, logp_old, adv, None, agg="token-mean")
        terms = LossTerms(policy=pl.loss, entropy=entropy_bonus(ent))
        terms.value = value_loss(v, returns, values_old=values_old,
                                 clip_range_vf=spec.clip_range_vf,
                                 clip_mode=spec.value_clip_mode)
        return terms.total(vf_coef=spec.vf_coef, ent_coef=spec.ent_coef, kl_coef=0.0)

    compiled = torch.compile(loss_of, dynamic=False)

    def eager_step():
        eager_minibatch_step(spec, tr._forward(), opt, params, mb, clip_range=spec.clip_range)

    def compiled_step():
        opt.zero_grad(set_to_none=True)
        loss = compiled(mb["obs"], mb["actions"], mb["logp"], mb["advantages"],
                        mb["returns"], mb["values"])
        loss.backward()
        clip_grad_norm_(params, spec.max_grad_norm)
        opt.step()

    fused = tr._minibatch_step()

    def fused_step():
        fused(mb, spec.clip_range, None)

    variants = {"eager": eager_step, "compiled": compiled_step, "fused": fused_step}
    t0 = time.perf_counter()
    for fn in variants.values():  # warm-up; the compiled variant compiles here
        for _ in range(5):
            fn()
    print(f"warm-up (compiling included): {time.perf_counter() - t0:.1f} s")
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(a.repeats):
        for name, fn in variants.items():
            t = time.perf_counter()
            for _ in range(a.steps):
                fn()
            times[name].append((time.perf_counter() - t) / a.steps)
    base = statistics.median(times["fused"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<9} {med * 1e3:7.3f} ms/step   {med / base:5.2f}x the fused step")
    tr.close()


if __name__ == "__main__":
    main()
