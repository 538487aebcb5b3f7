"""The benchmark results file: merged by the scripts that measure, and complete where it is committed."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("benchmark_results", ROOT / "benchmarks" / "results.py")
results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results)


def _row(mode="online", runner="v2", concurrency=1, value=1.0):
    return {"mode": mode, "runner": runner, "cuda_graph": "on", "concurrency": concurrency,
            "audio_s_per_s": value, "ttfp_p50_ms": 10.0, "ttfp_p99_ms": 20.0, "rtf_mean": 0.5, "requests": 8,
            "mean_in_flight": 0.9, "codec_gmac_per_audio_s": 31.0, "wall_s": 3.0}


def test_a_run_replaces_the_rows_it_measured_and_keeps_the_rest(tmp_path, monkeypatch):
    monkeypatch.setenv("LANEKEEPER_COMMIT", "abc123")
    path = tmp_path / "r.json"
    results.record(str(path), [_row(), _row(concurrency=64)], "cpu")
    results.record(str(path), [_row(value=2.0), _row(mode="offline", concurrency=64)], "cpu")
    doc = json.loads(path.read_text())
    assert doc["commit"] == "abc123" and doc["gpu"].startswith("cpu") and doc["date"]
    keys = {(r["mode"], r["concurrency"]): r for r in doc["rows"]}
    assert set(keys) == {("online", 1), ("online", 64), ("offline", 64)}
    assert keys[("online", 1)]["audio_s_per_s"] == 2.0 and "wall_s" not in keys[("online", 1)]
    assert {r["commit"] for r in doc["rows"]} == {"abc123"} and "abc123" in results.table(doc)


def test_a_run_at_another_commit_starts_the_file_over(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    monkeypatch.setenv("LANEKEEPER_COMMIT", "abc123")
    results.record(str(path), [_row(), _row(concurrency=64)], "cpu")
    monkeypatch.setenv("LANEKEEPER_COMMIT", "def456")
    results.record(str(path), [_row(concurrency=128)], "cpu")
    doc = json.loads(path.read_text())
    assert [(r["concurrency"], r["commit"]) for r in doc["rows"]] == [(128, "def456")]


def test_a_row_without_a_field_is_refused_by_name(tmp_path):
    row = _row()
    del row["rtf_mean"]
    with pytest.raises(ValueError, match="lacks rtf_mean"):
        results.record(str(tmp_path / "r.json"), [row], "cpu")
    assert not (tmp_path / "r.json").exists()


GPU_FILES = sorted((ROOT / "benchmarks" / "results").glob("h[0-9]*.json"))   # one a GPU: h200.json, h100.json


def test_there_is_a_committed_gpu_file():
    assert GPU_FILES


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.name)
def test_a_committed_gpu_file_has_every_level(path):
    doc = json.loads(path.read_text())
    assert path.stem.upper() in doc["gpu"] and len(doc["commit"]) >= 7
    have = {(r["mode"], r["runner"], r["concurrency"]) for r in doc["rows"]}
    for runner, levels in (("v2", (1, 64, 128)), ("v1", (1, 64))):
        for c in levels:
            assert ("online", runner, c) in have, (runner, c)
    for r in doc["rows"]:
        assert r["audio_s_per_s"] > 0


@pytest.mark.parametrize("path", GPU_FILES, ids=lambda p: p.name)
def test_a_committed_gpu_file_is_one_commits_steady_levels_of_the_real_cost_codec(path):
    """Every row from one commit, each a steady level (at least 10 x C requests) of the real-cost codec,
    and the frame step measured at that commit too."""
    doc = json.loads(path.read_text())
    for r in doc["rows"]:
        assert set(results.FIELDS) <= set(r) and r["commit"] == doc["commit"], r
        assert r["requests"] >= 10 * r["concurrency"] and 24 <= r["codec_gmac_per_audio_s"] <= 36, r
    assert doc["frame_step"]["commit"] == doc["commit"]


def test_the_readme_timings_are_the_committed_file():
    """Every CPU timing in the README is the table the scripts' results file renders."""
    doc = results.load(str(ROOT / "benchmarks" / "results" / "cpu.json"))
    assert results.readme_timings((ROOT / "README.md").read_text()) == results.timing_table(doc) + "\n"
    assert any("engine start" in r["what"] for r in doc["rows"])


def test_timing_rows_merge_by_what(tmp_path, monkeypatch):
    monkeypatch.setenv("LANEKEEPER_COMMIT", "abc123")
    path = tmp_path / "t.json"
    results.record_timings(str(path), [{"what": "a", "command": "x", "seconds": 1}, {"what": "b", "command": "y",
                                                                                   "seconds": 2}])
    results.record_timings(str(path), [{"what": "a", "command": "x", "seconds": 3}])
    doc = results.load(str(path))
    assert {r["what"]: r["seconds"] for r in doc["rows"]} == {"a": 3, "b": 2} and "abc123" in results.timing_table(doc)
    assert {r["commit"] for r in doc["rows"]} == {"abc123"}
    with pytest.raises(ValueError, match="lacks seconds"):
        results.record_timings(str(path), [{"what": "c", "command": "z"}])
