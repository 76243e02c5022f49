"""preprocess.overlap_rounds: a round's rows come back as ``Landing``s while its GPU work
may still run; ``_landed`` gives each call its rows only once their round is done, or the
error its wait ended in. (The whole path runs on a GPU: tests/gpu/test_preprocess_gpu.py.)"""

from __future__ import annotations

import asyncio

from pipeline.config import PipelineConfig
from pipeline.errors import FerryError, TransportError
from pipeline.preprocess_gpu.rounds import RETRY, Landing, landed


def test_rows_wait_for_their_round_and_the_rest_pass_through():
    async def main():
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        refused = FerryError("not an image")
        results = [Landing("a", first), RETRY, refused, Landing("b", second), Landing("c", first)]
        task = asyncio.ensure_future(landed(results))
        await asyncio.sleep(0.01)
        assert not task.done()  # neither round is complete
        first.set_result(None)
        await asyncio.sleep(0.01)
        assert not task.done()  # "b"'s round is not
        second.set_result(None)
        return await task

    out = asyncio.run(main())
    assert out[0] == "a" and out[1] is RETRY and isinstance(out[2], FerryError)
    assert out[3:] == ["b", "c"]


def test_a_failed_round_fails_only_its_rows():
    async def main():
        loop = asyncio.get_running_loop()
        bad, good = loop.create_future(), loop.create_future()
        bad.set_exception(TransportError("the round's event never came"))
        good.set_result(None)
        return await landed([Landing("x", bad), Landing("y", good)])

    out = asyncio.run(main())
    assert isinstance(out[0], TransportError) and out[1] == "y"


def test_without_landings_the_results_are_returned_as_they_are():
    results = ["r", RETRY]
    assert asyncio.run(landed(results)) is results


def test_the_option_is_off_by_default_and_set_from_the_config():
    base = {"models": [{"name": "digits", "arch": "digits"}]}
    assert PipelineConfig.model_validate(base).preprocess.overlap_rounds is False
    on = PipelineConfig.model_validate({**base, "preprocess": {"overlap_rounds": True}})
    assert on.preprocess.overlap_rounds is True
