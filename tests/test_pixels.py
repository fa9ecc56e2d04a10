"""Image and Dict observations (CNN and multi-input encoders) and MultiBinary actions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

import ppokit
from _pixel_envs import CopyBits, DictGoal, ImageChoice
from ppokit.errors import UsageError
from ppokit.io import read_metrics
from ppokit.policies.encoders import NatureCNN, image_layout, is_image_space

FAST = dict(progress=False, tensorboard=False, n_envs=4, n_steps=128, batch_size=128,
            n_epochs=4)


SMALL = {"cnn_channels": (8, 16, 16), "features_dim": 64}  # a cheaper trunk for the tests


@pytest.mark.parametrize("make, encoder, precision, more", [
    (lambda: ImageChoice(), "NatureCNN", "fp32", {}),
    # bf16 on a CPU without native bf16 matmuls is several times slower: a slow run
    pytest.param(lambda: ImageChoice(), "NatureCNN", "bf16", {}, marks=pytest.mark.slow),
    (lambda: ImageChoice(size=10, dtype="bool"), "SmallImageCNN", "fp32", SMALL),
    pytest.param(lambda: ImageChoice(size=32, channels_first=True), "SmallImageCNN", "fp32",
                 SMALL, marks=pytest.mark.slow),
    pytest.param(lambda: DictGoal(), "MultiInputEncoder", "fp32", {}, marks=pytest.mark.slow),
    (lambda: DictGoal(img_size=32), "MultiInputEncoder", "fp32", SMALL),
    (lambda: CopyBits(), None, "fp32", {}),
])
def test_pixels_dicts_and_bits_learn(tmp_path, make, encoder, precision, more):
    """8192 steps: a policy that reads the image / the goal key / the target bits scores
    8 per episode, a random one 4 (ImageChoice, CopyBits) or 8/3 (DictGoal); the image
    task also with the convolutions in bfloat16, and below the Nature CNN's 36x36 (10x10
    boolean planes as MinAtar's, 32x32 pixels, a 32x32 image in a Dict) with the
    small-image CNN."""
    agent = ppokit.train(make, total_steps=8192, run_dir=tmp_path / "r", seed=0,
                         precision=precision, **FAST, **more)
    assert type(agent.policy.encoder).__name__ == str(encoder) or (
        encoder is None and agent.policy.encoder is None)
    if encoder == "MultiInputEncoder":  # the Dict's image key: the trunk its size takes
        img = agent.policy.encoder.cnns["img"]
        assert type(img).__name__ == ("NatureCNN" if make().img_size >= 36
                                      else "SmallImageCNN")
    res = agent.evaluate(episodes=10)
    assert res["mean_return"] >= 7.5, res
    agent.close()


@pytest.mark.parametrize("shape, dtype, high, last, scale", [
    ((36, 36, 3), np.uint8, 255, True, 1 / 255),
    ((3, 36, 36), np.uint8, 255, False, 1 / 255),
    ((84, 84, 4), np.uint8, 255, True, 1 / 255),
    ((4, 84, 84), np.float32, 1.0, False, 1.0),
    ((64, 64, 1), np.float32, 255.0, True, 1 / 255),
    ((10, 10, 4), np.bool_, 1, True, 1.0),  # MinAtar's object planes
    ((10, 10, 10), np.bool_, 1, True, 1.0),  # a tie (MinAtar Seaquest): H×W×C
])
def test_image_layout(shape, dtype, high, last, scale):
    space = spaces.Box(0, high, shape, dtype=dtype)
    assert is_image_space(space)
    got_last, c, h, w, got_scale = image_layout(space)
    assert got_last == last and got_scale == pytest.approx(scale)
    assert (h, w, c) == ((shape[0], shape[1], shape[2]) if last else
                         (shape[1], shape[2], shape[0]))


def test_not_images():
    assert not is_image_space(spaces.Box(-1, 1, (4, 4, 4), np.float32))  # not pixel bounds
    assert not is_image_space(spaces.Box(0, 255, (36, 36), np.uint8))  # 2-D
    assert not is_image_space(spaces.Discrete(3))


def test_cnn_reads_both_layouts_the_same():
    """The same picture as HWC uint8 and as CHW floats in [0, 1] gives the same features
    from the same weights."""
    hwc = spaces.Box(0, 255, (36, 36, 3), np.uint8)
    chw = spaces.Box(0.0, 1.0, (3, 36, 36), np.float32)
    a, b = NatureCNN(hwc), NatureCNN(chw)
    b.load_state_dict(a.state_dict())
    img = torch.randint(0, 256, (5, 36, 36, 3))
    fa = a(img.float())
    fb = b(img.permute(0, 3, 1, 2).float() / 255)
    assert torch.allclose(fa, fb, atol=1e-5)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 10_000))
def test_bernoulli_head_matches_torch_distributions(n_bits, batch, seed):
    from ppokit.policies.mlp import MLPActorCritic

    g = torch.Generator().manual_seed(seed)
    pol = MLPActorCritic(3, "bernoulli", n_bits, hidden=(8,))
    obs = torch.randn(batch, 3, generator=g)
    a, logp, _ = pol.act(obs, g)
    assert set(a.unique().tolist()) <= {0.0, 1.0} and a.shape == (batch, n_bits)
    logits = pol.actor(obs)
    ref = torch.distributions.Bernoulli(logits=logits)
    assert torch.allclose(logp, ref.log_prob(a).sum(-1), atol=1e-5)
    lp2, ent, _ = pol.evaluate(obs, a)
    assert torch.allclose(lp2, logp, atol=1e-6)
    assert torch.allclose(ent, ref.entropy().sum(-1), atol=1e-5)
    assert torch.equal(pol.deterministic_action(obs), (logits > 0).float())


def test_dict_observations_are_stored_flat_final_obs_included():
    from ppokit.envs import make_vec

    env = make_vec(lambda: DictGoal(), 2, vectorization="sync")
    raw = gym.vector.SyncVectorEnv([lambda: DictGoal()] * 2,
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    d = raw.single_observation_space
    assert env.single_observation_space.dict_space == d
    o, _ = env.reset(seed=3)
    ro, _ = raw.reset(seed=3)
    for i in range(2):
        one = {k: v[i] for k, v in ro.items()}
        assert np.allclose(o[i], gym.spaces.flatten(d, one))
    for _ in range(8):  # the episode ends at step 8: final_obs flattened too
        o, _, te, tr, info = env.step(np.array([0, 1]))
        ro, _, rte, rtr, rinfo = raw.step(np.array([0, 1]))
    assert te.all() and "final_obs" in info
    for i in range(2):
        assert np.allclose(info["final_obs"][i], gym.spaces.flatten(d, rinfo["final_obs"][i]))
    env.close()
    raw.close()


@pytest.mark.parametrize("kwargs, message", [
    (dict(env="CartPole-v1", policy="cnn"), "policy: cnn needs an image observation space"),
    (dict(env=lambda: DictGoal(), policy="mlp"), "policy: mlp cannot read a Dict"),
    (dict(env=lambda: ImageChoice(), policy="multi_input"), "policy: multi_input needs a Dict"),
    (dict(env="CartPole-v1", policy="resnet"), "policy: expected one of"),
    (dict(env=lambda: ImageChoice(), precision="fp16"), "precision: expected one of fp32, "
     "bf16, auto"),
    (dict(env=lambda: ImageChoice(), cnn_channels=[32, 64]), "cnn_channels: expected a list "
     "of 3"),
])
def test_policy_choices_are_checked(tmp_path, kwargs, message):
    env = kwargs.pop("env")
    with pytest.raises(UsageError) as exc:
        ppokit.train(env, total_steps=512, run_dir=tmp_path / "r", n_envs=4, n_steps=128,
                     **kwargs,
                     progress=False)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("size", [1, 2, 3, 5, 10, 16, 19, 20, 32, 35, 36])
def test_images_of_every_size_get_a_cnn(size):
    """policy=auto: the Nature CNN from 36x36 pixels, the small-image CNN below (never a
    map that vanishes); the same in a Dict; policy=mlp still flattens them."""
    from ppokit.policies import make_policy

    space = spaces.Box(0, 255, (size, size, 3), np.uint8)
    want = "NatureCNN" if size >= 36 else "SmallImageCNN"
    pol = make_policy(space, spaces.Discrete(2))
    assert type(pol.encoder).__name__ == want
    out = pol.encoder(torch.randint(0, 256, (2, size, size, 3)).float())
    assert out.shape == (2, 512) and bool(torch.isfinite(out).all())
    d = make_policy(spaces.Dict({"img": space, "v": spaces.Box(-1, 1, (2,))}),
                    spaces.Discrete(2))
    assert type(d.encoder.cnns["img"]).__name__ == want
    assert make_policy(space, spaces.Discrete(2), policy="mlp").encoder is None


def test_cnn_checkpoints_round_trip_and_predict_with_images(tmp_path):
    """A CNN run (separate actor and critic trunks) writes the same checkpoint at iteration
    2 as a run stopped there; the stopped run resumes from it (a custom env's episodes
    restart, said in the log) and continues; predict takes an unbatched HWC image."""
    from ppokit.io import load_checkpoint

    kw = dict(FAST, n_epochs=2, share_features=False, checkpoint_every=2)
    straight = ppokit.train(lambda: ImageChoice(), total_steps=2048, run_dir=tmp_path / "a",
                            **kw)
    half = ppokit.train(lambda: ImageChoice(), total_steps=1024, run_dir=tmp_path / "b", **kw)
    half.close()
    ta = load_checkpoint(tmp_path / "a" / "checkpoints" / "iter_000000002")[0]
    tb = load_checkpoint(tmp_path / "b" / "checkpoints" / "iter_000000002")[0]
    for group in ("model", "optimizer"):
        assert ta[group].keys() == tb[group].keys()
        assert all(torch.equal(ta[group][k], tb[group][k]) for k in ta[group]), group
    assert any(k.startswith("critic_encoder.") for k in ta["model"])
    resumed = ppokit.load(tmp_path / "b", env=lambda: ImageChoice())
    sb = resumed.policy.state_dict()
    assert all(torch.equal(sb[k], tb["model"][k]) for k in sb)
    resumed.learn(1024, progress=False)
    assert [r["iteration"] for r in read_metrics(tmp_path / "b")] == [1, 2, 3, 4]
    obs, _ = ImageChoice().reset(seed=1)
    action, _ = resumed.predict(obs)
    want = resumed.policy.deterministic_action(torch.as_tensor(obs[None], dtype=torch.float32))
    assert int(action) == int(want[0])
    straight.close()
    resumed.close()


def test_predict_takes_dict_observations(tmp_path):
    agent = ppokit.train(lambda: DictGoal(), total_steps=1024, run_dir=tmp_path / "r", **FAST)
    env = DictGoal()
    obs, _ = env.reset(seed=0)
    flat = gym.spaces.flatten(env.observation_space, obs).astype(np.float32)
    a, _ = agent.predict(obs)
    want = agent.policy.deterministic_action(torch.as_tensor(flat[None]))
    assert int(a) == int(want[0])
    batch = {k: np.stack([v, v]) for k, v in obs.items()}
    batch["goal"] = np.array([obs["goal"], obs["goal"]])
    b, _ = agent.predict(batch)
    assert b.shape == (2,) and int(b[0]) == int(a)
    with pytest.raises(UsageError, match="observation: expected a dict with the keys"):
        agent.predict({"goal": 1})
    agent.close()


def test_dict_keys_in_any_order_are_read_in_one_order(tmp_path):
    """A Dict space built with its keys out of order: observations, final observations
    and predict all lay the keys out in sorted order, the encoder's."""
    from collections import OrderedDict

    from ppokit.envs import make_vec

    class Unordered(DictGoal):
        def __init__(self):
            super().__init__()
            s = self.observation_space.spaces
            self.observation_space = spaces.Dict(OrderedDict(
                [("noise", s["noise"]), ("img", s["img"]), ("goal", s["goal"])]))

    assert list(Unordered().observation_space.spaces) == ["noise", "img", "goal"]
    env = make_vec(lambda: Unordered(), 2, vectorization="sync")
    d = env.single_observation_space.dict_space
    assert list(d.spaces) == ["goal", "img", "noise"]
    o, _ = env.reset(seed=0)
    for _ in range(8):
        o, _, te, _, info = env.step(np.array([0, 0]))
    assert te.all()
    first = info["final_obs"][0]
    goal = first[:3]  # sorted: the goal's one-hot comes first
    assert goal.sum() == 1.0 and set(np.unique(goal)) <= {0.0, 1.0}
    env.close()
    agent = ppokit.train(lambda: Unordered(), total_steps=512, run_dir=tmp_path / "r",
                         **FAST)
    raw, _ = Unordered().reset(seed=1)
    flat = gym.spaces.flatten(d, raw).astype(np.float32)
    a, _ = agent.predict(raw)
    want = agent.policy.deterministic_action(torch.as_tensor(flat[None]))
    assert int(a) == int(want[0])
    agent.close()


def test_normalize_obs_is_refused_in_front_of_an_encoder(tmp_path):
    with pytest.raises(UsageError, match="normalize_obs: the observation encoder"):
        ppokit.train(lambda: ImageChoice(), total_steps=512, run_dir=tmp_path / "r",
                     normalize_obs=True, **FAST)
    assert not (tmp_path / "r").exists()
