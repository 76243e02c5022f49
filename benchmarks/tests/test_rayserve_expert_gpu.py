"""The expert peer's replica work on the GPU, without Serve (skipped without CUDA and torch)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _cuda() -> bool:
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


needs_cuda = pytest.mark.skipif(not _cuda(), reason="needs CUDA, torch and torchvision")


def _nvimgcodec() -> bool:
    try:
        from nvidia import nvimgcodec  # noqa: F401
    except Exception:
        return False
    return True


DECODERS = [
    "torchvision",
    pytest.param(
        "nvimgcodec",
        marks=pytest.mark.skipif(not _nvimgcodec(), reason="needs nvImageCodec"),
    ),
]


def _reference(core, bodies):
    """The same images through PIL and torchvision's transforms, eager, fp32."""
    import io

    import torch
    from PIL import Image
    from torchvision import transforms

    from benchmarks.peers.rayserve_expert import CROP, MEAN, SHORT_SIDE, STD

    t = transforms.Compose(
        [
            transforms.Resize(SHORT_SIDE, antialias=True),
            transforms.CenterCrop(CROP),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    return torch.stack([t(Image.open(io.BytesIO(b)).convert("RGB")) for b in bodies]).cuda()


@needs_cuda
@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("compiled", [False, True])
def test_expert_core_classifies_both_corpora_like_eager_torchvision(compiled, decoder):
    import torch

    from benchmarks.peers.rayserve_expert import ExpertCore
    from loadtest.corpus import corpus

    # torch's own threads: the test process is not a replica
    core = ExpertCore(buckets=(8, 32), compile=compiled, threads=None, decoder=decoder)
    photos = list(corpus("photos").bodies)
    bodies = photos + list(corpus("chelsea").bodies) * 3  # 19 images: padded to 32
    pending = core.submit(bodies)  # launched, not waited for
    answers = core.finish(pending)
    assert len(answers) == 19 and all(len(a["top_k"]) == 5 for a in answers)
    # rows go by size group: row r holds image order[r]
    assert sorted(pending.order) == list(range(19)) and pending.order[0] == 0
    x = core.inputs[32][:19].float()
    ref = _reference(core, bodies)[pending.order]
    # nvJPEG and libjpeg-turbo decode a little apart, torch's and PIL's antialiasing too
    assert (x - ref).abs().mean() < 0.08
    batched = core._run(32)[:19].float()
    assert torch.isfinite(batched).all()
    # each answer is its own image's: its classes hold its row's top 5 logits (ties either way)
    for r, i in enumerate(pending.order):
        classes = [t["class"] for t in answers[i]["top_k"]]
        torch.testing.assert_close(
            batched[r][classes], batched[r].topk(5).values, rtol=0, atol=1e-2
        )
    core.classify(bodies[:1])  # a batch of one rides the bucket of 8
    alone = core._run(8)[0].float()
    assert ((alone - batched[0]).norm() / batched[0].norm()) < 2e-2  # fp16, other kernels
    bad = core.classify([b"not a jpeg"] + bodies[:1])
    assert bad[0] == {"error": "not a JPEG the GPU decoder reads"} and len(bad[1]["top_k"]) == 5
    assert core.classify([b"not a jpeg"]) == [{"error": "not a JPEG the GPU decoder reads"}]


@needs_cuda
@pytest.mark.parametrize("decoder", DECODERS)
def test_expert_core_keeps_two_batches_in_flight_apart(decoder):
    """Two batches launched before either is waited for (as the replica pipelines them)
    answer as each alone: the second's decode does not overwrite the first's memory."""
    from benchmarks.peers.rayserve_expert import ExpertCore
    from loadtest.corpus import corpus

    core = ExpertCore(buckets=(8, 32), compile=False, threads=None, decoder=decoder)
    photos, chelsea = list(corpus("photos").bodies), list(corpus("chelsea").bodies)
    one, two = photos[:8] + chelsea * 4, chelsea * 3 + photos[8:]
    alone = [core.classify(one), core.classify(two)]
    for _ in range(3):
        p1 = core.submit(one)
        p2 = core.submit(two)
        got = [core.finish(p1), core.finish(p2)]
        for g, a in zip(got, alone, strict=True):
            assert [[t["class"] for t in x["top_k"]] for x in g] == [
                [t["class"] for t in x["top_k"]] for x in a
            ]
