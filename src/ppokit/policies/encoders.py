"""Observation encoders: what turns an observation into the feature vector the actor and
critic MLPs read.

* **Images** (``policy = "cnn"``, or ``auto`` on an image ``Box``): a ``Box`` with three
  dimensions is an image when its dtype is uint8, bool (one plane per kind of object, as
  MinAtar's games), or float with bounds 0 and 1 (or 0 and 255). The channel axis is the
  smaller of the first and last axes (``C×H×W`` when ``shape[0] < shape[-1]``, else
  ``H×W×C``, Gymnasium's layout, which a tie such as MinAtar Seaquest's 10×10×10 also
  reads: 84×84×4 and 4×84×84 are both read right). Pixels are scaled to [0, 1] (divided
  by 255 for uint8 or 0–255 bounds) and go through a convolutional trunk with
  ``cnn_channels`` filters (32, 64, 64), ReLU after each convolution, then a linear layer
  to ``features_dim`` (512) and ReLU:

  - images of at least 36×36 pixels: the trunk of the Nature DQN paper — 8×8 stride 4,
    4×4 stride 2, 3×3 stride 1 (:class:`NatureCNN`);
  - smaller ones (MinAtar's 10×10, 32×32 thumbnails, down to 1×1), where those kernels do
    not fit: three 3×3 convolutions, as MinAtar's agents use (:class:`SmallImageCNN`):
    stride 1 (MinAtar's 10×10 maps become 8×8, 6×6, 4×4), except stride 2 for a layer
    whose input side is 12 pixels or more (32×32 becomes 15×15, 7×7, 5×5: the work and
    the flattened map stay small), and padding 1 along a side under 3 pixels (so the map
    never vanishes).

  With ``precision = "bf16"`` the trunk computes in bfloat16 (autocast) and hands float32
  features to the heads.
* **Dictionaries** (``policy = "multi_input"``, or ``auto`` on a ``Dict``): one encoder
  per key, in sorted key order — the image trunk above for an image of any size (256
  features, as the combined extractor most users know), the flattened values for a vector
  ``Box``, one-hot for a ``Discrete`` (and each of a ``MultiDiscrete``'s entries), the bits
  of a ``MultiBinary`` — concatenated. The ``"action_mask"`` key, an environment's action
  mask (:mod:`ppokit.envs.masks`), is not an input: it masks the logits instead.

Dictionary observations are stored flat in rollouts (Gymnasium's ``spaces.flatten``: each
key's values, one-hot for discrete ones, concatenated in sorted key order); the
multi-input encoder cuts that vector back into its keys, so buffers, normalisation of a
flat vector and minibatch indexing stay what they are for every other policy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from ppokit.core.registry import Registry
from ppokit.envs.masks import MASK_KEY
from ppokit.errors import UserCodeError

__all__ = ["is_image_space", "image_layout", "ImageCNN", "NatureCNN", "SmallImageCNN",
           "precision_note",
           "image_cnn", "MultiInputEncoder", "flat_dict_space", "POLICIES", "native_bf16",
           "frozen_weights", "space_to_depth", "depth_weight",
           "FEATURES_EXTRACTORS", "register_features_extractor", "BUILT_IN",
           "resolve_precision", "MIN_CNN_SIZE"]

BUILT_IN = ("mlp", "cnn", "multi_input")
MIN_CNN_SIZE = 36  # the smallest height and width the Nature CNN's three kernels fit
SMALL_STRIDE_FROM = 12  # SmallImageCNN: stride 2 along a side of at least this many pixels


def is_image_space(space: spaces.Space) -> bool:
    """A 3-D ``Box`` of uint8 pixels or of booleans (object planes), or of floats bounded
    by 0 and 1 (or 0 and 255)."""
    if not isinstance(space, spaces.Box) or len(space.shape) != 3:
        return False
    if space.dtype in (np.uint8, np.bool_):
        return True
    if not np.issubdtype(space.dtype, np.floating):
        return False
    lo, hi = np.unique(space.low), np.unique(space.high)
    return len(lo) == 1 and len(hi) == 1 and lo[0] == 0 and hi[0] in (1.0, 255.0)


def image_layout(space: spaces.Box) -> tuple[bool, int, int, int, float]:
    """``(channels_last, C, H, W, scale)`` of an image space (``scale`` multiplies pixels
    into [0, 1])."""
    shape = space.shape
    last = shape[-1] <= shape[0]  # a tie: H×W×C, Gymnasium's layout
    c, h, w = (shape[2], shape[0], shape[1]) if last else shape
    scale = 1.0 / 255.0 if space.dtype == np.uint8 or float(np.max(space.high)) > 1 else 1.0
    return last, int(c), int(h), int(w), scale


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX tiles or AVX-512 BF16): where
    it does not, bfloat16 convolutions are emulated and slower than float32 ones."""
    cpu = torch.cpu
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in probes)


def resolve_precision(precision: str) -> str:
    """``fp32`` or ``bf16`` for the config key ``precision`` (``auto``: bf16 when
    :func:`native_bf16`)."""
    if precision == "auto":
        return "bf16" if native_bf16() else "fp32"
    return precision


@contextlib.contextmanager
def frozen_weights(module: object) -> Iterator[None]:
    """:meth:`ImageCNN.frozen` for every image trunk inside ``module``: the block promises
    that no weight changes in it (the collector wraps each rollout in it)."""
    with contextlib.ExitStack() as stack:
        # (a policy need not be an nn.Module: the collector takes any object with act)
        for m in module.modules() if isinstance(module, nn.Module) else ():
            if isinstance(m, ImageCNN):
                stack.enter_context(m.frozen())
        yield


def _conv_out(n: int, k: int, s: int, p: int = 0) -> int:
    return (n + 2 * p - k) // s + 1


# an s×s block of C channels is one run of s·C·itemsize bytes in a row: moved as one
# element of this width, the rearrangement copies 16-byte elements instead of single
# bytes (on 256 Atari frames 1.8 ms against 7–12 ms)
_RUNS = {16: torch.complex128, 8: torch.int64, 4: torch.int32, 2: torch.int16}


def space_to_depth(x: torch.Tensor, s: int) -> torch.Tensor:
    """``[N, H, W, C]`` → ``[N, H/s, W/s, s·s·C]`` (H and W multiples of ``s``): each
    ``s``×``s`` block of pixels becomes one pixel whose channel ``(dy·s + dx)·C + c`` is
    channel ``c`` of the block's pixel in row ``dy``, column ``dx``. Only bytes move."""
    n, h, w, c = x.shape
    if s < 1 or h % s or w % s:
        raise ValueError(f"space_to_depth: images of {h}x{w} pixels are not a whole number "
                         f"of {s}x{s} blocks")
    x = x.contiguous()
    run = s * c * x.element_size()
    wide = _RUNS.get(run) if x.device.type in ("cpu", "cuda") else None  # (no complex128 on MPS)
    # the plain permutation where the wide view does not apply: an empty batch (its strides
    # may be anything), memory not aligned to the run (torch's view checks the offset into
    # the storage), or an input that needs a gradient (a view across element sizes has none)
    if (wide is None or x.numel() == 0 or x.requires_grad or x.data_ptr() % run
            or x.storage_offset() * x.element_size() % run):
        return (x.reshape(n, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5)
                .reshape(n, h // s, w // s, s * s * c))
    runs = x.view(n, h, w // s, s * c).view(wide).view(n, h // s, s, w // s)
    return runs.permute(0, 1, 3, 2).contiguous().view(x.dtype).view(n, h // s, w // s,
                                                                      s * s * c)


def depth_weight(weight: torch.Tensor, s: int) -> torch.Tensor:
    """A convolution's weight ``[O, C, k, k]`` (``k`` a multiple of ``s``) as the weight
    ``[O, s·s·C, k/s, k/s]`` of the same convolution on :func:`space_to_depth` input:
    ``conv(x, W, stride s) = conv(space_to_depth(x), depth_weight(W), stride 1)``, the
    same products summed in another order."""
    o, c, kh, kw = weight.shape
    if s < 1 or kh % s or kw % s:
        raise ValueError(f"depth_weight: a {kh}x{kw} kernel is not a whole number of "
                         f"{s}x{s} blocks")
    return (weight.view(o, c, kh // s, s, kw // s, s).permute(0, 3, 5, 1, 2, 4)
            .reshape(o, s * s * c, kh // s, kw // s))


class ImageCNN(nn.Module):
    """A convolutional trunk on one image space; ``[B, *shape]`` → ``[B, features_dim]``.

    :meth:`plan` says each convolution's kernel, stride and padding (per side: height,
    width) for the image's size; a subclass gives its own (:class:`NatureCNN`,
    :class:`SmallImageCNN`). Each convolution has the next ``channels`` entry of filters
    and a ReLU, then a linear layer to ``features_dim`` and ReLU; orthogonal
    initialisation with gain √2, zero biases."""

    def plan(self, h: int, w: int) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
        raise NotImplementedError

    def __init__(self, space: spaces.Box, channels: tuple[int, ...] = (32, 64, 64),
                 features_dim: int = 512):
        super().__init__()
        self.channels_last, c, h, w, self.scale = image_layout(space)
        self.shape = tuple(space.shape)
        layers: list[nn.Module] = []
        for out, (k, (sh, sw), (ph, pw)) in zip(channels, self.plan(h, w)):
            h, w = _conv_out(h, k, sh, ph), _conv_out(w, k, sw, pw)
            if h < 1 or w < 1:
                raise ValueError(
                    f"observation space {space.shape}: images of "
                    f"{image_layout(space)[2]}x{image_layout(space)[3]} pixels are too small "
                    f"for the {type(self).__name__} (at least {MIN_CNN_SIZE}x{MIN_CNN_SIZE})")
            layers += [nn.Conv2d(c, out, k, stride=(sh, sw), padding=(ph, pw)), nn.ReLU()]
            c = out
        self.conv = nn.Sequential(*layers, nn.Flatten())
        # the first convolution on space-to-depth input where that is the same function
        # (a kernel a multiple of its stride, no padding, the image a multiple of the
        # stride): a k×k convolution of stride s on C channels becomes a (k/s)×(k/s)
        # convolution of stride 1 on s·s·C channels — the Nature CNN's 8×8/4 on 84×84×4
        # frames a 2×2 on 21×21×64, 2.5× faster forward and backward with oneDNN
        # (docs/performance.md). 0: off.
        _, _, h0, w0, _ = image_layout(space)
        k0, (sh, sw), (ph, pw) = self.plan(h0, w0)[0]
        self.depth_block = sh if (sh == sw > 1 and k0 % sh == 0 and ph == pw == 0
                                  and h0 % sh == 0 and w0 % sh == 0) else 0
        self.linear = nn.Sequential(nn.Linear(c * h * w, features_dim), nn.ReLU())
        self.features_dim = features_dim
        # compute the convolutions on a channels-last copy of the input (fast=true); false:
        # the reference, the input's own layout (tests/test_pixels.py holds them together)
        self.fast_layout = True
        self.precision = "fp32"  # or "bf16" (config key precision; forward says what it does)
        self._frozen: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # frozen_weights
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.orthogonal_(m.weight, np.sqrt(2))
                nn.init.zeros_(m.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.precision == "fp32":
            return self._trunk(obs)
        # bf16: the convolutions and the linear layer take bfloat16 copies of their inputs
        # and weights (autocast) and accumulate in float32; the features come back as
        # float32, so the heads, the log-probabilities and every loss stay in float32, and
        # so do the weights, their gradients and the optimiser state. uint8 pixels are
        # integers below 256, exact in bfloat16; what is rounded is the weights (8 bits of
        # mantissa) and the activations between layers.
        if self._frozen is not None and not torch.is_grad_enabled():
            return self._trunk_frozen(obs)
        with torch.autocast(obs.device.type, dtype=torch.bfloat16):
            return self._trunk(obs).float()

    def _layers(self) -> list[nn.Module]:
        """The trunk's modules in the order the fast layout runs them: the last ReLU after
        the flattening (the same values), so that its gradient meets the saved output in
        one memory order — before, the flattened gradient (channel-major) met a
        channels-last output and the ReLU's backward took a strided path 4× slower per
        element than the other ReLUs'."""
        conv = [*self.conv]
        if isinstance(conv[-1], nn.Flatten) and isinstance(conv[-2], nn.ReLU):
            conv[-2], conv[-1] = conv[-1], conv[-2]
        return [*conv, *self.linear]

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Within this block the weights do not change (a rollout): a bf16 trunk casts
        them to bfloat16 once, on entry, and its no-grad forwards use those copies
        instead of autocast's, which casts every weight on every call (the 3136×512
        linear layer's cast was a third of an 8-frame Atari forward). The copies are the
        values autocast makes, so the features are the same bits (tests). A forward that
        records a graph inside the block still takes the autocast path."""
        if self.precision != "bf16" or not self.fast_layout or self._frozen is not None:
            yield
            return
        with torch.no_grad():
            casts = []
            for k, m in enumerate(self._layers()):
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    w = self._first(m.weight)[0] if k == 0 else m.weight
                    casts.append((w.to(torch.bfloat16), m.bias.to(torch.bfloat16)))
        self._frozen = casts
        try:
            yield
        finally:
            self._frozen = None

    def _trunk_frozen(self, obs: torch.Tensor) -> torch.Tensor:
        # _trunk under autocast, op for op, with the weights cast on entry to frozen()
        x = self._channels_last_input(obs, bf16=True).to(torch.bfloat16)
        casts = iter(self._frozen)
        for k, m in enumerate(self._layers()):
            if isinstance(m, nn.Conv2d):
                w, b = next(casts)
                stride, pad = self._first(None)[1:] if k == 0 else (m.stride, m.padding)
                x = nn.functional.conv2d(x, w, b, stride, pad)
            elif isinstance(m, nn.Linear):
                w, b = next(casts)
                x = nn.functional.linear(x, w, b)
            else:
                x = m(x)
        return x.float()

    def _channels_last_input(self, obs: torch.Tensor, bf16: bool) -> torch.Tensor:
        """The observations as ``[B, C, H, W]`` in channels-last memory, the layout oneDNN's
        CPU convolutions run faster (weights and gradients keep theirs): uint8 pixels
        straight to bfloat16 when ``bf16`` (integers below 256 are exact in it: the
        values autocast would make of float32 pixels; on 256 Atari frames 8 ms against
        18 ms for the float32 route plus autocast's cast), otherwise float32, the layout
        changed before the conversion (on uint8: a quarter of the bytes to move). With
        ``depth_block`` the result is the space-to-depth input of the first convolution,
        ``[B, s·s·C, H/s, W/s]`` (:meth:`_first` gives the matching weights)."""
        x = obs.reshape(obs.shape[0], *self.shape)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)  # already a channels-last view
        if self.depth_block:  # rearranged before the conversion (fewer bytes to move)
            x = space_to_depth(x.permute(0, 2, 3, 1), self.depth_block).permute(0, 3, 1, 2)
        if bf16 and x.dtype == torch.uint8:
            return x.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        return x.contiguous(memory_format=torch.channels_last).to(torch.float32)

    def _trunk(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.fast_layout:  # the reference: as the observations come
            x = obs.reshape(obs.shape[0], *self.shape).float() * self.scale
            if self.channels_last:
                x = x.permute(0, 3, 1, 2)
            return self.linear(self.conv(x))
        dev = obs.device.type
        x = self._channels_last_input(obs, bf16=torch.is_autocast_enabled(dev)
                                      and torch.get_autocast_dtype(dev) == torch.bfloat16)
        w, stride, pad = self._first(self.conv[0].weight)
        x = nn.functional.conv2d(x, w, self.conv[0].bias, stride, pad)
        for m in self._layers()[1:]:
            x = m(x)
        return x

    def _first(self, weight: torch.Tensor | None):
        """``(weight, stride, padding)`` of the first convolution as the fast layout runs
        it: the scale to [0, 1] folded into the weights (no pass over the pixels; zero
        padding stays zero: conv(x · s, W) = conv(x, s · W)), and on space-to-depth input
        (``depth_block``) the rearranged weights with stride 1. ``weight`` None: the
        stride and padding only."""
        first, s = self.conv[0], self.depth_block
        if weight is not None:
            weight = weight * self.scale
            if s:
                weight = depth_weight(weight, s)
        return (weight, 1, 0) if s else (weight, first.stride, first.padding)


class NatureCNN(ImageCNN):
    """The Nature-DQN convolutional trunk (8×8/4, 4×4/2, 3×3/1) on one image space of at
    least 36×36 pixels; ``[B, *shape]`` → ``[B, features_dim]``."""

    KERNELS = ((8, 4), (4, 2), (3, 1))

    def plan(self, h, w):
        return [(k, (s, s), (0, 0)) for k, s in self.KERNELS]


class SmallImageCNN(ImageCNN):
    """Three 3×3 convolutions for images below the Nature CNN's 36×36 (module doc): stride
    1, or 2 along a side of at least :data:`SMALL_STRIDE_FROM` pixels; padding 1 along a
    side under 3 pixels. MinAtar's 10×10 maps become 8×8, 6×6, 4×4."""

    def plan(self, h, w):
        out = []
        for _ in range(3):
            sh, sw = (2 if n >= SMALL_STRIDE_FROM else 1 for n in (h, w))
            ph, pw = (1 if n < 3 else 0 for n in (h, w))
            out.append((3, (sh, sw), (ph, pw)))
            h, w = _conv_out(h, 3, sh, ph), _conv_out(w, 3, sw, pw)
        return out


def image_cnn(space: spaces.Box, channels: tuple[int, ...] = (32, 64, 64),
              features_dim: int = 512) -> ImageCNN:
    """The trunk for an image space: :class:`NatureCNN` from 36×36 pixels, else
    :class:`SmallImageCNN`."""
    _, _, h, w, _ = image_layout(space)
    cls = NatureCNN if min(h, w) >= MIN_CNN_SIZE else SmallImageCNN
    return cls(space, channels, features_dim)


def flat_dict_space(space: spaces.Dict) -> spaces.Box:
    """The ``Box`` a ``Dict`` observation is stored as (``spaces.flatten_space``)."""
    return spaces.flatten_space(space)


class MultiInputEncoder(nn.Module):
    """Per-key encoders of a ``Dict`` space over its flattened vector (module doc)."""

    def __init__(self, space: spaces.Dict, channels: tuple[int, ...] = (32, 64, 64),
                 image_features: int = 256):
        super().__init__()
        self.parts: list[tuple[str, int, int, str]] = []  # key, start, size, kind
        self.cnns = nn.ModuleDict()
        start, dim = 0, 0
        for key in sorted(space.spaces):
            sub = space.spaces[key]
            size = int(spaces.flatdim(sub))
            if key == MASK_KEY:  # the action mask is applied to the logits, not read
                start += size
                continue
            if is_image_space(sub):
                self.cnns[key] = image_cnn(sub, channels, image_features)
                kind, out = "image", image_features
            elif isinstance(sub, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete,
                                  spaces.MultiBinary)):
                kind, out = "flat", size  # flatten: values, one-hot, bits
            else:
                raise ValueError(f"observation space: key {key!r} is {sub}; supported: "
                                 "Box (vector or image), Discrete, MultiDiscrete, MultiBinary")
            self.parts.append((key, start, size, kind))
            start += size
            dim += out
        self.in_dim = start
        self.features_dim = dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(obs.shape[0], -1).float()
        feats = []
        for key, start, size, kind in self.parts:
            part = x[:, start:start + size]
            feats.append(self.cnns[key](part) if kind == "image" else part)
        return torch.cat(feats, -1)


# --------------------------------------------------------------------------- the one seam

FEATURES_EXTRACTORS = Registry(
    "features extractor",
    "(observation_space, features_dim=...) -> nn.Module with .features_dim, [B, *obs] -> "
    "[B, features_dim]")
# the configuration's ``policy`` values: auto (picked from the space) or an extractor's name
POLICIES = FEATURES_EXTRACTORS.where("policy", extra=("auto",))


def register_features_extractor(name: str, fn=None, *, help: str = ""):  # noqa: A002
    """Register a features extractor (decorator or call): ``fn(observation_space,
    features_dim=N)`` — a ``torch.nn.Module`` subclass such as Stable-Baselines3's
    ``BaseFeaturesExtractor`` subclasses, or a function — returning a module with a
    ``features_dim`` attribute that maps a batch of observations ``[B, *shape]`` (a Dict
    observation arrives flattened, :func:`flat_dict_space`) to ``[B, features_dim]``.
    Then ``policy = name`` selects it, in training, evaluation, ``load``/``predict`` and
    the Ray actors alike."""
    if name in ("auto", *BUILT_IN):
        raise ValueError(f"features extractor: {name!r} is ppokit's own")
    return FEATURES_EXTRACTORS.register(name, fn, help=help)


@FEATURES_EXTRACTORS.register("mlp", help="the flattened observation itself (Box, Discrete "
                              "as one-hot)")
def _flat(space, **kw):
    return None  # the MLPs read the observation directly (make_policy)


@FEATURES_EXTRACTORS.register("cnn", help="the Nature CNN from 36x36 pixels, else the small "
                              "image CNN")
def _cnn(space, *, features_dim: int = 512, channels: tuple[int, ...] = (32, 64, 64)):
    return image_cnn(space, tuple(channels), features_dim)


@FEATURES_EXTRACTORS.register("multi_input", help="per-key encoders of a Dict space, "
                              "concatenated")
def _multi(space, *, features_dim: int = 512, channels: tuple[int, ...] = (32, 64, 64)):
    return MultiInputEncoder(space, tuple(channels))


def build_extractor(name: str, space, *, features_dim: int,
                    channels: tuple[int, ...]) -> nn.Module | None:
    """The extractor ``name`` for ``space`` (``None``: the MLPs read the observation); a
    user's is checked to be a module with an integer ``features_dim``."""
    fn = FEATURES_EXTRACTORS.get(name)
    if name in BUILT_IN:
        return fn(space, features_dim=features_dim, channels=channels)
    try:
        module = fn(space, features_dim=features_dim)
    except Exception as exc:  # noqa: BLE001 - the user's code, named
        raise UserCodeError(f"features extractor {name!r}: building it for {space} raised "
                            f"{type(exc).__name__}: {exc}") from exc
    dim = getattr(module, "features_dim", None)
    if not isinstance(module, nn.Module) or not isinstance(dim, int) or dim < 1:
        raise UserCodeError(f"features extractor {name!r}: expected a torch.nn.Module with "
                            f"an integer features_dim >= 1, got {type(module).__name__} "
                            f"(features_dim={dim!r})")
    return module


def precision_note(policy: nn.Module, asked: str) -> str | None:
    """What to say of the number format of ``policy``'s convolutional trunk when it is not
    float32 as asked (``precision``: fp32, bf16 or auto), else None."""
    cnn = next((m for m in policy.modules() if isinstance(m, ImageCNN)), None)
    if cnn is None or asked == "fp32":
        return None
    if cnn.precision == "fp32":  # auto, on a CPU without native bfloat16
        return ("convolutional trunk in float32 (precision=auto: this CPU has no native "
                "bfloat16)")
    why = " (precision=auto: this CPU computes it natively)" if asked == "auto" else ""
    return (f"convolutional trunk in bfloat16{why}; heads, losses and optimiser in float32 "
            "(--set precision=fp32 for float32 throughout)")
