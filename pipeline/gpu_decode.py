"""JPEG decoding on the GPU with nvImageCodec (``pip install 'ferry[gpu-decode]'``).

One ``Decoder`` per process and device decodes a whole call's JPEGs in one batch, in
stream order on the caller's CUDA stream: nvJPEG's hardware engines where the GPU has
them (A100, H100, H200), its CUDA decoder otherwise, libjpeg-turbo on nvImageCodec's
own threads for what neither takes. The images land in device memory, ready for the
resize kernel that follows on the same stream; nothing crosses PCIe but the compressed
bytes.

What the decoder cannot take (a corrupt file, a colour space it refuses) comes back as
``None``; the caller decodes those on the CPU, which also gives the precise error. EXIF
orientation is not applied, as the CPU path does not apply it either: both give the
same pixels.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "hardware", "cuda", "hybrid")


def available() -> bool:
    """True when nvImageCodec and its nvJPEG extension load in this process."""
    try:
        from nvidia import nvimgcodec  # noqa: F401
    except Exception:
        return False
    return True


def usable(setting: str, want: str, instead: str) -> bool:
    """Whether nvImageCodec is to be used for ``setting`` (``preprocess.decoder`` or
    ``preprocess.encoder``) set to ``want`` (``auto`` or ``nvimgcodec``; ``cpu`` is the
    caller's): True where it loads; where it does not, ``FerryError`` for ``nvimgcodec``,
    else False, logging what is done ``instead``."""
    if available():
        return True
    if want == "nvimgcodec":
        from .errors import FerryError

        raise FerryError(
            f"{setting} is 'nvimgcodec' but nvImageCodec does not load here; "
            "install the gpu-decode extra (pip install 'ferry[gpu-decode]')"
        )
    logger.info("nvImageCodec not installed: %s", instead)
    return False


_decoders: dict[tuple[int, int, str, float], GpuJpegDecoder] = {}
_decoders_lock = threading.Lock()


def decoder_for(
    device_id: int,
    cpu_threads: int = 4,
    backends: str = "auto",
    hw_load: float = 1.0,
    largest: int = 0,
    keep_bytes: int | None = None,
    lane: int = 0,
) -> GpuJpegDecoder:
    """The process's decoder for these settings, made once and kept for the life of the
    process (with the streams it has decoded on): one per process and device is the
    intended use, and tearing one down while images or streams it touched are in flight
    is what nvImageCodec is least forgiving of. ``largest``: the most JPEGs one call will
    carry; the new decoder's first call is that many (``GpuJpegDecoder.prime``).
    ``keep_bytes`` (None or 0: as it is): ``keep_decoded``, before the first call.
    ``lane``: a decoder of its own for each lane that calls at the same time
    (``preprocess.decode_rounds``): one decoder's calls are made one at a time."""
    key = (device_id, cpu_threads, backends, hw_load, lane)
    with _decoders_lock:
        if keep_bytes:
            try:
                keep_decoded(device_id, keep_bytes)
            except Exception:  # the decoder works without it, mapping each round afresh
                logger.warning("could not set the decoder's pool to keep memory", exc_info=True)
        dec = _decoders.get(key)
        if dec is None:
            dec = GpuJpegDecoder(device_id, cpu_threads, backends, hw_load)
            if largest > 0:
                try:
                    dec.prime(largest)
                except Exception:  # a decoder that serves unprimed beats a replica that fails
                    logger.warning("could not prime nvImageCodec's decoder", exc_info=True)
            _decoders[key] = dec
        elif largest > dec.primed:
            logger.warning(
                "nvImageCodec's decoder was first called with %d images: calls of up to %d "
                "send what is past its backends' shares to the next backend",
                dec.primed,
                largest,
            )
        return dec


RELEASE_THRESHOLD = 4  # cudaMemPoolAttrReleaseThreshold (driver_types.h)


def keep_decoded(device_id: int, nbytes: int) -> int:
    """Let the device's current memory pool -- where nvImageCodec's Python ``Decoder`` puts
    each decoded image (``cudaMallocAsync`` on the call's stream, ``cudaFreeAsync`` when it
    is dropped) -- keep up to ``nbytes`` of freed memory mapped. CUDA's default, 0, hands
    every freed byte back to the driver at the next synchronisation, and Ferry synchronises
    once a round, so each round's images were mapped afresh by the thread that calls the
    decoder. The pool is per process (a replica's own context); a larger value already set
    is kept. Returns the threshold the pool has."""
    from cupy.cuda import runtime  # optional: cupy, present where the decoder runs

    pool = runtime.deviceGetMemPool(device_id)
    have = int(runtime.memPoolGetAttribute(pool, RELEASE_THRESHOLD))
    if nbytes > have:
        runtime.memPoolSetAttribute(pool, RELEASE_THRESHOLD, int(nbytes))
        have = int(nbytes)
    return have


class GpuJpegDecoder:
    """Batch JPEG decode onto one device with nvImageCodec.

    ``backends``: ``auto`` lets nvImageCodec pick per image (hardware engine first, then
    CUDA, then hybrid and CPU); ``hardware`` / ``cuda`` / ``hybrid`` prefer that one,
    with the CPU decoder behind it for what it refuses. ``hardware`` gives the engines
    ``hw_load`` of a batch (nvImageCodec's fixed load hint) and the rest to the CUDA
    decoder, so no image of it is decoded on the host unless both refuse it.
    ``cpu_threads`` bounds the threads nvImageCodec uses for parsing and for the hybrid
    and CPU decoders.
    """

    def __init__(
        self, device_id: int, cpu_threads: int = 4, backends: str = "auto", hw_load: float = 1.0
    ) -> None:
        from nvidia import nvimgcodec as nv  # optional: nvimgcodec

        if backends not in BACKENDS:
            raise ValueError(f"backends must be one of {BACKENDS}, got {backends!r}")
        if not 0.0 < hw_load <= 1.0:
            raise ValueError(f"hw_load must be in (0, 1], got {hw_load!r}")
        chain = {
            "auto": None,
            "hardware": [(nv.HW_GPU_ONLY, hw_load), (nv.GPU_ONLY, 1.0), (nv.CPU_ONLY, 1.0)],
            "cuda": [(nv.GPU_ONLY, 1.0), (nv.CPU_ONLY, 1.0)],
            "hybrid": [(nv.HYBRID_CPU_GPU, 1.0), (nv.CPU_ONLY, 1.0)],
        }[backends]
        self.nv = nv
        self.device_id = device_id
        self.decoder = nv.Decoder(
            device_id=device_id,
            max_num_cpu_threads=cpu_threads,
            backends=None if chain is None else [nv.Backend(k, load_hint=h) for k, h in chain],
        )
        self._streams: dict[int, Any] = {}  # every stream used: they outlive the decoder
        self.primed = 0  # the images of its first call, where prime made it
        self.params = {
            3: nv.DecodeParams(
                apply_exif_orientation=False, color_spec=nv.SRGB, sample_format=nv.I_RGB
            ),
            1: nv.DecodeParams(
                apply_exif_orientation=False, color_spec=nv.GRAY, sample_format=nv.I_Y
            ),
        }

    def prime(self, n: int) -> None:
        """Make this decoder's first call one of ``n`` small JPEGs, ``n`` the most a call
        will carry. nvImageCodec fixes each backend's share of a call at the decoder's first
        call and keeps it (``load_hint`` x that call's images, rounded up to the hardware's
        mini-batch: engines x cores; ``image_generic_codec.h``, v0.8): a first call of one
        image caps the hardware engines at a mini-batch a call for the process's life, and
        what every larger call holds past it goes to the next backend (nvJPEG's CUDA decoder,
        Huffman on the host, or libjpeg-turbo)."""
        import cupy  # optional: cupy, present where the decoder runs
        import numpy as np

        from .imaging import encode_jpeg

        data = encode_jpeg(np.full((64, 64, 3), 128, np.uint8))
        with cupy.cuda.Device(self.device_id):
            stream = cupy.cuda.Stream(non_blocking=True)  # (on this decoder's device)
            got = self.decode([data] * n, 3, stream)
            stream.synchronize()
        del got
        self.primed = n
        logger.info("nvImageCodec decoder primed with a first call of %d JPEGs", n)

    def decode(self, datas: list[bytes], channels: int, stream: Any) -> list[Any]:
        """``DecodedImage``s of ``datas`` ([h, w, channels] uint8 on the device; ``None``
        where this decoder failed), ready in stream order on ``stream`` (a cupy stream, or
        anything with ``.ptr`` and ``.raw``): whatever stream nvImageCodec finished them
        on, ``stream`` waits for it on the device. Each keeps its image, this decoder and
        ``stream`` alive until it is dropped, which must be after the work that reads it."""
        if not datas:
            return []
        codes, where = [], []
        for i, d in enumerate(datas):
            try:
                codes.append(self.nv.CodeStream(d))
                where.append(i)
            except Exception:  # unparseable: the CPU path says why
                pass
        out: list[Any] = [None] * len(datas)
        if not codes:
            return out
        ptr = int(stream.ptr)
        self._streams.setdefault(ptr, stream)  # nvImageCodec keeps state per stream
        try:
            images = self.decoder.decode(codes, params=self.params[channels], cuda_stream=ptr)
        except Exception as exc:  # the whole batch refused: the CPU takes all of it
            logger.warning("nvImageCodec refused a batch of %d: %s", len(codes), exc)
            return out
        owner = (self, stream)
        got = [None if img is None else DecodedImage(img, owner) for img in images]
        self._order_after(got, ptr, stream)
        for i, img in zip(where, got, strict=True):
            out[i] = img
        return out

    def __del__(self) -> None:
        self.decoder = None  # the decoder goes before the streams it has worked on

    @staticmethod
    def _order_after(images: list[DecodedImage | None], ptr: int, stream: Any) -> None:
        """Make ``stream`` wait (on the device) for every other stream an image is on."""
        import cupy  # optional: cupy

        others = set()
        for img in images:
            if img is None:
                continue
            s = img.__cuda_array_interface__.get("stream")
            if s is not None and int(s) != ptr:
                others.add(int(s))
        raw = getattr(stream, "raw", stream)
        for s in others:
            ev = cupy.cuda.Event(block=True, disable_timing=True)
            ev.record(cupy.cuda.ExternalStream(s))
            raw.wait_event(ev)


class DecodedImage:
    """A decoded device image and what must outlive it (its decoder, the stream it is freed
    on): nvImageCodec frees an image on its stream, so the image goes first. Its
    ``__cuda_array_interface__`` is read from nvImageCodec once (each read there builds the
    dict and lets the GIL go three times; the decode and the fit each read it)."""

    __slots__ = ("image", "owner", "_cai")

    def __init__(self, image: Any, owner: Any) -> None:
        self.image = image
        self.owner = owner
        self._cai: dict | None = None

    @property
    def __cuda_array_interface__(self) -> dict:
        cai = self._cai
        if cai is None:
            cai = self._cai = self.image.__cuda_array_interface__
        return cai

    def __del__(self) -> None:
        self.image = None  # before the owner, whatever order the collector picks
