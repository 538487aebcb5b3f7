"""The path-addressed profile document, and the pins derived from the profiles."""
import shutil

import pytest

from ci.cli import main
from engine.profile import pins
from engine.profile.resolve import resolve
from tests.helpers.repo import PROFILES_DIR
from engine.profile.document import MISSING, ProfileDoc, diff, platform_key, unflatten
from engine.profile.errors import ProfileError

pytestmark = pytest.mark.config

TEXT = """\
# a header comment
model_runner: v2   # the runner
connectors:
  shm:
    codec_chunk_frames: 25
stages:
  - stage_id: 1
    devices: "1"
  - stage_id: 0
    max_num_seqs: 4   # small
    default_sampling_params:
      stop_token_ids: [2150]
platforms:
  cuda: {}
  rocm:
    model_runner: v1
"""


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(TEXT)
    return ProfileDoc.load(path)


def test_flat_view_by_path_with_lines(doc):
    flat = doc.flat()
    assert flat["model_runner"].value == "v2" and flat["model_runner"].line == 2
    assert flat["stages.0.max_num_seqs"].value == 4 and flat["stages.0.max_num_seqs"].line == 10
    assert flat["stages.1.devices"].value == "1"
    assert flat["stages.0.default_sampling_params.stop_token_ids"].value == [2150]
    assert flat["platforms.rocm.model_runner"].line == 16 and flat["platforms.cuda"].value == {}
    assert flat["stages.0.stage_id"].line == 9      # a stage exists even when it sets nothing else
    assert doc.line("platforms.rocm.model_runner") == 16 and doc.line("stages.0") == 9
    assert doc.line("stages.0.max_model_len") == 9   # the deepest part the document has
    assert doc.get("connectors.shm.codec_chunk_frames") == 25 and doc.get("nope") is MISSING


def test_set_and_delete_keep_comments_and_style(doc):
    doc.set("model_runner", "v1")
    doc.set("stages.0.max_num_seqs", 8)
    doc.set("stages.0.default_sampling_params.stop_token_ids", [2150, 7])
    doc.set("platforms.cuda.model_runner", "v1")           # into an empty flow mapping
    doc.set("platforms.npu.stages.0.max_num_seqs", 2)      # a new section and a new stage entry
    doc.delete("connectors.shm.codec_chunk_frames")
    text = doc.dump()
    assert "# a header comment" in text and "# the runner" in text and "# small" in text
    assert "stop_token_ids: [2150, 7]" in text
    again = ProfileDoc.load("again.yaml", text).flat()
    assert again["model_runner"].value == "v1" and again["stages.0.max_num_seqs"].value == 8
    assert again["platforms.cuda.model_runner"].value == "v1"
    assert again["platforms.npu.stages.0.max_num_seqs"].value == 2
    assert "connectors.shm.codec_chunk_frames" not in again
    with pytest.raises(ProfileError, match="not a mapping"):
        doc.set("model_runner.deeper", 1)


def test_diff_and_unflatten(doc):
    old = doc.flat()
    doc.set("model_runner", "v1")
    doc.delete("platforms.rocm.model_runner")
    changed = diff(old, doc.flat())
    assert changed == {"model_runner": ("v2", "v1"), "platforms.rocm.model_runner": ("v1", MISSING),
                       "platforms.rocm": (MISSING, {})}     # the section stays, empty
    assert diff({"a": 1}, {"a": True}) == {"a": (1, True)}      # a bool is not the number it equals
    assert platform_key("platforms.rocm.stages.0.max_num_seqs") == "stages.0.max_num_seqs"
    tree = unflatten({k: leaf.value for k, leaf in doc.flat().items() if not k.startswith("platforms")})
    assert [s["stage_id"] for s in tree["stages"]] == [0, 1] and tree["stages"][0]["max_num_seqs"] == 4


@pytest.mark.parametrize("text,message,line", [
    ("a: 1\na: 2\n", "duplicate key", 2),
    ("stages:\n  - stage_id: 0\n  - stage_id: 0\n", "duplicate stage_id 0", 3),
    ("stages:\n  - max_num_seqs: 1\n", "needs an integer stage_id", 2),
    ("- just a list\n", "expected a mapping at the top level", 1),
    ("a: [\n", "YAML syntax error", 2),
])
def test_bad_documents_say_where(text, message, line, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as err:
        ProfileDoc.load(path).flat()
    assert message in str(err.value) and f"{path}:{line}" in str(err.value)


def test_connectors_must_be_one_link(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("connectors: {a: {}, b: {}}\nstages:\n  - {stage_id: 0, output_connector: a}\n"
                    "  - {stage_id: 1, input_connector: b}\n")
    with pytest.raises(ProfileError, match="stage 1 reads from connector 'b' but stage 0 writes to 'a'"):
        resolve(path, platform="cpu")


# ---------------------------------------------------------------- pins

def _profiles_copy(tmp_path):
    dest = tmp_path / "profiles"
    shutil.copytree(PROFILES_DIR, dest)
    return dest


def test_pin_check_reports_drift_as_a_diff(tmp_path, capsys):
    profiles = _profiles_copy(tmp_path)
    assert main(["profile", "pin", "--check", "--profiles-dir", str(profiles)]) == 0
    capsys.readouterr()
    doc = ProfileDoc.load(profiles / "qwen3_tts.yaml")
    doc.set("stages.0.max_num_seqs", 32)
    doc.save()
    assert main(["profile", "pin", "--check", "--profiles-dir", str(profiles)]) == 1
    out = capsys.readouterr()
    assert "qwen3_tts stages.0.max_num_seqs (every platform): pinned 64, resolves to 32" in out.out
    assert "qwen3_tts_mrv2 stages.0.max_num_seqs (every platform): pinned 64, resolves to 32" in out.out
    assert "high_concurrency" not in out.out
    assert "run `lanekeeper profile pin`" in out.err
    # qwen3_tts_mrv2 inherits the key, the high-concurrency profiles set their own
    assert main(["profile", "pin", "--profiles-dir", str(profiles)]) == 0
    assert "pinned qwen3_tts, qwen3_tts_mrv2" in capsys.readouterr().out
    assert pins.drift(profiles) == []
    text = (profiles / "pins.yaml").read_text()
    assert text.startswith(pins.HEADER) and "lanekeeper profile pin" in text.splitlines()[0]
    (profiles / "pins.yaml").write_text(text.replace("# Generated", "# Made"))
    assert "not as `lanekeeper profile pin` writes it" in pins.drift(profiles)[0]


def test_pin_rejects_a_broken_pins_file(tmp_path, capsys):
    profiles = _profiles_copy(tmp_path)
    (profiles / "pins.yaml").write_text("qwen3_tts: [\n")
    assert main(["profile", "pin", "--check", "--profiles-dir", str(profiles)]) == 2
    assert "pins.yaml: not valid YAML" in capsys.readouterr().err
