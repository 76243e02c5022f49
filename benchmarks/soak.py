"""Soak (issue 17 item 7; not in CI): N minutes of mixed traffic -- classify on every model,
v2 binary tensors, 2% bad requests from the regression corpus, and with ``--streams K`` live
streams opening and closing all the time (``soak_streams.py``) -- while the RSS of every
Serve replica and proxy process and the device pool's bytes in use are sampled.

    python benchmarks/soak.py --config serve_config.yaml --minutes 30            # CPU default
    python benchmarks/soak.py --config serve_config.gpu.yaml --minutes 10 --clients 64 \\
        --name gpu --out $OUT/soak --write-to $OUT/reliability.json          # on the GPU box
    python benchmarks/soak.py --url http://127.0.0.1:8000 ...                # a running Ferry
    python benchmarks/soak.py --minutes 10 --streams 8 --name cpu_streams        # with streams

Judged as Triton's memory-growth test does: per process, the largest sample after the
warm-up minus the trimmed mean (10% off each end) of the second half's samples, at most
``--max-growth-mb`` (100). Latency: the p99 of the good requests in the second half against
the first half's (warm-up left out), at most ``--max-drift`` (20%) apart; every window's p99
is listed too. A good request must get 200, a bad one its 4xx with Ferry's JSON error;
a good request refused by the queue budget (503 with Ferry's JSON and ``Retry-After``) is
counted as shed, apart, and its client waits ``Retry-After`` as a client should; anything
else is counted as unexpected (for streams: ``soak_streams.py``; the replica's stream book
must be idle at the end). Progress is printed every sample. Writes
``soak.<name>`` into results/reliability.json (``--write-to``) and the samples to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks import ray_probe, soak_streams  # noqa: E402
from benchmarks.common import read_results, write_json, write_results  # noqa: E402
from benchmarks.soak_judge import growth, judge, pct, section, trimmed_mean  # noqa: E402,F401

RESULTS = os.path.join(HERE, "results", "reliability.json")


@dataclass(frozen=True)
class Req:
    kind: str  # what it is, for the per-kind figures
    path: str
    body: bytes
    headers: dict[str, str]
    expect: tuple[int, ...]  # the statuses it may get
    bad: bool = False


def _v2_binary(model: str, name: str, shape: list[int]) -> Req:
    import numpy as np

    dims = [1, *(d if d > 0 else 1 for d in shape[1:])]
    x = np.random.default_rng(0).integers(0, 256, dims, dtype=np.uint8).tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": dims,
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": len(x)},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return Req(
        f"v2 {model}",
        f"/v2/models/{model}/infer",
        head + x,
        {
            "content-type": "application/octet-stream",
            "inference-header-content-length": str(len(head)),
        },
        (200,),
    )


def traffic(url: str) -> tuple[list[Req], list[Req]]:
    """(good requests, bad requests) for the models the service lists."""
    import httpx
    import numpy as np

    from loadtest.corpus import corpus
    from pipeline.imaging import encode_jpeg, encode_png
    from pipeline.models import digits
    from tests.unit.test_error_json import REGRESSIONS, _deep

    models = [m["name"] for m in httpx.get(url + "/v1/models", timeout=30).json()["models"]]
    photos = corpus("photos").bodies[:8]
    digit_pngs = [encode_png(x) for x in digits.load_split()[2][:16]]
    good: list[Req] = []
    for m in models:
        meta = httpx.get(f"{url}/v2/models/{m}", timeout=30).json()
        shape = meta["inputs"][0]["shape"]
        small = shape[1] <= 32  # a digits-sized input: its own small images
        for body in digit_pngs if small else photos:
            ct = "image/png" if small else "image/jpeg"
            good.append(
                Req(f"classify {m}", f"/v1/models/{m}/classify", body, {"content-type": ct}, (200,))
            )
        if meta["inputs"][0]["datatype"] == "UINT8":
            good.append(_v2_binary(m, meta["inputs"][0]["name"], shape))
    target = "digits" if "digits" in models else models[0]
    bad = [
        Req(
            "bad v2",
            f"/v2/models/{target}/infer",
            json.dumps(b).encode(),
            {"content-type": "application/json"},
            (400,),
            True,
        )
        for _, b in REGRESSIONS
    ]
    bad += [
        Req(
            "bad v2",
            f"/v2/models/{target}/infer",
            _deep(10_000),
            {"content-type": "application/json"},
            (400,),
            True,
        ),
        Req(
            "bad header",
            f"/v1/models/{models[0]}/classify",
            photos[0],
            {"content-type": "image/jpeg", "x-deadline-ms": "nan"},
            (400,),
            True,
        ),
        Req(
            "bad image",
            f"/v1/models/{models[0]}/classify",
            b"GIF89a" + b"\0" * 64,
            {"content-type": "image/jpeg"},
            (415,),
            True,
        ),
        Req(
            "bad image",
            f"/v1/models/{models[0]}/classify",
            photos[0][: len(photos[0]) // 3],
            {"content-type": "image/jpeg"},
            (200, 400),  # a truncated JPEG may decode (grey below the cut) or be refused
            True,
        ),
        Req(
            "bad route",
            "/v1/models/nope/classify",
            photos[0],
            {"content-type": "image/jpeg"},
            (404,),
            True,
        ),
        Req(
            "bad image",
            f"/v1/models/{models[0]}/classify",
            encode_jpeg(np.zeros((4, 40000, 3), np.uint8)),
            {"content-type": "image/jpeg"},
            (200, 400, 413),
            True,
        ),
    ]
    return good, bad


class Book:
    """Every answer: (time, kind, status, ms) plus what was unexpected."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, str, int, float]] = []
        self.unexpected: dict[str, int] = {}
        self.shed = 0  # good requests refused by the queue budget: 503, Ferry JSON, Retry-After

    def add(self, req: Req, status: int, ms: float, json_ok: bool, retry_after: bool) -> None:
        self.rows.append((time.time(), req.kind, status, ms))
        if status == 503 and not req.bad and json_ok and retry_after:
            self.shed += 1  # the service's answer to load, not a fault: counted apart
        elif status not in req.expect or (req.bad and not json_ok):
            key = f"{req.kind} -> {status}{'' if json_ok else ' (not Ferry JSON)'}"
            self.unexpected[key] = self.unexpected.get(key, 0) + 1


async def client(
    url: str, good: list[Req], bad: list[Req], bad_share: float, end: float, book: Book, seed: int
) -> None:
    import httpx

    rnd = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        while time.time() < end:
            req = rnd.choice(bad) if rnd.random() < bad_share else rnd.choice(good)
            t0 = time.perf_counter()
            try:
                r = await c.post(
                    req.path,
                    content=req.body,
                    headers={**req.headers, "x-request-id": uuid.uuid4().hex},
                )
                status, json_ok = r.status_code, True
                if status != 200:
                    try:
                        b = r.json()
                        json_ok = bool(b.get("error")) and bool(b.get("request_id"))
                    except ValueError:
                        json_ok = False
            except httpx.HTTPError as exc:  # no answer at all
                key = f"{req.kind} -> {type(exc).__name__}"
                book.unexpected[key] = book.unexpected.get(key, 0) + 1
                book.rows.append((time.time(), req.kind, 0, (time.perf_counter() - t0) * 1e3))
                await asyncio.sleep(0.5)
                continue
            retry_after = r.headers.get("retry-after")
            book.add(req, status, (time.perf_counter() - t0) * 1e3, json_ok, bool(retry_after))
            if status == 503 and retry_after:  # a client that does as it is told
                await asyncio.sleep(float(retry_after))


async def soak(args: argparse.Namespace, url: str) -> dict[str, Any]:
    good, bad = traffic(url)
    book = Book()
    t_start = time.time()
    end = t_start + args.minutes * 60
    tasks = [
        asyncio.ensure_future(client(url, good, bad, args.bad_share, end, book, i))
        for i in range(args.clients)
    ]
    sbook = soak_streams.StreamBook()
    tasks += soak_streams.start(args, url, end, sbook)
    rss: dict[str, list[tuple[float, float]]] = {}
    pool: dict[str, list[tuple[float, float]]] = {}
    last_n = 0
    while time.time() < end:
        await asyncio.sleep(min(args.sample_s, max(0.0, end - time.time())))
        now = time.time()
        for k, v in ray_probe.serve_rss().items():
            rss.setdefault(k, []).append((now, float(v)))
        for k, v in ray_probe.pool_bytes().items():
            pool.setdefault(k, []).append((now, v))
        recent = [r[3] for r in book.rows[last_n:] if r[2] == 200]
        top = max(((s[-1][1] - s[0][1]) / 2**20 for s in rss.values()), default=0.0)
        print(
            f"[{now - t_start:6.0f}/{args.minutes * 60:.0f} s] {len(book.rows)} requests, "
            f"{(len(book.rows) - last_n) / args.sample_s:.1f}/s, p99 {pct(recent, 0.99)} ms, "
            f"{len(rss)} processes, largest RSS change {top:+.1f} MB, "
            f"shed {book.shed}, unexpected {sum(book.unexpected.values())}"
            + (
                f", streams {len(sbook.done)} closed ({sbook.opened()} opened), "
                f"unexpected {sum(sbook.unexpected.values())}"
                if args.streams
                else ""
            ),
            flush=True,
        )
        last_n = len(book.rows)
    await asyncio.gather(*tasks)
    t_end = time.time()
    out = judge(args, book, rss, pool, t_start, t_end)
    if args.streams:
        await soak_streams.judge_into(out, args, sbook, url, t_start, t_end)
    return out


def write_section(name: str, doc: dict[str, Any], path: str) -> None:
    rel = read_results(path)
    rel.setdefault("soak", {})[name] = doc
    write_results(path, rel)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=os.path.join(ROOT, "serve_config.yaml"))
    ap.add_argument("--url", help="a running Ferry instead of `serve run --config`")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--bad-share", type=float, default=0.02)
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--window-s", type=float, default=60)
    ap.add_argument("--warmup-s", type=float, default=60)
    ap.add_argument("--max-growth-mb", type=float, default=100)
    ap.add_argument("--max-drift", type=float, default=0.20)
    ap.add_argument("--streams", type=int, default=0, help="stream players (0: none)")
    ap.add_argument("--stream-model", default="digits")
    ap.add_argument("--stream-fps", type=float, default=10)
    ap.add_argument("--stream-seconds", type=float, default=5, help="a stream's mean life")
    ap.add_argument("--stream-size", default="64x64", help="frame WIDTHxHEIGHT (JPEG)")
    ap.add_argument("--name", default="cpu", help="its key under soak in reliability.json")
    ap.add_argument("--label", default="", help="e.g. 'short check'")
    ap.add_argument("--conditions", default="", help="what else ran on the machine")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "ferry-soak"))
    ap.add_argument("--write-to", default=RESULTS)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    args.ingress_replicas = 1 if args.url else ingress_replicas(args.config)
    import psutil

    from loadtest.run import start_app, stop_app, wait_ok, wait_ready

    os.makedirs(args.out, exist_ok=True)
    proc, url = None, args.url
    if url is None:
        url = "http://127.0.0.1:8000"
        proc = start_app(args.config, os.path.join(args.out, "serve.log"))
    try:
        if not wait_ready(url, 600, proc):
            raise SystemExit(f"not ready; see {args.out}/serve.log")
        for m in ("digits", "resnet50"):  # every stage has answered once before timing
            wait_ok(
                f"{url}/v1/models/{m}/classify",
                120,
                proc,
                _warm_png(),
                {"content-type": "image/png"},
                60,
            )
        res = asyncio.run(soak(args, url))
    finally:
        if proc is not None:
            stop_app(proc)
    try:
        import cupy  # noqa: F401

        gpu = (
            ", GPU " + os.popen("nvidia-smi --query-gpu=name --format=csv,noheader").read().strip()
        )
    except ImportError:
        gpu = ", no GPU"
    doc = {
        "label": args.label,
        "config": os.path.relpath(args.config, ROOT) if args.url is None else args.url,
        "machine": f"{platform.node()}: {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB{gpu}",
        "conditions": f"{args.conditions}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}".lstrip("; "),
        "date": datetime.date.today().isoformat(),
        "clients": args.clients,
        "bad_share": args.bad_share,
        "rule": f"per process and per pool: max after {args.warmup_s:.0f} s warm-up minus the "
        f"10%-trimmed mean of the second half <= {args.max_growth_mb:.0f} MB; p99 of 200s, "
        f"second half vs first, within {args.max_drift:.0%}",
        **res,
    }
    write_json(os.path.join(args.out, "soak.json"), doc)
    if not args.no_write:
        write_section(args.name, doc, args.write_to)
    print(
        json.dumps(
            {k: doc[k] for k in ("requests", "unexpected", "worst_growth_mb", "p99_drift", "pass")},
            indent=2,
        )
    )
    return 0 if all(doc["pass"].values()) else 1


def ingress_replicas(path: str) -> int:
    """How many replicas answer ``GET /v1/streams`` in the Serve config ``path`` (its Ferry
    app's ingress deployment): the stream book must be idle in each of them."""
    from deployments import config_file as cf

    for app in cf.read(path).get("applications") or []:
        if app.get("import_path") == cf.FERRY_APP:
            args = cf.app_args(app.get("args"), cf.base_dir_of(path))
            return cf.load_config(args).ingress_deployment.num_replicas
    return 1


def _warm_png() -> bytes:
    import numpy as np

    from pipeline.imaging import encode_png

    return encode_png(np.zeros((32, 32, 3), np.uint8))


if __name__ == "__main__":
    sys.exit(main())
