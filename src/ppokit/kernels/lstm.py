"""A single-layer LSTM over ``[S, L]`` sequences in C, forward and backward, as an autograd
function: what the recurrent trainer's update runs (:meth:`ppokit.policies.LSTMActorCritic.
evaluate_sequences`) in place of ``nn.LSTM`` where :func:`supports` says it can.

It computes torch's LSTM (gates in torch's order input, forget, cell, output;
``c_t = f c_{t-1} + i g``, ``h_t = o tanh(c_t)``) from the module's own parameters and
returns every ``h_t``; the final state is not returned (the update does not use it) and
its gradient is taken as zero. Sigmoid and tanh are computed from a polynomial ``e^x``
(relative error below 2 ulp) and tanh's refined form (absolute error about 1e-7), so the
results match ``nn.LSTM`` to float32 rounding, not bit for bit; ``tests/test_lstm_native.py``
holds outputs and every gradient to it on random shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from . import available, lstm_backward, lstm_forward, lstm_scratch

__all__ = ["supports", "lstm"]


def supports(module: nn.Module, x: torch.Tensor, h0: torch.Tensor) -> bool:
    """Whether :func:`lstm` can run ``module`` (an ``nn.LSTM``) on ``x`` from ``h0``: one
    layer, batch-first, one direction, biases, no projection, float32 on the CPU, the
    kernels built."""
    return (available("lstm") and isinstance(module, nn.LSTM) and module.num_layers == 1
            and module.batch_first and not module.bidirectional and module.bias
            and module.proj_size == 0 and x.dim() == 3 and x.dtype == torch.float32
            and x.device.type == "cpu" and h0.dtype == torch.float32
            and all(p.dtype == torch.float32 and p.device.type == "cpu"
                    for p in module.parameters()))


class _LSTM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh):
        S, L, F = x.shape
        H = w_hh.shape[1]
        x, h0, c0 = x.contiguous(), h0.contiguous(), c0.contiguous()
        w_ih, w_hh = w_ih.contiguous(), w_hh.contiguous()
        bias = (b_ih + b_hh).contiguous()
        y = x.new_empty(S, L, H)
        acts = x.new_empty(S, L, 4 * H)
        cs = x.new_empty(S, L, H)
        scratch = x.new_empty(lstm_scratch(S, L, F, H))
        lstm_forward(S, L, F, H, x.data_ptr(), h0.data_ptr(), c0.data_ptr(), w_ih.data_ptr(),
                     w_hh.data_ptr(), bias.data_ptr(), y.data_ptr(), acts.data_ptr(),
                     cs.data_ptr(), scratch.data_ptr())
        ctx.save_for_backward(x, h0, c0, w_ih, w_hh, y, acts, cs)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, h0, c0, w_ih, w_hh, y, acts, cs = ctx.saved_tensors
        S, L, F = x.shape
        H = w_hh.shape[1]
        dy = dy.contiguous()
        dw_ih, dw_hh = torch.empty_like(w_ih), torch.empty_like(w_hh)
        db = x.new_empty(4 * H)
        need = ctx.needs_input_grad
        dx = torch.empty_like(x) if need[0] else None
        dh0 = torch.empty_like(h0) if need[1] else None
        dc0 = torch.empty_like(c0) if need[2] else None
        scratch = x.new_empty(lstm_scratch(S, L, F, H))
        lstm_backward(S, L, F, H, x.data_ptr(), h0.data_ptr(), c0.data_ptr(),
                      w_ih.data_ptr(), w_hh.data_ptr(), y.data_ptr(), acts.data_ptr(),
                      cs.data_ptr(), dy.data_ptr(), dw_ih.data_ptr(), dw_hh.data_ptr(),
                      db.data_ptr(), 0 if dx is None else dx.data_ptr(),
                      0 if dh0 is None else dh0.data_ptr(),
                      0 if dc0 is None else dc0.data_ptr(), scratch.data_ptr())
        return (dx, dh0, dc0, dw_ih if need[3] else None, dw_hh if need[4] else None,
                db if need[5] else None, db if need[6] else None)


def lstm(module: nn.LSTM, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor
         ) -> torch.Tensor:
    """``module(x, (h0, c0))[0]`` — every ``h_t`` ``[S, L, H]`` of the batch-first input
    ``x`` ``[S, L, F]`` from the state ``h0``, ``c0`` (``[1, S, H]`` as ``nn.LSTM`` takes
    them, or ``[S, H]``) — in C; :func:`supports` must hold. Differentiable in the input,
    the initial state and the module's parameters."""
    S, L, F = x.shape
    H = module.hidden_size
    if F != module.input_size:
        raise ValueError(f"lstm: input of {F} features, the module takes {module.input_size}")
    h0, c0 = h0.reshape(-1, H), c0.reshape(-1, H)
    if h0.shape[0] != S or c0.shape[0] != S:
        raise ValueError(f"lstm: a state of {h0.shape[0]} rows for {S} sequences")
    return _LSTM.apply(x, h0, c0, module.weight_ih_l0, module.weight_hh_l0,
                       module.bias_ih_l0, module.bias_hh_l0)
