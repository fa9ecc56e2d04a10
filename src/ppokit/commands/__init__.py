"""Command modules of the ``ppokit`` CLI for environment RL (train, eval, plot)."""
