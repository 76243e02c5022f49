"""The expert peer's GPU JPEG decoders: a batch of JPEG bodies in, CHW uint8 images on the
GPU out (None where a body does not decode), ready on the caller's current stream.

* ``torchvision``: ``torchvision.io.decode_jpeg(list, device="cuda")`` -- nvJPEG's batched
  decode, on the JPEG engines for baseline JPEGs (the hardware back end torchvision asks
  for), one by one on the CUDA decoder for the rest. Its outputs come from torch's caching
  allocator on a stream of the caller's (``ExpertCore`` says why).
* ``nvimgcodec``: NVIDIA's nvImageCodec (``pip install nvidia-nvimgcodec-cu13``), the
  library NVIDIA points image pipelines at, which picks per image among the JPEG engines,
  the CUDA decoder and the CPU. A strong Ray Serve user who decodes on the GPU may well
  take it; Ferry decodes with it too (``pipeline/gpu_decode.py``), so with it the two
  systems differ only in what is around the decode.

Nothing here imports torch or nvImageCodec at module level: the peer's module must load on a
machine without them.
"""

from __future__ import annotations

from typing import Any

DECODERS = ("torchvision", "nvimgcodec")


def decode_on_gpu(torch: Any, bodies: list[bytes]) -> list[Any]:
    """CHW uint8 images on the GPU, one batched nvJPEG call; a body it refuses is None.
    nvJPEG writes them on a private stream and waits for it before returning."""
    from torchvision.io import ImageReadMode, decode_jpeg  # optional: torchvision

    datas = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in bodies]
    try:
        return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda"))
    except (RuntimeError, ValueError):  # one bad image fails the batch: one by one
        out = []
        for d in datas:
            try:
                out.append(decode_jpeg(d, mode=ImageReadMode.RGB, device="cuda"))
            except (RuntimeError, ValueError):
                out.append(None)
        return out


class NvImageCodecDecoder:
    """nvImageCodec's batched decode into torch tensors, in stream order on the caller's
    current stream. Its images are freed on the decoder's own stream when dropped: each
    decode first waits (on the device) for everything the caller's stream has queued, so
    memory the previous batch's kernels still read is never handed to a new image."""

    def __init__(self, torch: Any, device_id: int = 0, cpu_threads: int = 1) -> None:
        from nvidia import nvimgcodec as nv  # optional: nvImageCodec

        self.torch = torch
        self.nv = nv
        self.decoder = nv.Decoder(device_id=device_id, max_num_cpu_threads=cpu_threads)
        self.params = nv.DecodeParams(
            apply_exif_orientation=False, color_spec=nv.SRGB, sample_format=nv.I_RGB
        )
        self.stream = torch.cuda.Stream()  # the decoder's: its images are freed on it

    def __call__(self, bodies: list[bytes]) -> list[Any]:
        torch = self.torch
        caller = torch.cuda.current_stream()
        self.stream.wait_stream(caller)  # (the class docstring says why)
        codes, where = [], []
        for i, b in enumerate(bodies):
            try:
                codes.append(self.nv.CodeStream(b))
                where.append(i)
            except Exception:  # not a JPEG it can parse: no image
                pass
        out: list[Any] = [None] * len(bodies)
        if not codes:
            return out
        try:
            images = self.decoder.decode(
                codes, params=self.params, cuda_stream=self.stream.cuda_stream
            )
        except Exception:  # the whole batch refused
            return out
        others = set()
        for i, img in zip(where, images, strict=True):
            if img is None:
                continue
            s = img.__cuda_array_interface__.get("stream")
            if s is not None and int(s) != self.stream.cuda_stream:
                others.add(int(s))
            # HWC on the device, zero-copy; the tensor keeps the image alive
            out[i] = torch.as_tensor(img, device="cuda").permute(2, 0, 1)
        for s in others:  # an image nvImageCodec finished on a stream of its own
            self.stream.wait_stream(torch.cuda.ExternalStream(s))
        caller.wait_stream(self.stream)
        return out
