"""``fsdp = true``: the models sharded across ranks with torch's FSDP2 (``fully_shard``).

With data parallelism alone (:mod:`ppokit.llm.training.parallel`) every rank holds whole copies of
the policy, the reference and the critic. With ``fsdp`` each decoder layer and the model
around them are sharded: a rank stores ``1/N`` of every parameter, gradient and Adam
moment, and gathers a layer's full weights only while it runs it. The update rule does not
change — N ranks still compute the update one process computes on the global batch:

* the gradients are **summed** across ranks by FSDP's reduce-scatter (its divide factor is
  set to 1, since every rank's loss already divides by the global token or sequence
  counts); parameters FSDP does not shard (a critic's value head) are summed by
  :meth:`ppokit.engine.dist.DataParallel.sum_grads_` as before;
* a sharded model is a collective: every rank must run the same number of forward and
  backward passes. Generation therefore continues until every rank's rows have finished
  (a finished row only receives padding), and in the update a rank that owns fewer rows of
  a minibatch than ``grad_accum`` runs zero-weight passes so the ranks stay in step;
* checkpoints hold full tensors (gathered from the shards; rank 0 writes them) for the
  models, and each rank's own optimiser shard, so resuming needs the same number of ranks
  and the exported ``policy/`` is a plain Hugging Face directory.

It runs on the CPU with gloo, like the rest of the token trainer (the scale of the tests);
the point of sharding — a model that does not fit one device fits N — pays on GPUs, which
the token trainer does not use yet.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["shard_model", "full_state_dict", "plain_copy", "local_optimizer_state",
           "load_local_optimizer_state", "is_sharded"]


def _layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM or its backbone (Llama/Qwen2: ``layers``, GPT-2:
    ``h``), found by name."""
    for name in ("layers", "h"):
        for mod_name, mod in model.named_modules():
            if mod_name.split(".")[-1] == name and isinstance(mod, nn.ModuleList):
                return list(mod)
    return []


def shard_model(model: nn.Module) -> nn.Module:
    """Shard ``model`` in place: each decoder layer, then the whole model; gradients are
    summed (not averaged) across ranks."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in _layers(model):
        fully_shard(layer)
    # the root too reshards after every forward: its weights gathered under no_grad
    # (generation, the frozen log-probs) must not be reused by a forward that needs their
    # gradient (they would get none)
    fully_shard(model, reshard_after_forward=True)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            # a plain SUM in the collective (gloo has no pre-multiplied sum)
            m.set_force_sum_reduction_for_comms(True)
    return model


def is_sharded(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) tensors of ``model``'s state dict: a collective, every rank
    calls it in the same order."""
    return {k: (v.full_tensor() if is_sharded(v) else v).detach().clone()
            for k, v in model.state_dict().items()}


def plain_copy(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """An unsharded model of ``model``'s class and config holding ``state`` (for export)."""
    cls = type(model)
    bases = [b for b in cls.__mro__ if b.__module__.startswith("transformers.")
             and not b.__name__.startswith("FSDP")]
    plain = bases[0](copy.deepcopy(model.config))
    plain.load_state_dict(state)
    plain.eval()
    return plain


def local_optimizer_state(opt: torch.optim.Optimizer) -> dict:
    """``opt.state_dict()`` with each sharded state tensor replaced by this rank's shard."""
    sd = opt.state_dict()
    state = {pid: {k: (v.to_local() if is_sharded(v) else v) for k, v in st.items()}
             for pid, st in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}


def load_local_optimizer_state(opt: torch.optim.Optimizer, sd: dict) -> None:
    """Inverse of :func:`local_optimizer_state` on an optimiser over the same sharded
    parameters (the same number of ranks)."""
    from torch.distributed.tensor import DTensor

    params = [p for g in opt.param_groups for p in g["params"]]
    state = {}
    for pid, st in sd["state"].items():
        p = params[int(pid)]
        # uneven shards: the global shape is the parameter's, not local size × ranks
        state[pid] = {k: (DTensor.from_local(v, p.device_mesh, p.placements,
                                             shape=p.size(), stride=p.stride())
                          if is_sharded(p) and torch.is_tensor(v) and v.dim() > 0 else v)
                      for k, v in st.items()}
    opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
