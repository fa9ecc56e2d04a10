"""Running on Ray: environments in remote actors (:mod:`.rollout`) and Ray start-up
(:mod:`.cluster`). Ray is imported only when one of these is used (the ``ray`` extra)."""

from .cluster import ensure_ray
from .rollout import RayCollector, RayEnvInfo

__all__ = ["RayCollector", "RayEnvInfo", "ensure_ray"]
