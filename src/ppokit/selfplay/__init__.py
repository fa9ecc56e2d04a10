"""Self-play for two-player, turn-based, zero-sum games with action masks (PettingZoo's
classic AEC games): the game as a single-agent environment whose opponent moves inside the
step (:mod:`.games`), the fixed players and policy players (:mod:`.opponents`), the
snapshot pool and its ratings (:mod:`.pool`), what a self-play run adds to the trainer
(:mod:`.coach`) and games against one opponent with their intervals (:mod:`.match`).
docs/multiagent.md#self-play describes how to use it. (The submodules are imported where
they are used: the configuration imports only :mod:`.settings`.)"""

from .settings import POOL_MODES, SelfPlaySettings, check_selfplay

__all__ = ["POOL_MODES", "SelfPlaySettings", "check_selfplay"]
