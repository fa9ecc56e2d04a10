"""An optimiser stand-in for tests of the engine's minibatch step: gradients are computed
and kept, nothing moves."""

from __future__ import annotations


class NoStep:
    """``zero_grad`` clears the parameters' gradients; ``step`` does nothing."""

    def __init__(self, params):
        self.params = list(params)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        pass
