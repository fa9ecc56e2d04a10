"""Adam without ``torch.optim``.

Constructing any ``torch.optim`` optimiser imports ``torch._dynamo`` (about 800 modules and
70 MB of resident memory on torch 2.13), which an environment-RL run never uses otherwise.
:class:`Adam` runs the very kernel ``torch.optim.Adam(fused=True)`` runs
(``torch._fused_adam_``, after incrementing the step counters) and exposes the parts of the
optimiser interface ppokit uses: ``param_groups`` (``lr`` is set there by the schedules),
``state`` (per parameter: ``step``, ``exp_avg``, ``exp_avg_sq``), ``step``, ``zero_grad``,
and ``state_dict`` / ``load_state_dict`` in ``torch.optim``'s format, so checkpoints are
interchangeable with ``torch.optim.Adam``'s. ``tests/test_optim.py`` checks it against
``torch.optim.Adam(fused=True)`` step by step.

Supported: one parameter group, float CPU parameters, no weight decay, AMSGrad or
``maximize`` (what the trainer configures).

Given ``flat=`` (:class:`ppokit.engine.flat.FlatParameters` over the same parameters), the
moments live in two flat buffers too (each parameter's ``exp_avg`` / ``exp_avg_sq`` is a
view) with one shared step counter, and a step is one fused-kernel call on the three
buffers — what the fused minibatch step relies on. ``zero_grad`` then zeroes the flat
gradient in place (the gradients stay views).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["Adam"]


class Adam:
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, *,
                 flat=None):
        params = list(params)
        if not params:
            raise ValueError("Adam: got an empty parameter list")
        if not lr >= 0.0:
            raise ValueError(f"Adam: lr must be >= 0, got {lr}")
        self.param_groups: list[dict[str, Any]] = [{
            "params": params, "lr": lr, "betas": (float(betas[0]), float(betas[1])),
            "eps": eps, "weight_decay": 0, "amsgrad": False, "maximize": False,
            "foreach": None, "capturable": False, "differentiable": False, "fused": True,
            "decoupled_weight_decay": False}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self.flat = flat
        if flat is not None:
            if not flat.owns(params):
                raise ValueError("Adam: flat= must hold exactly these parameters")
            self.exp_avg = torch.zeros_like(flat.data)
            self.exp_avg_sq = torch.zeros_like(flat.data)
            self.step_t = torch.zeros((), dtype=torch.float32)
            for p, m, v in zip(params, flat.views(self.exp_avg), flat.views(self.exp_avg_sq)):
                self.state[p] = {"step": self.step_t, "exp_avg": m, "exp_avg_sq": v}

    @property
    def _params(self) -> list[torch.nn.Parameter]:
        return self.param_groups[0]["params"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.flat is not None:
            self.flat.zero_grad()
            return
        for p in self._params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        g = self.param_groups[0]
        if self.flat is not None:  # one kernel call on the flat buffers
            self.step_t += 1.0
            beta1, beta2 = g["betas"]
            torch._fused_adam_([self.flat.data], [self.flat.grad], [self.exp_avg],
                               [self.exp_avg_sq], [], [self.step_t], lr=float(g["lr"]),
                               beta1=beta1, beta2=beta2, weight_decay=0.0, eps=g["eps"],
                               amsgrad=False, maximize=False)
            return
        params, grads, avgs, sqs, steps = [], [], [], [], []
        for p in self._params:
            if p.grad is None:
                continue
            st = self.state.get(p)
            if not st:
                st = self.state[p] = {"step": torch.zeros((), dtype=torch.float32),
                                      "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}
            params.append(p)
            grads.append(p.grad)
            avgs.append(st["exp_avg"])
            sqs.append(st["exp_avg_sq"])
            steps.append(st["step"])
        if not params:
            return
        for s in {id(s): s for s in steps}.values():  # a step tensor shared by several
            s += 1.0                                    # parameters counts once
        beta1, beta2 = g["betas"]
        torch._fused_adam_(params, grads, avgs, sqs, [], steps, lr=float(g["lr"]),
                           beta1=beta1, beta2=beta2, weight_decay=0.0, eps=g["eps"],
                           amsgrad=False, maximize=False)

    def state_dict(self) -> dict[str, Any]:
        index = {p: i for i, p in enumerate(self._params)}
        state = {index[p]: dict(st) for p, st in self.state.items() if p in index}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self._params)))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        groups = sd["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self._params):
            raise ValueError("Adam.load_state_dict: the state has a different number of "
                             "parameter groups or parameters than this optimiser")
        for k, v in groups[0].items():
            if k != "params":
                self.param_groups[0][k] = tuple(v) if k == "betas" else v
        if self.flat is not None:  # copy into the flat buffers' views
            for i, p in enumerate(self._params):
                st = sd["state"].get(i)
                if st is None:
                    continue
                self.step_t.fill_(float(torch.as_tensor(st["step"])))
                self.state[p]["exp_avg"].copy_(st["exp_avg"])
                self.state[p]["exp_avg_sq"].copy_(st["exp_avg_sq"])
            return
        self.state = {}
        for i, p in enumerate(self._params):
            st = sd["state"].get(i)
            if st is None:
                continue
            self.state[p] = {
                "step": torch.as_tensor(st["step"], dtype=torch.float32).clone(),
                "exp_avg": st["exp_avg"].to(p.dtype).clone(),
                "exp_avg_sq": st["exp_avg_sq"].to(p.dtype).clone()}
