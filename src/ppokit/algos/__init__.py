"""Configs, presets and the one learner loop for environment RL."""

from .config import ALGORITHMS, ENV_PRESETS, TrainConfig, config_help, resolve_config
from .runs import load_run_config
from .trainer import Trainer

__all__ = ["ALGORITHMS", "ENV_PRESETS", "TrainConfig", "Trainer", "config_help",
           "load_run_config", "resolve_config"]
