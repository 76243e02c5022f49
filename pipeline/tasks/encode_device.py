"""Image answers made on the device that ran the model: each answer's window of the model's
output resized to the answer's size, then encoded as JPEG, a call's answers together.

    device = DeviceAnswers.make(config, executor)         # None where it cannot run
    jpegs = device.jpegs(windows, sizes, qualities)       # bytes, or None where refused

The resize is Ferry's ``ResizeCrop`` through ``GpuFitter`` -- the preprocessing's two-phase
path: the windows staged in a pinned ring of this answerer's own, the answers' pixels
reserved from the executor's hard-limited pool, one launch per answer size -- and the
encode is nvImageCodec's CUDA JPEG encoder on the same stream, one call per quality, its
code streams (host bytes) the answers. So a 1280x720 answer of a 256x256 model crosses
PCIe as its model-size window going up and as its JPEG coming back, never as pixels, and
no host thread resizes or encodes it.

On the numpy backend the same path runs with the pool and ring in host memory and the CPU
encoder (``encode_one``): that is how the CPU tests check it against the CPU answers (the
same op resizes both, so the bytes are equal); ``make`` never builds it there, where the
CPU path (``answers._image_back``, ``encode_many``) answers directly.

One call at a time an answerer (a lock): its stream orders the launches and the encode
(nvImageCodec waits for that stream, encodes on its own and returns once the bytes are on
the host, the GIL released meanwhile). A JPEG the encoder refuses, or a window larger than
the ring, comes back as None and is encoded on the CPU by the caller; a pool or ring with no
room now raises ``ResourceExhausted`` (what the call had taken goes back), and the caller
answers that call on the CPU too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..async_result import CompletionWatcher
from ..device import Backend, Stream
from ..memory import DevicePool, PinnedRing
from ..preprocess_gpu.fitter import GpuFitter
from ..resize_plan import Target
from .encode import encode_one

logger = logging.getLogger(__name__)

RING_SLOTS = 2
RING_SLOT_BYTES = 32 << 20  # a call's model-size windows: 64 RGB 256x256 are 12.6 MB


class DeviceAnswers:
    """Resize and JPEG-encode image answers on one device, from ``pool``. Its ring, streams
    and encoder are made at its first call (a replica that never answers an image makes
    none), or at once with ``eager``, and proved on a small image; where that fails,
    ``strict`` raises, else the answers go the CPU's way from then on (one warning)."""

    def __init__(
        self,
        backend: Backend,
        pool: DevicePool,
        threads: int = 4,
        timeout_s: float = 10.0,
        *,
        eager: bool = True,
        strict: bool = True,
        ring_slot_bytes: int = RING_SLOT_BYTES,
    ) -> None:
        self.backend, self.pool, self.threads, self.timeout_s = backend, pool, threads, timeout_s
        self.strict, self.ring_slot_bytes = strict, ring_slot_bytes
        self.lock = threading.Lock()
        self.fitter: GpuFitter | None = None
        self.failed: str | None = None  # why the device path is off
        self.nv: Any = None
        self.encoder: Any = None
        self._out: list[Any] = []  # the encoder's code streams, reused call after call
        self._parts: list[Any] = []  # what _ready made, closed in reverse by close()
        if eager:
            with self.lock:
                self._ready()

    def _ready(self) -> bool:
        """Make the ring, the streams and the encoder once, and encode a small image with
        them; False where that failed (under the lock)."""
        if self.fitter is not None or self.failed is not None:
            return self.failed is None
        backend = self.backend
        try:
            backend.activate()
            if backend.is_cuda:
                from nvidia import nvimgcodec as nv  # optional: the gpu-decode extra

                # nvJPEG's CUDA encoder is nvImageCodec's HYBRID_CPU_GPU backend (the
                # bitstream is assembled on the host); no CPU encoder behind it: a refusal
                # comes back None and the caller encodes it with simplejpeg
                self.nv = nv
                self.encoder = nv.Encoder(
                    device_id=backend.device_id,
                    max_num_cpu_threads=self.threads,
                    backends=[nv.Backend(nv.HYBRID_CPU_GPU)],
                )
            ring = PinnedRing(backend, self.ring_slot_bytes, RING_SLOTS)
            self._parts.append(ring)
            stream, copy = Stream("answers", backend), Stream("answers-h2d", backend)
            self._parts += [stream, copy]
            watcher = CompletionWatcher("ferry-answers-done")
            self._parts.append(watcher)
            self.stream = stream
            self.fitter = GpuFitter(backend, self.pool, ring, stream, copy, watcher, self.timeout_s)
            probe = np.full((16, 16, 3), 128, np.uint8)
            if self._jpegs([probe], [(8, 8)], [90]) == [None]:
                raise RuntimeError("the encoder refused a 16x16 RGB image")
        except Exception as exc:
            self._close_parts()
            if self.strict:
                raise
            self.failed = f"{type(exc).__name__}: {exc}"
            logger.warning("image answers are encoded on the CPU: %s", self.failed)
            return False
        return True

    @classmethod
    def make(cls, config: Any, executor: Any) -> DeviceAnswers | None:
        """The answerer for ``executor``'s device as ``preprocess.encoder`` asks, or None:
        on the CPU, with ``encoder: cpu``, or (``auto``) where nvImageCodec does not load.
        ``nvimgcodec`` makes it now and fails the start where it cannot; ``auto`` makes it
        at the first image answer and falls back to the CPU where it cannot."""
        from .. import gpu_decode

        pre = config.preprocess
        want = pre.encoder
        if want == "cpu" or not executor.backend.is_cuda:
            return None
        if not gpu_decode.usable("preprocess.encoder", want, "answers are encoded on CPU threads"):
            return None
        strict = want == "nvimgcodec"
        return cls(
            executor.backend,
            executor.pool,
            pre.encoder_threads or pre.threads,
            config.transport.timeout_s,
            eager=strict,
            strict=strict,
        )

    def jpegs(
        self,
        windows: Sequence[np.ndarray],
        sizes: Sequence[tuple[int, int]],
        qualities: Sequence[int],
    ) -> list[bytes | None]:
        """The JPEG of each window (uint8 [h, w, C], C 1 or 3, on the host) resized to its
        size (height, width), at its quality; None where this path does not take one (the
        encoder refused it, its window is more than the staging ring holds) or where the
        path is off. ``ResourceExhausted`` where the pool or the ring has no room now."""
        if not windows:
            return []
        with self.lock:
            if not self._ready():
                return [None] * len(windows)
            self.backend.activate()  # (this worker thread's current device: the executor's)
            return self._jpegs(windows, sizes, qualities)

    def _jpegs(
        self,
        windows: Sequence[np.ndarray],
        sizes: Sequence[tuple[int, int]],
        qualities: Sequence[int],
    ) -> list[bytes | None]:
        leases: list[Any] = []
        try:
            answers = self._resized(windows, sizes, leases)
            out: list[bytes | None] = [None] * len(windows)
            calls: dict[tuple[int, int], list[int]] = {}  # one encode a quality and channels
            for i, a in enumerate(answers):
                if a is not None:
                    calls.setdefault((qualities[i], int(a.shape[2])), []).append(i)
            with self.stream:  # (cupy's current stream: the one the rows' interface names)
                for (q, c), idx in calls.items():
                    got = self._encode([answers[i] for i in idx], q, c)
                    for i, data in zip(idx, got, strict=True):
                        out[i] = data
            return out
        finally:
            done = self.stream.record()
            for lease in leases:  # the pixels go back to the pool once the encode has read them
                lease.after = done

    def _resized(
        self, windows: Sequence[np.ndarray], sizes: Sequence[tuple[int, int]], leases: list[Any]
    ) -> list[Any]:
        """Each window stretched to its size on the device, in stream order on ``stream``
        (None for a window the ring cannot stage): one batch per distinct size, its lease
        (a pool reservation, given back when the last row of its batch is dropped, after
        the lease's ``after``) put in ``leases`` as soon as it is made."""
        rows: list[Any] = [None] * len(windows)
        fitter = self.fitter
        assert fitter is not None
        groups: dict[tuple[int, int, int], list[int]] = {}
        for i, (w, s) in enumerate(zip(windows, sizes, strict=True)):
            c = 1 if w.ndim == 2 else int(w.shape[2])
            groups.setdefault((int(s[0]), int(s[1]), c), []).append(i)
        for (h, w, c), idx in groups.items():
            target = Target(h, w, c, "stretch")
            imgs = [windows[i] for i in idx]
            parts, _refused = fitter.parts(target, imgs)  # (refused: left None, the CPU's)
            taken = [k for part in parts for k in part]
            if not taken:
                continue
            out, lease = fitter.output(target, len(taken))
            leases.append(lease)
            row = 0
            for part in parts:
                p = fitter.prepare(target, [imgs[k] for k in part], out[row : row + len(part)])
                lease.after = fitter.commit(p)
                for k in part:
                    rows[idx[k]] = out[row]
                    row += 1
        return rows

    def _encode(self, images: list[Any], quality: int, channels: int) -> list[bytes | None]:
        """JPEGs of ``images`` (rows [h, w, ``channels``] of the resized batches), one call."""
        if self.encoder is None:  # the numpy backend: the CPU encoder on the same pixels
            return [encode_one(np.asarray(img), "image/jpeg", quality) for img in images]
        nv = self.nv
        css = nv.ChromaSubsampling.CSS_444 if channels == 3 else nv.ChromaSubsampling.CSS_GRAY
        params = nv.EncodeParams(  # 4:4:4 as simplejpeg's default
            quality_type=nv.QualityType.QUALITY,
            quality_value=float(quality),
            chroma_subsampling=css,
        )
        streams = self.encoder.encode(
            images,
            "jpeg",
            code_stream_s=self._encoded_into(len(images)),
            params=params,
            cuda_stream=self.stream.ptr,
        )
        return [None if cs is None else bytes(cs) for cs in streams]

    def _encoded_into(self, n: int) -> Any:
        """``n`` code streams for the encoder to write into, kept from call to call (each
        new one would be a page-locked host buffer allocated and freed per answer), or None
        where this nvImageCodec cannot preallocate them."""
        try:
            while len(self._out) < n:
                self._out.append(self.nv.CodeStream(1 << 20, pin_memory=False))
        except (TypeError, AttributeError):
            return None
        return self._out[:n]

    def _close_parts(self) -> None:
        self.fitter, self.encoder, self._out = None, None, []
        for part in reversed(self._parts):
            try:
                part.close()
            except Exception:  # best effort: a part that was never started
                logger.debug("closing %r failed", part, exc_info=True)
        self._parts = []

    def close(self) -> None:
        """Give the ring, the streams and the encoder back; later calls answer None."""
        with self.lock:
            if self.fitter is not None:
                self.stream.synchronize()
            self._close_parts()
            self.failed = self.failed or "closed"
