"""Vector environments, auto-reset modes, running normalisers and where a run's
environments come from (registered ids, ``module:Id``, factories)."""

from .normalize import ObsNormalizer, RewardScaler, RunningMeanStd
from .source import check_env_kwargs, env_for_run, import_env_module, split_env_id
from .vec import autoreset_mode_of, check_env_id, env_state, load_env_state, make_vec

__all__ = ["ObsNormalizer", "RewardScaler", "RunningMeanStd", "autoreset_mode_of",
           "check_env_id", "check_env_kwargs", "env_for_run", "env_state",
           "import_env_module", "load_env_state", "make_vec", "split_env_id"]
