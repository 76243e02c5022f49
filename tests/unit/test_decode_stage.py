"""The CPU decode stage's ``decode_many``: a call's images shared out over the pool's
threads (one pool call per thread), every image where it was and each bad one failing
alone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipeline.config import PipelineConfig
from pipeline.errors import FerryError
from pipeline.imaging import encode_jpeg, encode_png
from pipeline.models.repository import model_card
from pipeline.stages.decode import PreprocessStage
from pipeline.stages.messages import Encoded


@pytest.mark.parametrize("threads, n", [(1, 3), (2, 7), (3, 2), (4, 9)])
def test_every_image_in_its_place_and_each_bad_one_alone(threads, n):
    cfg = PipelineConfig.model_validate(
        {"models": [{"name": "digits", "source": "digits"}], "preprocess": {"threads": threads}}
    )
    stage = PreprocessStage(cfg)
    target = model_card(cfg.models[0]).target()
    rng = np.random.default_rng(n)
    items, bad = [], set()
    for i in range(n):
        img = rng.integers(0, 256, (9 + i, 11 + 2 * i, 3), dtype=np.uint8)
        data, ct = (encode_png(img), "image/png") if i % 2 else (encode_jpeg(img), "image/jpeg")
        item = Encoded.checked(data, ct, target, 1 << 24, 1 << 30)
        if i % 3 == 1:  # a sound header, a body cut short: fails when decoded
            item = Encoded(data[: len(data) // 2], ct, item.plan)
            bad.add(i)
        items.append(item)
    calls = []
    stage._decode_share = lambda m, share, f=stage._decode_share: calls.append(1) or f(m, share)
    imgs, owner, errors = asyncio.run(stage.decode_many("digits", items))
    assert len(calls) == min(n, threads)  # one pool call per thread, not per image
    assert set(errors) == bad and all(isinstance(e, FerryError) for e in errors.values())
    assert owner == [i for i in range(n) if i not in bad]
    for i, img in zip(owner, imgs, strict=True):
        it = items[i]
        assert np.array_equal(img, stage.decode_one("digits", it.data, it.content_type, it.plan))


def test_no_images_no_call():
    cfg = PipelineConfig.model_validate({"models": [{"name": "digits", "source": "digits"}]})
    assert asyncio.run(PreprocessStage(cfg).decode_many("digits", [])) == ([], [], {})
