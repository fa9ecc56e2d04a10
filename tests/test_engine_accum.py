"""Gradient accumulation and data parallelism change memory, never the update.

One minibatch of ``[B, L]`` rows with an action mask — rows without any action included,
and micro-batches (or a rank's share) made only of such rows — must give the same gradient
and the same statistics whether it is computed in one pass, in ``grad_accum`` micro-batches
or on two ranks, for every aggregation mode and KL anchor.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given
from hypothesis import strategies as st

from _nostep import NoStep
from ppokit.core.losses import AGGREGATION_MODES
from ppokit.engine import Forward, UpdateSpec, eager_minibatch_step

F = 3  # features per position
COMPARED = ("policy_loss", "value_loss", "entropy", "kl_loss", "approx_kl", "approx_kl_k1",
            "clipfrac", "clip_active_frac", "ratio_min", "ratio_max")


def _params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(F, generator=g) * 0.5).requires_grad_(),
            (torch.randn(F, generator=g) * 0.5).requires_grad_(),
            (torch.randn(F, generator=g) * 0.5).requires_grad_()]


def _forward(params):
    """A differentiable stand-in for a model: per position, log-prob, entropy and value
    from the row's features (any rows, as the engine hands them)."""
    w_pi, w_h, w_v = params

    def forward(rows: dict) -> Forward:
        x = rows["x"]
        logp = -torch.nn.functional.softplus(x @ w_pi)
        return Forward(logp, torch.sigmoid(x @ w_h), x @ w_v)
    return forward


def _minibatch(mask: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b, length = mask.shape
    return {"x": torch.randn(b, length, F, generator=g),
            "logp": -torch.rand(b, length, generator=g) * 2 - 0.05,
            "ref_logp": -torch.rand(b, length, generator=g) * 2 - 0.05,
            "advantages": torch.randn(b, length, generator=g),
            "returns": torch.randn(b, length, generator=g),
            "values": torch.randn(b, length, generator=g),
            "mask": mask}


def _spec(agg: str, kl_anchor: str, grad_accum: int = 1) -> UpdateSpec:
    return UpdateSpec(agg=agg, kl_anchor=kl_anchor, ent_coef=0.01, vf_coef=0.5,
                      clip_range_vf=0.3, max_grad_norm=None, grad_accum=grad_accum,
                      normalize_advantage=True, norm_length=5.0)


def _run(spec: UpdateSpec, mb: dict, seed: int, dp=None):
    params = _params(seed)
    stats = eager_minibatch_step(spec, _forward(params), NoStep(params), params, mb,
                                 clip_range=0.2, kl_coef=0.3, dp=dp)
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
    return stats, grads


def _assert_same(a, b):
    (sa, ga), (sb, gb) = a, b
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    for k in COMPARED:
        torch.testing.assert_close(sa[k].float(), sb[k].float(), rtol=1e-5, atol=1e-6,
                                   equal_nan=True, msg=k)


@st.composite
def _masks(draw):
    """``[B, L]`` masks with empty rows in any place (runs of them too), or none at all."""
    b = draw(st.integers(1, 7))
    length = draw(st.integers(1, 4))
    cells = draw(st.lists(st.booleans(), min_size=b * length, max_size=b * length))
    m = torch.tensor(cells, dtype=torch.bool).reshape(b, length)
    empty = draw(st.lists(st.booleans(), min_size=b, max_size=b))
    m[torch.tensor(empty, dtype=torch.bool)] = False
    return m


@given(mask=_masks(), agg=st.sampled_from(AGGREGATION_MODES),
       kl=st.sampled_from(("none", "old", "ref")), accum=st.integers(2, 8),
       seed=st.integers(0, 2**16))
def test_accumulation_equals_the_whole_minibatch_on_every_mask(mask, agg, kl, accum, seed):
    mb = _minibatch(mask, seed)
    whole = _run(_spec(agg, kl), mb, seed)
    _assert_same(_run(_spec(agg, kl, accum), mb, seed), whole)


@pytest.mark.parametrize("agg", AGGREGATION_MODES)
def test_a_micro_batch_of_empty_rows_changes_nothing(agg):
    """B=4, L=3, row 1 empty: two micro-batches (rows 0-1 and 2-3); and rows 0-1 both empty,
    so that the first micro-batch holds no action at all."""
    for empty in ([1], [0, 1]):
        mask = torch.ones(4, 3, dtype=torch.bool)
        mask[empty] = False
        mask[3, 2] = False
        mb = _minibatch(mask, 7)
        whole = _run(_spec(agg, "ref"), mb, 7)
        _assert_same(_run(_spec(agg, "ref", 2), mb, 7), whole)


# ----------------------------------------------------------------------- two ranks
# (B, L) masks and which rank owns each row: a rank holding only empty rows, one holding
# none at all, empty rows split across ranks
RANK_CASES = [
    ([[1, 1, 1], [0, 0, 0], [1, 0, 1], [1, 1, 0]], [0, 0, 1, 1]),
    ([[0, 0, 0], [0, 0, 0], [1, 0, 1], [1, 1, 1]], [0, 0, 1, 1]),
    ([[1, 1, 0], [0, 0, 0], [1, 0, 1], [0, 0, 0], [1, 1, 1]], [1, 0, 1, 0, 1]),
    ([[1, 0], [0, 0], [1, 1]], [1, 1, 1]),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    import os

    from ppokit.engine.dist import init_from_env

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dp = init_from_env(timeout_s=120)
    results = []
    for i, (mask, owner) in enumerate(RANK_CASES):
        mb = _minibatch(torch.tensor(mask, dtype=torch.bool), i)
        mb["owner"] = torch.tensor(owner)
        for agg in AGGREGATION_MODES:
            for accum in (1, 2):
                results.append(_run(_spec(agg, "ref", accum), mb, i, dp=dp))
    if rank == 0:
        torch.save(results, Path(out))
    dp.barrier()


def test_two_ranks_give_the_gradient_of_one_process(tmp_path):
    """Two gloo ranks each computing their own rows of the minibatch (some of them only
    rows without actions, or no rows at all) sum to the one-process gradient."""
    out = tmp_path / "ranks.pt"
    mp.spawn(_rank_main, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    got = iter(torch.load(out, weights_only=False))
    for i, (mask, _owner) in enumerate(RANK_CASES):
        mb = _minibatch(torch.tensor(mask, dtype=torch.bool), i)
        for agg in AGGREGATION_MODES:
            whole = _run(_spec(agg, "ref"), mb, i)
            for _accum in (1, 2):
                _assert_same(next(got), whole)
