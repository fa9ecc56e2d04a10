"""ppokit: policy-gradient reinforcement learning centred on PPO."""

__version__ = "0.1.0"
