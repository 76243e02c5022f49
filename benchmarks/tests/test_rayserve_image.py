"""The image workload's peer (benchmarks/peers/rayserve_image.py) on the CPU: the module and
its app without torch, its pure helpers, and -- on CPU torch -- its weights and the tensor
work around the model, checked against Ferry's own CPU path (Pillow's bilinear resizes,
ImageNet normalisation), so the two systems do the same work. Its decode, compile and
encode need CUDA and torchvision: test_rayserve_image_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg

from benchmarks import image_workload as iw
from benchmarks.loadgen import jpeg_size, server_timing
from benchmarks.peers import rayserve_image as peer
from benchmarks.tests.torchless import assert_builds_without_torch
from pipeline.imaging import fit
from pipeline.resize_plan import Target

MEAN, STD = np.array(peer.MEAN), np.array(peer.STD)


def test_the_module_and_its_app_load_without_torch():
    assert_builds_without_torch("rayserve_image", {"replicas": 8})


def test_the_app_shares_the_gpu_and_batches_as_ferry_does():
    app = peer.build_app({"replicas": 8})._bound_deployment
    assert app.num_replicas == 8 and app.ray_actor_options["num_gpus"] == 0.125
    assert app.max_ongoing_requests >= peer.BUCKETS[-1]  # a full batch can form
    # Ferry's model file, torch's own threads, the GPU
    assert app.init_args == (iw.UNET_PATH, None, "cuda")
    four = peer.build_app({"replicas": 4, "model": "/m.pt2", "threads": "1"})._bound_deployment
    assert four.ray_actor_options["num_gpus"] == 0.25 and four.init_args == ("/m.pt2", 1, "cuda")
    cpu = peer.build_app({"replicas": 2, "device": "cpu"})._bound_deployment  # (the tests')
    assert cpu.ray_actor_options["num_gpus"] == 0 and cpu.init_args[2] == "cpu"
    # a batch holds at most 64 frames, as Ferry's config lets it
    assert peer.BUCKETS[-1] == 64
    assert [peer.bucket_of(n, peer.BUCKETS) for n in (1, 8, 9, 17, 33, 64)] == [
        8,
        8,
        16,
        32,
        64,
        64,
    ]
    with pytest.raises(ValueError):
        peer.bucket_of(65, peer.BUCKETS)


def test_pure_helpers():
    sizes = [(720, 1280), None, (480, 640), (720, 1280)]
    assert peer.size_groups(sizes) == {(720, 1280): [0, 3], (480, 640): [2]}
    assert peer.size_groups([None, None]) == {}
    assert peer.split_bytes(b"aabbbc", [2, 3, 1]) == [b"aa", b"bbb", b"c"]
    assert peer.split_bytes(np.frombuffer(b"xyz", np.uint8), [1, 2]) == [b"x", b"yz"]
    assert peer.split_bytes(b"", []) == []
    with pytest.raises(ValueError):
        peer.split_bytes(b"abc", [1, 1])
    assert peer.place([b"a", b"b"], [True, False, True]) == [b"a", None, b"b"]
    assert peer.place([], [False]) == [None]
    with pytest.raises(ValueError):
        peer.place([b"a", b"b"], [True])
    # the load generator reads the peer's timings as it reads Ferry's
    assert server_timing(peer.timing_header(0.0012, 0.0205)) == {"queue": 1.2, "batch": 20.5}


def test_once_per_machine_runs_the_first_alone_then_each(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    calls = []
    peer.once_per_machine("t", lambda: calls.append(1))
    peer.once_per_machine("t", lambda: calls.append(2))
    assert calls == [1, 2] and (tmp_path / "ferry-image-peer-t.warm").exists()


# ----------------------------------------------------------------------- on CPU torch

torch_mark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def small_unet(tmp_path_factory):
    """Ferry's model file at width 4 (the benchmark's is 32): its path, and the module."""
    torch = pytest.importorskip("torch")
    path = str(tmp_path_factory.mktemp("unet") / "unet.pt2")
    iw.export_unet(path, width=4, seed=3)
    return path, torch.export.load(path).module()


@torch_mark
def test_the_peer_loads_the_weights_of_ferrys_file(small_unet):
    import torch

    path, exported = small_unet
    net = peer.load_unet(path)
    assert isinstance(net, torch.nn.Module) and not isinstance(net, torch.fx.GraphModule)
    x = torch.randn(2, 3, iw.UNET_SIZE, iw.UNET_SIZE)
    with torch.no_grad():
        assert torch.equal(net(x), exported(x))


@torch_mark
def test_the_peers_work_around_the_model_is_ferrys(small_unet):
    """A real 1280x720 frame: stretched to 256 and normalised as Ferry's CPU path does
    (Pillow's antialiased bilinear), and the model's output turned back into a frame of the
    input's size as Ferry does (denormalised, clipped, Pillow's bilinear resize)."""
    import torch

    _, net = small_unet
    frame = simplejpeg.decode_jpeg(iw.frames(n=1).bodies[0], colorspace="RGB")
    assert frame.shape == (iw.FRAME_H, iw.FRAME_W, 3)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    x = torch.zeros(2, 3, iw.UNET_SIZE, iw.UNET_SIZE)  # a bucket of 2, one frame
    chw = torch.from_numpy(frame).permute(2, 0, 1).contiguous()
    peer.to_input([chw, None], x, mean.float(), std.float())
    small = fit(frame, Target(iw.UNET_SIZE, iw.UNET_SIZE, 3))  # Ferry's resize
    pixels = ((x[0].double() * std[0] + mean[0]) * 255).permute(1, 2, 0).numpy()
    diff = np.abs(pixels - small)
    assert diff.mean() < 0.3 and diff.max() < 1.5  # Pillow rounds to uint8, torch does not
    assert not x[1].any()  # the padding row untouched

    with torch.no_grad():
        y = net(x)
    y = y.to(memory_format=torch.channels_last)  # as the compiled fp16 model gives it
    frames = peer.to_frames(y, [(iw.FRAME_H, iw.FRAME_W), None], mean.float(), std.float())
    assert frames[1] is None and frames[0].dtype == torch.uint8
    assert frames[0].is_contiguous()  # planes, as nvJPEG reads them
    got = frames[0].permute(1, 2, 0).numpy()
    assert got.shape == frame.shape
    model_px = ((y[0].double() * std[0] + mean[0]) * 255).permute(1, 2, 0).numpy()
    model_px = np.clip(np.rint(model_px), 0, 255).astype(np.uint8)  # Ferry's Denormalize
    want = fit(model_px, Target(iw.FRAME_H, iw.FRAME_W, 3))  # Ferry's resize back
    diff = np.abs(got.astype(int) - want)
    assert diff.mean() < 0.3 and diff.max() <= 1
    # a frame of the model's own size is not resized
    same = peer.to_frames(y[:1], [(iw.UNET_SIZE, iw.UNET_SIZE)], mean.float(), std.float())
    assert np.abs(same[0].permute(1, 2, 0).numpy().astype(int) - model_px).max() <= 1


@torch_mark
def test_a_batch_flows_through_the_cpu_form_of_the_core(small_unet):
    """``ImageCore.process`` in its CPU form (the same steps in fp32 on CPU tensors, JPEGs
    through simplejpeg instead of nvJPEG): a bad body among good ones, two frame sizes, the
    bucket's padding."""
    path, _ = small_unet
    core = peer.ImageCore(path, buckets=(2, 4), device="cpu")
    small = simplejpeg.encode_jpeg(np.full((40, 60, 3), 200, np.uint8))
    bodies = [iw.frames(n=1).bodies[0], b"not a jpeg", small]
    answers = core.process(bodies)  # 3 frames: bucket 4
    assert answers[1] is None
    assert [jpeg_size(a) for a in (answers[0], answers[2])] == [(1280, 720), (60, 40)]
    assert core.process([b"nope"]) == [None]
    with pytest.raises(ValueError):
        core.process([small] * 5)  # over the largest bucket: Serve's batch never is
