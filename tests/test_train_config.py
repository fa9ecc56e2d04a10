"""Configuration: presets, validation naming the field, TOML/--set, CLI exit status 2."""

import pytest

from ppokit.algos import ENV_PRESETS, TrainConfig, resolve_config
from ppokit.algos.config import parse_value
from ppokit.cli import main
from ppokit.errors import UsageError


def test_cartpole_preset_is_the_zoo_ppo():
    c = resolve_config()
    assert (c.env_id, c.algo) == ("CartPole-v1", "ppo")
    assert (c.n_envs, c.n_steps, c.batch_size, c.gamma, c.gae_lambda, c.n_epochs) == \
        (8, 32, 256, 0.98, 0.8, 20)
    assert (c.ent_coef, c.learning_rate, c.lr_schedule, c.clip_range, c.clip_schedule) == \
        (0.0, 1e-3, "linear", 0.2, "linear")
    assert c.total_timesteps == 100_000
    for env in ("Acrobot-v1", "LunarLander-v3", "Pendulum-v1", "HalfCheetah-v5"):
        assert env in ENV_PRESETS


def test_every_preset_resolves_to_a_valid_config():
    for env in ENV_PRESETS:
        c = resolve_config(env_id=env)
        assert c.total_timesteps == ENV_PRESETS[env]["total_timesteps"]
        assert c.batch_size <= c.n_steps * c.n_envs


def test_image_observations_get_the_image_family_settings():
    from ppokit.algos.presets import IMAGE_PRESET, SMALL_IMAGE_PRESET

    for env in ("ppokit/ImageSide-v0", "ppokit/ImageFlag-v0"):  # 32x32: small images
        c = resolve_config(env_id=env)
        assert (c.n_steps, c.n_epochs, c.batch_size, c.learning_rate, c.cnn_channels,
                c.features_dim, c.activation, c.net_arch) == \
            (128, 4, 256, SMALL_IMAGE_PRESET["learning_rate"], (16, 32, 32), 256, "relu",
             (64, 64))
        assert c.total_timesteps == 100_000  # the family gives no budget
    big = resolve_config(env_id="ppokit/ImageSide-v0",
                         overrides={"env_kwargs": {"size": 64, "block": 8}})
    assert (big.learning_rate, big.clip_range, big.n_epochs, big.cnn_channels) == \
        (IMAGE_PRESET["learning_rate"], 0.1, 4, (32, 64, 64))
    mine = resolve_config(env_id="ppokit/ImageSide-v0", toml_values={"n_epochs": 7},
                          overrides={"learning_rate": 1e-3})
    assert (mine.n_epochs, mine.learning_rate, mine.n_steps) == (7, 1e-3, 128)
    flat = resolve_config(env_id="ppokit/CopyBits-v0")  # not an image: generic settings
    assert (flat.n_steps, flat.n_epochs, flat.activation) == (256, 10, "tanh")
    a2c = resolve_config(env_id="ppokit/ImageSide-v0", flags={"algo": "a2c"})
    assert a2c.n_steps == 5  # the family is PPO's, as the environment presets are


def test_precedence_presets_toml_set_flags():
    c = resolve_config(env_id="CartPole-v1", toml_values={"gamma": 0.9, "n_epochs": 3},
                       overrides={"n_epochs": 4}, flags={"seed": 5, "n_envs": 16})
    assert (c.gamma, c.n_epochs, c.seed, c.n_envs, c.n_steps) == (0.9, 4, 5, 16, 32)
    a2c = resolve_config(flags={"algo": "a2c"})
    assert (a2c.policy_loss, a2c.optimizer, a2c.n_steps) == ("vanilla", "rmsprop", 5)


@pytest.mark.parametrize("kw, field", [
    (dict(total_timesteps=-5), "total_timesteps"),
    (dict(gamma=1.5), "gamma"),
    (dict(batch_size=10_000), "batch_size"),
    (dict(clip_range=0.0), "clip_range"),
    (dict(lr_schedule="cosine"), "lr_schedule"),
    (dict(n_epochs=2.5), "n_epochs"),
    (dict(normalize_advantage="yes"), "normalize_advantage"),
    (dict(target_kl=-1.0), "target_kl"),
    (dict(learning_rate=float("nan")), "learning_rate"),
])
def test_validation_names_the_field(kw, field):
    with pytest.raises(UsageError, match=f"^{field}:"):
        TrainConfig(**{**dict(n_steps=32, n_envs=8, batch_size=64), **kw})


def test_unknown_key_lists_valid_ones():
    with pytest.raises(UsageError, match="unknown key 'lr'.*learning_rate"):
        resolve_config(overrides={"lr": 1.0})
    with pytest.raises(UsageError, match="unknown key 'lr'.*valid keys"):
        parse_value("lr", "1")


def test_parse_value_types():
    assert parse_value("total_timesteps", "1e5") == 100_000
    assert parse_value("target_kl", "none") is None
    assert parse_value("normalize_advantage", "false") is False
    assert parse_value("net_arch", "[128, 64]") == (128, 64)
    with pytest.raises(UsageError, match="^n_steps: expected an integer"):
        parse_value("n_steps", "3.5")


@pytest.mark.parametrize("argv, msg", [
    (["--total-steps", "-5"], "total_timesteps"),
    (["--set", "batch_size=100000"], "batch_size"),
    (["--env", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
    (["--algo", "trpo"], "unknown algorithm 'trpo'"),
    (["--set", "bogus=1"], "valid keys"),
    (["--set", "gamma"], "KEY=VALUE"),
    (["--config", "/nonexistent.toml"], "no such file"),
    (["--resume", "/nonexistent_run"], "no such run directory"),
])
def test_cli_bad_values_exit_2_with_one_line(argv, msg, capsys, tmp_path):
    assert main(["train", "--run-dir", str(tmp_path / "r"), *argv]
                if "--resume" not in argv else ["train", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_toml_config_file(tmp_path):
    from ppokit.cliutil import read_toml

    f = tmp_path / "c.toml"
    f.write_text('gamma = 0.95\nnet_arch = [32, 32]\nclip_range_vf = 0.2\n')
    c = resolve_config(toml_values=read_toml(str(f), "train"))
    assert (c.gamma, c.net_arch, c.clip_range_vf) == (0.95, (32, 32), 0.2)
    f.write_text('gamma = "high"\n')
    with pytest.raises(UsageError, match="^gamma:"):
        resolve_config(toml_values=read_toml(str(f), "train"))
