"""The classify answer's JSON (``ingress_http.JsonAnswer``, orjson) against Starlette's
``JSONResponse``, which encoded it before: the same keys and values, to the last bit of
every float, whatever the labels, ids and numbers."""

from __future__ import annotations

import json
import math

import numpy as np
from fastapi.responses import JSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.ingress_http import JsonAnswer

finite = st.floats(allow_nan=False, allow_infinity=False)
answers = st.fixed_dictionaries(
    {
        "request_id": st.text(max_size=40),
        "model": st.text(min_size=1, max_size=20),
        "top_k": st.lists(
            st.fixed_dictionaries(
                {
                    "label": st.text(max_size=30),  # any unicode: UTF-8, not \\u escapes
                    "class": st.integers(0, 100_000),
                    "score": st.one_of(st.floats(0.0, 1.0), finite),
                }
            ),
            max_size=8,
        ),
        "timings_ms": st.dictionaries(st.sampled_from(["ingress", "gpu", "total"]), finite),
        "batch_size": st.integers(0, 1 << 20),
        "random_weights": st.booleans(),
    }
)


@settings(max_examples=300, deadline=None)
@given(answers)
def test_the_same_content_as_starlettes_json(answer):
    ours, theirs = JsonAnswer(answer), JSONResponse(answer)
    assert json.loads(ours.body) == json.loads(theirs.body) == answer
    assert list(json.loads(ours.body)) == list(answer)  # keys in the same order
    assert ours.media_type == theirs.media_type == "application/json"
    assert ours.headers["content-length"] == str(len(ours.body))


def test_a_tiny_score_may_be_spelled_differently_but_is_the_same_number():
    answer = {"top_k": [{"label": "9", "class": 9, "score": 2.7989461159450002e-05}]}
    assert json.loads(JsonAnswer(answer).body) == answer
    assert b'"label":"9"' in JsonAnswer(answer).body  # compact, as JSONResponse


def test_numpy_scalars_are_numbers_as_before():
    answer = {"gpu": np.float64(0.125), "batch_size": np.int64(8), "random_weights": np.bool_(True)}
    assert json.loads(JsonAnswer(answer).body) == {
        "gpu": 0.125,
        "batch_size": 8,
        "random_weights": True,
    }
    assert json.loads(JsonAnswer({"gpu": np.float64(0.1)}).body) == json.loads(
        JSONResponse({"gpu": np.float64(0.1)}).body
    )


def test_a_nan_score_is_null():
    # (JSONResponse refused NaN: the request failed with a 500; orjson writes null)
    body = json.loads(JsonAnswer({"score": math.nan, "inf": math.inf}).body)
    assert body == {"score": None, "inf": None}
