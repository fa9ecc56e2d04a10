"""Data parallelism for the update engine: several processes (ranks), one update.

The rule ppokit keeps: **N ranks compute the update one process would compute on the same
global batch.** Each rank holds the whole labelled batch of the iteration (the labels are
small; a trainer gathers them once per iteration), so minibatch composition, advantage
whitening and the aggregation's token and sequence counts are the global ones, computed
identically everywhere. What is split is the expensive part: each rank runs the forward and
backward passes only on the rows it owns (``owner``), as if they were micro-batches of the
global minibatch — each divides by the *global* minibatch counts — and the gradients are
summed across ranks before the one global clip and the optimiser step. The statistics that
decide something (approx_kl for the target-KL early stop) are summed the same way, so every
rank takes the same decision and the parameters stay identical on all ranks.

With one process, :class:`DataParallel` is simply absent (``None``): nothing here runs.
"""

from __future__ import annotations

import datetime
import os

import torch
from torch import Tensor

__all__ = ["DataParallel", "world_from_env", "init_from_env"]


def world_from_env() -> tuple[int, int]:
    """``(rank, world_size)`` as torchrun sets them (``RANK``, ``WORLD_SIZE``); ``(0, 1)``
    outside a launched job."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def init_from_env(timeout_s: float = 600.0, device: str = "cpu") -> DataParallel | None:
    """Join the job torchrun started (``MASTER_ADDR``/``MASTER_PORT``/``RANK``/
    ``WORLD_SIZE`` in the environment): NCCL for tensors on CUDA devices, gloo for tensors
    on the CPU (the token trainer keeps its tensors on the CPU today, so it uses gloo).
    ``None`` for a single process."""
    import torch.distributed as dist

    rank, world = world_from_env()
    if world <= 1:
        return None
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") and torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DataParallel()


class DataParallel:
    """The ranks of an initialised default process group."""

    def __init__(self):
        import torch.distributed as dist

        self._d = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- reductions (in place on a float tensor; returned for chaining)
    def sum_(self, t: Tensor) -> Tensor:
        self._d.all_reduce(t, op=self._d.ReduceOp.SUM)
        return t

    def min_(self, t: Tensor) -> Tensor:
        self._d.all_reduce(t, op=self._d.ReduceOp.MIN)
        return t

    def max_(self, t: Tensor) -> Tensor:
        self._d.all_reduce(t, op=self._d.ReduceOp.MAX)
        return t

    lockstep = False  # sharded models (FSDP): every rank runs the same passes

    def sum_grads_(self, params: list[Tensor]) -> None:
        """Sum every parameter's gradient across ranks, in one flat buffer (a parameter
        without a gradient on this rank counts as zeros). Sharded parameters (FSDP's
        DTensors) are skipped: their reduce-scatter has summed them already."""
        params = [p for p in params if not hasattr(p, "device_mesh")]
        if not params:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        self.sum_(flat)
        off = 0
        for p in params:
            n = p.numel()
            g = flat[off:off + n].view_as(p)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
            off += n

    def clip_grad_norm_(self, params: list[Tensor], max_norm: float) -> Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over parameters of which some are sharded
        (FSDP's DTensors: each rank holds a part, the squares are summed across ranks)
        and some replicated (the same gradient on every rank). The same norm and the same
        scaling on every rank."""
        grads = [p.grad for p in params if p.grad is not None]
        sharded = [g for g in grads if hasattr(g, "to_local")]
        plain = [g for g in grads if not hasattr(g, "to_local")]
        sq = torch.zeros((), dtype=torch.float64)
        for g in sharded:
            sq += g.to_local().double().pow(2).sum()
        self.sum_(sq)  # every rank calls it, with or without sharded gradients
        for g in plain:
            sq += g.double().pow(2).sum()
        norm = sq.sqrt().float()
        coef = float(max_norm) / (float(norm) + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
        return norm

    def broadcast_(self, tensors: list[Tensor], src: int = 0) -> None:
        for t in tensors:
            self._d.broadcast(t, src)

    def gather_objects(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        out = [None] * self.world
        self._d.all_gather_object(out, obj)
        return out

    def gather_to_main(self, obj) -> list | None:
        """Every rank's ``obj`` in rank order on rank 0 (``None`` on the others)."""
        out = [None] * self.world if self.rank == 0 else None
        self._d.gather_object(obj, out, dst=0)
        return out

    def all_gather_rows(self, t: Tensor) -> Tensor:
        """Concatenate every rank's ``t`` along the first dimension (rank order); the other
        dimensions must agree."""
        n = torch.tensor([t.shape[0]], dtype=torch.long)
        sizes = [torch.zeros_like(n) for _ in range(self.world)]
        self._d.all_gather(sizes, n)
        most = int(max(int(s) for s in sizes))
        pad = torch.zeros((most - t.shape[0], *t.shape[1:]), dtype=t.dtype)
        parts = [torch.empty((most, *t.shape[1:]), dtype=t.dtype) for _ in range(self.world)]
        self._d.all_gather(parts, torch.cat([t, pad]).contiguous())
        return torch.cat([p[:int(s)] for p, s in zip(parts, sizes)])

    def barrier(self) -> None:
        self._d.barrier()
