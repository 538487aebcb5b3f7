import base64
import io

import numpy as np
import pytest
import soundfile as sf
from openai import OpenAI

from ci.matrix import TEST_WATCHDOG
from ci.remote_server import RemoteServer


@pytest.fixture(scope="session")
def server(cell, platform, profile_name):
    """One server per matrix cell, shared by every online test of that cell, on the lane's profile."""
    args = ["--platform", platform, "--profile", profile_name]
    for o in cell.overrides + TEST_WATCHDOG:
        args += ["--set", o]
    with RemoteServer(args) as srv:
        yield srv


def client_for(srv) -> OpenAI:
    return OpenAI(base_url=srv.url + "/v1", api_key="EMPTY", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def client(server):
    return client_for(server)


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """int16 samples and sample rate, whatever the container."""
    if fmt == "pcm":
        audio, sr = sf.read(io.BytesIO(data), format="RAW", samplerate=24000, channels=1, subtype="PCM_16",
                            dtype="int16")
    else:
        audio, sr = sf.read(io.BytesIO(data), dtype="int16")
    return audio, sr


def data_url(audio: np.ndarray, sr: int = 24000) -> str:
    buf = io.BytesIO()
    sf.write(buf, audio, sr, format="WAV")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()
