"""Generalised advantage estimation.

Two layouts:

* **Environment layout**, time-major ``[T]`` or ``[T, N]`` (T steps of N parallel envs):
  :func:`gae`. Each transition carries its own ``next_value`` and two flags.
* **Token layout**, ``[B, L]`` (B sequences of L positions) with an action mask:
  :func:`token_gae`. Only positions with mask 1 are actions; the recursion steps from
  one action to the next *action* in the same row, so masked spans inside a sequence
  (tool output, a user turn) are skipped over, and padding never contributes.

The two masks of the environment layout
---------------------------------------
``terminated[t]``  the episode really ended after step t: no bootstrap, ``V(s_{t+1}) := 0``.
``episode_end[t]`` terminated *or* truncated: the GAE carry stops, so the recursion never
                   reaches into the next episode after an auto-reset.

On a time-limit truncation ``terminated = 0`` and ``episode_end = 1``: the TD target still
bootstraps, from ``next_values[t]`` = V of the *real final observation* (before the reset),
but the advantage does not accumulate residuals from the following episode. A rollout
window that simply ends has both flags 0 and ``next_values[T-1]`` = V of the last
next-state; beyond the window ``A_T = 0``.
"""

from __future__ import annotations

import numpy as np
import torch

from .scan import (
    CHUNK,
    ROWS,
    discounted_reverse_cumsum,
    from_chunks,
    scan_chunks,
    to_chunks,
)
from .validation import (
    Tensor,
    as_tensor,
    check_binary,
    check_finite,
    check_mask,
    check_ndim,
    check_nonempty,
    check_same_shape,
    check_unit_interval,
    float_inputs,
)

__all__ = [
    "td_residuals",
    "gae",
    "gae_reference",
    "token_gae",
    "token_gae_reference",
    "discounted_reverse_cumsum",
]


def _env_inputs(rewards, values, next_values, terminated, episode_end):
    f = float_inputs({"rewards": rewards, "values": values, "next_values": next_values},
                     finite=("rewards", "values", "next_values"))
    r, v, nv = f["rewards"], f["values"], f["next_values"]
    check_nonempty(r, "rewards")
    check_ndim(r, "rewards", (1, 2), "[T] or [T, N]")
    term = as_tensor(terminated, "terminated").to(r.device)
    end = as_tensor(episode_end, "episode_end").to(r.device)
    check_same_shape(r, "rewards", values=v, next_values=nv, terminated=term, episode_end=end)
    term = check_binary(term, "terminated")
    end = check_binary(end, "episode_end")
    if bool((term & ~end).any()):
        idx = torch.nonzero(term & ~end)[0].tolist()
        raise ValueError(
            f"terminated: set at index {idx} where episode_end is not; a termination always "
            "ends the episode (episode_end = terminated OR truncated)")
    return r, v, nv, term, end


def td_residuals(rewards, values, next_values, terminated, gamma: float) -> Tensor:
    """One-step TD residuals ``δ_t = r_t + γ (1 − terminated_t) V(s_{t+1}) − V(s_t)``.

    Shapes: all inputs ``[T]`` or ``[T, N]``; returns the same shape.
    """
    gamma = check_unit_interval(gamma, "gamma")
    r, v, nv, term, _ = _env_inputs(rewards, values, next_values, terminated, terminated)
    return r + gamma * (~term).to(r.dtype) * nv - v


def gae(rewards, values, next_values, terminated, episode_end, gamma: float,
        lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation with separate bootstrap and carry masks.

    Args:
        rewards:     ``[T]`` or ``[T, N]`` reward of each transition.
        values:      same shape, ``V(s_t)`` recorded at collection time (frozen).
        next_values: same shape, ``V(s_{t+1})`` of the transition's *real* next state —
                     for a truncation, V of the final observation before auto-reset; for
                     the last step of a window, the critic's value of the last next-state.
                     Ignored where ``terminated`` is 1.
        terminated:  same shape, 0/1 or bool: stop the bootstrap.
        episode_end: same shape, 0/1 or bool: terminated or truncated; stop the carry.
        gamma, lam:  discount and GAE λ in [0, 1].

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + values`` (the value targets),
        both of the input shape and dtype. No gradient flows into either.

    ``A_t = δ_t + γ λ (1 − episode_end_t) A_{t+1}``, ``A_T = 0``.

    CPU float32/float64 tensors take a chunked scan in NumPy (:func:`_reverse_scan_time`,
    equal to :func:`gae_reference`'s loop to rounding); others the loop itself.
    """
    deltas, carry_coef, v = _gae_terms(rewards, values, next_values, terminated, episode_end,
                                       gamma, lam)
    if deltas.device.type == "cpu" and deltas.dtype in (torch.float32, torch.float64):
        adv = _reverse_scan_time(deltas, carry_coef)
    else:
        adv = _reverse_scan_loop(deltas, carry_coef)
    return adv, adv + v


def _gae_terms(rewards, values, next_values, terminated, episode_end, gamma: float,
               lam: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(δ, γλ(1 − episode_end), values)`` of checked, detached inputs."""
    gamma = check_unit_interval(gamma, "gamma")
    lam = check_unit_interval(lam, "lam")
    r, v, nv, term, end = _env_inputs(rewards, values, next_values, terminated, episode_end)
    r, v, nv = r.detach(), v.detach(), nv.detach()
    deltas = r + gamma * (~term).to(r.dtype) * nv - v
    return deltas, (gamma * lam) * (~end).to(r.dtype), v


def gae_reference(rewards, values, next_values, terminated, episode_end, gamma: float,
                  lam: float) -> tuple[Tensor, Tensor]:
    """:func:`gae` as the plain loop over time steps (the definition the fast path is
    held to by the tests)."""
    deltas, carry_coef, v = _gae_terms(rewards, values, next_values, terminated, episode_end,
                                       gamma, lam)
    adv = _reverse_scan_loop(deltas, carry_coef)
    return adv, adv + v


def _reverse_scan_loop(x: Tensor, a: Tensor) -> Tensor:
    """``y_t = x_t + a_t y_{t+1}`` along the first axis, ``y_T = 0``: one step at a time."""
    y = torch.empty_like(x)
    carry = torch.zeros_like(x[0])
    for t in range(x.shape[0] - 1, -1, -1):
        carry = x[t] + a[t] * carry
        y[t] = carry
    return y


def _reverse_scan_time(x: Tensor, a: Tensor, chunk: int = 16) -> Tensor:
    """:func:`_reverse_scan_loop` for CPU tensors ``[T]`` or ``[T, N]``, in NumPy without a
    Python loop over T. Time is the leading axis, so chunks of ``chunk`` steps are views
    ``[n, chunk, N]``: a scan inside every chunk at once (``chunk`` vector steps, keeping
    each position's product of coefficients to the chunk's end), the chunks' first values
    solved by recursive doubling over the ``n`` chunks, then each chunk's carry-in added
    through those products. The same sums in another order: equal to the loop to rounding
    (``tests/test_core_gae_fast.py``)."""
    xn, an = x.numpy(), a.numpy()
    if xn.ndim == 1:
        xn, an = xn[:, None], an[:, None]
    length, width = xn.shape
    n = -(-length // chunk)
    y = np.empty((n * chunk, width), xn.dtype)
    p = np.empty_like(y)
    y[:length] = xn
    y[length:] = 0
    p[:length] = an
    p[length:] = 1
    y3, p3 = y.reshape(n, chunk, width), p.reshape(n, chunk, width)
    with np.errstate(all="ignore"):  # an overflow gives inf, as the loop does
        tmp = np.empty((n, width), xn.dtype)
        for i in range(chunk - 2, -1, -1):  # p3[:, i] is still a_i here, then a_i…a_{C−1}
            np.multiply(p3[:, i], y3[:, i + 1], out=tmp)
            y3[:, i] += tmp
            p3[:, i] *= p3[:, i + 1]
        # the chunks' first values: Y_k = first_k + P_k · Y_{k+1}, Y_n = 0
        head = y3[:, 0].copy()
        prod = p3[:, 0].copy()
        step = 1
        while step < n:
            head[:-step] += prod[:-step] * head[step:]
            prod[:-step] *= prod[step:].copy()
            step *= 2
        after = np.zeros((n, width), xn.dtype)  # each chunk's carry-in: Y_{k+1}
        after[:-1] = head[1:]
        y3 += p3 * after[:, None, :]
    out = y[:length]
    return torch.from_numpy(out[:, 0].copy() if x.ndim == 1 else out)


# --------------------------------------------------------------------------- token layout


def _token_inputs(rewards, values, mask, bootstrap_values):
    """Validate token-layout shapes and flags (finiteness is checked on action positions
    by the caller: padding may hold anything, NaN included)."""
    f = float_inputs({"rewards": rewards, "values": values})
    r, v = f["rewards"], f["values"]
    check_nonempty(r, "rewards")
    check_ndim(r, "rewards", (2,), "[B, L]")
    check_same_shape(r, "rewards", values=v)
    m = check_mask(mask, r, "rewards")
    boot = None
    if bootstrap_values is not None:
        boot = as_tensor(bootstrap_values, "bootstrap_values", like=r)
        if tuple(boot.shape) != (r.shape[0],):
            raise ValueError(f"bootstrap_values: expected shape [B] = ({r.shape[0]},), got "
                             f"{tuple(boot.shape)}")
        check_finite(boot, "bootstrap_values")
    return r.detach(), v.detach(), m, boot


def _check_action_values(t: Tensor, name: str) -> None:
    """``t`` holds only action-position values (and zeros): all must be finite."""
    if not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: expected finite values at action positions, found NaN or inf")


# The CPU path of token_gae: NumPy, a chunked scan of the recurrence in position space.
#
# Along a row, with c = γλ, the quantities GAE needs obey one first-order recurrence that
# steps over masked positions: y_t = m_t x_t + a_t y_{t+1} with a_t = c at an action and
# a_t = 1 elsewhere (a masked position hands the carry on unchanged). Its value at an action
# is Σ over the row's later actions of c^(actions in between) x, and its value at any
# position is the one at the next action. For the j-th action of a row (n actions; v_n and
# r_n the bootstrap value b, or 0):
#     A_j = R_j − v_j + γ(1 − λ) T_{j+1},   R = scan of r,  T = scan of v,  carry-in b,
# which is Σ_i c^(i−j) δ_i with δ_i = r_i + γ v_{i+1} − v_i, rearranged: no residual needs
# the next action's value, so the rewards and values are scanned side by side and no
# packing, sorting or gathering is needed. Rounding is that of the position loop: there is
# no difference of large sums (γ(1 − λ)·T is at most the size of the values).
#
# The scan runs on chunks of C positions laid out position-in-chunk first ([C, …, n]): a
# loop of C steps over contiguous [K, B, n] slices gives each chunk's own scan; one level
# up, the chunks' first values and the products of their coefficients are scanned by
# recursive doubling; then each position gets its chunk's carry-in. Blocks of rows small
# enough to stay in a core's cache are done one after the other.
# Every operation is a NumPy elementwise ufunc: single-threaded, whatever the torch or BLAS
# thread settings, so the speed does not depend on the thread count and no setting is
# touched. (The torch path below, for other devices, runs its large ops on the intra-op
# thread pool; on a busy CPU every such op waits for its slowest thread.) The layout and
# the scan are in scan.py.


def _gae_rows(rn: np.ndarray, vn: np.ndarray, mn: np.ndarray, boot: np.ndarray | None,
              gamma: float, lam: float, adv: np.ndarray, ret: np.ndarray,
              finite: bool) -> None:
    """Advantages and returns of a block of rows into ``adv`` and ``ret`` (``[b, L]``);
    ``finite``: every reward and value of the whole batch is finite."""
    dt = rn.dtype.type
    mf = mn.astype(rn.dtype)
    bsz, length = rn.shape
    c = CHUNK
    n = -(-(length + 1) // c)  # at least one padded position: it holds the carry-in b
    buf = np.empty((3, bsz, n * c), rn.dtype)  # masked rewards, masked values, coefficients
    xr, xv, xa = buf[0, :, :length], buf[1, :, :length], buf[2, :, :length]
    if finite:
        np.multiply(rn, mf, out=xr)
        np.multiply(vn, mf, out=xv)
    else:  # junk at masked positions is allowed; at an action it is an error
        for name, src, dst in (("rewards", rn, xr), ("values", vn, xv)):
            np.copyto(dst, np.where(mn, src, dt(0)))
            if not np.isfinite(dst).all():
                raise ValueError(f"{name}: expected finite values at action positions, "
                                 "found NaN or inf")
    np.multiply(mf, dt(gamma * lam - 1.0), out=xa)
    xa += dt(1)
    buf[:2, :, length:] = 0
    buf[2, :, length:] = 1
    carry = np.zeros((2, bsz), rn.dtype)
    if boot is not None:
        carry[:] = boot
    t = to_chunks(buf, c)
    yt = t[:, :2]
    scan_chunks(yt, t[:, 2], carry)
    y = from_chunks(yt)  # [2, b, n·C]: scans of the rewards and of the values
    # A = R − v + γ(1 − λ)·T at the next position (the carry-in after the row's end)
    np.multiply(y[1, :, 1:length + 1], dt(gamma * (1.0 - lam)), out=ret)
    ret += y[0, :, :length]
    ret -= xv
    np.multiply(ret, mf, out=adv)
    np.add(adv, xv, out=ret)
    if not np.isfinite(adv).all():  # an overflow: inf · 0 must not leave NaN off the mask
        adv[~mn] = 0
        ret[~mn] = 0


def _token_gae_numpy(r: Tensor, v: Tensor, m: Tensor, gamma: float, lam: float,
                     boot: Tensor | None) -> tuple[Tensor, Tensor]:
    """:func:`token_gae` for CPU tensors (see the comment above ``_gae_rows``), by blocks of
    rows small enough for the working set to stay in cache."""
    dtype = r.dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    rn, vn = r.to(work).numpy(), v.to(work).numpy()
    mn = m.numpy()
    bn = None if boot is None else boot.to(work).numpy()
    bsz, length = rn.shape
    adv = np.empty((bsz, length), rn.dtype)
    ret = np.empty_like(adv)
    rows = max(1, ROWS // (length + CHUNK))
    finite = bool(np.isfinite(rn).all() and np.isfinite(vn).all())
    with np.errstate(all="ignore"):  # an overflow gives inf, as in torch, without a warning
        for i in range(0, bsz, rows):
            j = slice(i, i + rows)
            _gae_rows(rn[j], vn[j], mn[j], None if bn is None else bn[j], gamma, lam,
                      adv[j], ret[j], finite)
    return torch.from_numpy(adv).to(dtype), torch.from_numpy(ret).to(dtype)


def token_gae(rewards, values, mask, gamma: float, lam: float, *,
              bootstrap_values=None, chunk_size: int | None = None) -> tuple[Tensor, Tensor]:
    """GAE over token sequences ``[B, L]`` with an action mask.

    Args:
        rewards: ``[B, L]`` per-position rewards. Only action positions (mask 1) are read;
                 place the sequence score on the last action token and per-token KL
                 rewards on action tokens. Rewards at masked positions are ignored.
        values:  ``[B, L]`` critic values recorded at rollout time. Values at masked
                 positions are never read.
        mask:    ``[B, L]`` 0/1 or bool; 1 marks tokens sampled by the policy. May be
                 non-contiguous (multi-turn): the recursion steps from each action to the
                 next action of the same row, carrying across masked spans.
        gamma, lam: discount and λ in [0, 1], counted per action token.
        bootstrap_values: optional ``[B]``: value to bootstrap from after each row's last
                 action (e.g. a response cut at the maximum length, when truncation is
                 treated as "bootstrap"). Default: the last action is terminal.
        chunk_size: scan chunk size of the non-CPU path (speed only; default 32).

    Returns:
        ``(advantages, returns)``, ``[B, L]``, ``returns = advantages + values`` on action
        positions; both are exactly 0 at masked positions.

    On the CPU a chunked scan in NumPy (see the comment above ``_gae_rows`` in the source):
    single-threaded by construction, so it is as fast at one torch thread as at many, and it
    leaves every thread setting alone. float16/bfloat16 inputs are computed in float32. On
    other devices the actions of each row are packed to the left (a stable sort of the
    mask), the residuals computed with the next action's value, and the discounted reverse
    sum done by :func:`discounted_reverse_cumsum`. :func:`token_gae_reference` is the plain
    position loop both are tested against.
    """
    gamma = check_unit_interval(gamma, "gamma")
    lam = check_unit_interval(lam, "lam")
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size: expected an integer >= 1, got {chunk_size}")
    r, v, m, boot = _token_inputs(rewards, values, mask, bootstrap_values)
    if r.device.type == "cpu":
        return _token_gae_numpy(r, v, m, gamma, lam, boot)
    return _token_gae_packed(r, v, m, gamma, lam, boot, chunk_size or 32)


def _token_gae_packed(r: Tensor, v: Tensor, m: Tensor, gamma: float, lam: float,
                      boot: Tensor | None, chunk_size: int) -> tuple[Tensor, Tensor]:
    """:func:`token_gae` in torch operations (any device): pack each row's actions to the
    left, residuals with the next action's value, a chunked discounted reverse sum."""
    with torch.no_grad():
        bsz, length = r.shape
        # Pack each row's actions to the left, in order: action j of a row goes to column
        # j of a [B, L+1] buffer; every other position is sent to the spare column L, which
        # is then zeroed. Beyond a row's last action the packed rewards and values are 0,
        # hence so are the residuals and advantages, and gathering back with the same index
        # puts exact zeros on masked positions. (Integer arithmetic rather than
        # torch.where: several times faster on CPU.)
        cs = m.cumsum(1)
        mi = m.to(torch.int64)
        idx = mi * (cs - (length + 1)) + length
        rp = r.new_zeros(bsz, length + 1).scatter_(1, idx, r)
        vp = v.new_zeros(bsz, length + 1).scatter_(1, idx, v)
        rp[:, length] = 0
        vp[:, length] = 0
        _check_action_values(rp, "rewards")
        _check_action_values(vp, "values")
        v_next = vp[:, 1:]  # the next action's value; 0 after the last action
        if boot is not None:
            n_act = cs[:, -1:]
            v_next = v_next.scatter_add(1, (n_act - 1).clamp(min=0),
                                        torch.where(n_act > 0, boot[:, None], 0.0))
        deltas = torch.add(rp[:, :length], v_next, alpha=gamma).sub_(vp[:, :length])
        adv_p = discounted_reverse_cumsum(deltas, gamma * lam, chunk_size)
        adv_p = torch.nn.functional.pad(adv_p, (0, 1))
        adv = adv_p.gather(1, idx)
        ret = adv + vp.gather(1, idx)
    return adv, ret


def token_gae_reference(rewards, values, mask, gamma: float, lam: float, *,
                        bootstrap_values=None) -> tuple[Tensor, Tensor]:
    """The plain position loop (vectorised over B only) that :func:`token_gae` must equal.

    Same contract as :func:`token_gae` (``[B, L]`` rewards, values and mask; optional
    ``[B]`` bootstrap values; returns two ``[B, L]`` tensors). Walks positions
    ``L−1 … 0``; at an action position ``δ = r + γ V(next action) − V`` and
    ``A = δ + γ λ A(next action)``; masked positions leave the carried value and advantage
    unchanged.
    """
    gamma = check_unit_interval(gamma, "gamma")
    lam = check_unit_interval(lam, "lam")
    r, v, m, boot = _token_inputs(rewards, values, mask, bootstrap_values)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    r, v = torch.where(m, r, zero), torch.where(m, v, zero)
    _check_action_values(r, "rewards")
    _check_action_values(v, "values")
    with torch.no_grad():
        length = r.shape[1]
        adv = torch.zeros_like(r)
        next_v = boot.clone() if boot is not None else torch.zeros_like(r[:, 0])
        carry = torch.zeros_like(r[:, 0])
        for t in range(length - 1, -1, -1):
            mt = m[:, t]
            delta = r[:, t] + gamma * next_v - v[:, t]
            new = delta + gamma * lam * carry
            carry = torch.where(mt, new, carry)
            next_v = torch.where(mt, v[:, t], next_v)
            adv[:, t] = torch.where(mt, new, torch.zeros_like(new))
    return adv, adv + v
