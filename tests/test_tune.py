"""`ppokit tune`: the search file's errors, a small local search and its outputs."""

import csv

import optuna  # noqa: F401 - the tune extra, which `make test` installs
import pytest
import tomllib

from ppokit.cli import main
from ppokit.commands.tune import read_search, to_toml
from ppokit.errors import UsageError

SMALL = """
[search]
learning_rate = {low = 1e-4, high = 1e-2, log = true}
n_epochs = {low = 1, high = 3}
gae_lambda = {choices = [0.8, 0.95]}
[fixed]
n_envs = 4
n_steps = 32
batch_size = 64
[tune]
eval_every = 1
eval_episodes = 2
startup_trials = 1
warmup_evals = 1
sampler = "random"
"""


def _file(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text, expected", [
    ("[search]\n", "names no key"),
    ("[search]\nlr = {low = 1e-4, high = 1e-2}\n", "did you mean 'learning_rate'"),
    ("[search]\nlearning_rate = {low = 1e-2, high = 1e-4}\n", "low must be below high"),
    ("[search]\nlearning_rate = {low = 0, high = 1e-2, log = true}\n", "log = true needs"),
    ("[search]\nlearning_rate = {lo = 0, high = 1e-2}\n", "unknown field 'lo'"),
    ("[search]\nlearning_rate = 0.01\n", "expected a table"),
    ("[search]\nn_epochs = {low = 1.5, high = 3}\n", "integer key"),
    ("[search]\ngae_lambda = {choices = []}\n", "non-empty list"),
    ("[search]\nactivation = {low = 1, high = 2}\n", "search it with choices"),
    ("[search]\nn_epochs = {low = 1, high = 3}\n[fixed]\nn_epochs = 2\n", "both searched"),
    ("[search]\nn_epochs = {low = 1, high = 3}\n[tune]\npruner = 'hyperband'\n",
     "median or none"),
    ("[search]\nn_epochs = {low = 1, high = 3}\n[tune]\ntrials = 3\n", "unknown key"),
    ("[search]\nn_epochs = {low = 1, high = 3}\n[other]\n", "unknown table"),
    ("[search\n", "--search"),
])
def test_bad_search_files_are_one_line_errors(tmp_path, text, expected):
    with pytest.raises(UsageError, match=None) as exc:
        read_search(_file(tmp_path, text))
    msg = str(exc.value)
    assert expected in msg and "\n" not in msg.strip()


def test_bad_values_are_named_before_any_trial(tmp_path, capsys):
    path = _file(tmp_path, "[search]\nactivation = {choices = ['tanh', 'gelu']}\n")
    assert main(["tune", "--search", path, "--trials", "1",
                 "--run-dir", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "activation" in err and "'gelu'" in err and len(err.strip().splitlines()) == 1
    assert main(["tune", "--search", str(tmp_path / "missing.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_toml_of_a_config_reads_back():
    values = {"learning_rate": 1e-3, "net_arch": (64, 64), "target_kl": None,
              "env_kwargs": {"size": 8}, "normalize_obs": True, "env_id": "CartPole-v1"}
    back = tomllib.loads(to_toml(values, "header"))
    from ppokit.algos import resolve_config

    cfg = resolve_config(toml_values=back)
    assert cfg.learning_rate == 1e-3 and cfg.net_arch == (64, 64) and cfg.target_kl is None
    assert cfg.normalize_obs is True


def test_a_small_search_writes_table_best_config_and_plot(tmp_path, capsys):
    root = tmp_path / "tune"
    rc = main(["tune", "--search", _file(tmp_path, SMALL), "--trials", "4",
               "--total-steps", "512", "--run-dir", str(root), "--eval-episodes", "2"])
    assert rc == 0
    rows = list(csv.DictReader((root / "trials.csv").open()))
    assert [int(r["number"]) for r in rows] == [0, 1, 2, 3]
    assert {r["state"] for r in rows} <= {"complete", "pruned", "failed"}
    complete = [r for r in rows if r["state"] == "complete"]
    assert complete and all(float(r["value"]) > 0 for r in complete)
    for r in rows:
        assert 1e-4 <= float(r["learning_rate"]) <= 1e-2 and int(r["n_epochs"]) in (1, 2, 3)
        assert float(r["gae_lambda"]) in (0.8, 0.95)
    best = max(complete, key=lambda r: float(r["value"]))
    values = tomllib.loads((root / "best.toml").read_text())
    assert values["learning_rate"] == pytest.approx(float(best["learning_rate"]))
    assert values["n_envs"] == 4 and values["env_id"] == "CartPole-v1"
    assert (root / "search.png").stat().st_size > 0
    # the best configuration trains as it is
    assert main(["train", "--config", str(root / "best.toml"), "--run-dir",
                 str(tmp_path / "again"), "--eval-episodes", "1", "--no-progress"]) == 0
    assert "best trial" in capsys.readouterr().out
