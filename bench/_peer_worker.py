"""One PPO training run on CartPole-v1 by a peer library, with that library's own PPO, timed
from inside; run by ``bench.vs_peers`` in a fresh process. Prints one JSON line.

    python -m bench._peer_worker --lib {rlox,rlox-rust,skrl,tianshou,torchrl,pufferlib}
                                 [--seed S] [--steps N] [--cpu C]

Every library gets the RL-zoo's CartPole PPO settings (``ZOO`` below: the ones
``bench._sb3_worker`` and ppokit's CartPole preset use) as far as its PPO lets them be set
through its own configuration, models and training loop; nothing in a library is patched.
What it cannot express is listed in ``deviations``; settings that had to be translated
(a value-loss coefficient that a library halves, a disabled value clip) are in ``notes``.

The process is pinned to one CPU (``--cpu``, default the last one) with one thread for
OpenMP, MKL, Rayon and torch before torch is imported. ``seconds`` is the library's
training call alone: environment stepping, action sampling, advantage estimation and the
updates, with whatever bookkeeping the library does during them (its logging, progress
output, JIT compilation on first use). Not in it: imports, building the environments,
networks, optimiser and agent, and the evaluation. The evaluation is the same for every
library: 10 episodes of Gymnasium's CartPole-v1, episode ``k`` reset with seed
``10000 + seed + k`` (as ppokit's evaluation seeds them), actions the argmax of the trained
policy network's logits.

Output keys: lib, seed, steps (environment steps trained on), seconds, s_per_100k, eval_mean,
eval_returns, deviations, notes, versions, cpu, threads; or lib, seed and ``error`` when the
library is not installed or cannot run PPO on CartPole here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

LIBS = ("rlox", "rlox-rust", "skrl", "tianshou", "torchrl", "pufferlib")
# the distribution each library is installed as (for its version and the install hint)
DISTS = {"rlox": "rlox", "rlox-rust": "rlox", "skrl": "skrl", "tianshou": "tianshou",
         "torchrl": "torchrl", "pufferlib": "pufferlib-core"}
ENV_ID = "CartPole-v1"
# The RL-zoo's PPO settings for CartPole-v1 (hyperparams/ppo.yml; bench._sb3_worker.zoo and
# ppokit's preset) with SB3's defaults for what the zoo leaves unset.
ZOO = dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
           ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, learning_rate=1e-3, clip_range=0.2,
           adam_eps=1e-5, hidden=(64, 64))
# In every library: linear learning-rate and clip-range schedules to 0 (where it has them),
# advantages normalised per minibatch, no value clipping, no entropy bonus, separate 64x64
# tanh actor and critic with SB3's orthogonal initialisation (gain sqrt 2 for hidden layers,
# 0.01 for the logits, 1 for the value), one Adam over both with the gradients' global norm
# clipped, a time-limit end bootstrapped from the critic's value of the final observation.
CLIP_CONSTANT = "clip range constant 0.2 (its PPO has no clip-range schedule; zoo: linear 0.2 -> 0)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", required=True, choices=LIBS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the last)")
    p.add_argument("--eval-episodes", type=int, default=10)
    return p


def pin(cpu: int | None) -> int:
    """Pin this process to one CPU and one thread per runtime; call before importing torch."""
    cpu = sorted(os.sched_getaffinity(0))[-1] if cpu is None else cpu
    os.sched_setaffinity(0, {cpu})
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[var] = "1"
    return cpu


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _mlp(n_in: int, n_out: int, out_gain: float):
    """64x64 tanh MLP with SB3's orthogonal initialisation (biases 0)."""
    import torch.nn as nn

    sizes = (n_in, *ZOO["hidden"])
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    layers.append(nn.Linear(sizes[-1], n_out))
    net = nn.Sequential(*layers)
    for m in net:
        if isinstance(m, nn.Linear):
            nn.init.orthogonal_(m.weight, gain=2 ** 0.5)
            nn.init.zeros_(m.bias)
    nn.init.orthogonal_(net[-1].weight, gain=out_gain)
    return net


def _linear(i: int, n: int) -> float:
    """The linear schedules' factor at update ``i`` of ``n``: 1 at the first update,
    decreasing by 1/n each (as rlox's and tianshou's learning-rate annealing count)."""
    return 1.0 - i / n


def evaluate(logits_fn, seed: int, episodes: int) -> list[float]:
    """The evaluation every library gets: episode k of Gymnasium's CartPole-v1 reset with seed
    ``10000 + seed + k``, actions argmax of ``logits_fn(obs[None])``."""
    import gymnasium as gym
    import numpy as np
    import torch

    env = gym.make(ENV_ID)
    returns = []
    with torch.no_grad():
        for k in range(episodes):
            obs, _ = env.reset(seed=10_000 + seed + k)
            done, ret = False, 0.0
            while not done:
                x = torch.as_tensor(np.asarray(obs, dtype=np.float32)[None])
                action = int(logits_fn(x).argmax(-1).reshape(-1)[0])
                obs, r, term, trunc, _ = env.step(action)
                ret += float(r)
                done = term or trunc
            returns.append(ret)
    env.close()
    return returns


# --- one function per library: build (not timed), train (timed); returns the record ---------

def run_rlox(a, rust: bool) -> dict:
    import gymnasium as gym
    from rlox.algorithms.ppo import PPO

    if rust:
        env_id = ENV_ID  # rlox steps "CartPole-v1" with its own Rust CartPole (rlox.VecEnv)
    else:
        # Under any id but its native ones rlox steps Gymnasium's environment (its GymVecEnv,
        # a Gymnasium SyncVectorEnv): the same CartPoleEnv under another name.
        env_id = "ppokit-bench/GymnasiumCartPole-v1"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                         max_episode_steps=500, reward_threshold=475.0)
    z = ZOO
    ppo = PPO(env_id, n_envs=z["n_envs"], seed=a.seed, n_steps=z["n_steps"],
              n_epochs=z["n_epochs"], batch_size=z["batch_size"],
              learning_rate=z["learning_rate"], anneal_lr=True, clip_eps=z["clip_range"],
              vf_coef=2 * z["vf_coef"], ent_coef=z["ent_coef"],
              max_grad_norm=z["max_grad_norm"], gamma=z["gamma"], gae_lambda=z["gae_lambda"],
              normalize_advantages=True, clip_vloss=False)
    rollout = z["n_envs"] * z["n_steps"]
    t0 = time.perf_counter()
    ppo.train(total_timesteps=a.steps)  # steps // rollout whole rollouts
    seconds = time.perf_counter() - t0
    env_note = ("rlox's own Rust CartPole (rlox.VecEnv), not Gymnasium's code" if rust else
                "Gymnasium's CartPoleEnv through rlox's GymVecEnv (a Gymnasium SyncVectorEnv)")
    return dict(
        seconds=seconds, steps=max(1, a.steps // rollout) * rollout,
        logits_fn=ppo.policy.actor,
        deviations=[
            CLIP_CONSTANT,
            "time-limit ends (CartPole's 500 steps) are bootstrapped twice and not cut: rlox "
            "adds gamma*V(final observation) to the reward but passes only `terminated` to its "
            "GAE, which then also bootstraps from, and carries the advantage across, the next "
            "episode's first state",
        ],
        notes=[
            f"environment: {env_note}",
            "vf_coef=1.0: rlox's value loss is 0.5*MSE, so this is SB3's 0.5*MSE",
            "clip_vloss=False (its default clips the value loss; SB3 does not)",
            f"trains steps // {rollout} rollouts (whole rollouts only; SB3 and ppokit round up)",
            "DiscretePolicy: separate 64x64 tanh actor and critic, SB3's orthogonal init",
        ])


def run_skrl(a) -> dict:
    import gymnasium as gym
    import torch
    from skrl.agents.torch.base import ExperimentCfg
    from skrl.agents.torch.ppo import PPO, PPO_CFG
    from skrl.envs.wrappers.torch import wrap_env
    from skrl.memories.torch import RandomMemory
    from skrl.models.torch import CategoricalMixin, DeterministicMixin, Model
    from skrl.trainers.torch import SequentialTrainer
    from skrl.utils import set_seed

    set_seed(a.seed)
    z = ZOO
    # same-step autoreset: no transition of a finished episode's reset in the rollout (skrl
    # relies on the vector env's autoreset and records every step it returns)
    venv = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID)] * z["n_envs"],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = wrap_env(venv, wrapper="gymnasium")

    class Policy(CategoricalMixin, Model):
        def __init__(self):
            Model.__init__(self, observation_space=env.observation_space,
                           action_space=env.action_space, device="cpu")
            CategoricalMixin.__init__(self, unnormalized_log_prob=True)
            self.net = _mlp(4, 2, 0.01)

        def compute(self, inputs, role=""):
            return self.net(inputs["observations"]), {}

    class Value(DeterministicMixin, Model):
        def __init__(self):
            Model.__init__(self, observation_space=env.observation_space,
                           action_space=env.action_space, device="cpu")
            DeterministicMixin.__init__(self)
            self.net = _mlp(4, 1, 1.0)

        def compute(self, inputs, role=""):
            return self.net(inputs["observations"]), {}

    timesteps = a.steps // z["n_envs"]  # skrl counts vector steps
    n_updates = max(1, timesteps // z["n_steps"])
    epochs = z["n_epochs"]
    policy, value = Policy(), Value()
    run_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"skrl-bench-{os.getpid()}")
    cfg = PPO_CFG(
        rollouts=z["n_steps"], learning_epochs=epochs,
        mini_batches=z["n_envs"] * z["n_steps"] // z["batch_size"],
        discount_factor=z["gamma"], gae_lambda=z["gae_lambda"],
        learning_rate=z["learning_rate"],
        # skrl steps the scheduler after every epoch: k // epochs is the update's index
        learning_rate_scheduler=torch.optim.lr_scheduler.LambdaLR,
        learning_rate_scheduler_kwargs={"lr_lambda": lambda k: _linear(k // epochs, n_updates)},
        grad_norm_clip=z["max_grad_norm"], ratio_clip=z["clip_range"], value_clip=0.0,
        entropy_loss_scale=z["ent_coef"], value_loss_scale=z["vf_coef"], kl_threshold=0.0,
        time_limit_bootstrap=True,
        experiment=ExperimentCfg(directory=run_dir, write_interval=0, checkpoint_interval=0))
    memory = RandomMemory(memory_size=z["n_steps"], num_envs=z["n_envs"], device="cpu")
    agent = PPO(models={"policy": policy, "value": value}, memory=memory,
                observation_space=env.observation_space, action_space=env.action_space,
                device="cpu", cfg=cfg)
    trainer = SequentialTrainer(env=env, agents=agent, cfg={
        "timesteps": timesteps, "headless": True, "disable_progressbar": True,
        "close_environment_at_exit": False})
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    return dict(
        seconds=seconds, steps=timesteps * z["n_envs"], logits_fn=policy.net,
        deviations=[
            CLIP_CONSTANT,
            "Adam eps 1e-8 (skrl builds its Adam with torch's default; zoo/SB3: 1e-5)",
            "time-limit ends bootstrapped from V of the next episode's first observation: "
            "skrl bootstraps from the step's next observation, which a same-step autoreset "
            "has already reset (with next-step autoreset every episode end would leave a "
            "spurious reset transition in the rollout instead)",
        ],
        notes=[
            "environment: Gymnasium's CartPoleEnv in a Gymnasium SyncVectorEnv (same-step "
            "autoreset)",
            "advantages normalised over the rollout, which at batch 256 = rollout is the "
            "one minibatch",
            "learning rate: LambdaLR linear to 0, per update (skrl steps it per epoch)",
            "models: our 64x64 tanh actor and critic (skrl has the user write them)",
        ] + ([f"the last {timesteps % z['n_steps']} vector steps of {timesteps} are collected "
              "but not trained on (skrl updates every 32 steps)"]
             if timesteps % z["n_steps"] else []))


def run_tianshou(a) -> dict:
    import gymnasium as gym
    import torch
    import torch.nn as nn
    from tianshou.algorithm import PPO
    from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory, LRSchedulerFactoryLinear
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OnPolicyTrainerParams
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    z = ZOO
    rollout = z["n_envs"] * z["n_steps"]
    envs = DummyVectorEnv([lambda: gym.make(ENV_ID) for _ in range(z["n_envs"])])
    envs.seed(a.seed)
    actor = DiscreteActor(preprocess_net=Net(state_shape=4, hidden_sizes=list(z["hidden"]),
                                             activation=nn.Tanh),
                          action_shape=2, softmax_output=False)
    critic = DiscreteCritic(preprocess_net=Net(state_shape=4, hidden_sizes=list(z["hidden"]),
                                               activation=nn.Tanh))
    for net, gain in ((actor, 0.01), (critic, 1.0)):  # SB3's initialisation
        linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
        for m in linears:
            nn.init.orthogonal_(m.weight, gain=2 ** 0.5)
            nn.init.zeros_(m.bias)
        nn.init.orthogonal_(linears[-1].weight, gain=gain)
    policy = ProbabilisticActorPolicy(
        actor=actor, dist_fn=lambda logits: torch.distributions.Categorical(logits=logits),
        action_space=envs.action_space[0], deterministic_eval=True,
        action_scaling=False)
    optim = AdamOptimizerFactory(lr=z["learning_rate"], eps=z["adam_eps"])
    optim.with_lr_scheduler_factory(LRSchedulerFactoryLinear(
        max_epochs=1, epoch_num_steps=a.steps, collection_step_num_env_steps=rollout))
    algo = PPO(policy=policy, critic=critic, optim=optim, eps_clip=z["clip_range"],
               value_clip=False, advantage_normalization=True, vf_coef=z["vf_coef"],
               ent_coef=z["ent_coef"], max_grad_norm=z["max_grad_norm"],
               gae_lambda=z["gae_lambda"], gamma=z["gamma"], max_batchsize=rollout)
    collector = Collector(algo, envs, VectorReplayBuffer(rollout, z["n_envs"]))
    collector.reset()
    params = OnPolicyTrainerParams(
        training_collector=collector, max_epochs=1, epoch_num_steps=a.steps,
        collection_step_num_env_steps=rollout, update_step_num_repetitions=z["n_epochs"],
        batch_size=z["batch_size"], test_collector=None, verbose=False, show_progress=False)
    t0 = time.perf_counter()
    algo.run_training(params)
    seconds = time.perf_counter() - t0
    steps = -(-a.steps // rollout) * rollout
    return dict(
        seconds=seconds, steps=steps, logits_fn=lambda x: actor(x)[0],
        deviations=[CLIP_CONSTANT],
        notes=[
            "environment: Gymnasium's CartPoleEnv in tianshou's DummyVectorEnv",
            "networks: tianshou's Net (64x64 tanh) + DiscreteActor / DiscreteCritic heads, "
            "SB3's orthogonal initialisation applied to them",
            "numba compiles tianshou's GAE and buffer functions on first use, inside the "
            "timed training",
        ])


def run_torchrl(a) -> dict:
    import gymnasium as gym
    import torch
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.envs import GymWrapper
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    z = ZOO
    rollout = z["n_envs"] * z["n_steps"]
    # A Gymnasium SyncVectorEnv without autoreset (torchrl's preferred mode: it resets the
    # finished envs itself, keeping the final observation as the step's "next"). Not
    # GymEnv(num_envs=8): that is an AsyncVectorEnv, 8 subprocesses.
    venv = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID)] * z["n_envs"],
                                    autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    env = GymWrapper(venv, categorical_action_encoding=True)
    env.set_seed(a.seed)
    actor_net, critic_net = _mlp(4, 2, 0.01), _mlp(4, 1, 1.0)
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=torch.distributions.Categorical,
        spec=env.action_spec, return_log_prob=True)
    critic = ValueOperator(critic_net, in_keys=["observation"])
    advantage = GAE(gamma=z["gamma"], lmbda=z["gae_lambda"], value_network=critic,
                    average_gae=False)
    loss_fn = ClipPPOLoss(actor, critic, clip_epsilon=z["clip_range"], entropy_bonus=False,
                          critic_coeff=z["vf_coef"], loss_critic_type="l2",
                          normalize_advantage=True)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=z["learning_rate"], eps=z["adam_eps"])
    n_updates = -(-a.steps // rollout)
    collector = Collector(env, actor, frames_per_batch=rollout,
                          total_frames=n_updates * rollout, device="cpu",
                          auto_register_policy_transforms=False)
    steps = 0
    t0 = time.perf_counter()
    for i, data in enumerate(collector):
        frac = _linear(i, n_updates)
        for g in optim.param_groups:
            g["lr"] = z["learning_rate"] * frac
        loss_fn.clip_epsilon.copy_(z["clip_range"] * frac)  # a documented schedulable buffer
        with torch.no_grad():
            advantage(data)
        flat = data.reshape(-1)
        steps += flat.numel()
        for _ in range(z["n_epochs"]):
            perm = torch.randperm(flat.numel())
            for j in range(0, flat.numel(), z["batch_size"]):
                out = loss_fn(flat[perm[j:j + z["batch_size"]]])
                loss = out["loss_objective"] + out["loss_critic"]
                optim.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(loss_fn.parameters(), z["max_grad_norm"])
                optim.step()
    seconds = time.perf_counter() - t0
    collector.shutdown()
    return dict(
        seconds=seconds, steps=steps, logits_fn=actor_net, deviations=[],
        notes=[
            "environment: Gymnasium's CartPoleEnv in a Gymnasium SyncVectorEnv (autoreset "
            "disabled: torchrl resets finished envs) through torchrl's GymWrapper",
            "torchrl has the user write the loop: Collector, GAE (once per rollout), "
            "ClipPPOLoss (l2 critic loss x 0.5, per-minibatch advantage normalisation), "
            "Adam(eps 1e-5), linear lr and clip_epsilon schedules, global-norm clipping",
        ])


def _pufferlib_cpu_kernel() -> None:
    """Make ``pufferlib._C`` importable on CPU torch: the pufferlib-core wheel's binary links
    CUDA torch (libtorch_cuda, libcudart), so its advantage kernel is built here, once, from
    the C++ source the wheel ships (``extensions/pufferlib.cpp``, CPU implementation
    included), and stands in for the module."""
    import importlib.util
    import types

    import torch.utils.cpp_extension as ce

    spec = importlib.util.find_spec("pufferlib")
    src = os.path.join(os.path.dirname(spec.origin), "extensions", "pufferlib.cpp")
    try:
        import pufferlib._C  # noqa: F401 - the wheel's own binary, where it loads
        return
    except ImportError:
        pass
    cache = os.path.join(os.path.expanduser("~"), ".cache", "ppokit-bench",
                         f"pufferlib-core-{_version('pufferlib-core')}-cpu")
    os.makedirs(cache, exist_ok=True)
    ce.load(name="pufferlib_cpu_advantage", sources=[src], build_directory=cache,
            is_python_module=False, extra_cflags=["-O3"], verbose=False)
    sys.modules["pufferlib._C"] = types.ModuleType("pufferlib._C")


def run_pufferlib(a) -> dict:
    import functools
    import tempfile

    import gymnasium as gym
    import torch.nn as nn

    _pufferlib_cpu_kernel()
    import pufferlib.emulation
    import pufferlib.pufferl
    import pufferlib.vector

    z = ZOO

    class Policy(nn.Module):
        """Separate 64x64 tanh actor and critic (PufferLib has the user write the policy:
        ``forward_eval`` while collecting, ``forward`` in the update)."""

        def __init__(self):
            super().__init__()
            self.actor, self.critic = _mlp(4, 2, 0.01), _mlp(4, 1, 1.0)

        def forward_eval(self, obs, state=None):
            return self.actor(obs), self.critic(obs)

        def forward(self, obs, state=None):
            return self.forward_eval(obs, state)

    creator = functools.partial(pufferlib.emulation.GymnasiumPufferEnv, env_creator=gym.make,
                                env_args=[ENV_ID])
    vecenv = pufferlib.vector.make(creator, num_envs=z["n_envs"], seed=a.seed,
                                   backend=pufferlib.vector.Serial)
    policy = Policy()
    rollout = z["n_envs"] * z["n_steps"]
    tmp = tempfile.TemporaryDirectory()
    config = dict(
        env=ENV_ID, seed=a.seed, device="cpu", torch_deterministic=False, cpu_offload=False,
        use_rnn=False, compile=False, compile_mode="default", compile_fullgraph=False,
        precision="float32", total_timesteps=a.steps, batch_size=rollout,
        bptt_horizon=z["n_steps"], minibatch_size=z["batch_size"],
        max_minibatch_size=z["batch_size"], update_epochs=z["n_epochs"], optimizer="adam",
        learning_rate=z["learning_rate"], adam_beta1=0.9, adam_beta2=0.999,
        adam_eps=z["adam_eps"], anneal_lr=True, gamma=z["gamma"], gae_lambda=z["gae_lambda"],
        clip_coef=z["clip_range"], vf_clip_coef=1e9, vf_coef=2 * z["vf_coef"],
        ent_coef=z["ent_coef"], max_grad_norm=z["max_grad_norm"], vtrace_rho_clip=1.0,
        vtrace_c_clip=1.0, prio_alpha=0.0, prio_beta0=1.0, checkpoint_interval=10**9,
        data_dir=tmp.name)
    sink = open(os.devnull, "w")
    with contextlib.redirect_stdout(sink):  # its dashboard; stdout carries the JSON line
        trainer = pufferlib.pufferl.PuffeRL(config, vecenv, policy)
        t0 = time.perf_counter()
        while trainer.global_step < config["total_timesteps"]:  # as pufferl.train loops
            trainer.evaluate()
            trainer.train()
        seconds = time.perf_counter() - t0
        steps = trainer.global_step
        trainer.close()
    trainer.utilization.join()
    tmp.cleanup()
    return dict(
        seconds=seconds, steps=steps, logits_fn=policy.actor,
        deviations=[
            "learning rate cosine-annealed 1e-3 -> 0 (PufferLib anneals by cosine only; "
            "zoo: linear)",
            CLIP_CONSTANT,
            "advantages: PufferLib's V-trace-clipped GAE (rho, c clipped at 1), recomputed "
            "before every minibatch from the values and ratios its earlier minibatches "
            "wrote back, over 32-step rows whose last step gets no advantage (no bootstrap "
            "past a row)",
            "time-limit ends not handled: only terminations stop the bootstrap and the "
            "trace (PufferLib stores no truncation flag in its GAE input)",
        ],
        notes=[
            "environment: Gymnasium's CartPoleEnv through PufferLib's GymnasiumPufferEnv "
            "emulation, Serial vectorization",
            "vf_coef=1.0: its value loss is 0.5*MSE, so this is SB3's 0.5*MSE",
            "value clipping off by vf_clip_coef=1e9 (PufferLib always clips the value)",
            "prio_alpha=0: uniform minibatch sampling of the 32-step rows",
            "rewards clamped to [-1, 1] by PufferLib (CartPole's are 1)",
            "its C++ advantage kernel built for CPU torch from the wheel's own source (the "
            "wheel's binary needs CUDA torch); its dashboard rendered (to /dev/null) during "
            "training, as in every PufferLib run",
        ])


RUNNERS = {
    "rlox": lambda a: run_rlox(a, rust=False),
    "rlox-rust": lambda a: run_rlox(a, rust=True),
    "skrl": run_skrl,
    "tianshou": run_tianshou,
    "torchrl": run_torchrl,
    "pufferlib": run_pufferlib,
}
MODULES = {"rlox": "rlox", "rlox-rust": "rlox", "skrl": "skrl", "tianshou": "tianshou",
           "torchrl": "torchrl", "pufferlib": "pufferlib"}


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    cpu = pin(a.cpu)
    import importlib.util

    import torch

    torch.set_num_threads(1)
    base = {"lib": a.lib, "seed": a.seed}
    if importlib.util.find_spec(MODULES[a.lib]) is None:
        print(json.dumps({**base, "error": f"not installed (pip install {DISTS[a.lib]})"}))
        return 0
    import random

    import numpy as np

    random.seed(a.seed)
    np.random.seed(a.seed)  # noqa: NPY002 - the libraries draw from the global RNG
    torch.manual_seed(a.seed)
    try:
        rec = RUNNERS[a.lib](a)
    except Exception as exc:  # reported, not hidden: the bench prints the row as unavailable
        import traceback

        traceback.print_exc()
        print(json.dumps({**base, "error": f"{type(exc).__name__}: {exc}"[:500]}))
        return 1
    returns = evaluate(rec.pop("logits_fn"), a.seed, a.eval_episodes)
    versions = {d: _version(d) for d in ("torch", "gymnasium", "numpy", DISTS[a.lib])}
    if a.lib == "torchrl":
        versions["tensordict"] = _version("tensordict")
    print(json.dumps({
        **base, "steps": int(rec["steps"]), "seconds": rec["seconds"],
        "s_per_100k": rec["seconds"] / rec["steps"] * 1e5,
        "eval_mean": float(np.mean(returns)), "eval_returns": returns,
        "deviations": rec["deviations"], "notes": rec["notes"], "versions": versions,
        "cpu": cpu, "threads": torch.get_num_threads(),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
