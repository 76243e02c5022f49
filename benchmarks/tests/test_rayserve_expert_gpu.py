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
@pytest.mark.parametrize("compiled", [False, True])
def test_expert_core_classifies_both_corpora_like_eager_torchvision(compiled):
    import torch

    from benchmarks.peers.rayserve_expert import ExpertCore
    from loadtest.corpus import corpus

    core = ExpertCore(buckets=(8, 32), compile=compiled)
    photos = list(corpus("photos").bodies)
    bodies = photos + list(corpus("chelsea").bodies) * 3  # 19 images: padded to 32
    answers = core.classify(bodies)
    assert len(answers) == 19 and all(len(a["top_k"]) == 5 for a in answers)
    x = core.inputs[32][:19].float()
    ref = _reference(core, bodies)
    # nvJPEG and libjpeg-turbo decode a little apart, torch's and PIL's antialiasing too
    assert (x - ref).abs().mean() < 0.08
    batched = core._run(32)[:19].float()
    assert torch.isfinite(batched).all()
    core.classify(bodies[:1])  # a batch of one rides the bucket of 8
    alone = core._run(8)[0].float()
    assert ((alone - batched[0]).norm() / batched[0].norm()) < 2e-2  # fp16, other kernels
    bad = core.classify([b"not a jpeg"] + bodies[:1])
    assert bad[0] == {"error": "not a JPEG the GPU decoder reads"} and len(bad[1]["top_k"]) == 5
