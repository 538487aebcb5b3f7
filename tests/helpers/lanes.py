"""Lanes files for tests that run a lane."""


def one_lane_file(tmp_path, key: str, keyword: str, profile: str | None = None, budget: int = 600):
    """A lanes file with one merge-only lane over the offline CustomVoice tests that `keyword` selects."""
    path = tmp_path / "lanes.yaml"
    path.write_text(f"""\
lanes:
  - key: {key}
    label: "TTS · {key}"
    trigger: merge_only
    paths: [tests/e2e/offline/test_custom_voice.py]
    markers: merge_only
    keyword: "{keyword}"
    timeout: 120
    budget: {budget}
""" + (f"    profile: {profile}\n" if profile else ""))
    return path
