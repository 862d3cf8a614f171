"""Image pipelines, Inception V3 fp32 under one CPU for the callers and the pod together: photographs as JPEG ->
top-5 through the planned ensemble against the bare model fed ready tensors; against callers that decode on their
side, at the same total CPU; the bytes a request carries each way; the naive ensemble (Triton's default instance
counts, ONNX Runtime's default threads, Triton's unbounded queue); bad input beside the callers; and the planned
ensemble's memory with its queues full of the largest images it takes, against the limit the plan gives its pod.

The callers run in a cgroup of their own, as the server does, and the two share TOTAL_CPUS: callers that only send
files need ENSEMBLE_CALLERS_CPUS, callers that decode each image before they send it need more, which the server
then lacks. Each split in DECODING_SPLITS is measured and the best kept. Every server runs at once and they are
measured in turn over alternating rounds: this machine's speed drifts by a fifth within minutes, more than separate
measurements could tell.

`python -m inferop_devtools.bench.pipeline URL MODEL FOLDER send|decode CALLERS SECONDS PROCS` runs the callers,
joins their cgroup (PROCS: its cgroup.procs files, comma-separated) once they are ready to send, and prints what they
measured as JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from inferop_devtools.bench.targets import Target

TOTAL_CPUS = 1.0  # the callers' and the pod's: the other CPU of a two-CPU machine keeps the rest of it quiet
# The least CFS quota, 1 ms a 100 ms period: callers that only send files need about a tenth of it (0.15 ms a request
# at 9 requests/s, measured).
ENSEMBLE_CALLERS_CPUS = 0.01
# CPUs tried for callers that decode: decoding, preprocessing and ranking an image take about 5 ms in a process of its
# own (the stages' rate), about twice that beside the server, whose model evicts its caches: 9.6 ms an image measured,
# the sending of its tensor included, 0.09 CPU at the model's 9 images/s. The best of the splits is kept.
DECODING_SPLITS = (0.08, 0.1, 0.12)
CALLERS = 16  # closed-loop callers of one image each: two batches of the model's, the dynamic batcher kept full
ROUNDS = 3
TIMEOUT = 60.0
ENSEMBLE_OVER_MODEL = 0.9
ENSEMBLE_OVER_CALLERS_DECODING = 1.0
FEWER_BYTES = 10.0
PLANNED_OVER_NAIVE = 1.0
BESIDE_BAD_INPUT = 0.9  # the ensemble's callers' rate while bad input arrives, against their rounds' median
# The server's memory at the end of the bad input against half-way through it: nothing kept per request. Not against
# before it: the first 8 MiB bodies grow tritonserver's buffers once (700 -> 737 MiB, 1.05x, in one run; 1.04x in
# another), which then serve every later one.
MEMORY_END_OVER_HALFWAY = 1.02
# The pipeline full of its largest images: each 10th caller sends a PNG of maxImagePixels (what a decoding instance
# holds most of), the others a JPEG of nearly maxImageBytes (what every request in the pipeline holds most of); as many
# callers as the memory estimate counts requests (both queues, the batches executing, the decoding instances), each
# sending again as soon as it is answered or refused. A caller beyond those holds its image too while tritonserver
# reads it and a full queue refuses it, and the allocator keeps some of the freed ones: with a round of batches more
# (107-109 callers) the peak reached 1,806-2,158 MiB in three runs against 1,697 with the 89 the estimate counts
# (Inception V3 under 1 CPU, 2026-12-06), and 2,290 with 182.
# A pod's callers beyond what it holds are the gateway's to refuse (inferop_core.capacity.gateway_admission).
LARGEST_PICTURE_EVERY = 10
LARGEST_SECONDS = 60.0

SERVERS = ("ensemble", "model", "decoding", "naive_ensemble")


def pipeline_bench(seconds: float) -> dict[str, Any]:
    """Export Inception V3 with its pipeline (measured and proved as a user's export is), render every
    configuration for its CPUs as the operator would, and measure them side by side."""
    from inferop.serving.localrepo import write_model_repo, write_pipeline_repo
    from inferop_devtools.field.pods import naive
    from inferop_export.exporter import export_model
    from inferop_export.networks.inception_v3 import inception_v3
    from inferop_export.pipeline import typical_images
    from inferop_operator.plan import plan_service
    from inferop_operator.spec import Pipeline

    pod_cpus = TOTAL_CPUS - ENSEMBLE_CALLERS_CPUS
    with tempfile.TemporaryDirectory(prefix="inferop-bench-pipeline-") as work_dir:
        work = Path(work_dir)
        print("image pipeline: exporting Inception V3 with --pipeline image ...", flush=True)
        report = export_model(inception_v3(), work / "exported", quiet=True, pipeline=Pipeline())
        source = Path(report.model_path).parents[1]
        limits = {"limits": {"cpu": f"{pod_cpus:g}"}, "requests": {}}
        on_pod = report.spec.model_copy(update={"resources": report.spec.resources.model_copy(update=limits)})
        planned = plan_service(on_pod)
        assert planned.pipeline is not None and planned.stages is not None
        bare = plan_service(on_pod.model_copy(update={"pipeline": None})).serving
        naive_pipeline = planned.pipeline.model_copy(
            update={"model": naive(planned.pipeline.model, instances=1), "pre_instances": 1, "post_instances": 1}
        )
        images = work / "images"
        images.mkdir()
        for index, data in enumerate(typical_images()):
            (images / f"{index}.jpg").write_bytes(data)

        repos = {
            "ensemble": write_pipeline_repo(planned.pipeline, source, work / "ensemble"),
            "model": write_model_repo(bare, source, work / "model"),
            "decoding": write_model_repo(bare, source, work / "decoding"),
            "naive_ensemble": write_pipeline_repo(naive_pipeline, source, work / "naive"),
        }
        pipeline_name = planned.pipeline.name
        print(
            f"image pipeline: {ROUNDS} alternating rounds of {CALLERS} callers of one image, callers and server "
            f"sharing {TOTAL_CPUS:g} CPU ...",
            flush=True,
        )
        measured: dict[str, list[dict[str, Any]]] = {name: [] for name in (*SERVERS[:2], SERVERS[3])}
        decoding: dict[float, list[dict[str, Any]]] = {split: [] for split in DECODING_SPLITS}
        with ExitStack() as stack:
            servers = {name: stack.enter_context(served(repo, pod_cpus)) for name, repo in repos.items()}
            for name, server in servers.items():  # warm: the first requests of a server load what it lazily loads
                callers(server.url, pipeline_name if name.endswith("ensemble") else bare.name, images, False, 1, 2)
            for _ in range(ROUNDS):
                for name in measured:
                    pipeline = name.endswith("ensemble")
                    model = pipeline_name if pipeline else bare.name
                    # The bare model's callers send ready tensors: they get what the ensemble's do.
                    measured[name].append(
                        callers(servers[name].url, model, images, False, ENSEMBLE_CALLERS_CPUS, seconds)
                    )
                for split in DECODING_SPLITS:
                    assert servers["decoding"].cgroup is not None
                    servers["decoding"].cgroup.limit_cpu(TOTAL_CPUS - split)
                    decoding[split].append(callers(servers["decoding"].url, bare.name, images, True, split, seconds))
            print("image pipeline: bad input beside the callers of the planned ensemble ...", flush=True)
            refused = bad_input_round(
                servers["ensemble"], pipeline_name, images, planned.pipeline.max_image_bytes, seconds
            )
        print("image pipeline: the planned ensemble full of its largest images ...", flush=True)
        largest = largest_images_round(on_pod, source, work / "largest", pod_cpus, LARGEST_SECONDS)
    best = max(DECODING_SPLITS, key=lambda split: statistics.median(r["throughput"] for r in decoding[split]))
    return {
        "total_cpus": TOTAL_CPUS,
        "callers": CALLERS,
        "stages": planned.stages.explain(),
        "images_per_cpu_second": report.spec.pipeline.images_per_cpu_second if report.spec.pipeline else None,
        "proved": report.pipeline,
        **{name: summary(rounds, callers_cpus=ENSEMBLE_CALLERS_CPUS) for name, rounds in measured.items()},
        "decoding": summary(decoding[best], callers_cpus=best),
        "decoding_splits": {f"{split:g}": summary(decoding[split], callers_cpus=split) for split in DECODING_SPLITS},
        "bad_input": refused,
        "largest_images": largest,
    }


def png_declaring(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header declares `width` x `height` pixels: a decompression bomb."""
    from inferop_operator.agreement import PNG_SIGNATURE, png_chunk

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunks = png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(bytes(64))) + png_chunk(b"IEND", b"")
    return PNG_SIGNATURE + chunks


def bad_inputs(max_image_bytes: int) -> dict[str, bytes]:
    """What a caller may send that is no image the pipeline takes, by what it is."""
    from inferop_export.pipeline import typical_images

    photo = typical_images()[0]
    return {
        "a zero-byte body": b"",
        "bytes that are no image": b"%PDF-1.7 a document, not a picture",
        "a corrupt JPEG": photo[: len(photo) // 3],
        "a file over maxImageBytes": b"\xff\xd8\xff" + bytes(max_image_bytes),
        "a decompression bomb": png_declaring(20_000, 20_000),  # 400 megapixels declared, 64 bytes of them sent
    }


def bad_input_round(server: Any, ensemble: str, images: Path, max_image_bytes: int, seconds: float) -> dict[str, Any]:
    """The ensemble's callers as in a round, while one more caller (this process, on the CPU the pod and its callers
    leave) sends bad input after bad input: each one's answer and time, the good callers' images per second, and the
    server's memory before, half-way, at its peak and after."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from inferop.bench import percentiles
    from inferop_core.tritonconfig import IMAGE_INPUT

    bad = bad_inputs(max_image_bytes)
    assert server.cgroup is not None
    before = server.cgroup.memory_current()
    server.cgroup.reset_peak()
    answers: dict[str, list[tuple[str, float]]] = {kind: [] for kind in bad}
    stop = threading.Event()

    def send() -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=TIMEOUT)
        try:
            for kind in itertools.cycle(bad):
                if stop.is_set():
                    return
                request = httpclient.InferInput(IMAGE_INPUT, [1, 1], "BYTES")
                request.set_data_from_numpy(np.array([[bad[kind]]], dtype=np.object_), binary_data=True)
                began = time.monotonic()
                try:
                    client.infer(ensemble, [request])
                    status = "200"
                except InferenceServerException as error:
                    status = str(error.status())
                answers[kind].append((status, time.monotonic() - began))
        finally:
            client.close()

    samples: list[tuple[float, int]] = []  # the server's memory while bad input arrives

    def sample() -> None:
        while not stop.wait(0.5):
            samples.append((time.monotonic(), server.cgroup.memory_current()))

    sender, sampler = threading.Thread(target=send, daemon=True), threading.Thread(target=sample, daemon=True)
    began = time.monotonic()
    sender.start()
    sampler.start()
    try:
        good = callers(server.url, ensemble, images, False, ENSEMBLE_CALLERS_CPUS, seconds)
    finally:
        stop.set()
        sender.join(timeout=2 * TIMEOUT)
        sampler.join()
    halfway = next(memory for at, memory in samples if at >= (began + time.monotonic()) / 2)
    latencies = [latency for sent in answers.values() for _, latency in sent]
    return {
        "sent": sum(len(sent) for sent in answers.values()),
        "not_400": sum(status != "400" for sent in answers.values() for status, _ in sent),
        "p99_ms": round(percentiles(latencies)[2], 1),
        "p99_ms_by_kind": {kind: round(percentiles([t for _, t in sent])[2], 1) for kind, sent in answers.items()},
        "good": summary([good], callers_cpus=ENSEMBLE_CALLERS_CPUS),
        "memory_before_mib": round(before / 2**20, 1),
        "memory_halfway_mib": round(halfway / 2**20, 1),
        "memory_peak_mib": round(server.cgroup.memory_peak() / 2**20, 1),
        "memory_after_mib": round(server.cgroup.memory_current() / 2**20, 1),
    }


def largest_images(max_image_bytes: int, max_image_pixels: int) -> dict[str, bytes]:
    """The largest images a pipeline takes: a JPEG of noise, the largest at quality 95 under `max_image_bytes`
    (decoded at the scale the resize needs, it holds its bytes more than its pixels), and a flat RGBA PNG of nearly
    `max_image_pixels` (a few KB that decode to the most bytes a pixel)."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    jpeg, side = b"", 256
    while True:
        encoded = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(encoded, "JPEG", quality=95)
        if len(encoded.getvalue()) > max_image_bytes:
            break
        jpeg, side = encoded.getvalue(), round(side * 1.05)
    side = math.isqrt(max_image_pixels)
    png = io.BytesIO()
    Image.new("RGBA", (side, side), (10, 200, 30, 128)).save(png, "PNG")
    return {"jpeg": jpeg, "png": png.getvalue()}


def largest_images_round(spec: Any, source: Path, work: Path, cpus: float, seconds: float) -> dict[str, Any]:
    """The planned ensemble (the local runtime's memory constants, as the field drills plan their pods) under its
    pod's CPU quota, its queues kept full of the largest images it takes: the server's memory peak against the
    estimate and the limit the plan gives, and against the limit without the stages' term (the ablation)."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from inferop.serving.localrepo import write_pipeline_repo
    from inferop_core.memory import LOCAL_RUNTIME
    from inferop_core.tritonconfig import IMAGE_INPUT
    from inferop_operator.plan import needed_limit_bytes, plan_service
    from inferop_operator.spec import parse_spec

    raw = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["runtime"] = {**raw.get("runtime", {}), "memoryOverhead": str(LOCAL_RUNTIME.baseline_bytes)}
    plan = plan_service(parse_spec(raw), LOCAL_RUNTIME)
    pipeline, estimate = plan.pipeline, plan.memory.estimate
    assert pipeline is not None and pipeline.model.max_queue_size is not None
    images = largest_images(pipeline.max_image_bytes, pipeline.max_image_pixels)
    batch_round = pipeline.model.instances * pipeline.model.max_batch_size
    # The requests the memory estimate holds an image for (inferop_core.memory.stage_bytes): both queues at the
    # model's bound, a batch round executing, one image in each decoding instance.
    callers = 2 * pipeline.model.max_queue_size + batch_round + pipeline.pre_instances
    outcomes: Counter[str] = Counter()
    counting = threading.Lock()
    stop = threading.Event()

    def call(url: str, index: int) -> None:
        data = images["png" if index % LARGEST_PICTURE_EVERY == 0 else "jpeg"]
        client = httpclient.InferenceServerClient(url, network_timeout=TIMEOUT, connection_timeout=TIMEOUT)
        request = httpclient.InferInput(IMAGE_INPUT, [1, 1], "BYTES")
        request.set_data_from_numpy(np.array([[data]], dtype=np.object_), binary_data=True)
        try:
            while not stop.is_set():
                try:
                    client.infer(pipeline.name, [request])
                    outcome = "answered"
                except InferenceServerException as error:
                    outcome = f"{error.status()} {'queue full' if 'queue size' in str(error) else 'timed out'}"
                with counting:
                    outcomes[outcome] += 1
        finally:
            client.close()

    with served(write_pipeline_repo(pipeline, source, work), cpus) as server:
        assert server.cgroup is not None
        before = server.cgroup.memory_current()
        server.cgroup.reset_peak()
        threads = [threading.Thread(target=call, args=(server.url, index), daemon=True) for index in range(callers)]
        for thread in threads:
            thread.start()
        time.sleep(seconds)  # the duration of the round: the peak is read after it
        stop.set()
        for thread in threads:
            thread.join(timeout=2 * TIMEOUT)
        peak = server.cgroup.memory_peak()
    return {
        "callers": callers,
        "seconds": seconds,
        "jpeg_bytes": len(images["jpeg"]),
        "png_pixels": math.isqrt(pipeline.max_image_pixels) ** 2,
        "outcomes": dict(sorted(outcomes.items())),
        "memory_before_mib": round(before / 2**20, 1),
        "memory_peak_mib": round(peak / 2**20, 1),
        "estimate_mib": round(estimate.total / 2**20, 1),
        "stages_mib": round(estimate.stages / 2**20, 1),
        "limit_mib": round(needed_limit_bytes(estimate.total) / 2**20, 1),
        "ablated_mib": round(needed_limit_bytes(estimate.total - estimate.stages) / 2**20, 1),
    }


def summary(rounds: list[dict[str, Any]], callers_cpus: float) -> dict[str, Any]:
    return {
        "median": round(statistics.median(r["throughput"] for r in rounds), 2),
        "rounds": [round(r["throughput"], 2) for r in rounds],
        "p99_ms": round(statistics.median(r["p99_ms"] for r in rounds), 1),
        "request_bytes": round(rounds[0]["request_bytes"]),
        "callers_cpu_ms": round(statistics.median(r["client_cpu_ms"] for r in rounds), 3),
        "callers_cpus": callers_cpus,
        "errors": sum(r["errors"] for r in rounds),
    }


def served(repo: Path, cpus: float) -> Any:
    from inferop.limits import PodLimits
    from inferop.serving.tritonserver import TritonServer, free_port

    return TritonServer(repo, http_port=free_port(), limits=PodLimits(cpus=cpus))


def callers(url: str, model: str, images: Path, decode: bool, cpus: float, seconds: float) -> dict[str, Any]:
    """CALLERS closed-loop callers in a cgroup of `cpus` (this module as its own process), sending the images of
    `images` to the ensemble, or decoding each (`decode`) and sending the model its tensor. The process joins the
    cgroup once it is ready to send: starting Python and importing numpy under a hundredth of a CPU takes minutes."""
    from inferop.limits import PodCgroup, PodLimits

    cgroup = PodCgroup(PodLimits(cpus=cpus)).create()
    try:
        mode = "decode" if decode else "send"
        procs = ",".join(str(directory / "cgroup.procs") for directory in cgroup.directories)
        done = subprocess.run(
            [sys.executable, "-m", __name__, url, model, str(images), mode, str(CALLERS), str(seconds), procs],
            capture_output=True,
            text=True,
            timeout=seconds + 4 * TIMEOUT,
            check=False,
        )
    finally:
        cgroup.destroy()
    if done.returncode != 0:
        raise RuntimeError(f"the callers failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def closed_loop(
    url: str, model: str, images: Path, decode: bool, concurrency: int, seconds: float, procs: list[Path]
) -> dict[str, Any]:
    """What `concurrency` callers measure in `seconds`, in the cgroup whose cgroup.procs files are `procs`: each sends
    the next image (decoding it first and sending its tensor where `decode`), waits for the answer, and sends again."""
    from inferop import bench
    from inferop.client import connect, describe, preprocess_image

    client = connect(url, TIMEOUT)
    info = describe(client, model)
    client.close()
    paths = sorted(images.iterdir())
    turns = None
    if decode:
        size = info.input_dims[-1]
        tensors = [[(info.inputs[0], preprocess_image(path, size, info.processing)[None])] for path in paths]
        exchange = bench.Exchange.for_model(url, info, tensors)

        def decoded() -> Any:
            for index in itertools.cycle(range(len(paths))):
                preprocess_image(paths[index], size, info.processing)  # each request's own decoding, its CPU spent
                yield exchange.requests[index]

        turns = decoded()
    else:
        # The ensemble's callers send the files; the bare model's, generated tensors of its input's size.
        exchange = bench.Exchange.for_model(
            url, info, bench.bench_requests(info, paths if info.image_pipeline else [], 1)
        )
    for path in procs:  # ready to send: from here on, every CPU-second counts against the callers' share
        path.write_text(str(os.getpid()))
    began = time.process_time()
    seen, elapsed = asyncio.run(exchange.closed_loop(concurrency, seconds, TIMEOUT, turns))
    cpu = time.process_time() - began
    latencies = [latency for caller in seen for latency in caller.latencies]
    return {
        "throughput": len(latencies) / elapsed,
        "p99_ms": bench.percentiles(latencies)[2],
        "errors": sum(len(caller.errors) + caller.rejected for caller in seen),
        "client_cpu_ms": cpu * 1e3 / max(1, len(latencies)),
        "request_bytes": exchange.request_bytes,
    }


def pipeline_lines(figures: dict[str, Any]) -> list[str]:
    def row(name: str, what: str, f: dict[str, Any] | None = None) -> str:
        f = f or figures[name]
        return (
            f"  {what:<40} {f['median']:>6.2f} images/s  p99 {f['p99_ms']:>7.1f} ms  {f['request_bytes']:>9,} bytes a "
            f"request, callers {f['callers_cpus']:g} CPU ({f['callers_cpu_ms']:.2f} ms an image)  rounds "
            f"{f['rounds']}, errors {f['errors']}"
        )

    splits = [row("", f"  callers decoding on {split} CPU", f) for split, f in figures["decoding_splits"].items()]
    return [
        f"Image pipeline, Inception V3 fp32, {figures['callers']} callers of one image, callers and server sharing "
        f"{figures['total_cpus']:g} CPU (medians of alternating rounds):",
        f"  proved: {figures['proved']}",
        f"  plan: {figures['stages']}",
        row("ensemble", "JPEG -> top-5, the planned ensemble"),
        row("model", "the bare model, ready tensors"),
        row("decoding", "callers decoding, at their best split"),
        *splits,
        row("naive_ensemble", "the naive ensemble (defaults everywhere)"),
        *bad_input_lines(figures["bad_input"], row),
        *largest_images_lines(figures["largest_images"]),
    ]


def largest_images_lines(largest: dict[str, Any]) -> list[str]:
    return [
        f"  the ensemble full of its largest images ({largest['callers']} callers for {largest['seconds']:g} s, a JPEG "
        f"of {largest['jpeg_bytes']:,} bytes, each {LARGEST_PICTURE_EVERY}th a PNG of {largest['png_pixels']:,} "
        f"pixels; {largest['outcomes']}): server memory {largest['memory_before_mib']:g} MiB before, "
        f"{largest['memory_peak_mib']:g} at its peak, against the estimate's {largest['estimate_mib']:g} (the "
        f"stages' {largest['stages_mib']:g}) and the limit's {largest['limit_mib']:g}; "
        f"{largest['ablated_mib']:g} without the stages' term",
    ]


def bad_input_lines(bad: dict[str, Any], row: Any) -> list[str]:
    kinds = ", ".join(f"{kind} {p99:g}" for kind, p99 in bad["p99_ms_by_kind"].items())
    return [
        f"  bad input beside the ensemble's callers: {bad['sent']} sent, {bad['not_400']} not answered 400; p99 "
        f"{bad['p99_ms']:g} ms ({kinds}); server memory {bad['memory_before_mib']:g} MiB before, "
        f"{bad['memory_halfway_mib']:g} half-way, {bad['memory_peak_mib']:g} at its peak, {bad['memory_after_mib']:g} "
        "after",
        row("", "the ensemble's callers meanwhile", bad["good"]),
    ]


def pipeline_targets(figures: dict[str, Any]) -> list[Target]:
    ensemble = figures["ensemble"]
    return [
        Target("ensemble / bare model, same CPU", ensemble["median"] / figures["model"]["median"], ENSEMBLE_OVER_MODEL),
        Target(
            "ensemble / callers decoding, same total CPU",
            ensemble["median"] / figures["decoding"]["median"],
            ENSEMBLE_OVER_CALLERS_DECODING,
        ),
        Target(
            "bytes a request: tensors / image",
            figures["model"]["request_bytes"] / ensemble["request_bytes"],
            FEWER_BYTES,
        ),
        Target("ensemble errors and rejections", ensemble["errors"], 0, at_least=False),
        # The plan's ablation: the same ensemble with every default, which must not serve as much.
        Target(
            "planned / naive ensemble", ensemble["median"] / figures["naive_ensemble"]["median"], PLANNED_OVER_NAIVE
        ),
        *bad_input_targets(figures["bad_input"], ensemble),
        *largest_images_targets(figures["largest_images"]),
    ]


def largest_images_targets(largest: dict[str, Any]) -> list[Target]:
    """The pod's limit holds the pipeline full of its largest images; without the stages' term it would not (the
    ablation: the memory fit as it was for the bare model)."""
    peak = largest["memory_peak_mib"]
    return [
        Target("largest images: memory peak / the plan's limit", peak / largest["limit_mib"], 1.0, at_least=False),
        Target(
            "largest images: memory peak / the limit without the stages",
            peak / largest["ablated_mib"],
            1.0,
        ),
    ]


def bad_input_targets(bad: dict[str, Any], ensemble: dict[str, Any]) -> list[Target]:
    """Bad input is refused with a 400, sooner than any image is answered, while the other callers keep their rate
    and the server its memory."""
    return [
        Target("bad input not answered 400", bad["not_400"], 0, at_least=False),
        Target(
            "bad input p99 / the callers' p99 meanwhile", bad["p99_ms"] / bad["good"]["p99_ms"], 1.0, at_least=False
        ),
        Target("callers beside bad input / alone", bad["good"]["median"] / ensemble["median"], BESIDE_BAD_INPUT),
        Target(
            "server memory after bad input / half-way through it",
            bad["memory_after_mib"] / bad["memory_halfway_mib"],
            MEMORY_END_OVER_HALFWAY,
            at_least=False,
        ),
    ]


def main(argv: list[str]) -> None:
    url, model, images, mode, concurrency, seconds, procs = argv
    paths = [Path(path) for path in procs.split(",")]
    print(json.dumps(closed_loop(url, model, Path(images), mode == "decode", int(concurrency), float(seconds), paths)))


if __name__ == "__main__":
    main(sys.argv[1:])
