"""Byte-level text tokenizer and the conditioning vocabularies (voices, languages)."""
from __future__ import annotations

TEXT_BOS, TEXT_EOS, TEXT_INSTRUCT, TEXT_REF = 257, 258, 259, 260   # 256 is the (unused) text pad
TEXT_VOCAB = 512

VOICES = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
LANGUAGES = ("auto", "chinese", "english", "japanese", "korean", "german", "french", "russian",
             "portuguese", "spanish", "italian")
TASK_TYPES = ("CustomVoice", "VoiceDesign", "Base")


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def frames_for_text(text: str) -> int:
    """Synthetic weights speak at a fixed rate: about 15 UTF-8 bytes a second at 12.5 frames/s."""
    return max(2, round(len(text.encode("utf-8")) * 0.8) + 2)
