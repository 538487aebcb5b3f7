import numpy as np
import pytest
import soundfile as sf


@pytest.fixture(scope="session")
def ref_audio(tmp_path_factory):
    """A reference clip the Base task can clone, written and read back as a real file."""
    t = np.arange(24000) / 24000
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * np.exp(-t)).astype(np.float32)
    path = tmp_path_factory.mktemp("ref") / "ref.wav"
    sf.write(path, audio, 24000)
    data, sr = sf.read(path, dtype="float32")
    return path, data, sr


