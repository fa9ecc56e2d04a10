"""Vector environments, auto-reset modes, running normalisers, where a run's environments
come from (registered ids, ``module:Id``, factories), and ppokit's own partially observable
tasks (``ppokit/CartPoleNoVel-v1``, ``ppokit/PendulumNoVel-v1``, registered on import)."""

from .normalize import ObsNormalizer, RewardScaler, RunningMeanStd
from .pomdp import POMDP_IDS, HideVelocity, register_pomdps
from .source import check_env_kwargs, env_for_run, import_env_module, split_env_id
from .vec import autoreset_mode_of, check_env_id, env_state, load_env_state, make_vec

register_pomdps()

__all__ = ["HideVelocity", "ObsNormalizer", "POMDP_IDS", "RewardScaler", "RunningMeanStd",
           "autoreset_mode_of", "check_env_id", "check_env_kwargs", "env_for_run", "env_state",
           "import_env_module", "load_env_state", "make_vec", "register_pomdps",
           "split_env_id"]
