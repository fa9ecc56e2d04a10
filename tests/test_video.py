"""`ppokit eval RUN_DIR --video DIR`: playable MP4s of the evaluation episodes whose returns
are the evaluation's; bad --video paths are one-line errors."""

import json
import os

import pytest

from ppokit.cli import main

pytest.importorskip("moviepy", reason="the video extra (pip install 'ppokit[video]')")
imageio = pytest.importorskip("imageio.v2")
pytest.importorskip("imageio_ffmpeg")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    rd = tmp_path_factory.mktemp("video") / "run"
    rc = main(["train", "--total-steps", "1024", "--seed", "3", "--run-dir", str(rd),
               "--set", "tensorboard=false", "--eval-episodes", "1", "--no-progress"])
    assert rc == 0
    return rd


def _frames(path):
    """Frame count and shape, decoded by the ffmpeg binary imageio-ffmpeg ships."""
    n, shape = 0, None
    with imageio.get_reader(path, format="FFMPEG") as reader:
        for frame in reader:
            n += 1
            shape = frame.shape
    return n, shape


def test_eval_video_writes_playable_mp4s_with_the_evaluation_returns(run_dir, tmp_path,
                                                                        capsys):
    assert main(["eval", str(run_dir), "--episodes", "2", "--seed", "7"]) == 0
    plain = json.loads((run_dir / "eval.json").read_text())
    capsys.readouterr()
    out = tmp_path / "videos"
    assert main(["eval", str(run_dir), "--episodes", "2", "--seed", "7",
                 "--video", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"2 MP4 files in {out}" in printed
    assert json.loads((run_dir / "eval.json").read_text())["returns"] == plain["returns"]
    meta = json.loads((out / "video.json").read_text())
    assert meta["returns"] == plain["returns"] and meta["seeds"] == [7, 8]
    assert sorted(os.listdir(out)) == ["eval-episode-0.mp4", "eval-episode-1.mp4",
                                       "video.json"]
    for name, ret in zip(meta["files"], meta["returns"]):
        path = out / name
        assert path.stat().st_size > 0
        n, shape = _frames(path)
        # CartPole's reward is 1 per step: one frame for the reset and one per step
        assert n > 0 and abs(n - (ret + 1)) <= 1, (name, n, ret)
        assert len(shape) == 3 and shape[2] == 3 and shape[0] > 0 and shape[1] > 0
    # a previous video output is replaced (one episode now: no stale second file)
    assert main(["eval", str(run_dir), "--episodes", "1", "--seed", "7",
                 "--video", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["eval-episode-0.mp4", "video.json"]


def test_bad_video_paths_are_one_line_errors(run_dir, tmp_path, capsys):
    a_file = tmp_path / "file.mp4"
    a_file.write_text("x")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep")
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    for bad in (a_file, busy, link, tmp_path / "no" / "such" / "dir"):
        capsys.readouterr()
        assert main(["eval", str(run_dir), "--episodes", "1", "--video", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--video" in err[0], (bad, err)
    assert (busy / "notes.txt").read_text() == "keep" and os.listdir(target) == []
    assert a_file.read_text() == "x"


def test_agent_evaluate_video(run_dir, tmp_path):
    import ppokit
    from ppokit.errors import UsageError

    agent = ppokit.load(run_dir)
    res = agent.evaluate(episodes=1, seed=11, video=tmp_path / "v")
    again = agent.evaluate(episodes=1, seed=11)
    assert res["video"]["returns"] == res["returns"] == again["returns"]
    assert (tmp_path / "v" / "eval-episode-0.mp4").stat().st_size > 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("")
    with pytest.raises(UsageError, match="^video:"):
        agent.evaluate(episodes=1, video=tmp_path / "other")


def test_a_factory_needs_rgb_array_rendering(tmp_path):
    import gymnasium as gym

    import ppokit
    from ppokit.errors import UsageError

    agent = ppokit.train(lambda: gym.make("CartPole-v1"), total_steps=2048,
                         run_dir=tmp_path / "run", progress=False)
    with pytest.raises(UsageError, match="^video: .*render_mode='rgb_array'"):
        agent.evaluate(episodes=1, video=tmp_path / "v")
    assert not (tmp_path / "v").exists()  # the directory it created is removed again
    again = ppokit.load(tmp_path / "run",
                        env=lambda: gym.make("CartPole-v1", render_mode="rgb_array"))
    res = again.evaluate(episodes=1, video=tmp_path / "v")
    assert res["video"]["returns"] == res["returns"]
    assert (tmp_path / "v" / "eval-episode-0.mp4").stat().st_size > 0
