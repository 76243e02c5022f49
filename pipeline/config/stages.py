"""Configuration of the stages around the GPU actor: the HTTP front, decoding and resizing,
and the tensor transport between GPU stages."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from .base import Strict


class IngressConfig(Strict):
    """The HTTP front."""

    removed: ClassVar[dict[str, str]] = {
        "dispatch_when_idle": "a group that starts while none is out always leaves at "
        "once; delete it"
    }

    coalesce_window_ms: float = Field(1.0, ge=0.0, le=100.0)
    """Requests arriving within this window go downstream as one call."""
    max_coalesce: int = Field(64, ge=1, le=4096)
    """Most requests in one downstream call."""
    max_groups_in_flight: int = Field(2, ge=1, le=1024)
    """Downstream calls one ingress replica keeps open per model; while they are all out, the
    next group keeps growing (calls follow the pipeline's pace, not the arrival rate). 2, not
    4: on the CPU default (four stages, two cores) 4 let groups of one or two leave whenever
    requests came one per event-loop turn, as unary gRPC's do -- it ran at 0.56x HTTP at
    concurrency 64, its downstream replicas spending 3.6x HTTP's CPU a request. With 2,
    unary gRPC ran 1.6x faster there, HTTP within 5% (+10% at concurrency 16), streams
    +4-14%, and the classify route 1.14x with 18% less CPU a request
    (benchmarks/results/perf_analyzer.json, ``experiments``). The GPU configs set their own
    (4, measured on the H200)."""
    max_request_rows: int | None = Field(None, ge=1, le=1_000_000)
    """Most rows (images, or tensor rows) one v2 request may carry -- Triton's
    ``max_batch_size`` in ``/v2/models/{m}/config``; at most ``batching.max_queue``, which is
    what ``None`` takes. The rows form GPU batches of up to their model's ``max_batch``."""
    max_body_bytes: int = Field(8 << 20, ge=1024, le=1 << 30)
    """Bodies over this get 413."""
    max_pixels: int = Field(40_000_000, ge=1, le=1 << 31)
    """Images whose header declares more pixels get 413 before any decoding."""
    max_image_work_bytes: int = Field(512 << 20, ge=1 << 20, le=1 << 36)
    """What decoding and resizing one image may hold at its peak, planned from its header
    (decoded pixels, the decoder's buffers, the resize's intermediate and output): an image
    whose plan needs more gets 413 before any decoding."""
    default_top_k: int = Field(5, ge=1, le=64)
    """``top_k`` when the request gives none."""
    request_timeout_s: float = Field(60.0, gt=0.0, le=3600.0)
    """A request that has no answer after this gets 504."""
    upload_grace_s: float = Field(1.0, gt=0.0, le=60.0)
    """A request body complete this soon after the request reaches the replica (nearly
    every body) is read without an upload slot; one still arriving needs a slot."""
    max_concurrent_uploads: int = Field(128, ge=1, le=100_000)
    """Slow request bodies (past ``upload_grace_s``) one ingress replica reads at once; a
    request beyond that gets 503 with ``Retry-After`` at once. Capped at three quarters of
    ``ingress_deployment.max_ongoing_requests``, so stalled uploads never take every slot
    (health and requests whose bodies come keep the rest)."""
    body_idle_timeout_s: float = Field(5.0, gt=0.0, le=600.0)
    """A request body that makes no progress for this long gets 408 and the connection
    closes."""
    body_timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    """A request body not complete this long after its first read gets 408."""
    direct_port: int | None = Field(None, ge=1, le=65535)
    """Ferry's own HTTP listener (``deployments/direct.py``): every ingress replica also
    serves the whole app on this port of its node, bound with ``SO_REUSEPORT`` so that the
    node's ingress replicas share it (the kernel spreads connections over them). A request
    to it skips Serve's proxy (HAProxy) and Serve's request handling in the replica: less
    CPU a request (``profile_pipeline.json``, ``direct_listener``); Serve's port answers as
    before. ``None`` (the default): Serve's port only."""
    direct_host: str = "0.0.0.0"
    """The address ``direct_port`` listens on (``127.0.0.1``: this machine only)."""


class PreprocessConfig(Strict):
    """Decoding and resizing."""

    threads: int = Field(4, ge=1, le=256)
    """Worker threads per replica for decode + resize (simplejpeg and Pillow release the GIL)."""
    decoder: Literal["auto", "cpu", "nvimgcodec"] = "auto"
    """JPEG decoding where the placement decodes on a GPU: ``nvimgcodec`` decodes on the GPU
    (nvJPEG; the ``gpu-decode`` extra), ``cpu`` on worker threads (simplejpeg), ``auto``
    the GPU when nvImageCodec loads. PNG is always decoded on the CPU."""
    encoder: Literal["auto", "cpu", "nvimgcodec"] = "auto"
    """JPEG image answers (``task: image``) where the stage that answers runs the model on a
    GPU: ``nvimgcodec`` resizes each answer back on the GPU and encodes it with nvImageCodec's
    CUDA encoder (the ``gpu-decode`` extra), ``cpu`` resizes and encodes on worker threads
    (simplejpeg), ``auto`` the GPU when nvImageCodec loads. PNG, WebP and masks are always
    encoded on the CPU."""
    encoder_threads: int | None = Field(None, ge=1, le=256)
    """nvImageCodec's JPEG encoder's host threads a replica (``None``: ``threads``). Its CUDA
    encoder takes one answer at a time on each thread and waits for the GPU after each
    (``extensions/nvjpeg/cuda_encoder.cpp``), so a call of N answers makes N / threads GPU
    round trips in turn: more threads, a shorter call, the same work an answer."""
    gpu_decode_backend: Literal["auto", "hardware", "cuda", "hybrid"] = "auto"
    """Which nvJPEG backend nvImageCodec prefers: the hardware engines (A100/H100/H200),
    CUDA kernels, or hybrid (Huffman on the CPU); ``auto`` lets it choose per image."""
    gpu_decode_hw_load: float = Field(1.0, gt=0.0, le=1.0)
    """With ``gpu_decode_backend: hardware``: the share of each decode call that goes to the
    hardware engines (nvImageCodec's fixed load hint: of the largest batch, as the primed
    first call sets it, so a smaller call may go to the engines whole); the rest goes to the
    next decoder, so large photos need not queue on the engines while the SMs idle."""
    gpu_decode_prime: bool = True
    """The GPU decoder's first call decodes as many small JPEGs as the largest batch
    (``GpuJpegDecoder.prime``): nvImageCodec fixes each backend's share of a call at its
    first call, so a first call of one image would send most of every large call past the
    hardware engines, to decoders that work on the host. ``false`` leaves the first call
    to the warm-up's one JPEG, as before (``bench_e2e`` system ``ferry_noprime``)."""
    gpu_decode_keep_bytes: int = Field(0, ge=0, le=1 << 40)
    """Freed device memory the GPU decoder's pool keeps mapped between rounds, a replica
    (``gpu_decode.keep_decoded``; nvImageCodec allocates each decoded image from the
    device's stream-ordered pool, which by CUDA's default, 0, hands freed bytes back at
    each synchronisation). Held outside the executor's pool and the check that the
    replicas' pools fit their GPU. Measured on an H100 (8 replicas, ``e2e_notes.md``): 256
    MiB saved no host time on the decode thread, and photos at 1,024 clients then found the
    GPU full -- nvImageCodec refused rounds, whose images went to the CPU and 3.9-4.2k
    requests got 503 -- where 0 answered all. So 0 (``bench_e2e`` system
    ``ferry_keep256``)."""
    gpu_decode_round_bytes: int = Field(256 << 20, ge=1, le=1 << 40)
    """The decoded bytes one nvImageCodec call of a round holds at most, a replica
    (height x width x channels, from each JPEG's header, as the ingress planned it): a
    round past it -- large photos; up to ``max_pixels`` each -- is decoded and fitted in
    runs of consecutive images, a run's images freed once its fit has run on the device and
    a run decoded only once the fit two runs before it has, so the decoder holds about two
    runs whatever the images' sizes; an image past it alone is a run of its own. A round
    of 256 451x300 JPEGs is 99 MiB (one run); 256 of 1920x1080, 1.5 GiB (six). Only where
    the GPU decodes in the replica that owns the executor (``one_process``, ``split`` on a
    GPU)."""
    overlap_rounds: bool = False
    """Where the GPU decodes in the process that owns the executor (``one_process``, and
    ``split`` on a GPU; not ``gpu_preprocess``, whose stage sends each batch): start the next
    round of decoding once this one is enqueued on the GPU, not once the GPU has finished
    it, so the device's time for a round overlaps the next round's host work (parsing,
    nvImageCodec's host side, the fit's plan). The rows still reach the model complete on
    the device. Off until measured on a GPU node (``bench_e2e`` system ``ferry_overlap``)."""
    stream_priority: Literal["normal", "high"] = "normal"
    """The CUDA priority of the GPU decode-and-fit streams (where the GPU decodes or fits):
    ``high`` lets a round's kernels start ahead of the model's queued kernels in the same
    process, so the round -- whose end every image in it waits for -- does not wait behind
    a batch of the model. On an H100 (8 replicas, 2026-12-06, ``e2e_notes.md``) the preprocess
    stage (the wait for a round, and the round) was about half of a request's time at every
    level, with the GPU 0.6 busy under MPS. Copies, the JPEG engines' decoding and other
    processes' work are not reordered. ``normal`` until measured on a GPU
    node (``bench_e2e`` systems ``ferry_prio``, ``ferry_torch_prio``)."""
    decode_rounds: int = Field(1, ge=1, le=4)
    """Rounds of GPU decoding a replica runs at once (where the GPU decodes in the process
    that owns the executor), each on a thread of its own with its own nvImageCodec decoder,
    stream and fit (``preprocess_gpu.lanes``): the next round's images start while one
    round waits inside its decoder call. On an H200 (8 replicas, 2026-12-06, ``e2e_notes.md``)
    a round at 256 clients spent 4.4 of its 6.7 ms host time in nvImageCodec's call, mostly
    not on the CPU, with the JPEG engines 0.24 busy; meanwhile the next round's images wait
    (5.5 ms). 1 until measured on a GPU node (``bench_e2e`` system ``ferry_r2``); each more
    holds another decoder's device memory, outside the executor's pool."""

    @model_validator(mode="after")
    def _one_way_to_overlap(self) -> PreprocessConfig:
        if self.decode_rounds > 1 and self.overlap_rounds:
            raise ValueError(
                "preprocess.decode_rounds > 1 and preprocess.overlap_rounds are two ways to "
                "run rounds side by side: choose one"
            )
        return self


class TransportConfig(Strict):
    """How batches move from PreprocessGPU to the inference replica (``gpu_preprocess``): NCCL
    when both ends hold CUDA devices and NCCL loads, the object store otherwise; and how an
    ingress reaches an inference replica of its node (``local_hop``)."""

    timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    """Deadline of each transfer; past it the NCCL link is aborted (``TransportError``) and
    rebuilt on next use."""
    staging_slots: int = Field(4, ge=1, le=64)
    """Pinned buffers the GPU preprocess stage uploads decoded images through."""
    staging_slot_bytes: int = Field(64 << 20, ge=1 << 20, le=4 << 30)
    """Size of each; a call whose decoded images do not fit is uploaded in parts."""
    local_hop: bool = True
    """``split`` and ``gpu_preprocess``: an ingress sends its coalesced groups to the
    inference replicas of its own node over a Unix socket (``transport/local_hop.py``), not
    as Serve calls -- Serve's call where none runs there, and for a group whose socket
    closed before it was answered. Off (every group a Serve call) where the inference
    deployment autoscales: Serve counts only its own calls as a replica's load."""


class StreamsConfig(Strict):
    """Live video streams over WebSocket (``/v1/streams/{model}``; ``docs/api.md``, Live streams)."""

    max_streams: int = Field(256, ge=0, le=100_000)
    """Streams one ingress replica holds open at once; one more is refused at its handshake
    (close code 1013, try again later). 0: no streams."""
    max_fps: float | None = Field(None, gt=0.0, le=1_000_000.0)
    """Frames a second the open streams of one model may declare together, per ingress
    replica (set it from a load test of the model); a stream that would pass it is refused
    at its handshake. ``None``: no ceiling of declared rates."""
    max_late: float = Field(0.01, ge=0.0, le=1.0)
    """A new stream of a model is refused while more than this fraction of the frames of
    its open streams were dropped late over the last ``late_window_s`` (the streams it
    admitted already miss their deadlines: there is no room for one more)."""
    late_window_s: float = Field(5.0, gt=0.0, le=600.0)
    """The window of ``max_late``."""
    default_fps: float = Field(30.0, gt=0.0, le=1000.0)
    """A stream's rate when it declares none (``fps``)."""
    max_stream_fps: float = Field(120.0, gt=0.0, le=1000.0)
    """The most frames a second one stream may declare."""
    deadline_frames: float = Field(2.0, gt=0.0, le=1000.0)
    """A frame's deadline when the stream gives no ``deadline_ms``: this many frame intervals
    at its rate (2 at 30 fps: 66.7 ms from the frame's arrival to its answer)."""
    max_deadline_ms: float = Field(10_000.0, gt=0.0, le=600_000.0)
    """The longest deadline a stream may ask for."""
    unread_s: float = Field(2.0, gt=0.0, le=600.0)
    """Slow readers: a stream may have this many seconds of answers at its rate (at least 8)
    sent and not yet acknowledged (``{"read": n}``) before it is paused."""
    pause_s: float = Field(5.0, gt=0.0, le=3600.0)
    """How long a stream may stay paused (its frames dropped, reason ``paused``) before it is
    closed (1008) and everything it holds is freed."""

    @model_validator(mode="after")
    def _default_rate_allowed(self) -> StreamsConfig:
        if self.default_fps > self.max_stream_fps:
            raise ValueError(
                f"streams.default_fps ({self.default_fps}) exceeds streams.max_stream_fps "
                f"({self.max_stream_fps})"
            )
        return self
