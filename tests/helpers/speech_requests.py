"""Speech requests of each task, as the end-to-end tests send them."""
from engine.request import SpeechRequest


TEXTS = [
    "Hello from the talker.",
    "The quick brown fox jumps over the lazy dog.",
    "Short one.",
    "Stage one turns codec frames into twenty-four kilohertz audio, chunk by chunk.",
]


def make_request(task: str, text: str, ref=None, **kw) -> SpeechRequest:
    if task == "CustomVoice":
        return SpeechRequest(text, task_type=task, voice=kw.pop("voice", "ryan"), **kw)
    if task == "VoiceDesign":
        return SpeechRequest(text, task_type=task, instructions="A warm, slow, low-pitched narrator.", **kw)
    _, audio, sr = ref
    return SpeechRequest(text, task_type="Base", ref_audio=audio, ref_sample_rate=sr,
                         ref_text="A short reference sentence.", **kw)
