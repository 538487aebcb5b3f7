"""A request the engine cannot honour is refused before it reaches a stage, naming the field."""
import math

import numpy as np
import pytest

from engine.request import MAX_INPUT_CHARS, RequestError, SpeechRequest


@pytest.mark.parametrize("field,value,message", [
    ("seed", 2**64, "between 0 and"),
    ("seed", -1, "between 0 and"),
    ("seed", 1.5, "an integer"),
    ("seed", True, "an integer"),
    ("temperature", 1e30, "between 0 and 10"),
    ("temperature", math.nan, "between 0 and 10"),
    ("temperature", math.inf, "between 0 and 10"),
    ("temperature", "hot", "a number"),
    ("top_k", 5000, "between 0 and 2048"),
    ("top_p", 0.0, "between"),
    ("repetition_penalty", 0, "between"),
    ("max_new_tokens", 0, "between 1 and"),
    ("max_new_tokens", 10**12, "between 1 and"),
    ("instructions", "x" * (MAX_INPUT_CHARS + 1), "at most 4096 characters"),
    ("ref_text", "x" * 2**20, "at most 4096 characters"),
])
def test_out_of_range_values_name_their_field(field, value, message):
    req = SpeechRequest("Hello.", **{field: value})
    with pytest.raises(RequestError, match=message) as err:
        req.validate()
    assert err.value.param == field


def test_values_at_the_edges_are_accepted():
    SpeechRequest("Hello.", seed=2**63 - 1, temperature=10.0, top_k=2048, top_p=1.0, max_new_tokens=1,
                  instructions="x" * MAX_INPUT_CHARS, ref_text=None).validate()
    SpeechRequest("Hello.", seed=np.int64(7), temperature=np.float32(0.5)).validate()
