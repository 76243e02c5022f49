"""What ``bench_e2e.py`` serves and asks: its workloads, its systems, the file each system
hands ``serve run`` (made by ``e2e_configs.py``, with the experiments' ``--set``
overrides). No Ray, no GPU: the tests check all of it on any machine.

Two workloads (``WORKLOADS``):

* ``classify``: ResNet-50 top-5 of each JPEG (``/v1/models/resnet50/classify``; the peers'
  ``/classify``) on the ``chelsea`` and ``photos`` corpora;
* ``image`` (issue 33): a 256x256 U-Net applied to 1280x720 JPEG frames, answered as a JPEG
  at the frame's size (``/v1/models/unet/image?size=input``; the peer's ``/image``), with
  ``Accept: image/jpeg``, on the ``frames720`` corpus; an answer counts only as a JPEG of
  its frame's size. ``benchmarks/image_workload.py`` makes the corpus and the model file.

Each system serves one workload: Ferry's placements (``ferry``, ``ferry_split``, ...;
``ferry_image``) and the Ray Serve peers (``rayserve_batch_*``, ``rayserve_expert_*``;
``rayserve_image_*``). A system's ``headers`` go with each of its requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from benchmarks import image_workload as iw
from loadtest.corpus import Corpus, corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "benchmarks", "configs")
BASE = "http://127.0.0.1:8000"
DIRECT_PORT = 8080
"""The port of the systems that take their load on Ferry's own listener (``_direct``)."""
# HAProxy in front of the replicas; Serve's throughput-optimized mode: gRPC between
# deployments and user code on the replica's own event loop (on the 2-core machine: 17-23%
# more img/s, a third less ingress CPU per request; RESULTS.md)
FERRY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
HAPROXY = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
# Serve's own header: no task a request watching for its client leaving (docs/api.md;
# profile_pipeline.json disconnect_header: 0.82-0.92x of the replica's CPU a request)
NOWATCH = {"headers": {"x-request-disconnect-disabled": "?1"}}


@dataclass(frozen=True)
class Workload:
    """One kind of request: its routes, headers, default corpora and systems, and whether an
    answer must be a JPEG of its input's size."""

    name: str
    ferry_path: str
    peer_path: str
    corpora: str
    systems: str
    accept: str | None = None
    answers_jpeg: bool = False
    model: str = "ResNet-50 (random weights), top 5"

    def url(self, spec: dict[str, Any]) -> str:
        return BASE + (self.ferry_path if spec["kind"] == "ferry" else self.peer_path)

    def headers(self) -> dict[str, str]:
        """The requests' headers beside ``Content-Type``."""
        return {"accept": self.accept} if self.accept else {}

    def expect(self, c: Corpus) -> tuple[tuple[int, int], ...] | None:
        """Each body's (width, height) that its answer must have, where answers are JPEGs."""
        return c.sizes if self.answers_jpeg else None


WORKLOADS = {
    "classify": Workload(
        "classify",
        "/v1/models/resnet50/classify",
        "/classify",
        corpora="chelsea,photos",
        systems="ferry,ferry_naive,rayserve_batch_haproxy_8rep,rayserve_expert_8",
    ),
    "image": Workload(
        "image",
        iw.FERRY_PATH,
        iw.PEER_PATH,
        corpora=iw.CORPUS,
        systems="ferry_image,rayserve_image_8",
        accept="image/jpeg",
        answers_jpeg=True,
        model=iw.describe(),
    ),
}


def corpus_of(name: str) -> Corpus:
    """A corpus by name: ``loadtest.corpus``'s, or the image workload's ``frames720``."""
    return iw.frames() if name == iw.CORPUS else corpus(name)


# A system's usual start-up, every replica up (bench_e2e waits for all), what ``bench_e2e.py
# --budget-s`` plans with (seen in the runs' logs: ferry 39-53 s; the image systems compile the
# U-Net per batch size); ``startup_s`` is how long it may take at most. A torch.compile system's
# first replica compiles alone, the other seven then from its caches.
UP_S = {
    "ferry": 60,
    "ferry_image": 150,  # up in 88-90 s on an H100 (2026-12-05)
    "ferry_torch": 240,  # three buckets, as the peer's (its first answer at 134 s with nine)
    "ferry_torch_dyn": 150,  # one compile, ten buckets: all up in 106 s on an H100 (2026-12-07)
    "rayserve_batch": 40,
    "rayserve_expert": 220,  # all 8 replicas in 209 s on an H100 (2026-12-06), three buckets
    "rayserve_image": 120,  # 50 s on an H100 (2026-12-05), inductor still compiling after
}


def _ferry(
    config: str,
    naive: bool = False,
    workload: str = "classify",
    startup_s: float = 300,
    sets: dict[str, Any] | None = None,
    up_s: float | None = None,
) -> dict[str, Any]:
    """A Ferry system: ``config`` with ``sets`` (dotted keys, as ``--set``) applied first;
    ``up_s`` its usual start-up where it is not its workload's (``UP_S``)."""
    if up_s is None:
        up_s = UP_S["ferry_image" if workload == "image" else "ferry"]
    return {
        "kind": "ferry",
        "workload": workload,
        "env": FERRY_ENV,
        "config": os.path.join(CONFIGS, config),
        "naive": naive,
        "startup_s": startup_s,
        "up_s": up_s,
        "sets": sets or {},
    }


def _ferry_image(sets: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Ferry system of the image workload: ``ferry_e2e_image.yaml`` (the U-Net compiles
    per batch size in every replica: minutes) with ``sets``."""
    return _ferry("ferry_e2e_image.yaml", workload="image", startup_s=600, sets=sets)


def _peer(
    module: str,
    replicas: int,
    env: dict[str, str],
    startup_s: float = 300,
    workload: str = "classify",
    **args: Any,
) -> dict[str, Any]:
    """A peer app: ``args`` go to its ``build_app`` beside ``replicas``."""
    return {
        "kind": "peer",
        "workload": workload,
        "module": module,
        "replicas": replicas,
        "env": env,
        "startup_s": startup_s,
        "up_s": UP_S.get(module, 120),
        "args": {"replicas": replicas, **args},
    }


HOP2 = {
    "ingress_deployment.num_replicas": 8,
    "inference_deployment.num_replicas": 2,
    "inference_deployment.num_gpus": 0.5,
    "executor.pool_limit_fraction": 0.45,
}
"""``ferry_e2e_split.yaml`` as 8 HTTP replicas and 2 GPU owners of half the GPU each."""

TORCH_R50 = {"name": "resnet50", "engine": "torch", "source": "resnet50", "buckets": [8, 32, 128]}
"""ResNet-50 on the torch engine at the expert peer's three buckets (one compile each, in each
of 8 replicas: nine made its start-up minutes longer than the peer's)."""


TORCH_DYN = {**TORCH_R50, "compile": "dynamic", "buckets": [4, 8, 12, 16, 24, 32, 48, 64, 96, 128]}
"""ResNet-50 compiled once for every batch size (``compile: dynamic``) at ten buckets."""


def _ferry_torch(model: dict[str, Any] = TORCH_R50, **sets: Any) -> dict[str, Any]:
    """``ferry`` with ResNet-50 on the torch engine (``model``) and ``sets`` besides."""
    up = UP_S["ferry_torch_dyn" if model.get("compile") == "dynamic" else "ferry_torch"]
    return _ferry("ferry_e2e.yaml", startup_s=600, up_s=up, sets={"models": [model], **sets})


SHIPPED = os.path.join(ROOT, "serve_config.gpu.yaml")
"""The shipped GPU config, served as it is by ``ferry_shipped``."""

SYSTEMS: dict[str, dict[str, Any]] = {
    "ferry": _ferry("ferry_e2e.yaml"),
    "ferry_split": _ferry("ferry_e2e_split.yaml"),
    # split's hop (6 ingress, 4 inference replicas) as a Serve call, against ``ferry_split``'s
    # Unix socket (transport.local_hop, the default since it was built)
    "ferry_split_serve": _ferry("ferry_e2e_split.yaml", sets={"transport.local_hop": False}),
    # HTTP in 8 CPU replicas, the GPU owned by 2 inference replicas over the local hop
    "ferry_hop2": _ferry("ferry_e2e_split.yaml", sets=HOP2),
    # ``ferry_hop2`` with every JPEG on the hardware engines (not the hybrid CPU decoder)
    "ferry_hop2_hw": _ferry(
        "ferry_e2e_split.yaml", sets={**HOP2, "preprocess.gpu_decode_backend": "hardware"}
    ),
    "ferry_4stage": _ferry("ferry_e2e_4stage.yaml"),
    # ``ferry`` with ResNet-50 on the torch engine (torch.compile in Ferry's CUDA graphs)
    "ferry_torch": _ferry_torch(),
    # ``ferry`` and ``ferry_torch`` with kept arenas (executor.arenas: kept, executor_arenas.py):
    # each batch on one of the arenas its model keeps, so past the warm-up no batch is
    # captured as a new graph (the rows' executor_counts say how many were without it);
    # (ferry_torch's 0.2x ferry of 2026-12-06 measured one replica of 8: the rest compiling)
    "ferry_kept": _ferry("ferry_e2e.yaml", sets={"executor.arenas": "kept"}),
    "ferry_torch_kept": _ferry_torch(**{"executor.arenas": "kept"}),
    "ferry_naive": _ferry("ferry_e2e.yaml", naive=True),
    # ``ferry`` with every CUDA host wait of the replicas asleep (executor.host_wait: sleep):
    # nvImageCodec's threads spun on up to 6 of the 16 cores at 1,024 clients (e2e.json)
    "ferry_sleep": _ferry("ferry_e2e.yaml", sets={"executor.host_wait": "sleep"}),
    # The decode questions of 2026-12-05 (results/e2e_notes.md, run6), each beside ``ferry`` in
    # one run with the rows' gpu_jpeg_util: nvImageCodec's host threads a replica (4 in
    # ``ferry``; 8 replicas x 4 on 16 cores), the hardware JPEG engines alone, and 4 replicas
    # (a replica decodes a round of images per nvImageCodec call: fewer replicas, larger
    # rounds, as the peer decodes up to 128 in one call)
    **{f"ferry_t{n}": _ferry("ferry_e2e.yaml", sets={"preprocess.threads": n}) for n in (1, 2)},
    "ferry_hw": _ferry("ferry_e2e.yaml", sets={"preprocess.gpu_decode_backend": "hardware"}),
    # the engines take 60% of each call, the CUDA decoder the rest (photos: engines 75% busy)
    "ferry_hw60": _ferry(
        "ferry_e2e.yaml",
        sets={"preprocess.gpu_decode_backend": "hardware", "preprocess.gpu_decode_hw_load": 0.6},
    ),
    # the decoder's first call as before 2026-12-05: the warm-up's one JPEG, which fixed the
    # engines' share of every later call at one mini-batch (docs/placement.md)
    "ferry_noprime": _ferry("ferry_e2e.yaml", sets={"preprocess.gpu_decode_prime": False}),
    # the decoder's pool keeping 256 MiB of freed memory mapped (the default 0 hands it back)
    "ferry_keep256": _ferry("ferry_e2e.yaml", sets={"preprocess.gpu_decode_keep_bytes": 256 << 20}),
    # a replica's next decode round starts while the GPU still works on the last one
    "ferry_overlap": _ferry("ferry_e2e.yaml", sets={"preprocess.overlap_rounds": True}),
    # the decode-and-fit streams at CUDA's greatest priority, ahead of the model's kernels in
    # the replica: on an H100 (2026-12-06) the preprocess stage was half a request's time
    "ferry_prio": _ferry("ferry_e2e.yaml", sets={"preprocess.stream_priority": "high"}),
    "ferry_torch_prio": _ferry_torch(**{"preprocess.stream_priority": "high"}),
    # a 0.5 ms GIL switch interval in the replicas (Python's is 5): the decode round's thread
    # was busy 0.2 of a core while its round took ~13 ms, with the event loop at 0.6 of a
    # core -- a thread that waits for the GIL held by a busy loop waits up to the interval
    "ferry_swi05": _ferry("ferry_e2e.yaml", sets={"ingress_deployment.switch_interval_ms": 0.5}),
    "ferry_torch_swi05": _ferry_torch(**{"ingress_deployment.switch_interval_ms": 0.5}),
    # two decode rounds at once a replica, each with its own decoder (preprocess.decode_rounds;
    # H200, 2026-12-06: a round's 6.7 ms had 4.4 inside nvImageCodec, the next images waited)
    "ferry_r2": _ferry("ferry_e2e.yaml", sets={"preprocess.decode_rounds": 2}),
    "ferry_torch_r2": _ferry_torch(**{"preprocess.decode_rounds": 2}),
    # that with ten buckets from one dynamic compile: a batch of 9 runs at 12, not 32
    "ferry_torch_dyn": _ferry_torch(TORCH_DYN, **{"preprocess.decode_rounds": 2}),
    # that with the load on Ferry's own listener in each replica (ingress.direct_port,
    # deployments/direct.py): no HAProxy, no Serve request path (profile_pipeline.json
    # direct_listener: 0.52-0.65x the CPU a request on the 2-core VM)
    "ferry_torch_dyn_direct": _ferry_torch(
        TORCH_DYN, **{"preprocess.decode_rounds": 2, "ingress.direct_port": DIRECT_PORT}
    ),
    # HTTP in 8 CPU replicas on Ferry's own listener, the GPU in 2 owners of ResNet-50
    # compiled once (torch engine, compile: dynamic) fed over the local hop, every JPEG on
    # the hardware engines: bigger GPU batches than 8 owners make (ferry_hop2 lost to ferry
    # on 2026-12-05 by its owners' hybrid decode on the CPU, e2e_notes.md run7)
    "ferry_torch_hop2_direct": _ferry(
        "ferry_e2e_split.yaml",
        startup_s=600,
        up_s=UP_S["ferry_torch_dyn"],
        sets={
            **HOP2,
            "models": [TORCH_DYN],
            "preprocess.gpu_decode_backend": "hardware",
            "ingress.direct_port": DIRECT_PORT,
        },
    ),
    # serve_config.gpu.yaml as it ships (``ferry_torch_dyn_direct``'s form, on its port 8001,
    # with the digits model beside ResNet-50): the figures the README quotes are this config's
    "ferry_shipped": _ferry(SHIPPED, startup_s=600, up_s=UP_S["ferry_torch_dyn"]),
    # that with one batch in flight a replica and one decode round (``max_in_flight: 1``):
    # at 64 clients its 8 requests a replica in fewer, larger batches -- the GPU's busy time
    # an image falls with the batch (e2e_notes.md, 2026-12-08)
    "ferry_shipped_b1": _ferry(
        SHIPPED,
        startup_s=600,
        up_s=UP_S["ferry_torch_dyn"],
        sets={"executor.max_in_flight": 1, "preprocess.decode_rounds": 1},
    ),
    "ferry_nowatch": {**_ferry("ferry_e2e.yaml"), **NOWATCH},
    "ferry_4rep": _ferry(
        "ferry_e2e.yaml",
        sets={
            "ingress_deployment.num_replicas": 4,
            "ingress_deployment.num_gpus": 0.25,
            "executor.pool_limit_fraction": 0.226,
        },
    ),
    "rayserve_batch_1rep": _peer("rayserve_batch", 1, {}),
    "rayserve_batch_4rep": _peer("rayserve_batch", 4, {}),
    "rayserve_batch_haproxy_4rep": _peer("rayserve_batch", 4, HAPROXY),
    "rayserve_batch_haproxy_8rep": _peer("rayserve_batch", 8, HAPROXY),
    # the expert peer as a strong Ray Serve user writes it (peers/rayserve_expert.py): HAProxy
    # and Serve's throughput mode, as Ferry gets; one torch CPU thread a replica, sleeping
    # CUDA waits, two batches in flight; torch.compile takes minutes to start
    **{f"rayserve_expert_{n}": _peer("rayserve_expert", n, FERRY_ENV, 600) for n in (4, 8, 12)},
    "rayserve_expert_8_nowatch": {**_peer("rayserve_expert", 8, FERRY_ENV, 600), **NOWATCH},
    # the same decoding with nvImageCodec, as Ferry does (peers/expert_decoders.py): on
    # 2026-12-05 torchvision's decode served the photos at 3,282-4,867 img/s but chelsea at
    # 1,546-1,672 (e2e.json run6), where Ferry's decode is fastest
    **{
        f"rayserve_expert_{n}_nvimgcodec": _peer(
            "rayserve_expert", n, FERRY_ENV, 600, decoder="nvimgcodec"
        )
        for n in (4, 8, 12)
    },
    # the same, one batch at a time on the GPU thread (what the two in flight add)
    **{
        f"rayserve_expert_{n}_serial": _peer("rayserve_expert", n, FERRY_ENV, 600, pipelined=False)
        for n in (4, 8, 12)
    },
    # the same with only the batch's event wait asleep, nvJPEG's syncs spinning, as in the
    # 2026-12-03 _t1_block form (photos 2,098 img/s at 256 clients; that form also ran one
    # batch at a time). Measured 2026-12-05 (e2e.json run3): photos 993 -- the context flag
    # is not what the 2,098 lost
    **{
        f"rayserve_expert_{n}_evwait": _peer(
            "rayserve_expert", n, FERRY_ENV, 600, context_sleep=False
        )
        for n in (4, 8, 12)
    },
    # the settings of the 2026-12-03 _t1_block form (on today's peer, which also admits 384 a
    # replica and answers with orjson): one torch thread, the event wait asleep, nvJPEG's
    # syncs spinning, one batch at a time
    **{
        f"rayserve_expert_{n}_t1_block": _peer(
            "rayserve_expert", n, FERRY_ENV, 600, context_sleep=False, pipelined=False
        )
        for n in (4, 8, 12)
    },
    # the first committed peer's settings, too weak to count (results/e2e_notes.md): torch's
    # CPU threads (one a core in each replica), spinning waits, one batch at a time (its
    # per-group index copy and Serve's JSON encoder are gone in every form)
    **{
        f"rayserve_expert_{n}_weak": _peer(
            "rayserve_expert", n, FERRY_ENV, 600, threads=None, blocking=False, pipelined=False
        )
        for n in (4, 8, 12)
    },
    # the image workload: the U-Net compiles per batch size in every replica (minutes)
    "ferry_image": _ferry_image(),
    # with every CUDA host wait asleep: nvImageCodec's JPEG encoder waits for each answer's
    # encode with a plain cudaEventSynchronize on its own threads (cuda_encoder.cpp), and
    # those threads took 2.5-4.9 cores at 1,149-1,900 frames/s on an H100 (2026-12-05)
    "ferry_image_sleep": _ferry_image({"executor.host_wait": "sleep"}),
    # ``ferry_image_sleep`` with nvImageCodec's encoder on 16 host threads a replica, not 4:
    # its CUDA encoder makes one GPU round trip an answer on each thread, so a call of 64
    # answers is 16 round trips in turn on 4 threads (postprocess 62-65 ms of a request's
    # 120-124 at 256 clients, H100); asleep, as CUDA's default would spin 16 threads a
    # replica on those waits (one context a process: CU_CTX_SCHED_AUTO spins)
    "ferry_image_enc16": _ferry_image(
        {"executor.host_wait": "sleep", "preprocess.encoder_threads": 16}
    ),
    **{
        f"rayserve_image_{n}": _peer(
            "rayserve_image", n, FERRY_ENV, 600, workload="image", model=iw.UNET_PATH
        )
        for n in (2, 4, 8, 12)  # 2: the smoke run's (scripts/gpu_check.sh)
    },
}


def systems_of(workload: str) -> list[str]:
    return [s for s, spec in SYSTEMS.items() if spec["workload"] == workload]
