"""A run records its observation and action spaces as data (JSON, strict: no pickle, no
import): they come back equal, ``ppokit.load`` needs no environment to predict, and a
checkpoint whose recorded spaces are not data of that form is refused in one line."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

import ppokit
from _corridor import write_module
from _pixel_envs import DictGoal
from _space_env import action_spaces, factory
from ppokit.errors import UsageError
from ppokit.io import latest_checkpoint
from ppokit.io.spaces import SpaceDataError, space_from_data, space_to_data

TINY = dict(tensorboard=False, progress=False)


@st.composite
def observation_spaces(draw):
    kind = draw(st.sampled_from(["action", "box-inf", "dict", "image"]))
    if kind == "action":
        return draw(action_spaces())
    if kind == "image":  # uint8 pixels, or boolean object planes (MinAtar)
        dtype = draw(st.sampled_from([np.uint8, np.bool_]))
        shape = (draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 4)))
        return spaces.Box(0, 1 if dtype == np.bool_ else 255, shape, dtype=dtype)
    if kind == "box-inf":  # unbounded and half-bounded entries
        low = np.array([-np.inf, 0.0, -1.5], np.float32)
        high = np.array([np.inf, np.inf, draw(st.floats(-1.5, 4.0))], np.float32)
        return spaces.Box(low, np.maximum(low, high), dtype=np.float32)
    n = draw(st.integers(1, 3))
    return spaces.Dict({f"k{i}": draw(action_spaces()) for i in range(n)})


@settings(max_examples=200)
@given(space=observation_spaces())
def test_spaces_round_trip_through_strict_json(space):
    text = json.dumps(space_to_data(space), allow_nan=False)
    back = space_from_data(json.loads(text))
    assert back == space and back.dtype == space.dtype


def test_the_flattened_dict_keeps_its_dict():
    d = spaces.Dict({"a": spaces.Discrete(3, start=2), "b": spaces.Box(0, 255, (4, 4), np.uint8)})
    flat = spaces.flatten_space(d)
    flat.dict_space = d
    back = space_from_data(json.loads(json.dumps(space_to_data(flat), allow_nan=False)))
    assert back == flat and back.dict_space == d


@pytest.mark.parametrize("data", [
    None, [], {"type": "Tuple", "spaces": []}, {"type": "Box"},
    {"type": "Box", "shape": [2**20, 2**20], "dtype": "float32", "low": 0, "high": 1},
    {"type": "Box", "shape": [2], "dtype": "object", "low": 0, "high": 1},
    {"type": "Box", "shape": [2], "dtype": "float32", "low": [0, 1, 2], "high": 1},
    {"type": "Box", "shape": [2], "dtype": "float32", "low": "os.system", "high": 1},
    {"type": "Discrete", "n": 0, "start": 0}, {"type": "Discrete", "n": True, "start": 0},
    {"type": "MultiDiscrete", "nvec": [[2, 3], [4]], "start": 0, "dtype": "int64"},
    {"type": "MultiDiscrete", "nvec": [0], "start": 0, "dtype": "int64"},
    {"type": "MultiBinary", "n": -1}, {"type": "Dict", "spaces": [["a", 1]]},
    {"type": "Dict", "spaces": [["a", {"type": "Discrete", "n": 2, "start": 0}]] * 2},
])
def test_what_is_not_a_recorded_space_is_refused(data):
    with pytest.raises(SpaceDataError):
        space_from_data(data)


def _edit_state(ck: Path, fn) -> None:
    """Edit a checkpoint's state.json and its manifest consistently (what someone who
    hands over a run directory can do)."""
    state = json.loads((ck / "state.json").read_text())
    fn(state)
    data = json.dumps(state).encode()
    (ck / "state.json").write_bytes(data)
    m = json.loads((ck / "manifest.json").read_text())
    m["files"]["state.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ck / "manifest.json").write_text(json.dumps(m))


def _train(run, maker, **config):
    base = dict(total_steps=256, n_envs=2, n_steps=64, batch_size=64, n_epochs=1, **TINY)
    base.update(config)
    agent = ppokit.train(maker, run_dir=run, **base)
    agent.close()


@pytest.mark.parametrize("case", ["box-normalised", "dict", "multidiscrete-start"])
def test_a_factory_run_loads_without_its_env_and_predicts(tmp_path, case):
    if case == "dict":
        maker, config = (lambda: DictGoal()), {}
        obs = [DictGoal().observation_space.sample() for _ in range(4)]
        batch = {k: np.stack([o[k] for o in obs]) for k in obs[0]}
    else:
        space = (spaces.Box(-1.0, 2.0, (2,), np.float64) if case == "box-normalised"
                 else spaces.MultiDiscrete([[2, 3], [4, 2]], start=[[1, -1], [0, 5]]))
        maker, config = factory(space), {"normalize_obs": case == "box-normalised"}
        obs = batch = np.random.default_rng(0).uniform(-1, 1, (4, 3)).astype(np.float32)
    _train(tmp_path / "run", maker, **config)
    bare = ppokit.load(tmp_path / "run")  # no env: the run's recorded spaces
    full = ppokit.load(tmp_path / "run", env=maker)
    assert bare.observation_space == full.observation_space
    assert bare.action_space == full.action_space
    a, _ = bare.predict(batch)
    b, _ = full.predict(batch)
    np.testing.assert_array_equal(a, b)
    assert all(full.action_space.contains(a[i, ...]) for i in range(len(a)))
    one, _ = bare.predict(obs[0])
    assert full.action_space.contains(one)
    for what in ("evaluate", "learn"):  # the environment is needed there, and said so
        with pytest.raises(UsageError, match=f"^{what}: needs the run's environment.*"
                                             "pass the factory again"):
            bare.evaluate(episodes=1) if what == "evaluate" else bare.learn(64)
    assert full.evaluate(episodes=1)["episodes"] == 1  # env= stays the way to evaluate
    bare.save(tmp_path / "saved")  # and what it saves loads without an env again
    np.testing.assert_array_equal(ppokit.load(tmp_path / "saved").predict(batch)[0], a)


def test_a_module_run_loads_without_importing_its_module(tmp_path, monkeypatch):
    from ppokit.envs import source

    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    marker = tmp_path / "imported.txt"
    write_module(tmp_path, "ppk_corr_spaces", "PpkCorridorSpaces-v0", marker=marker)
    _train(tmp_path / "run", "ppk_corr_spaces:PpkCorridorSpaces-v0")
    marker.unlink()
    monkeypatch.delitem(sys.modules, "ppk_corr_spaces")
    monkeypatch.setattr(source, "_IMPORTED", set())
    bare = ppokit.load(tmp_path / "run")
    assert bare.predict(np.array([0.0], np.float32))[0] in (0, 1)
    assert not marker.exists()  # nothing of the user's module was imported
    with pytest.raises(UsageError, match="pass --env ppk_corr_spaces:PpkCorridorSpaces-v0"):
        bare.evaluate(episodes=1)


def test_recorded_spaces_that_are_not_data_are_refused(tmp_path, capsys):
    _train(tmp_path / "run", factory(spaces.Discrete(2)))
    ck = latest_checkpoint(tmp_path / "run" / "checkpoints")
    _edit_state(ck, lambda st: st["spaces"]["observation"].update(shape=[2**30, 2**30]))
    with pytest.raises(UsageError) as exc:
        ppokit.load(tmp_path / "run")
    msg = str(exc.value)
    assert "\n" not in msg and "spaces.observation.shape" in msg


def test_a_checkpoint_without_recorded_spaces_still_loads_with_its_env(tmp_path):
    """Runs saved before the spaces were recorded: the env gives them, as before."""
    maker = factory(spaces.Discrete(3, start=-1))
    _train(tmp_path / "run", maker)
    ck = latest_checkpoint(tmp_path / "run" / "checkpoints")
    _edit_state(ck, lambda st: st.pop("spaces"))
    with pytest.raises(UsageError, match="pass the factory again"):
        ppokit.load(tmp_path / "run")
    agent = ppokit.load(tmp_path / "run", env=maker)
    assert agent.action_space == spaces.Discrete(3, start=-1)
