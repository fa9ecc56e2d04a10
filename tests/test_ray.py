"""vectorization=ray: remote rollouts against the local collector, reproducibility, a killed
actor, resume; ``--backend ray`` for seeds. One local Ray (2 CPUs) for the whole module:
starting Ray is slow."""

import json
import threading
import time

import numpy as np
import pytest
import ray  # the ray extra, which `make test` installs
import torch
from hypothesis import given
from hypothesis import strategies as st

from ppokit.algos import Trainer, resolve_config
from ppokit.distributed import RayCollector
from ppokit.distributed.rollout import FIELDS, merge_moments
from ppokit.envs import ObsNormalizer, RewardScaler, RunningMeanStd, make_vec
from ppokit.envs.slow import ENV_ID as SLOW_ID
from ppokit.io import WALL_CLOCK_FIELDS, read_metrics
from ppokit.policies import make_policy
from ppokit.rollout import Collector


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(**over):
    base = dict(tensorboard=False, checkpoint_every=100, total_timesteps=512, n_envs=4,
                n_steps=64, batch_size=64, n_epochs=2)
    base.update(over)
    return resolve_config(overrides=base)


@pytest.mark.parametrize("over", [
    # CartPole: vectorised NEXT_STEP envs (dummy rows), both normalisers
    dict(normalize_obs=True, normalize_reward=True),
    # Pendulum: sync SAME_STEP envs, Gaussian actions, truncation at 200 steps inside the
    # second window (bootstrapped from info["final_obs"] on the actor)
    dict(env_id="Pendulum-v1", n_envs=2, n_steps=128, normalize_obs=True),
    # the reference path (policy.act per step) on the actor
    dict(fast=False),
])
def test_one_actor_rollout_equals_the_local_collector(over):
    c = _cfg(vectorization="ray", num_workers=1, **over)
    remote = RayCollector(c, c.env_id, log=lambda m: None)
    try:
        env = make_vec(c.env_id, c.n_envs)
        torch.manual_seed(3)
        policy = make_policy(env.single_observation_space, env.single_action_space)
        shape = env.single_observation_space.shape
        norm_l = ObsNormalizer(shape) if c.normalize_obs else None
        norm_r = ObsNormalizer(shape) if c.normalize_obs else None
        scal_l = RewardScaler(c.n_envs, c.gamma) if c.normalize_reward else None
        scal_r = RewardScaler(c.n_envs, c.gamma) if c.normalize_reward else None
        local = Collector(env, policy, generator=torch.Generator().manual_seed(2 * c.seed + 1),
                          obs_normalizer=norm_l, reward_scaler=scal_l, fast=c.fast)
        remote.attach(policy, norm_r, scal_r)
        local.reset(seed=c.seed)
        remote.reset(seed=c.seed)
        for window in range(2):
            a, b = local.collect(c.n_steps), remote.collect(c.n_steps)
            for f in FIELDS:
                assert torch.equal(getattr(a, f), getattr(b, f)), (window, f)
            assert sorted(local.pop_finished()) == sorted(remote.pop_finished())
            if norm_l is not None:
                assert norm_l.rms.state_dict().keys() == norm_r.rms.state_dict().keys()
                for k, v in norm_l.rms.state_dict().items():
                    np.testing.assert_array_equal(v, norm_r.rms.state_dict()[k])
            with torch.no_grad():  # a new policy for the next window: weights are broadcast
                for p in policy.parameters():
                    p.add_(0.01 * torch.randn_like(p))
        if c.env_id == "Pendulum-v1":  # a truncation was bootstrapped (not a zero target)
            assert bool((a.episode_end & ~a.terminated).any())
        env.close()
    finally:
        remote.close()


@given(st.integers(0, 2**32 - 1))
def test_merged_moments_equal_moments_of_everything(seed):
    """The learner's fold of the actors' batch moments against one running pass over
    every batch (the reference), on random batches of random sizes and scales."""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        base, parts = rng.normal(size=(rng.integers(1, 20), 3)), []
        rms = RunningMeanStd((3,))
        rms.update(base)
        ref = RunningMeanStd((3,))
        ref.update(base)
        for _ in range(rng.integers(1, 4)):
            x = rng.normal(rng.normal(), rng.uniform(0.1, 3), size=(rng.integers(1, 30), 3))
            parts.append(x)
            ref.update(x)
            seen = RunningMeanStd((3,), epsilon=0.0)
            seen.update(x)
            merge_moments(rms, seen.state_dict())
        np.testing.assert_allclose(rms.mean, ref.mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(rms.var, ref.var, rtol=1e-9)
        assert rms.count == pytest.approx(ref.count)


def _train(tmp_path, name, log=None, **over):
    cfg = _cfg(**over)
    tr = Trainer(cfg, tmp_path / name, log=log or (lambda m: None))
    try:
        tr.train()
        params = [p.detach().clone() for p in tr.policy.parameters()]
    finally:
        tr.close()
    recs = [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS}
            for r in read_metrics(tmp_path / name)]
    return recs, params


def test_one_actor_training_equals_local_training(tmp_path):
    a, pa = _train(tmp_path, "local", normalize_obs=True)
    b, pb = _train(tmp_path, "ray", normalize_obs=True, vectorization="ray", num_workers=1)
    assert a == b
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))


@pytest.mark.slow  # 12 s of Ray actors
def test_two_actors_reproducible_from_the_seed(tmp_path):
    over = dict(vectorization="ray", num_workers=2, envs_per_worker=2, normalize_obs=True)
    a, pa = _train(tmp_path, "a", seed=5, **over)
    b, pb = _train(tmp_path, "b", seed=5, **over)
    c, _ = _train(tmp_path, "c", seed=6, **over)
    assert a == b and all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert a != c
    assert len(a) == 2 and a[-1]["global_step"] == 512


def test_actors_send_actions_their_spaces_contain(tmp_path):
    """Ray actors convert the policy's actions as the local collector does (the one
    conversion, ppokit.policies.actions): start offsets, shapes, Box bounds and dtypes
    (the environment refuses any action outside its space)."""
    from gymnasium import spaces
    from ray import cloudpickle

    import _space_env
    from ppokit.api import _resolve

    cloudpickle.register_pickle_by_value(_space_env)  # the actors cannot import tests/
    for space in (spaces.MultiDiscrete([[2, 3], [4, 2]], start=[[1, -1], [0, 5]]),
                  spaces.Box(-0.5, 0.25, (2, 2), np.float64)):
        maker = _space_env.factory(space)
        cfg = _resolve("SpaceEnv", "ppo", 32, None, "factory",
                       dict(n_envs=2, n_steps=16, batch_size=16, n_epochs=1,
                            tensorboard=False, vectorization="ray", num_workers=1), maker)
        tr = Trainer(cfg, tmp_path / type(space).__name__, env=maker, log=lambda m: None)
        tr.train()
        tr.close()
        assert tr.global_step == 32


def test_envs_per_worker_sets_n_envs_and_bad_splits_are_refused():
    from ppokit.errors import UsageError

    c = resolve_config(overrides=dict(vectorization="ray", num_workers=4, envs_per_worker=4))
    assert c.n_envs == 16
    with pytest.raises(UsageError, match="n_envs"):
        resolve_config(overrides=dict(vectorization="ray", num_workers=3, n_envs=8))
    with pytest.raises(UsageError, match="num_workers"):
        resolve_config(overrides=dict(vectorization="ray", num_workers=0))
    for key, v in (("num_workers", 2), ("envs_per_worker", 4)):
        with pytest.raises(UsageError, match=f"{key}: applies only with vectorization=ray"):
            resolve_config(overrides={key: v})


def test_a_killed_actor_does_not_stop_the_run(tmp_path):
    logs: list[str] = []
    cfg = _cfg(env_id=SLOW_ID, env_kwargs={"work_ms": 2.0}, vectorization="ray",
               num_workers=2, n_envs=2, n_steps=64, total_timesteps=128 * 4)
    tr = Trainer(cfg, tmp_path / "kill", log=logs.append)
    killed = []

    def kill_later():  # during the next iteration's rollout (~130 ms of env work)
        time.sleep(0.03)
        victim = tr.collector.workers[0]
        ray.kill(victim)
        killed.append(victim)

    def on_iteration(rec):
        if rec["iteration"] == 1:
            threading.Thread(target=kill_later).start()

    try:
        tr.train(on_iteration)
    finally:
        tr.close()
    recs = read_metrics(tmp_path / "kill")
    assert killed and [r["iteration"] for r in recs] == [1, 2, 3, 4]
    assert recs[-1]["global_step"] == 512
    assert tr.collector.restarts >= 1
    assert any("died" in m and "new actor" in m for m in logs)


def test_resume_starts_new_episodes_on_new_actors(tmp_path):
    logs: list[str] = []
    over = dict(vectorization="ray", num_workers=2, checkpoint_every=1)
    cfg = _cfg(**over)
    tr = Trainer(cfg, tmp_path / "r", log=logs.append)
    try:
        tr.train(lambda rec: rec["iteration"] < 1 or "stop")
    finally:
        tr.close()
    tr = Trainer(cfg, tmp_path / "r", resume=True, log=logs.append)
    try:
        assert tr.iteration == 1
        tr.train()
    finally:
        tr.close()
    assert [r["iteration"] for r in read_metrics(tmp_path / "r")] == [1, 2]
    assert any("Ray actors" in m and "reset" in m for m in logs)


@pytest.mark.slow  # 10 s of Ray tasks
def test_seeds_as_ray_tasks(tmp_path, capsys):
    import json

    from ppokit.cli import main

    root = tmp_path / "seeds"
    rc = main(["train", "--seeds", "0,1", "--backend", "ray", "--total-steps", "512",
               "--run-dir", str(root), "--eval-episodes", "2", "--set", "tensorboard=false"])
    assert rc == 0
    summary = json.loads((root / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["failed"] == []
    assert len(summary["eval_mean_returns"]) == 2
    assert (root / "summary.png").is_file()
    a, b = (read_metrics(root / f"s{s}") for s in (0, 1))
    assert a[-1]["global_step"] == b[-1]["global_step"] == 512
    assert a != b  # two seeds, two runs
    assert "as Ray tasks" in capsys.readouterr().out


def test_run_archives_unpack_regular_files_only(tmp_path):
    import io
    import tarfile

    from ppokit.distributed.tasks import unpack_run
    from ppokit.errors import UsageError

    for kind in ("link", "escape"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            if kind == "link":
                m = tarfile.TarInfo("metrics.jsonl")
                m.type, m.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(m)
            else:
                m = tarfile.TarInfo("../outside.txt")
                m.size = 1
                tar.addfile(m, io.BytesIO(b"x"))
        with pytest.raises(UsageError, match="refusing"):
            unpack_run(buf.getvalue(), tmp_path / kind)
    assert not (tmp_path / "outside.txt").exists()


def test_tune_trials_as_ray_tasks(tmp_path, capsys):
    import csv

    from ppokit.cli import main

    search = tmp_path / "s.toml"
    search.write_text("[search]\nlearning_rate = {low = 1e-4, high = 1e-2, log = true}\n"
                      "[fixed]\nn_envs = 4\nn_steps = 32\nbatch_size = 64\n"
                      "[tune]\neval_every = 1\neval_episodes = 2\nstartup_trials = 1\n"
                      "warmup_evals = 2\n")
    root = tmp_path / "tune"
    rc = main(["tune", "--search", str(search), "--trials", "3", "--backend", "ray",
               "--total-steps", "512", "--run-dir", str(root), "--eval-episodes", "2"])
    assert rc == 0
    rows = list(csv.DictReader((root / "trials.csv").open()))
    assert len(rows) == 3 and any(r["state"] == "complete" for r in rows)
    for r in rows:  # each trial's run directory came back from its task
        assert (root / f"trial_{int(r['number']):03d}" / "metrics.jsonl").is_file()
    assert (root / "best.toml").is_file() and (root / "search.png").is_file()


@pytest.mark.slow
def test_cartpole_learns_with_two_actors(tmp_path):
    """The CartPole-v1 preset (RL Zoo), environments in two Ray actors of four each."""
    from ppokit.algos.evaluate import evaluate_run

    cfg = resolve_config(env_id="CartPole-v1", overrides=dict(
        vectorization="ray", num_workers=2, envs_per_worker=4, tensorboard=False))
    assert cfg.n_envs == 8 and cfg.total_timesteps == 100_000
    tr = Trainer(cfg, tmp_path / "cp", log=lambda m: None)
    try:
        tr.train()
    finally:
        tr.close()
    res = evaluate_run(tmp_path / "cp", episodes=10)
    assert res["mean_return"] >= 475, res


@pytest.mark.slow  # a Ray cluster start for a parsing check (~30 s)
def test_set_takes_several_keys_at_once(tmp_path, capsys):
    """The issue's form: --set vectorization=ray num_workers=2 envs_per_worker=2."""
    from ppokit.cli import main

    rc = main(["train", "--total-steps", "256", "--set", "vectorization=ray", "num_workers=2",
               "envs_per_worker=2", "n_steps=64", "batch_size=64", "tensorboard=false",
               "--run-dir", str(tmp_path / "r"), "--eval-episodes", "1", "--no-progress"])
    assert rc == 0
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (cfg["vectorization"], cfg["num_workers"], cfg["n_envs"]) == ("ray", 2, 4)


def test_slow_cartpole_is_cartpole_plus_work():
    import gymnasium as gym

    from ppokit.envs.slow import SlowCartPole

    for bad in (dict(work_ms=-1), dict(work_ms=True), dict(work_units=-3),
                dict(work_units=1.5)):
        with pytest.raises(ValueError, match="work_"):
            SlowCartPole(**bad)
    slow, plain = SlowCartPole(work_units=5), gym.make("CartPole-v1").unwrapped
    a, _ = slow.reset(seed=4)
    b, _ = plain.reset(seed=4)
    for t in range(8):  # (alternating pushes: the pole stays up)
        a, ra, ta, _, _ = slow.step(t % 2)
        b, rb, tb, _, _ = plain.step(t % 2)
        assert np.array_equal(a, b) and ra == rb and ta == tb and not ta
