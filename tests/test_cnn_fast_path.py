"""The CNN's fast path (fast=true: channels-last convolutions, the [0, 1] scale folded into
the first convolution, uint8 pixels kept in rollouts) against the reference path on many
random inputs: equal outputs and gradients, equal rollouts."""

from __future__ import annotations

import copy

import numpy as np
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from _pixel_envs import ImageChoice
from ppokit.envs import make_vec
from ppokit.policies import make_policy
from ppokit.policies.encoders import NatureCNN
from ppokit.rollout import Collector


def _small_cnn(size, channels, last, floats, seed, high=1.0):
    """(shape, a seeded generator, a small NatureCNN on that image space: uint8 pixels,
    or floats in [0, high])."""
    shape = (size, size, channels) if last else (channels, size, size)
    space = (spaces.Box(0.0, high, shape, np.float32) if floats
             else spaces.Box(0, 255, shape, np.uint8))
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    return shape, g, NatureCNN(space, (8, 16, 16), 32)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 5), size=st.integers(36, 48), channels=st.integers(1, 4),
       last=st.booleans(), floats=st.booleans(), seed=st.integers(0, 10_000))
def test_fast_cnn_matches_reference(batch, size, channels, last, floats, seed):
    shape, g, ref = _small_cnn(size, channels, last, floats, seed)
    ref.fast_layout = False
    fast = copy.deepcopy(ref)
    fast.fast_layout = True
    if floats:
        x = torch.rand((batch, *shape), generator=g)
    else:
        x = torch.randint(0, 256, (batch, *shape), generator=g, dtype=torch.uint8)
    w = torch.randn(batch, 32, generator=g)
    outs, grads = [], []
    for net in (ref, fast):
        out = net(x)
        (out * w).sum().backward()
        outs.append(out.detach())
        grads.append([p.grad.clone() for p in net.parameters()])
        assert all(p.grad.is_contiguous() for p in net.parameters())
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
    for gf, gr in zip(grads[1], grads[0]):
        torch.testing.assert_close(gf, gr, rtol=1e-3, atol=1e-4)


def test_fast_rollouts_keep_uint8_pixels_and_match_the_reference():
    """The same policy weights and seeds: the fast collector stores uint8 pixels, the
    reference float32; observations, actions, log-probabilities and values agree."""
    outs = []
    torch.manual_seed(0)
    env0 = make_vec(lambda: ImageChoice(), 3, vectorization="sync")
    base = make_policy(env0.single_observation_space, env0.single_action_space,
                       policy="cnn", features_dim=64)
    env0.close()
    for fast in (False, True):
        pol = copy.deepcopy(base)
        pol.encoder.fast_layout = fast
        env = make_vec(lambda: ImageChoice(), 3, vectorization="sync")
        col = Collector(env, pol, generator=torch.Generator().manual_seed(1), fast=fast)
        col.reset(seed=4)
        outs.append(col.collect(40))
        env.close()
    ref, fast = outs
    assert ref.obs.dtype == torch.float32 and fast.obs.dtype == torch.uint8
    assert torch.equal(fast.obs.float(), ref.obs)
    assert torch.equal(fast.actions, ref.actions)
    torch.testing.assert_close(fast.logp, ref.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.values, ref.values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.next_values, ref.next_values, rtol=1e-5, atol=1e-5)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


def _bf16_emulated(net: NatureCNN, obs: torch.Tensor) -> torch.Tensor:
    """What autocast to bfloat16 does to the trunk, written out in float32: each layer's
    input, weight and bias rounded to bfloat16, the products summed in float32, the
    output rounded to bfloat16 (the fast layout scales the first weights, not the
    pixels)."""
    scale_w = net.scale if net.fast_layout else 1.0
    h = obs.reshape(obs.shape[0], *net.shape).float() * (net.scale / scale_w)
    if net.channels_last:
        h = h.permute(0, 3, 1, 2)
    for k, m in enumerate(net.conv):
        if isinstance(m, torch.nn.Conv2d):
            weight = m.weight * scale_w if k == 0 else m.weight
            h = _bf16(torch.nn.functional.conv2d(_bf16(h), _bf16(weight), _bf16(m.bias),
                                                 m.stride))
        elif isinstance(m, torch.nn.ReLU):
            h = h.clamp_min(0)
        else:
            h = h.flatten(1)
    lin = net.linear[0]
    return _bf16(torch.nn.functional.linear(_bf16(h), _bf16(lin.weight),
                                            _bf16(lin.bias))).clamp_min(0)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 6), size=st.integers(36, 48), channels=st.integers(1, 4),
       last=st.booleans(), fast_layout=st.booleans(), seed=st.integers(0, 10_000))
def test_bf16_trunk_is_autocast_and_near_float32(batch, size, channels, last, fast_layout,
                                                  seed):
    """precision=bf16 on random pixels: the features are the bfloat16 computation written
    out (all but a few elements exactly; the rest a rounding step apart, one rounding
    flipped upstream), within 3% of their scale of the float32 reference; the gradient is
    that of the written-out computation (cosine > 0.95; typically above 0.9999, the
    lowest of 1500 random cases 0.987 — against plain float32 it can fall below 0.9,
    where a rounding flips a ReLU); weights, gradients and features stay float32."""
    shape = (size, size, channels) if last else (channels, size, size)
    space = spaces.Box(0, 255, shape, np.uint8)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = NatureCNN(space, (8, 16, 16), 32)
    ref.fast_layout = False
    low = copy.deepcopy(ref)
    low.fast_layout, low.precision = fast_layout, "bf16"
    emu = copy.deepcopy(low)
    x = torch.randint(0, 256, (batch, *shape), generator=g, dtype=torch.uint8)
    w = torch.randn(batch, 32, generator=g)
    outs = []
    for net in (ref, low):
        out = net(x)
        assert out.dtype == torch.float32
        (out * w).sum().backward()
        outs.append(out.detach())
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in low.parameters())
    emulated = _bf16_emulated(emu, x)
    (emulated * w).sum().backward()
    scale = outs[0].abs().max().clamp_min(1e-3)
    off = (outs[1] - emulated.detach()).abs() > 1e-3 * scale
    assert off.float().mean() <= 0.1
    assert (outs[1] - outs[0]).abs().max() <= 0.03 * scale
    grad_low, grad_emu = (torch.cat([p.grad.flatten() for p in n.parameters()])
                          for n in (low, emu))
    assert torch.nn.functional.cosine_similarity(grad_low, grad_emu, 0) > 0.95


def test_precision_auto_follows_the_hardware(monkeypatch):
    from ppokit.algos import resolve_config
    from ppokit.policies import encoders, policy_for_config

    env = ImageChoice()
    cfg = resolve_config(overrides={"precision": "auto", "policy": "cnn"})
    for native, want in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(encoders, "native_bf16", lambda native=native: native)
        pol = policy_for_config(cfg, env.observation_space, env.action_space)
        assert pol.encoder.precision == want
    assert encoders.resolve_precision("fp32") == "fp32"
    assert encoders.resolve_precision("bf16") == "bf16"


def test_bf16_rollout_log_probs_are_what_the_update_recomputes():
    """The collector's old log-probabilities come from the same bfloat16 trunk the update
    runs, so the first ratio is 1 up to the kernels' batch-size dependence."""
    torch.manual_seed(0)
    env = make_vec(lambda: ImageChoice(), 3, vectorization="sync")
    pol = make_policy(env.single_observation_space, env.single_action_space,
                      policy="cnn", features_dim=64)
    pol.encoder.precision = "bf16"
    col = Collector(env, pol, generator=torch.Generator().manual_seed(1), fast=True)
    col.reset(seed=4)
    ro = col.collect(40)
    env.close()
    obs = ro.obs.reshape(-1, *ro.obs.shape[2:])
    with torch.no_grad():
        logp, _, values = pol.evaluate(obs, ro.actions.reshape(-1))
    torch.testing.assert_close(logp, ro.logp.reshape(-1), rtol=0, atol=2e-3)
    torch.testing.assert_close(values, ro.values.reshape(-1), rtol=0, atol=2e-3)


def _autocast_float32_route(net: NatureCNN, obs: torch.Tensor) -> torch.Tensor:
    """The bf16 trunk as it ran before pixels went straight to bfloat16: float32
    channels-last pixels, autocast casting them and every weight."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = obs.reshape(obs.shape[0], *net.shape)
        if net.channels_last:
            x = x.permute(0, 3, 1, 2)
        x = x.contiguous(memory_format=torch.channels_last).to(torch.float32)
        first, s = net.conv[0], net.depth_block
        w, stride, pad = first.weight * net.scale, first.stride, first.padding
        if s:  # the space-to-depth first convolution, written out
            x, w, stride, pad = _depth_input(x, s).permute(0, 3, 1, 2), _depth_w(w, s), 1, 0
        x = torch.nn.functional.conv2d(x, w, first.bias, stride, pad)
        return net.linear(net.conv[1:](x)).float()


def _depth_input(x: torch.Tensor, s: int) -> torch.Tensor:
    """``[N, C, H, W]`` → ``[N, H/s, W/s, s·s·C]``, channel ``(dy·s + dx)·C + c``, one
    element at a time."""
    n, c, h, w = x.shape
    out = x.new_empty(n, h // s, w // s, s * s * c)
    for dy in range(s):
        for dx in range(s):
            k = (dy * s + dx) * c
            out[..., k:k + c] = x[:, :, dy::s, dx::s].permute(0, 2, 3, 1)
    return out


def _depth_w(w: torch.Tensor, s: int) -> torch.Tensor:
    """A ``[O, C, k, k]`` weight as the ``[O, s·s·C, k/s, k/s]`` one on :func:`_depth_input`."""
    o, c, k, _ = w.shape
    out = w.new_empty(o, s * s * c, k // s, k // s)
    for dy in range(s):
        for dx in range(s):
            out[:, (dy * s + dx) * c:(dy * s + dx + 1) * c] = w[:, :, dy::s, dx::s]
    return out


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 3), hb=st.integers(1, 5), wb=st.integers(1, 5), c=st.integers(1, 5),
       s=st.integers(2, 4), dtype=st.sampled_from([torch.uint8, torch.bfloat16, torch.float32,
                                                   torch.int16]),
       layout=st.sampled_from(["contiguous", "channel-first", "offset", "storage offset"]),
       seed=st.integers(0, 10_000))
def test_space_to_depth_moves_every_byte(n, hb, wb, c, s, dtype, layout, seed):
    """space_to_depth against the element-by-element rearrangement on random bytes (any
    bit pattern, NaNs of the float formats included): the wide-element copy (16, 8, 4 or
    2 bytes per run), the plain permutation for other run widths, empty batches, inputs
    that are views of channel-first memory, of a misaligned address, or of an aligned
    address at an offset into a storage whose start is not aligned."""
    from ppokit.policies.encoders import space_to_depth

    g = torch.Generator().manual_seed(seed)
    h, w = hb * s, wb * s
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * h * w * c * size,), generator=g, dtype=torch.uint8)
    nhwc = raw.view(dtype).view(n, h, w, c)
    if layout == "offset":  # the same values one element into a buffer: misaligned
        base = torch.empty(nhwc.numel() + 1, dtype=dtype)
        base.view(torch.uint8)[size:] = raw
        nhwc = base[1:].view(n, h, w, c)
    elif layout == "storage offset":  # an address aligned to 16 bytes, 8 bytes into a
        buf = np.zeros(raw.numel() + 64, np.uint8)  # storage that starts 8 bytes past one
        start = (-buf.ctypes.data) % 16 + 8
        storage = torch.from_numpy(buf[start:])
        storage[8:8 + raw.numel()] = raw
        nhwc = storage[8:8 + raw.numel()].view(dtype).view(n, h, w, c)
    if layout == "channel-first":
        nhwc = nhwc.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
    out = space_to_depth(nhwc, s)
    ref = _depth_input(nhwc.permute(0, 3, 1, 2), s)
    assert out.is_contiguous() and out.dtype == dtype and out.shape == ref.shape
    assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 4), o=st.integers(1, 5), s=st.integers(2, 4),
       kb=st.integers(1, 3), extra=st.integers(0, 3), seed=st.integers(0, 10_000))
def test_depth_weight_convolution_is_the_strided_convolution(n, c, o, s, kb, extra, seed):
    """conv(x, W, stride s) = conv(space_to_depth(x), depth_weight(W), stride 1) for a
    kernel that is a multiple of the stride, in float64 (the same products, summed in
    another order)."""
    from ppokit.policies.encoders import depth_weight, space_to_depth

    g = torch.Generator().manual_seed(seed)
    k = kb * s
    h = w = k + extra * s
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    wt = torch.randn(o, c, k, k, generator=g, dtype=torch.float64)
    assert torch.equal(depth_weight(wt, s), _depth_w(wt, s))
    ref = torch.nn.functional.conv2d(x, wt, stride=s)
    out = torch.nn.functional.conv2d(space_to_depth(x.permute(0, 2, 3, 1), s)
                                     .permute(0, 3, 1, 2), depth_weight(wt, s))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_space_to_depth_keeps_the_gradient_of_its_input():
    """A float image that needs a gradient (saliency, a differentiable preprocessing) gets
    one through the fast trunk, as through the reference; an empty batch passes too."""
    shape, g, net = _small_cnn(44, 1, True, True, 0)
    assert net.depth_block == 4
    ref = copy.deepcopy(net)
    ref.fast_layout = False
    x = torch.rand((2, *shape), generator=g, requires_grad=True)
    grads = [torch.autograd.grad(m(x).sum(), x)[0] for m in (net, ref)]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    for last in (False, True):
        shape, _, net = _small_cnn(40, 4, last, False, 0)
        assert net(torch.zeros((0, *shape), dtype=torch.uint8)).shape == (0, 32)


def test_space_to_depth_refuses_partial_blocks():
    import pytest

    from ppokit.policies.encoders import depth_weight, space_to_depth

    with pytest.raises(ValueError, match="10x12 pixels are not a whole number of 4x4"):
        space_to_depth(torch.zeros(1, 10, 12, 4, dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match="a 3x3 kernel is not a whole number of 2x2"):
        depth_weight(torch.zeros(8, 4, 3, 3), 2)


def test_the_nature_cnn_takes_space_to_depth_input_where_it_is_the_same_function():
    def block(shape, cls=NatureCNN):
        return cls(spaces.Box(0, 255, shape, np.uint8), (8, 16, 16), 32).depth_block

    from ppokit.policies.encoders import SmallImageCNN

    assert block((4, 84, 84)) == 4 and block((84, 84, 4)) == 4 and block((1, 36, 40)) == 4
    assert block((4, 84, 86)) == 0 and block((3, 37, 40)) == 0  # not a multiple of 4
    assert block((4, 10, 10), SmallImageCNN) == 0  # 3x3 kernels


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 6), size=st.integers(36, 44), channels=st.integers(1, 4),
       last=st.booleans(), nhwc=st.booleans(), floats=st.booleans(),
       seed=st.integers(0, 10_000))
def test_bf16_fast_routes_are_the_same_bits(batch, size, channels, last, nhwc, floats, seed):
    """The bf16 trunk's shortcuts change no bit: uint8 pixels cast straight to bfloat16
    (integers below 256 are exact in it) against the float32 route autocast took, inputs
    in either memory layout; and inside frozen_weights (weights cast once per rollout) a
    no-grad forward gives the same features, a forward that records a graph the same
    gradients, and leaving the block drops the copies."""
    from ppokit.policies.encoders import frozen_weights

    shape, g, net = _small_cnn(size, channels, last, floats, seed, high=255.0)
    net.precision = "bf16"
    x = torch.randint(0, 256, (batch, *shape), generator=g, dtype=torch.uint8)
    if floats:
        x = x.float()
    if nhwc and not last:  # the collector's storage of channel-first pixels
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(batch, 32, generator=g)

    def run(f):
        net.zero_grad()
        out = f(x)
        (out * w).sum().backward()
        return out.detach(), [p.grad.clone() for p in net.parameters()]

    ref, ref_g = run(lambda o: _autocast_float32_route(net, o))
    out, out_g = run(net)
    assert torch.equal(out, ref)
    assert all(torch.equal(a, b) for a, b in zip(out_g, ref_g))
    with frozen_weights(net):
        assert net._frozen is not None
        with torch.no_grad():
            assert torch.equal(net(x), ref)
        inside, inside_g = run(net)  # grad enabled: the autocast path
    assert net._frozen is None
    assert torch.equal(inside, ref)
    assert all(torch.equal(a, b) for a, b in zip(inside_g, ref_g))


def test_frozen_weights_are_cast_on_entry_only():
    """A weight changed between two rollouts is seen by the next; float32 trunks and
    nested blocks cast nothing."""
    from ppokit.policies.encoders import frozen_weights

    space = spaces.Box(0, 255, (4, 36, 36), np.uint8)
    torch.manual_seed(0)
    net = NatureCNN(space, (8, 16, 16), 32)
    x = torch.randint(0, 256, (3, 4, 36, 36), dtype=torch.uint8)
    with frozen_weights(net):
        assert net._frozen is None  # float32: nothing to cast
    net.precision = "bf16"
    with torch.no_grad(), frozen_weights(net):
        before = net(x)
        outer = net._frozen
        with frozen_weights(net):
            assert net._frozen is outer
        assert net._frozen is outer
    with torch.no_grad():
        net.linear[0].bias.add_(1.0)
        with frozen_weights(net):
            after = net(x)
        assert torch.equal(after, net(x))
    assert not torch.equal(before, after)


def test_channel_first_pixels_are_stored_channels_last():
    """The collector keeps channel-first uint8 pixels in N, H, W, C memory for a CNN
    policy: the same values, actions and log-probabilities as a collector that keeps them
    as they come, and minibatch rows of them keep the layout."""
    from ppokit.engine.batch import take_rows

    torch.manual_seed(0)
    env0 = make_vec(lambda: ImageChoice(channels_first=True), 3, vectorization="sync")
    base = make_policy(env0.single_observation_space, env0.single_action_space,
                       policy="cnn", features_dim=64)
    env0.close()
    outs = []
    for nhwc in (False, True):
        env = make_vec(lambda: ImageChoice(channels_first=True), 3, vectorization="sync")
        col = Collector(env, copy.deepcopy(base), generator=torch.Generator().manual_seed(1),
                        fast=True)
        assert col.pixels_nhwc
        col.pixels_nhwc = nhwc
        col.reset(seed=4)
        outs.append(col.collect(20))
        env.close()
    plain, nhwc = outs
    flat = nhwc.obs.reshape(-1, *nhwc.obs.shape[2:])
    assert flat.is_contiguous(memory_format=torch.channels_last) and not flat.is_contiguous()
    assert torch.equal(nhwc.obs, plain.obs)
    assert torch.equal(nhwc.actions, plain.actions)
    assert torch.equal(nhwc.logp, plain.logp) and torch.equal(nhwc.values, plain.values)
    idx = torch.tensor([5, 0, 5, 59, 17])
    rows = take_rows(flat, idx)
    assert rows.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(rows, flat[idx])


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), cl=st.booleans(),
       picks=st.lists(st.integers(0, 10_000), max_size=12), mask=st.booleans(),
       seed=st.integers(0, 1000))
def test_take_rows_is_indexing(shape, cl, picks, mask, seed):
    """take_rows(t, idx) == t[idx] for row numbers (repeats, any order, none) and masks,
    on contiguous and channels-last tensors; channels-last rows stay channels-last."""
    from ppokit.engine.batch import take_rows

    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g)
    if cl and t.dim() == 4:
        t = t.contiguous(memory_format=torch.channels_last)
    n = t.shape[0]
    idx = (torch.rand(n, generator=g) < 0.5 if mask
           else torch.tensor([p % n for p in picks], dtype=torch.long))
    out = take_rows(t, idx)
    assert torch.equal(out, t[idx])
    if cl and t.dim() == 4 and not mask:
        assert out.is_contiguous(memory_format=torch.channels_last)


def test_bf16_rollout_with_weights_cast_once_is_the_same_rollout(monkeypatch):
    """The collector's frozen_weights block (a bf16 trunk's weights cast once per
    rollout) changes nothing in the rollout: the same actions, log-probabilities and
    values as a collector whose forwards cast the weights every time."""
    import contextlib

    from ppokit.rollout import collector as collector_mod

    torch.manual_seed(0)
    env0 = make_vec(lambda: ImageChoice(channels_first=True), 3, vectorization="sync")
    base = make_policy(env0.single_observation_space, env0.single_action_space,
                       policy="cnn", features_dim=64)
    env0.close()
    base.encoder.precision = "bf16"
    outs, seen = [], []
    real = collector_mod.frozen_weights

    @contextlib.contextmanager
    def spy(policy):
        with real(policy):
            seen.append(policy.encoder._frozen is not None)  # the copies are in use
            yield

    for frozen in (real, lambda policy: contextlib.nullcontext()):
        monkeypatch.setattr(collector_mod, "frozen_weights", frozen)
        if frozen is real:
            monkeypatch.setattr(collector_mod, "frozen_weights", spy)
        env = make_vec(lambda: ImageChoice(channels_first=True), 3, vectorization="sync")
        col = Collector(env, copy.deepcopy(base), generator=torch.Generator().manual_seed(1),
                        fast=True)
        col.reset(seed=4)
        outs.append(col.collect(20))
        env.close()
    assert seen and all(seen)  # the first collector's forwards ran on the cast copies
    cast_once, cast_each = outs
    for name in ("obs", "actions", "logp", "values", "next_values"):
        assert torch.equal(getattr(cast_once, name), getattr(cast_each, name)), name
