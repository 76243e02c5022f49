"""Streams of every task, without Ray: the task table (each task's options read from the
stream's query as its route reads them, the model's own task by default, the refusals), each
frame's spec from its own size, the answer's fields, and the message framing -- an image or
a mask is its JSON header followed at once by one binary message, in frame order -- through
the real stream route on the virtual-time loop."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from deployments import stream_tasks
from deployments.streams_route import StreamHub
from loadtest import streams as load
from pipeline.errors import InvalidInput, NotAcceptable, PayloadTooLarge, Unavailable
from pipeline.imaging import encode_jpeg
from pipeline.stages.messages import Answer, Encoded, Timings
from pipeline.streams import FrameAnswer, Outbox, Stream, StreamParams
from pipeline.tasks import options
from pipeline.tasks.options import PARAMS
from tests.integration.helpers import png_header_claiming
from tests.unit import virtual_time
from tests.unit.stream_fakes import Client, Downstream, Ingress, open_stream, png


def plan(model: str, **query: str) -> stream_tasks.FramePlan:
    return asyncio.run(stream_tasks.plan_of(Ingress(Downstream()), model, query))


def frame(ingress: Ingress, model: str, data: bytes) -> Encoded:
    ic = ingress.cfg.ingress
    return Encoded.checked(data, None, ingress.targets[model], ic.max_pixels, 1 << 40)


def test_every_task_is_served_with_its_routes_own_parameters():
    assert sorted(stream_tasks.TASKS) == ["classify", "detect", "image", "segment"]
    for name in ("image", "segment", "detect"):
        assert stream_tasks.TASKS[name].params == PARAMS[name]
    assert stream_tasks.TASKS["image"].formats == ("jpeg", "png", "webp")
    assert stream_tasks.TASKS["segment"].formats == ("png", "json")


def test_the_default_task_is_the_models_own():
    assert {m: plan(m).task.name for m in ("digits", "filter", "seg", "yolo", "raw")} == {
        "digits": "classify",
        "filter": "image",  # told by its outputs
        "seg": "segment",
        "yolo": "detect",  # named by its entry
        "raw": "classify",  # tensors: classify answers what it can, as its route does
    }
    assert plan("digits", top_k="3").spec.top_k == 3


def test_options_are_read_as_the_routes_read_them():
    p = plan("filter", quality="70", size="model", format="jpeg", fps="10", deadline_ms="200")
    assert (p.options.quality, p.options.size, p.options.media_type) == (70, "model", "image/jpeg")
    assert plan("filter").options.media_type is None  # each frame's own format
    assert plan("seg", format="json").options.format == "json"
    assert plan("seg").format == "png"
    d = plan("yolo", score_threshold="0.5", iou_threshold="0.3", max_boxes="7").options
    assert d.nms_key() == (0.5, 0.3, 7)


@pytest.mark.parametrize(
    "model, query, error, match",
    [
        ("digits", {"task": "image"}, InvalidInput, "answers task 'classify', not 'image'"),
        ("filter", {"task": "classify"}, InvalidInput, "answers task 'image'"),
        ("filter", {"task": "paint"}, InvalidInput, "no such task"),
        ("filter", {"quality": "0"}, InvalidInput, "quality out of range"),
        ("filter", {"top_k": "3"}, InvalidInput, "unknown query parameter"),
        ("digits", {"quality": "9"}, InvalidInput, "unknown query parameter"),
        ("filter", {"format": "gif"}, InvalidInput, "format not offered"),
        ("seg", {"format": "jpeg"}, InvalidInput, "format not offered"),
        ("yolo", {"format": "png"}, InvalidInput, "format not offered"),
        ("yolo", {"max_boxes": "5000"}, InvalidInput, "max_boxes out of range"),
    ],
)
def test_a_bad_query_is_refused_naming_what_is_wrong(model, query, error, match):
    with pytest.raises(error, match=match):
        plan(model, **query)


def test_an_image_format_without_an_encoder_is_not_acceptable(monkeypatch):
    monkeypatch.setattr(options, "available_media_types", lambda: ("image/jpeg", "image/png"))
    with pytest.raises(NotAcceptable):
        plan("filter", format="webp")


def test_a_task_the_inference_stage_cannot_tell_now_is_a_refusal_to_retry():
    ingress = Ingress(Downstream())

    async def lost(model: str):
        raise RuntimeError("the inference replica is being replaced")

    ingress._signature = lost
    with pytest.raises(Unavailable, match="could not be asked"):
        asyncio.run(stream_tasks.plan_of(ingress, "filter", {}))


def test_each_frames_spec_comes_from_its_own_size_and_format():
    ingress = Ingress(Downstream())
    p = asyncio.run(stream_tasks.plan_of(ingress, "filter", {"quality": "80"}))
    a = p.spec_for(frame(ingress, "filter", png(64, 64, 3)))
    b = p.spec_for(frame(ingress, "filter", encode_jpeg(np.zeros((96, 80, 3), np.uint8))))
    assert (a.kind, a.options.source, a.options.media_type) == ("image", (64, 64), "image/png")
    assert (b.options.source, b.options.media_type, b.options.quality) == (
        (96, 80),
        "image/jpeg",
        80,
    )
    assert a.task is b.task and a.task.kind == "image"
    with pytest.raises(PayloadTooLarge) as e:  # ~1 GB of answer: that frame's 413
        p.spec_for(frame(ingress, "filter", png_header_claiming(6000, 6000)))
    assert e.value.fields["hint"] == "size=model"
    model = asyncio.run(stream_tasks.plan_of(ingress, "filter", {"size": "model"}))
    assert model.spec_for(frame(ingress, "filter", png_header_claiming(6000, 6000))).kind == "image"
    c = asyncio.run(stream_tasks.plan_of(ingress, "digits", {}))
    assert c.spec_for(frame(ingress, "digits", png())) is c.spec  # classify: one for all


def test_an_answers_fields_are_its_routes():
    t = {"total": 1.0}
    head, media = stream_tasks.fields(Answer(Timings(), 3, media=b"PNG", media_type="image/png"), t)
    assert media == b"PNG"
    assert head == {
        "media_type": "image/png",
        "timings_ms": t,
        "batch_size": 3,
        "random_weights": False,
    }
    boxes = {"boxes": [], "height": 4, "width": 5}
    head, media = stream_tasks.fields(Answer(Timings(), 2, result=boxes), t)
    assert media is None and head == {
        **boxes,
        "timings_ms": t,
        "batch_size": 2,
        "random_weights": False,
    }
    head, media = stream_tasks.fields(Answer(Timings(), 1, top_k=[]), t)
    assert media is None and head["top_k"] == [] and "result" not in head


def test_an_answer_with_media_says_its_length_and_keeps_its_place():
    m = FrameAnswer(4, {"media_type": "image/png"}, b"12345")
    assert m.body() == {"frame": 4, "media_type": "image/png", "bytes": 5}
    assert FrameAnswer(4, {"top_k": []}).body() == {"frame": 4, "top_k": []}
    s = Stream(StreamParams(10, 1, 4, 8, 5), 0.0, lambda h: False)
    for n in range(2):
        s.arrive(0.0)
        s.hold(n, None, 1.0)
    s.answered(1, {"media_type": "image/png"}, b"one")
    assert s.take(0.0) == []  # frame 0 first
    s.answered(0, {"media_type": "image/png"}, b"zero")
    assert [(m.frame, m.media) for m in s.take(0.0)] == [(0, b"zero"), (1, b"one")]
    assert isinstance(Outbox().take(), list)


def test_a_stream_of_images_answers_a_header_then_the_bytes_of_each_frame_in_order():
    async def main():
        down = Downstream()
        down.gate.set()
        ingress = Ingress(down)
        hub, client = StreamHub(ingress), Client()
        task = open_stream(hub, client, b"fps=10&deadline_ms=5000", model="filter")
        client.frame(png(64, 64, 3))
        client.frame(png_header_claiming(6000, 6000))  # its answer would not fit: its 413
        client.frame(encode_jpeg(np.zeros((96, 80, 3), np.uint8)))
        await asyncio.sleep(0.5)
        client.text({"end": True})
        await task
        return client

    client = virtual_time.run(main())
    wire = client.wire()
    assert wire[0] == {**wire[0], "frame": 0, "media_type": "image/png", "bytes": len(wire[1])}
    assert wire[1] == b"64x64 image/png"
    assert wire[2]["frame"] == 1 and wire[2]["type"] == "PayloadTooLarge", wire[2]
    assert wire[2]["detail"]["answer_height"] == 6000  # the answer's memory, not the decode's
    assert wire[3]["frame"] == 2 and wire[3]["media_type"] == "image/jpeg"
    assert wire[4] == b"96x80 image/jpeg" and len(wire) == 5
    assert {"timings_ms", "batch_size", "random_weights"} <= set(wire[0])
    assert client.close()["code"] == 1000


def test_json_tasks_answer_one_text_message_a_frame():
    async def main(model: str, query: bytes):
        down = Downstream()
        down.gate.set()
        hub, client = StreamHub(Ingress(down)), Client()
        task = open_stream(hub, client, b"fps=10&deadline_ms=5000&" + query, model=model)
        client.frame(png(64, 64, 3))
        client.frame(png(32, 48, 3))
        await asyncio.sleep(0.5)
        client.text({"end": True})
        await task
        return client.wire()

    for model, query in (("yolo", b"score_threshold=0.5"), ("seg", b"format=json")):
        wire = virtual_time.run(main(model, query))
        assert [(m["frame"], m["height"], m["width"]) for m in wire] == [(0, 64, 64), (1, 32, 48)]
    wire = virtual_time.run(main("seg", b""))  # a mask: a PNG, header then bytes
    assert wire[0]["media_type"] == "image/png" and wire[1] == b"64x64 image/png"


class FakeSocket:
    """A client's socket as the load generator reads it: the messages given, then the close."""

    def __init__(self, messages: list[str | bytes]) -> None:
        self.messages, self.sent = messages, []

    async def __aiter__(self):
        for m in self.messages:
            yield m

    async def send(self, text: str) -> None:
        self.sent.append(text)


def test_the_load_generator_counts_an_image_answer_once_and_skips_its_bytes():
    st = load.StreamStats(sent_at=[time.perf_counter()] * 3)
    header = json.dumps({"frame": 0, "media_type": "image/png", "bytes": 3})
    ws = FakeSocket([header, b"PNG", json.dumps({"dropped": [1, 2], "reason": "late"})])
    asyncio.run(load._read(ws, st))
    assert (st.answered, st.errors, st.dropped, len(st.latency_ms)) == (1, 0, {"late": 2}, 1)


def test_the_load_generator_counts_the_answers_buffered_before_the_services_close():
    """A real WebSocket: the service sends 12 answers and closes before the client reads one.
    The client's receipts then fail; the answers already received still count (CI on b36e3b2
    lost a stream's last frame that way)."""
    import websockets
    from websockets.protocol import State

    n = 12

    async def serve(ws) -> None:
        for i in range(n):
            await ws.send(json.dumps({"frame": i, "label": "x"}))
        await ws.close(1000, "end of stream")

    async def main() -> load.StreamStats:
        st = load.StreamStats(sent_at=[time.perf_counter()] * n)
        async with websockets.serve(serve, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with websockets.connect(f"ws://127.0.0.1:{port}") as ws:
                while ws.state is not State.CLOSED:  # everything is here before a read
                    await asyncio.sleep(0.01)
                await load._read(ws, st)
        return st

    st = asyncio.run(main())
    assert (st.answered, st.errors, len(st.latency_ms)) == (n, 0, n)
