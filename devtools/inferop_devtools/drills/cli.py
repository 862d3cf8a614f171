"""`make drills`: reliability and security drills against real components, figures in out/drills/report.md.

Each control-plane drill gets a fresh local control plane and runs the operator as its own process; the hostile
requests drill runs a real tritonserver. `--drills` picks some (comma-separated), `--quick` runs small versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferop.paths import repo_root
from inferop_devtools.choices import add_subset_option
from inferop_devtools.drills.badspecs import format_bad_specs, run_bad_specs
from inferop_devtools.drills.fleet import format_fleet, run_fleet
from inferop_devtools.drills.kills import format_operator_kills, run_operator_kills
from inferop_devtools.drills.node import format_cpu_share, run_cpu_share
from inferop_devtools.drills.restart import format_apiserver_restart, run_apiserver_restart
from inferop_devtools.drills.rollout import format_rollout, run_rollout_drill

ROOT = repo_root()
OUT = ROOT / "out" / "drills"


def hostile(root: Path, quick: bool) -> dict[str, Any]:
    """The same hostile requests straight to tritonserver, then through an nginx ingress with the defences Triton
    lacks (Debian's nginx, unpacked into the cache by scripts/nginx.sh)."""
    from inferop_core.cli import main as inferop
    from inferop_devtools.drills.hostile import NginxFront, run_hostile_drill

    repo = ROOT / "model_repo"
    if not (repo / "conv_net" / "config.pbtxt").is_file() and inferop(["export", "conv_net", "--repo", str(repo)]):
        raise SystemExit("error: exporting conv_net for the hostile-requests drill failed")
    nginx = subprocess.run(["bash", str(ROOT / "scripts" / "nginx.sh")], capture_output=True, text=True, check=True)
    return {
        "direct": run_hostile_drill(repo, root / "direct", quick=quick),
        "ingress": run_hostile_drill(
            repo, root / "ingress", quick=quick, front=NginxFront(Path(nginx.stdout.split()[-1]))
        ),
    }


def format_hostile(result: dict[str, Any]) -> str:
    from inferop_devtools.drills.hostile import format_hostile as render

    return "\n\n".join(
        [
            "### 4. Hostile requests",
            "#### Straight to tritonserver\n\n" + render(result["direct"]),
            "#### Through an nginx ingress with a body limit, header and body timeouts, request buffering\n\n"
            + render(result["ingress"]),
        ]
    )


# name -> (run(root, quick), format(result))
DRILLS: dict[str, tuple[Callable[[Path, bool], dict[str, Any]], Callable[[dict[str, Any]], str]]] = {
    "badspecs": (lambda root, quick: run_bad_specs(root, valid=5 if quick else 20), format_bad_specs),
    "kills": (
        lambda root, quick: (
            run_operator_kills(root, services=20, kills=4, changes=30) if quick else run_operator_kills(root)
        ),
        format_operator_kills,
    ),
    "restart": (lambda root, quick: run_apiserver_restart(root, rounds=1 if quick else 3), format_apiserver_restart),
    "hostile": (hostile, format_hostile),
    "fleet": (
        lambda root, quick: run_fleet(root, services=100, resync=10) if quick else run_fleet(root),
        format_fleet,
    ),
    "rollout": (run_rollout_drill, format_rollout),
    "node": (run_cpu_share, format_cpu_share),
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="make drills", description=(__doc__ or "").splitlines()[0])
    add_subset_option(parser, "--drills", DRILLS)
    parser.add_argument("--quick", action="store_true", help="small versions, to check the drills themselves")
    args = parser.parse_args()
    chosen: list[str] = args.drills

    OUT.mkdir(parents=True, exist_ok=True)
    figures = OUT / "drills.json"
    # Drills not run now keep the figures of their last run (each says when): one drill can be run again alone.
    results: dict[str, Any] = json.loads(figures.read_text()) if figures.is_file() else {}
    for name in chosen:
        run, render = DRILLS[name]
        print(f"\n=== drill {name}", flush=True)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"inferop-drill-{name}-") as root:
            result = run(Path(root), args.quick)
        result["drill_seconds"] = round(time.perf_counter() - started, 1)
        result["ran_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        result["quick"] = args.quick
        results[name] = result
        print(render(result), flush=True)
        figures.write_text(json.dumps(results, indent=2, default=str))

    header = ["# Reliability and security drills", "", "Figures measured by `make drills` on a 2-core machine.", ""]
    sections = []
    for name, (_, render) in DRILLS.items():
        if name in results:
            result = results[name]
            quick = " (--quick)" if result["quick"] else ""
            when = f"_{name}: run {result['ran_at']}{quick}, {result['drill_seconds']} s_"
            sections.append(f"{render(result)}\n\n{when}")
    (OUT / "report.md").write_text("\n".join(header) + "\n" + "\n\n".join(sections) + "\n")
    print(f"\nreport: {(OUT / 'report.md').relative_to(ROOT)}; figures: {figures.relative_to(ROOT)}")
    return 0
