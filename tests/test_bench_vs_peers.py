"""bench.vs_peers' table (medians, ratios, groups, unavailable rows) on made-up runs, and
bench._peer_worker's argument parser; one real peer run, marked slow."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from bench import _peer_worker, vs_peers


def _runs(per100k, evals, deviations=()):
    return [vs_peers.normalize({"seconds": s / 1e5 * 100_000, "steps": 100_000,
                                "eval_mean": e, "deviations": list(deviations)})
            for s, e in zip(per100k, evals)]


def test_summarize_medians_and_mean_eval():
    s = vs_peers.summarize(_runs([12.0, 10.0, 11.0], [500.0, 400.0, 450.0]))
    assert s["median"] == 11.0 and s["min"] == 10.0 and s["max"] == 12.0
    assert s["eval"] == pytest.approx(450.0) and s["n"] == 3


def test_normalize_reads_train_s_of_ppokit_and_sb3_workers():
    rec = vs_peers.normalize({"train_s": 5.0, "steps": 50_000, "eval_mean": 1.0})
    assert rec["s_per_100k"] == pytest.approx(10.0) and rec["deviations"] == []


def test_markdown_table_ratios_groups_and_unavailable_rows():
    results = {
        "ppokit": {"recs": _runs([10.0, 12.0, 11.0], [500.0] * 3), "error": None},
        "ppokit sync": {"recs": _runs([20.0, 22.0, 24.0], [490.0, 500.0, 480.0]),
                        "error": None},
        "rlox": {"recs": _runs([33.0, 30.0, 36.0], [300.0, 200.0, 100.0],
                               ["clip constant"]), "error": None},
        "rlox-rust": {"recs": _runs([5.5, 5.5, 5.5], [500.0] * 3), "error": None},
        "skrl": {"recs": [], "error": "not installed (pip install skrl)"},
        "torchrl": {"recs": [], "error": "unavailable: ImportError: boom"},
    }
    table = vs_peers.markdown_table(results)
    lines = table.splitlines()
    row = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
           for ln in lines if ln.startswith("| ") and not ln.startswith("| library")}
    # ppokit default median 11, sync median 22; rlox median 33: 3x ppokit, 1.5x sync
    assert row["rlox"][:5] == ["33.00", "30.00–36.00", "3.00", "1.50", "200.0"]
    assert row["rlox"][5] == "clip constant"
    assert row["ppokit (vectorization=sync)"][:4] == ["22.00", "20.00–24.00", "2.00", "1.00"]
    assert row["ppokit (vectorization=sync)"][5] == "none"
    assert row["ppokit (default: Gymnasium's NumPy CartPoleVectorEnv)"][2] == "1.00"
    assert row["rlox (its Rust CartPole)"][2:4] == ["0.50", "0.25"]
    assert row["skrl"][0] == "not installed (pip install skrl)"
    assert row["torchrl"][0] == "unavailable: ImportError: boom"
    # two groups, the same-environment one first; the Rust env in the fastest group
    same, fastest = table.index("The same environment code"), table.index("fastest CartPole")
    assert same < table.index("| rlox |") < fastest < table.index("| rlox (its Rust")


def test_ratio_columns_empty_without_ppokit():
    table = vs_peers.markdown_table({"rlox": {"recs": _runs([30.0], [500.0]), "error": None}})
    assert "| rlox | 30.00 | 30.00–30.00 | – | – | 500.0 | none |" in table


def test_worker_parser_rejects_an_unknown_lib(capsys):
    with pytest.raises(SystemExit) as exc:
        _peer_worker.build_parser().parse_args(["--lib", "cleanrl"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_worker_parser_defaults():
    a = _peer_worker.build_parser().parse_args(["--lib", "torchrl"])
    assert (a.lib, a.seed, a.steps, a.cpu) == ("torchrl", 0, 100_000, None)
    assert set(_peer_worker.LIBS) == {"rlox", "rlox-rust", "skrl", "tianshou", "torchrl",
                                      "pufferlib"}


def test_vs_peers_rejects_an_unknown_lib():
    with pytest.raises(SystemExit):
        vs_peers.main(["--libs", "ppokit,cleanrl", "--skip-gae"])


@pytest.mark.slow
@pytest.mark.parametrize("lib", ["rlox", "torchrl"])
def test_peer_worker_runs_one_peer(lib):
    if importlib.util.find_spec(_peer_worker.MODULES[lib]) is None:
        pytest.skip(f"{lib} is not installed")
    out = subprocess.run([sys.executable, "-m", "bench._peer_worker", "--lib", lib,
                          "--steps", "2048", "--eval-episodes", "2"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["lib"] == lib and "error" not in rec
    assert rec["steps"] == 2048 and rec["seconds"] > 0
    assert rec["s_per_100k"] == pytest.approx(rec["seconds"] / 2048 * 1e5)
    assert len(rec["eval_returns"]) == 2 and 8 <= rec["eval_mean"] <= 500
    assert rec["threads"] == 1 and isinstance(rec["deviations"], list)
