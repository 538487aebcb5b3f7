import numpy as np
import pytest
import soundfile as sf

from engine.request import SpeechRequest

TEXTS = [
    "Hello from the talker.",
    "The quick brown fox jumps over the lazy dog.",
    "Short one.",
    "Stage one turns codec frames into twenty-four kilohertz audio, chunk by chunk.",
]


@pytest.fixture(scope="session")
def ref_audio(tmp_path_factory):
    """A reference clip the Base task can clone, written and read back as a real file."""
    t = np.arange(24000) / 24000
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * np.exp(-t)).astype(np.float32)
    path = tmp_path_factory.mktemp("ref") / "ref.wav"
    sf.write(path, audio, 24000)
    data, sr = sf.read(path, dtype="float32")
    return path, data, sr


def make_request(task: str, text: str, ref=None, **kw) -> SpeechRequest:
    if task == "CustomVoice":
        return SpeechRequest(text, task_type=task, voice=kw.pop("voice", "ryan"), **kw)
    if task == "VoiceDesign":
        return SpeechRequest(text, task_type=task, instructions="A warm, slow, low-pitched narrator.", **kw)
    _, audio, sr = ref
    return SpeechRequest(text, task_type="Base", ref_audio=audio, ref_sample_rate=sr,
                         ref_text="A short reference sentence.", **kw)
