"""RESULTS.md's sections for the single-process and transport benchmarks, reliability and
the models: each renders one result's JSON as markdown lines."""

from __future__ import annotations

from benchmarks.report_base import md_table, notes_of


def decode_section(dec: dict) -> list[str]:
    lines = [
        f"{dec['machine']}; {dec['date']}. Image: {dec['image']}. {dec['method']}."
        + (f" Code: {dec['code']}." if dec.get("code") else "")
        + (
            " Cut short: the rows measured before the run ended."
            if not dec.get("complete", 1)
            else ""
        ),
        "",
        md_table(
            dec["rows"],
            [
                *(
                    [("corpus", "corpus"), ("images a call", "batch")]
                    if "batch" in dec["rows"][0]
                    else []
                ),
                ("path", "path"),
                ("img/s", "img_s"),
                ("CPU ms / img", "cpu_ms_per_img"),
                ("img/s vs 1 CPU thread", "img_s_vs_cpu_1t"),
                ("CPU ms vs 1 CPU thread", "cpu_ms_vs_cpu_1t"),
                *(
                    [("img/s vs the peer", "img_s_vs_peer")]
                    if any("img_s_vs_peer" in r for r in dec["rows"])
                    else []
                ),
            ],
        ),
    ]
    return lines


def profile_inference_section(prof: dict) -> list[str]:
    rows = []
    for r in prof["rows"]:
        d = {k: r[k] for k in ("group", "img_s", "cpu_ms_per_img", "event_loop_ms_per_img")}
        d["event_loop_busy"] = f"{r['event_loop_busy']:.0%}"
        rows.append(d)
    cols = [
        ("images per call", "group"),
        ("img/s", "img_s"),
        ("process CPU ms / img", "cpu_ms_per_img"),
        ("event loop ms / img", "event_loop_ms_per_img"),
        ("event loop busy", "event_loop_busy"),
    ]
    return [
        f"{prof['machine']}; {prof['date']}. {prof['method']}; {prof['code']}.",
        "",
        md_table(rows, cols),
    ]


def profile_pairs_section(doc: dict) -> list[str]:
    """profile_pipeline.py results saved with --out/--label: one row per label."""
    rows = [
        {
            "label": label,
            **r["load"],  # clients, img_s, p50_ms, p99_ms, errors
            "cpu": r["cpu_ms_per_request_total"],
            "ingress_cpu": next(  # (--bare: the floor app's one replica)
                (
                    r["cpu_ms_per_request"][k]
                    for k in (
                        "ServeReplica:ferry:Ingress",
                        "ServeReplica:ferry:Floor",
                        "ServeReplica:ferry:BatchedFloor",
                    )
                    if k in r["cpu_ms_per_request"]
                ),
                0.0,
            ),
        }
        for label, r in doc["results"].items()
    ]
    cols = [
        ("run", "label"),
        ("clients", "clients"),
        ("img/s", "img_s"),
        ("p50 ms", "p50_ms"),
        ("p99 ms", "p99_ms"),
        ("CPU ms / request", "cpu"),
        ("of it in the ingress (--bare: its replica)", "ingress_cpu"),
        ("errors", "errors"),
    ]
    out = [f"{doc['machine']}; {doc['date']}. {doc.get('method', '')}", "", md_table(rows, cols)]
    return out + ["", doc["summary"]] if doc.get("summary") else out


def profile_pipeline_section(doc: dict) -> list[str]:
    """profile_pipeline.json: one experiment per A/B change, each run one row."""
    lines = []
    for exp in doc["experiments"].values():
        lines += [f"### {exp['title']}", "", *profile_pairs_section(exp), ""]
    return lines


def serve_hop_section(doc: dict) -> list[str]:
    """bench_serve_hop.py: one Serve call between replicas against a plain Ray actor call."""
    cols = [
        ("mode", "mode"),
        ("path", "path"),
        ("payload bytes", "payload_bytes"),
        ("there p50 ms", "hop_in_p50_ms"),
        ("back p50 ms", "hop_out_p50_ms"),
        ("round trip p50 ms", "round_trip_p50_ms"),
        ("p99 ms", "round_trip_p99_ms"),
        ("vs Ray actor", "vs_ray_actor"),
    ]
    lines = [f"{doc['machine']}; {doc['date']}. {doc['method']}.", "", md_table(doc["rows"], cols)]
    lines += notes_of("serve_hop")
    return lines


def transport_section(tr: dict) -> list[str]:
    lines = [f"{tr['machine']}; {tr['date']}. {tr['method']}.", ""]
    mb = 1 << 20
    rows = [{**r, "MB": r["bytes"] // mb} for r in tr["rows"]]
    for r in rows:
        r["gb_s_1"] = r.get("gb_s_one_envelope_per_call", "")
    lines.append(
        md_table(
            rows,
            [
                ("path", "path"),
                ("MB", "MB"),
                ("GB/s", "gb_s"),
                ("GB/s, 1 envelope a call", "gb_s_1"),
                ("p50 us", "p50_us"),
                ("p99 us", "p99_us"),
            ],
        )
    )
    lines += [
        "",
        "| MB | Ferry NCCL / raw NCCL | Ferry NCCL / object store | Ferry NCCL socket / object store |",
    ]
    lines.append("|---|---|---|---|")
    for r in tr["ratios"]:
        lines.append(
            f"| {r['bytes'] // mb} | {r['ferry_nccl_vs_raw']:.2f}x | "
            f"{r['ferry_nccl_vs_object_store']:.1f}x | {r['ferry_nccl_socket_vs_object_store']:.1f}x |"
        )
    lines += [
        "",
        "Goals: "
        + "; ".join(f"{k}: {'met' if v else 'missed'}" for k, v in tr["goals"].items())
        + ".",
    ]
    lines += notes_of("transport")
    return lines


def reliability_section(rel: dict) -> list[str]:
    """reliability.json: one pathological image's cost; 1,000 stalled uploads."""
    sc, slow = rel["strip_cost"], rel["slow_clients"]
    cols = [
        ("image", "image"),
        ("decoded Mpx", "decoded_mpx"),
        ("decoded MB", "decoded_mb"),
        ("peak RSS growth MB", "peak_rss_growth_mb"),
    ]
    st = ", ".join(f"{v} x {k}" for k, v in slow["statuses"].items())
    return [
        f"{rel['machine']}; {rel['date']}.",
        "",
        f"Bounded decode: {sc['method']}.",
        "",
        md_table(sc["rows"], cols),
        "",
        f"Slow clients: {slow['method']}. The stalled uploads got {st}, all "
        f"{slow['closed']} connections closed by the server, the refusals' p99 "
        f"{slow['refused_503_p99_s']} s; the worst health answer took "
        f"{slow['probe_worst_s']['health']} s and the worst classify "
        f"{slow['probe_worst_s']['classify']} s ({slow['probes']['health']} of each, all 200).",
        *chaos_lines(rel),
        *([""] + [f"Not measured yet: {rel['not_measured']}."] if rel.get("not_measured") else []),
    ]


def chaos_lines(rel: dict) -> list[str]:
    """reliability_chaos.py's sections: replicas killed under load; redeploy and shutdown."""
    out = []
    for key in ("", "_one_process", "_gpu"):
        ch, dr = rel.get(f"chaos{key}"), rel.get(f"drain{key}")
        if ch:
            out += [
                "",
                f"Chaos ({ch['machine']}, {ch['config']}): {ch['method']} {len(ch['kills_at_s'])} "
                f"kills of {ch['killed']} in {ch['duration_s']} s, {ch['clients']} clients: "
                f"{ch['succeeded']:,} of {ch['requests']:,} succeeded ({ch['success_rate']:.3%}), "
                f"{ch['retried']} retried, {ch['hung_past_deadline']} past the deadline "
                f"(worst {ch['worst_s']} s); final statuses {ch['final_statuses']}"
                + (f", the failures {ch['failed_as']}." if ch.get("failed_as") else "."),
                *([f"Note: {ch['note']}"] if ch.get("note") else []),
            ]
        if dr and dr.get("method"):
            req = f" Requests: {dr['requests']}." if dr.get("requests") else ""
            out += ["", f"Drain ({dr.get('date')}): {dr['method']}{req}"]
        for phase, d in (dr or {}).items():
            if not isinstance(d, dict):  # (its date and method)
                continue
            how = f": {d['dropped_as']}" if d.get("dropped_as") else ""
            out += [
                "",
                f"Drain on {phase}: {d['in_flight_at_start']} requests in flight when it began, "
                f"{d['in_flight_finished_200']} finished with 200, {d['dropped']} dropped{how} "
                f"(took {d['took_s']} s; started meanwhile: {d['started_during']['final_statuses']}).",
            ]
    return out


def models_section(doc: dict) -> list[str]:
    """img/s per model and batch, one column per system, and ferry_torch's and ferry_onnx's
    ratios to torch_compile."""
    systems = [
        "ferry_torch",
        "torch_compile",
        "torch_eager",
        "ferry_native",
        "ferry_onnx",
        "ferry_onnx_native",
    ]
    cells: dict[tuple, dict] = {}
    for r in doc["rows"]:
        cells.setdefault((r["model"], r["batch"]), {})[r["system"]] = r
    present = [s for s in systems if any(s in c for c in cells.values())]
    rows = []
    for (model, batch), c in cells.items():
        row = {"model": model, "batch": batch}
        for s in present:
            r = c.get(s)
            row[s] = "" if r is None else f"{r['img_s']:,.0f} ({r['top1_agree']:.2f})"
        tc = c.get("torch_compile")
        for s in ("ferry_torch", "ferry_onnx"):
            r = c.get(s)
            row[f"{s}_ratio"] = f"{r['img_s'] / tc['img_s']:.2f}x" if r and tc else ""
        rows.append(row)
    cols = [("model", "model"), ("batch", "batch"), *((s, s) for s in present)]
    ratios = [(f"{s} / torch_compile", f"{s}_ratio") for s in ("ferry_torch", "ferry_onnx")]
    notes = [f"* {n}" for n in ([doc["notes"]] if isinstance(doc.get("notes"), str) else [])]
    return [
        f"{doc['machine']}; {doc['date']}"
        + (f", commit {doc['commit']}" if doc.get("commit") else "")
        + f". {doc['setup']}. Cells: img/s (top-1 agreement with torch fp32).",
        "",
        md_table(rows, [*cols, *ratios]),
        *([""] + notes if notes else []),
        *(line for key, t in doc.get("traces", {}).items() for line in trace_section(key, t)),
        *(line for key, ab in doc.get("wait_ab", {}).items() for line in wait_ab_section(key, ab)),
    ]


def wait_ab_section(key: str, ab: dict) -> list[str]:
    """``scripts/gpu_engine_ab.sh``'s bench_models runs (``models.json``'s ``wait_ab``): per
    model, batch and Ferry's wait and compute streams, ferry_torch against torch_compile
    measured in the same run, and what each process spent a batch."""
    cols = [
        ("model", "model"),
        ("batch", "batch"),
        ("batch_wait", "batch_wait"),
        ("compute streams", "compute_streams"),
        ("ferry_torch img/s", "ferry_torch"),
        ("torch_compile img/s", "torch_compile"),
        ("ratio", "ratio"),
        ("ferry CPU us a batch", "ferry_cpu_us_per_batch"),
        ("torch CPU us a batch", "torch_cpu_us_per_batch"),
    ]
    return ["", f"#### Batch waits: `{key}`", "", ab["what"], "", md_table(ab["rows"], cols)]


def trace_section(key: str, trace: dict) -> list[str]:
    """``trace_engine.py``'s readings of the GPU under each loop (a diagnostic run kept in
    ``models.json``'s ``traces``): per model, batch and system, the device's own figures."""
    cols = [
        ("model", "model"),
        ("batch", "batch"),
        ("system", "system"),
        ("us a batch", "us_per_batch"),
        ("GPU busy", "gpu_busy"),
        ("kernel us a batch", "kernel_us_per_batch"),
        ("idle gaps a batch", "idle_gaps_per_batch"),
        ("idle us a batch", "idle_us_per_batch"),
    ]
    return ["", f"#### Trace: `{key}`", "", trace["what"], "", md_table(trace["rows"], cols)]
