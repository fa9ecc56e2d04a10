"""Vector environments, auto-reset modes and running normalisers."""

from .normalize import ObsNormalizer, RewardScaler, RunningMeanStd
from .vec import autoreset_mode_of, check_env_id, env_state, load_env_state, make_vec

__all__ = ["ObsNormalizer", "RewardScaler", "RunningMeanStd", "autoreset_mode_of",
           "check_env_id", "env_state", "load_env_state", "make_vec"]
