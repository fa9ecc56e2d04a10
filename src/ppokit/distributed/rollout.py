"""Rollouts on Ray actors: ``vectorization=ray``, ``num_workers``, ``envs_per_worker``.

Each of ``num_workers`` Ray actors (:class:`RolloutWorker`) holds its own vector env of
``envs_per_worker`` environments, a copy of the policy and the ordinary
:class:`ppokit.rollout.Collector` — so a remote window is collected by exactly the code of
a local one: the same two masks (``terminated`` / ``episode_end``), the same NEXT_STEP dummy
rows, and a SAME_STEP truncation bootstrapped from ``info["final_obs"]`` with the value
computed on the actor, where that observation is. The learner stays in the training
process.

What is sent where, per iteration:

* learner → every actor, once (one ``ray.put``): the policy's parameters as NumPy arrays
  and the running normalisers' statistics (when ``normalize_obs`` / ``normalize_reward``);
* actor → learner: its ``[T, M]`` rollout piece (observations, actions, log-probabilities,
  values, rewards, the masks, ``next_values``, ``valid``), its finished episodes and what
  its normalisers saw in this window.

The learner joins the pieces along the env axis in actor order, so actor ``k``'s envs are
envs ``k·M … k·M + M − 1`` of the run, seeded ``seed + k·M …`` as a local vector env of
``num_workers · M`` envs would be. Actor 0's sampling generator is the one a local run
uses (``2·seed + 1``), so with one actor a rollout equals the local one step for step;
with several the run is reproducible from its seed (each actor's generator is derived
from the seed and its index).

Normaliser statistics: each actor starts the window from the learner's statistics and
reports the batch statistics of what it saw; the learner folds them in (Chan et al.'s
parallel formula). With a single actor the learner takes the actor's statistics as they
are, which is what a local collector would hold.

Failure: an actor that dies (its process or node is lost, ``ray.kill``) is replaced by a
new actor whose environments start new episodes, and its part of the iteration's rollout
is collected again with the same weights; the log says so. Nothing of the iteration is
lost (the dead actor's unfinished episodes are). An exception raised by the environment
itself is not a failure of Ray and ends the run with that error.

Environment state lives in the actors and is not checkpointed: a resumed run starts new
episodes on new actors (the trainer says so).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ppokit.envs.normalize import ObsNormalizer, RewardScaler, RunningMeanStd
from ppokit.errors import UsageError
from ppokit.policies.encoders import BUILT_IN, FEATURES_EXTRACTORS
from ppokit.rollout import Collector, Rollout

from .cluster import ensure_ray

__all__ = ["RayCollector", "RayEnvInfo", "RolloutWorker", "worker_generator_seed",
           "merge_moments", "MAX_RESTARTS"]

MAX_RESTARTS = 3  # new actors tried for one actor's part of one iteration
FIELDS = ("obs", "actions", "logp", "values", "rewards", "terminated", "episode_end",
          "next_values", "valid")


def worker_generator_seed(seed: int, index: int) -> int:
    """Seed of actor ``index``'s sampling generator after a reset with env seed ``seed``:
    ``2·seed + 1`` for actor 0 (what a local run's sampling generator uses), a seed
    derived from ``(seed, index)`` for the others."""
    if index == 0:
        return 2 * seed + 1
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] >> 1)


class _TrackedMoments(RunningMeanStd):
    """A :class:`RunningMeanStd` that also keeps the moments of just what it saw since the
    last :meth:`restart` (``seen``), for the learner to fold in."""

    def __init__(self, shape=()):
        super().__init__(shape)
        self.restart()

    def restart(self) -> None:
        self.seen = RunningMeanStd(self.mean.shape, epsilon=0.0)

    def update(self, x) -> None:
        super().update(x)
        if np.shape(x)[0]:
            self.seen.update(x)


def merge_moments(rms: RunningMeanStd, seen: dict[str, np.ndarray]) -> None:
    """Fold batch moments ``seen`` (mean, population var, count) into ``rms`` — the same
    parallel formula as :meth:`RunningMeanStd.update`."""
    b_count = float(np.asarray(seen["count"]).reshape(-1)[0])
    if b_count <= 0:
        return
    b_mean = np.asarray(seen["mean"], np.float64)
    delta = b_mean - rms.mean
    tot = rms.count + b_count
    m2 = (rms.var * rms.count + np.asarray(seen["var"], np.float64) * b_count
          + delta * delta * (rms.count * b_count / tot))
    rms.mean = rms.mean + delta * (b_count / tot)
    rms.var = m2 / tot
    rms.count = tot


class RolloutWorker:
    """One actor's environments, policy copy and collector (run as a Ray actor)."""

    def __init__(self, env_maker: str | Callable, num_envs: int, spec: dict[str, Any]):
        from ppokit.envs import make_vec
        from ppokit.envs.source import import_env_module
        from ppokit.policies import policy_for_config
        from ppokit.policies.encoders import FEATURES_EXTRACTORS

        torch.set_num_threads(1)
        if isinstance(env_maker, str):
            import_env_module(env_maker)  # the user named it in the training process
        self.env = make_vec(env_maker, num_envs, vectorization=spec["vectorization"],
                            autoreset=spec["autoreset"], env_kwargs=spec["env_kwargs"])
        obs_space = self.env.single_observation_space
        name, extractor = spec["extractor"]
        if extractor is not None and name not in FEATURES_EXTRACTORS:
            FEATURES_EXTRACTORS.register(name, extractor)  # the learner's, sent along
        # the learner's own builder: the same encoder, layout and precision
        self.policy = policy_for_config(spec["config"], obs_space,
                                        self.env.single_action_space)
        self.obs_norm = None
        if spec["normalize_obs"]:
            self.obs_norm = ObsNormalizer(obs_space.shape, spec["clip_obs"])
            self.obs_norm.rms = _TrackedMoments(obs_space.shape)
        self.reward_scaler = None
        if spec["normalize_reward"]:
            self.reward_scaler = RewardScaler(num_envs, spec["gamma"], spec["clip_reward"])
            self.reward_scaler.rms = _TrackedMoments(())
        self.generator = torch.Generator()
        self.collector = Collector(self.env, self.policy, generator=self.generator,
                                   obs_normalizer=self.obs_norm,
                                   reward_scaler=self.reward_scaler,
                                   use_critic=spec["use_critic"], fast=spec["fast"])

    def info(self) -> dict[str, Any]:
        return {"observation_space": self.env.single_observation_space,
                "action_space": self.env.single_action_space,
                "metadata": dict(self.env.metadata), "pid": os.getpid(),
                "games": self.collector.games}

    def _norms(self) -> dict[str, Any]:
        out = {}
        for name, n in (("obs", self.obs_norm), ("reward", self.reward_scaler)):
            if n is not None:
                out[name] = {"state": RunningMeanStd.state_dict(n.rms),
                             "seen": n.rms.seen.state_dict()}
        return out

    def _set_norms(self, norms: dict[str, Any] | None) -> None:
        for name, n in (("obs", self.obs_norm), ("reward", self.reward_scaler)):
            if n is not None:
                if norms and name in norms:
                    RunningMeanStd.load_state_dict(n.rms, norms[name])
                n.rms.restart()

    def reset(self, env_seed: int, generator_seed: int,
              norms: dict[str, Any] | None = None) -> dict[str, Any]:
        self._set_norms(norms)
        self.generator.manual_seed(generator_seed)
        if self.reward_scaler is not None:
            self.reward_scaler.ret[:] = 0.0
        self.collector.reset(seed=env_seed)
        return self._norms()

    def collect(self, weights: dict[str, np.ndarray], norms: dict[str, Any] | None,
                n_steps: int) -> dict[str, Any]:
        self.policy.load_state_dict({k: torch.from_numpy(np.array(v))
                                     for k, v in weights.items()})
        self._set_norms(norms)
        r = self.collector.collect(n_steps)
        return {"rollout": {f: getattr(r, f).numpy() for f in FIELDS},
                "finished": self.collector.pop_finished(), "norms": self._norms()}

    def close(self) -> None:
        self.env.close()


class RayEnvInfo:
    """What the trainer needs of "the environment" when the environments are remote: the
    spaces, the number of envs, and ``close()`` (which ends the actors)."""

    def __init__(self, collector: RayCollector, info: dict[str, Any], num_envs: int):
        self._collector = collector
        self.single_observation_space = info["observation_space"]
        self.single_action_space = info["action_space"]
        self.metadata = info["metadata"]
        self.num_envs = num_envs

    def close(self) -> None:
        self._collector.close()


class RayCollector:
    """The learner's side: starts the actors, broadcasts weights, joins the pieces.

    The interface is the :class:`ppokit.rollout.Collector`'s (``reset``, ``collect``,
    ``pop_finished``, ``state_dict``); :meth:`attach` gives it the learner's policy and
    normalisers once they exist (they are built from :attr:`env`'s spaces).
    """

    def __init__(self, cfg, env_maker: str | Callable, *, log: Callable[[str], None] = print):
        if cfg.n_envs % cfg.num_workers:
            raise UsageError(f"n_envs: {cfg.n_envs} environments do not split evenly over "
                             f"num_workers = {cfg.num_workers}")
        self.ray = ensure_ray(log)
        self.log = log
        self.cfg = cfg
        self.env_maker = env_maker
        self.num_workers = cfg.num_workers
        self.per_worker = cfg.n_envs // cfg.num_workers
        self.spec = {
            "vectorization": "auto", "autoreset": cfg.autoreset_mode,
            "env_kwargs": cfg.env_kwargs,
            "config": cfg,  # the policy is built from it, as the learner's
            "extractor": (cfg.policy, None if cfg.policy in ("auto", *BUILT_IN)
                          else FEATURES_EXTRACTORS.get(cfg.policy)),
            "normalize_obs": cfg.normalize_obs, "clip_obs": cfg.clip_obs,
            "normalize_reward": cfg.normalize_reward, "gamma": cfg.gamma,
            "clip_reward": cfg.clip_reward, "use_critic": cfg.use_critic, "fast": cfg.fast,
        }
        self._remote_cls = self.ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        self.workers = [self._new_worker() for _ in range(self.num_workers)]
        self.restarts = 0
        self._reset_count = 0
        self.iteration = 0
        try:
            info = self._wait_for_actors()
        except BaseException:
            self.close()
            raise
        self.env = RayEnvInfo(self, info, cfg.n_envs)
        self.policy = None
        self.obs_norm: ObsNormalizer | None = None
        self.reward_scaler: RewardScaler | None = None
        self.finished: list[tuple[float, int]] = []
        # the actors' collectors count games (Atari game scores) instead of episodes
        self.games = bool(info.get("games", False))
        log(f"vectorization=ray: {self.num_workers} actor(s) x {self.per_worker} env(s)")

    def _wait_for_actors(self) -> dict[str, Any]:
        """The first actor's spaces, once every actor runs; said once in the log while the
        cluster lacks the CPUs (one per actor) to place them."""
        refs = [w.info.remote() for w in self.workers]
        waited = 0.0
        while True:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=10.0)
            if len(ready) == len(refs):
                return self._get(refs[0], "starting Ray actors")
            waited += 10.0
            if waited == 10.0:
                cpus = self.ray.cluster_resources().get("CPU", 0)
                self.log(f"vectorization=ray: waiting for {len(refs) - len(ready)} of "
                         f"{len(refs)} actors to start (each asks for 1 CPU; the Ray "
                         f"cluster has {cpus:g} CPUs in all)")

    def _new_worker(self):
        return self._remote_cls.remote(self.env_maker, self.per_worker, self.spec)

    def _get(self, ref, what: str):
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            if isinstance(cause, UsageError):
                raise UsageError(str(cause)) from None
            msg = str(cause).strip().splitlines()[-1] if str(cause).strip() else ""
            raise RuntimeError(f"{what}: a Ray actor failed ({type(cause).__name__}: "
                               f"{msg})") from None

    def attach(self, policy, obs_normalizer: ObsNormalizer | None,
               reward_scaler: RewardScaler | None) -> RayCollector:
        from ppokit.policies.mlp import MLPActorCritic

        if not isinstance(policy, MLPActorCritic):
            self.close()
            raise UsageError("vectorization=ray: remote rollouts support ppokit's MLP "
                             f"actor-critic, not {type(policy).__name__}; use a local "
                             "vectorization (auto, sync, async)")
        self.policy = policy
        self.obs_norm = obs_normalizer
        self.reward_scaler = reward_scaler
        return self

    # ------------------------------------------------------------------ normalisers
    def _norm_state(self) -> dict[str, Any] | None:
        out = {}
        if self.obs_norm is not None:
            out["obs"] = self.obs_norm.rms.state_dict()
        if self.reward_scaler is not None:
            out["reward"] = self.reward_scaler.rms.state_dict()
        return out or None

    def _fold_norms(self, reports: list[dict[str, Any]]) -> None:
        for name, n in (("obs", self.obs_norm), ("reward", self.reward_scaler)):
            if n is None:
                continue
            if len(reports) == 1:  # one actor: its statistics are the run's
                n.rms.load_state_dict(reports[0][name]["state"])
            else:
                for rep in reports:
                    merge_moments(n.rms, rep[name]["seen"])

    # ------------------------------------------------------------------ collection
    def reset(self, seed: int | None = None) -> None:
        """New episodes on every actor: actor ``k``'s envs are seeded ``seed + k·M``."""
        seed = self.cfg.seed if seed is None else int(seed)
        self._reset_count += 1
        norms = self._norm_state()
        refs = [w.reset.remote(seed + k * self.per_worker, worker_generator_seed(seed, k),
                               norms) for k, w in enumerate(self.workers)]
        reports = []
        for k in range(self.num_workers):
            reports.append(self._retry(k, refs[k], "reset", lambda w, k=k: w.reset.remote(
                seed + k * self.per_worker, worker_generator_seed(seed, k), norms)))
        self._fold_norms(reports)

    def _retry(self, k: int, ref, what: str, again: Callable):
        """``ray.get(ref)``; when actor ``k`` has died, a new actor (new episodes) runs
        ``again(worker)`` — up to :data:`MAX_RESTARTS` times."""
        ray = self.ray
        dead = (ray.exceptions.RayActorError,)
        if hasattr(ray.exceptions, "ActorUnavailableError"):
            dead += (ray.exceptions.ActorUnavailableError,)
        for attempt in range(MAX_RESTARTS + 1):
            try:
                return self._get(ref, what)
            except dead as exc:
                if attempt == MAX_RESTARTS:
                    raise RuntimeError(f"vectorization=ray: actor {k} died {attempt + 1} "
                                       f"times in one {what} ({type(exc).__name__}); "
                                       "giving up") from None
                self.restarts += 1
                self.log(f"Ray actor {k} died during a {what} ({type(exc).__name__}); "
                         "its part is collected again on a new actor (same weights; its "
                         "environments start new episodes)")
                self._replace(k)
                ref = again(self.workers[k])

    def _replace(self, k: int) -> None:
        try:
            self.ray.kill(self.workers[k])
        except Exception:  # noqa: BLE001 - already gone
            pass
        w = self._new_worker()
        self.workers[k] = w
        c = self.cfg
        seed = int(np.random.SeedSequence([c.seed, k, self.iteration, self.restarts])
                   .generate_state(1)[0] >> 1)
        self._get(w.reset.remote(seed, worker_generator_seed(seed, k + 1),
                                 self._norm_state()), "starting a new Ray actor")

    def collect(self, n_steps: int) -> Rollout:
        """Broadcast the weights once, collect ``n_steps`` on every actor, join the pieces
        (env axis, actor order)."""
        if self.policy is None:
            raise RuntimeError("attach() the policy first")
        if not self._reset_count:
            raise RuntimeError("reset() the collector first")
        ray = self.ray
        weights = ray.put({k: v.detach().cpu().numpy()
                           for k, v in self.policy.state_dict().items()})
        norms = self._norm_state()
        norms_ref = ray.put(norms)
        refs = [w.collect.remote(weights, norms_ref, n_steps) for w in self.workers]
        outs = [self._retry(k, refs[k], "rollout",
                            lambda w: w.collect.remote(weights, norms_ref, n_steps))
                for k in range(self.num_workers)]
        self.iteration += 1
        self._fold_norms([o["norms"] for o in outs])
        for o in outs:
            self.finished.extend((float(r), int(n)) for r, n in o["finished"])
        parts = {f: torch.from_numpy(np.concatenate([o["rollout"][f] for o in outs], axis=1))
                 for f in FIELDS}
        return Rollout(**parts)

    def pop_finished(self) -> list[tuple[float, int]]:
        out, self.finished = self.finished, []
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """The remote environments' state is not saved (a resume starts new episodes)."""
        return {"num_workers": np.array([self.num_workers], np.int64)}

    def load_state_dict(self, d: dict) -> None:  # pragma: no cover - never saved
        raise RuntimeError("remote environment state is not restored; reset() instead")

    def close(self) -> None:
        for w in getattr(self, "workers", []):
            try:
                self.ray.kill(w)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.workers = []
