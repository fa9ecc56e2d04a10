"""Vector environments, auto-reset modes, running normalisers, where a run's environments
come from (registered ids, ``module:Id``, factories), and ppokit's own partially observable
tasks (``ppokit/CartPoleNoVel-v1``, ``ppokit/PendulumNoVel-v1``) and the learning benchmark's
small known-answer tasks (``ppokit/ImageSide-v0``, ``ppokit/ImageFlag-v0``,
``ppokit/CopyBits-v0``), the task action masks make learnable (``ppokit/MaskedChoice-v0``)
and PettingZoo's tic-tac-toe against a random player (``ppokit/TicTacToe-v0``, the
pettingzoo extra), registered on import."""

from .choices import CHOICE_IDS, MaskedChoice, register_choices
from .normalize import ObsNormalizer, RewardScaler, RunningMeanStd
from .pomdp import POMDP_IDS, HideVelocity, register_pomdps
from .sight import SIGHT_IDS, register_sight
from .source import check_env_kwargs, env_for_run, import_env_module, split_env_id
from .vec import autoreset_mode_of, check_env_id, env_state, load_env_state, make_vec
from .versus import VERSUS_IDS, register_versus

register_pomdps()
register_sight()
register_choices()
register_versus()

__all__ = ["CHOICE_IDS", "HideVelocity", "MaskedChoice", "ObsNormalizer", "POMDP_IDS",
           "RewardScaler", "RunningMeanStd", "SIGHT_IDS", "autoreset_mode_of", "check_env_id",
           "check_env_kwargs", "env_for_run", "env_state", "import_env_module",
           "load_env_state", "make_vec", "register_choices", "register_pomdps",
           "register_sight", "register_versus", "split_env_id", "VERSUS_IDS"]
