"""The update engine both trainers use: :func:`run_update` over a :class:`LabelledBatch`
with an :class:`UpdateSpec`; the fused minibatch step (:mod:`.fused`) is one of its
backends, on flat parameter storage (:mod:`.flat`)."""

from .update import (
    STAT_KEYS,
    UPDATE_KEYS,
    Forward,
    LabelledBatch,
    UpdateSpec,
    eager_minibatch_step,
    run_update,
    summarise,
)

__all__ = ["STAT_KEYS", "UPDATE_KEYS", "Forward", "LabelledBatch", "UpdateSpec",
           "eager_minibatch_step", "run_update", "summarise"]
