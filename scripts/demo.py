"""`make demo`: export both networks, serve them with a real tritonserver, call them, benchmark briefly.

Everything it writes goes to model_repo/ (the models) and out/demo/ (image, manifests, plots, summary).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from inferop import bench
from inferop.cli import main as inferop
from inferop.paths import repo_root
from inferop.serving.tritonserver import TritonServer, free_port

ROOT = repo_root()
REPO = ROOT / "model_repo"
OUT = ROOT / "out" / "demo"


def make_image(path: Path) -> Path:
    """A 400x320 picture drawn here (no downloads): sky, sun, a hill and a house."""
    image = Image.new("RGB", (400, 320))
    draw = ImageDraw.Draw(image)
    for y in range(320):
        draw.line([(0, y), (400, y)], fill=(90 + y // 4, 150 + y // 6, 235))
    draw.ellipse((300, 30, 360, 90), fill=(255, 215, 60))
    draw.ellipse((-100, 200, 500, 480), fill=(60, 150, 70))
    draw.rectangle((140, 150, 260, 240), fill=(180, 60, 50))
    draw.polygon([(130, 150), (200, 95), (270, 150)], fill=(110, 40, 30))
    draw.rectangle((185, 195, 215, 240), fill=(70, 40, 20))
    image.save(path)
    return path


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def main() -> int:
    started = time.perf_counter()
    OUT.mkdir(parents=True, exist_ok=True)
    summary: dict[str, dict[str, Any]] = {}

    for network in ("conv_net", "inception_v3"):
        step(f"export {network}")
        manifest = OUT / f"{network.replace('_', '-')}.yaml"
        if inferop(["export", network, "--repo", str(REPO), "--manifest", str(manifest)]) != 0:
            return 1

    image = make_image(OUT / "house.png")
    board = OUT / "board.txt"
    board_cells = np.zeros((8, 7), dtype=int)
    board_cells[7, 3], board_cells[7, 2], board_cells[6, 3] = 1, -1, 1
    np.savetxt(board, board_cells, fmt="%d")

    step("start tritonserver")
    with TritonServer(REPO, http_port=free_port()) as server:
        print(f"ready at http://{server.url}, metrics at {server.metrics_url}")
        step(f"infer inception_v3 on {image.relative_to(ROOT)}")
        if inferop(["infer", "--url", server.url, "--model", "inception_v3", str(image)]) != 0:
            return 1
        step(f"infer conv_net on {board.relative_to(ROOT)}")
        if inferop(["infer", "--url", server.url, "--model", "conv_net", "--board", str(board)]) != 0:
            return 1

        # 16 callers keep the dynamic batcher's batches at maxBatchSize (8): one batch runs while the next waits.
        for model, levels, seconds in (("conv_net", [1, 4, 16], 2.0), ("inception_v3", [1, 4, 16], 3.0)):
            step(f"bench {model}")
            results = bench.sweep(server.url, model, levels, seconds, batch=1)
            print(bench.format_table(model, 1, results))
            plot = OUT / f"bench-{model}.png"
            bench.plot(model, results, plot)
            best = max(results, key=lambda r: r.throughput)
            summary[model] = {
                "best_throughput": round(best.throughput, 1),
                "at_concurrency": best.concurrency,
                "p99_ms": round(best.p99_ms, 1),
                "mean_batch": round(best.mean_batch, 1),
                "errors": sum(r.errors for r in results),
                "plot": str(plot.relative_to(ROOT)),
            }
    step("summary")
    elapsed = time.perf_counter() - started
    for model, figures in summary.items():
        print(
            f"{model:<13} {figures['best_throughput']:>8} samples/s at concurrency {figures['at_concurrency']} "
            f"(batches of {figures['mean_batch']}), p99 {figures['p99_ms']} ms, errors {figures['errors']}, "
            f"plot {figures['plot']}"
        )
    print(f"manifests: {', '.join(str(p.relative_to(ROOT)) for p in sorted(OUT.glob('*.yaml')))}")
    print(f"demo finished in {elapsed:.0f} s; tritonserver stopped")
    (OUT / "summary.json").write_text(json.dumps({**summary, "seconds": round(elapsed, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
