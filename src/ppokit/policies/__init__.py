"""Policies: torch modules implementing the :class:`Policy` interface (see ``base``)."""

from .base import Policy
from .mlp import ACTIVATIONS, MLPActorCritic, NumpySampler, make_policy
from .recurrent import LSTMActorCritic, make_recurrent_policy

__all__ = ["ACTIVATIONS", "LSTMActorCritic", "MLPActorCritic", "NumpySampler", "Policy",
           "is_recurrent", "make_policy", "make_recurrent_policy", "policy_for_config"]


def is_recurrent(policy) -> bool:
    """Whether ``policy`` carries a state from step to step (an LSTM policy)."""
    return bool(getattr(policy, "recurrent", False))


def policy_for_config(cfg, obs_space, action_space, state_space=None):
    """The policy a training configuration describes (``recurrent``: ``none`` → the MLP
    actor-critic, ``lstm`` → :class:`LSTMActorCritic`), for single-env spaces. ``fast``
    false gives CNN encoders their reference layout (no channels-last copy); ``precision``
    sets their number format. ``centralised_critic``: the critic reads the global state of
    ``state_space`` (the environment's, ppokit.envs.multiagent), which it then needs."""
    if getattr(cfg, "centralised_critic", False) and state_space is None:
        from ppokit.errors import UsageError

        raise UsageError("centralised_critic: the critic reads the environment's global "
                         "state, whose space is not known here")
    try:
        policy = _policy_for_config(cfg, obs_space, action_space,
                                    state_space if getattr(cfg, "centralised_critic", False)
                                    else None)
    except ValueError as exc:  # a configuration that does not fit the env's spaces
        from ppokit.errors import UsageError

        raise UsageError(str(exc)) from None
    from .encoders import ImageCNN, resolve_precision

    precision = resolve_precision(getattr(cfg, "precision", "fp32"))
    for m in policy.modules():
        if isinstance(m, ImageCNN):
            m.fast_layout = bool(getattr(cfg, "fast", True))
            m.precision = precision
    return policy


def _state_norm(cfg, state_space) -> bool:
    """Whether a centralised critic normalises its input (``critic_state_norm``)."""
    return state_space is not None and getattr(cfg, "critic_state_norm", "none") == "layer"


def _policy_for_config(cfg, obs_space, action_space, state_space=None):
    obs_space = getattr(obs_space, "dict_space", obs_space)  # stored flat, read per key
    kw = dict(hidden=cfg.net_arch, activation=cfg.activation, ortho_init=cfg.ortho_init)
    if getattr(cfg, "agent_groups", "shared") != "shared":  # one policy per agent group
        from .grouped import make_grouped_policy

        return make_grouped_policy(obs_space, action_space, **kw, state_space=state_space,
                                   state_norm=_state_norm(cfg, state_space))
    kw["log_std_init"] = cfg.log_std_init
    if getattr(cfg, "recurrent", "none") == "lstm":
        return make_recurrent_policy(obs_space, action_space, **kw,
                                     lstm_hidden_size=cfg.lstm_hidden_size,
                                     n_lstm_layers=cfg.n_lstm_layers,
                                     shared_lstm=cfg.shared_lstm,
                                     enable_critic_lstm=cfg.enable_critic_lstm)
    return make_policy(obs_space, action_space, **kw, policy=getattr(cfg, "policy", "auto"),
                       cnn_channels=getattr(cfg, "cnn_channels", (32, 64, 64)),
                       features_dim=getattr(cfg, "features_dim", 512),
                       share_features=getattr(cfg, "share_features", True),
                       state_space=state_space, state_norm=_state_norm(cfg, state_space))
