"""`inferop tune`: the serving settings that give a model the most throughput within a p99 budget, measured on
the real local Triton under the CPU quota its pod would have.

It searches instances, intra- and inter-op threads (every layout within the thread budget), maxBatchSize and
the dynamic batcher's queue delay. Triton's Model Analyzer searches batching and instances but never thread
counts, and on CPUs threads decide. Each trial serves the model with one candidate config (rendered as the
operator renders it) in a fresh tritonserver in a cgroup with the pod's CPU quota, and measures closed-loop
callers. The search climbs: from the thread budget's default layout it measures the neighbours of the best
config found (one step along one setting, or the layout with one instance more or fewer), moves while that
gains more than measurement noise, and stops where no neighbour does. `--exhaustive` measures the whole grid
instead, to check what the climb found.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from inferop_core.errors import InferopError
from inferop_core.threads import plan_threads
from inferop_core.tritonconfig import ServingConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from inferop_operator.spec import InferenceServiceSpec

# A neighbour must beat the best config by more than this to move the climb: repeated measurements of one
# config through the local Triton on 2 CPUs differ by up to about 2%.
MIN_GAIN = 0.03
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DEFAULT_QUEUE_DELAYS_US = (0, 1000, 4000)


class TuneError(InferopError, ValueError):
    """Bad tune input, or no config meets the budget; the message names the value and what was found."""


@dataclass(frozen=True, order=True)
class Layout:
    """How the CPU budget is split: model instances, each with its intra- and inter-op thread pools."""

    instances: int
    intra_op: int
    inter_op: int
    take_turns: bool = False  # the instances execute one at a time (ServingConfig.take_turns)

    def describe(self) -> str:
        return f"{self.instances}x({self.intra_op}+{self.inter_op}){' in turns' if self.take_turns else ''}"


def thread_layouts(cpus: float) -> tuple[Layout, ...]:
    """Every layout whose threads fit the budget (instances x (intra + inter - 1) <= whole CPUs), and the derived
    one where its instances take turns."""
    slots = max(1, math.floor(cpus))
    layouts = {
        Layout(instances, intra, inter)
        for instances in range(1, slots + 1)
        for inter in range(1, slots + 1)
        for intra in range(1, slots + 1)
        if not plan_threads(cpus, instances, intra, inter).oversubscribed
    }
    return tuple(sorted(layouts | {default_layout(cpus)}))


def default_layout(cpus: float) -> Layout:
    """What the operator derives when nothing is set: two instances, taking turns where the CPUs do not hold both,
    the CPUs' threads shared between those that execute (inferop_core.threads.derived_instances)."""
    plan = plan_threads(cpus, None)
    return Layout(plan.instances, plan.intra_op, plan.inter_op, plan.take_turns)


@dataclass(frozen=True, order=True)
class Settings:
    """One point of the grid: what a trial serves."""

    layout: Layout
    max_batch_size: int
    max_queue_delay_us: int

    def apply(self, serving: ServingConfig) -> ServingConfig:
        return serving.model_copy(
            update={
                "instances": self.layout.instances,
                "take_turns": self.layout.take_turns,
                "intra_op_threads": self.layout.intra_op,
                "inter_op_threads": self.layout.inter_op,
                "max_batch_size": self.max_batch_size,
                "max_queue_delay_microseconds": self.max_queue_delay_us,
            }
        )

    def describe(self) -> str:
        return f"{self.layout.describe()} batch {self.max_batch_size} delay {self.max_queue_delay_us}us"

    def as_dict(self) -> dict[str, int]:
        return {
            **asdict(self.layout),
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_us": self.max_queue_delay_us,
        }


@dataclass(frozen=True)
class Grid:
    cpus: float
    layouts: tuple[Layout, ...]
    batch_sizes: tuple[int, ...]
    queue_delays_us: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.layouts) * len(self.batch_sizes) * len(self.queue_delays_us)

    def points(self) -> Iterator[Settings]:
        for layout in self.layouts:
            for batch in self.batch_sizes:
                for delay in self.queue_delays_us:
                    yield Settings(layout, batch, delay)

    def start(self, max_batch_size: int, max_queue_delay_us: int) -> Settings:
        """The climb's first point: the budget's default layout and the grid values nearest the model's own."""
        layout = default_layout(self.cpus)
        if layout not in self.layouts:
            layout = self.layouts[-1]
        return Settings(
            layout,
            min(self.batch_sizes, key=lambda b: (abs(b - max_batch_size), b)),
            min(self.queue_delays_us, key=lambda d: (abs(d - max_queue_delay_us), d)),
        )

    def neighbours(self, point: Settings) -> list[Settings]:
        """One step along the batch size or the queue delay; a layout one thread or one instance away; and the
        budget's own layouts with one instance more or fewer (moving threads between instances at once)."""
        found: list[Settings] = []
        for values, index, make in (
            (
                self.batch_sizes,
                self.batch_sizes.index(point.max_batch_size),
                lambda v: replace(point, max_batch_size=v),
            ),
            (
                self.queue_delays_us,
                self.queue_delays_us.index(point.max_queue_delay_us),
                lambda v: replace(point, max_queue_delay_us=v),
            ),
        ):
            found += [make(values[i]) for i in (index - 1, index + 1) if 0 <= i < len(values)]
        here = point.layout
        near = [
            layout
            for layout in self.layouts
            if layout != here
            and max(
                abs(layout.instances - here.instances),
                abs(layout.intra_op - here.intra_op),
                abs(layout.inter_op - here.inter_op),
            )
            <= 1
        ]
        for instances in (here.instances - 1, here.instances + 1):
            if instances >= 1:
                plan = plan_threads(self.cpus, instances)
                derived = Layout(plan.instances, plan.intra_op, plan.inter_op)
                if derived in self.layouts and derived != here and derived not in near:
                    near.append(derived)
        found += [replace(point, layout=layout) for layout in near]
        return found


@dataclass(frozen=True)
class Trial:
    """What one config measured: a caller's view (throughput, latency, errors) and the batches Triton formed."""

    settings: Settings
    throughput: float  # samples per second
    p50_ms: float
    p99_ms: float
    errors: int
    mean_batch: float
    seconds: float  # the whole trial: start, warm-up, measurement, stop
    failure: str | None = None  # why the server failed outright
    first_error: str | None = None  # the first failed request's error, of `errors`

    def feasible(self, p99_budget_ms: float | None) -> bool:
        return (
            self.failure is None
            and self.errors == 0
            and self.throughput > 0
            and (p99_budget_ms is None or self.p99_ms <= p99_budget_ms)
        )

    def as_dict(self) -> dict[str, Any]:
        return {**self.settings.as_dict(), **{k: v for k, v in asdict(self).items() if k != "settings"}}


def score(trial: Trial, p99_budget_ms: float | None) -> tuple[bool, float]:
    """Feasible configs by throughput; below them, infeasible ones by p99, so a climb that starts outside the
    budget heads for it."""
    if trial.feasible(p99_budget_ms):
        return True, trial.throughput
    if trial.failure is not None or trial.errors or not math.isfinite(trial.p99_ms):
        return False, -math.inf
    return False, -trial.p99_ms


Measure = Callable[[Settings], Trial]


@dataclass
class Search:
    """Trials in the order measured, each config measured once; `on_trial` sees each as it ends (to save it)."""

    measure: Measure
    p99_budget_ms: float | None
    on_trial: Callable[[Trial], None] = lambda trial: None
    trials: list[Trial] = field(default_factory=list)

    def trial(self, settings: Settings) -> Trial:
        for done in self.trials:
            if done.settings == settings:
                return done
        result = self.measure(settings)
        self.trials.append(result)
        self.on_trial(result)
        return result

    def better(self, candidate: Trial, incumbent: Trial) -> bool:
        new, old = score(candidate, self.p99_budget_ms), score(incumbent, self.p99_budget_ms)
        if new[0] != old[0]:
            return new[0]
        if not new[0]:
            return new[1] > old[1]
        return new[1] > old[1] * (1 + MIN_GAIN)

    def climb(self, grid: Grid, start: Settings) -> list[Trial]:
        """Steepest ascent: measure every unmeasured neighbour of the best config, move to the best of them if
        it beats the incumbent by more than noise, stop when none does."""
        best = self.trial(start)
        while True:
            measured = [self.trial(point) for point in grid.neighbours(best.settings)]
            challenger = max(measured, key=lambda t: score(t, self.p99_budget_ms), default=None)
            if challenger is None or not self.better(challenger, best):
                return self.trials
            best = challenger

    def sweep(self, grid: Grid) -> list[Trial]:
        for point in grid.points():
            self.trial(point)
        return self.trials


def best_trial(trials: list[Trial], p99_budget_ms: float | None) -> Trial | None:
    feasible = [t for t in trials if t.feasible(p99_budget_ms)]
    return max(feasible, key=lambda t: t.throughput, default=None)


def pareto_front(trials: list[Trial]) -> list[Trial]:
    """Error-free trials that no other beats on both throughput and p99, by ascending p99."""
    clean = [t for t in trials if t.feasible(None)]
    front = [
        t
        for t in clean
        if not any(
            o.throughput >= t.throughput
            and o.p99_ms <= t.p99_ms
            and (o.throughput, o.p99_ms) != (t.throughput, t.p99_ms)
            for o in clean
        )
    ]
    return sorted(front, key=lambda t: t.p99_ms)


def require_best(trials: list[Trial], p99_budget_ms: float | None) -> Trial:
    """The winner, or an error that states the best p99 measured (and at what throughput)."""
    best = best_trial(trials, p99_budget_ms)
    if best is not None:
        return best
    clean = [t for t in trials if t.feasible(None)]
    if not clean:
        reasons = sorted({t.failure or f"{t.errors} failed requests" for t in trials})
        raise TuneError(f"no config served without errors in {len(trials)} trial(s): {'; '.join(reasons)[:600]}")
    fastest = min(clean, key=lambda t: t.p99_ms)
    raise TuneError(
        f"--p99-ms {p99_budget_ms:g}: no config met it; the best p99 measured was {fastest.p99_ms:.1f} ms "
        f"({fastest.settings.describe()}, {fastest.throughput:.1f} samples/s) in {len(trials)} trial(s): "
        f"raise the budget to at least {math.ceil(fastest.p99_ms)}, give the pod more CPUs, or call with less "
        "concurrency"
    )


@dataclass
class TritonTrials:
    """Measures a config on the real local tritonserver: the model's directory served under `settings` in a fresh
    server whose cgroup has the pod's CPU quota, `concurrency` closed-loop callers of `batch` samples each."""

    model_dir: Path
    serving: ServingConfig
    cpus: float
    concurrency: int
    batch: int
    seconds: float
    warmup_seconds: float = 1.0

    def __call__(self, settings: Settings) -> Trial:
        from inferop import bench
        from inferop.client import InferError, connect, describe, sample_inputs
        from inferop.limits import PodLimits
        from inferop.serving.localrepo import write_model_repo
        from inferop.serving.tritonserver import ServerError, TritonServer, free_port

        began = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix="inferop-tune-"))
        try:
            repo = write_model_repo(settings.apply(self.serving), self.model_dir, work / "repo")
            with TritonServer(repo, http_port=free_port(), limits=PodLimits(cpus=self.cpus)) as server:
                client = connect(server.url, 30.0)
                info = describe(client, self.serving.name)
                client.close()
                data = sample_inputs(info, self.batch)
                bench.run_level(server.url, info, data, self.concurrency, self.warmup_seconds, 30.0)
                level = bench.run_level(server.url, info, data, self.concurrency, self.seconds, 30.0)
        except (ServerError, InferError) as error:
            failure = str(error).splitlines()[0][:300]
            return Trial(settings, 0.0, math.nan, math.nan, 0, 0.0, time.monotonic() - began, failure)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return Trial(
            settings,
            throughput=level.throughput,
            p50_ms=level.p50_ms,
            p99_ms=level.p99_ms,
            # A request a full queue turned away fails the trial as much as an error: the load is the one to serve.
            errors=level.errors + level.rejected,
            mean_batch=level.mean_batch,
            seconds=time.monotonic() - began,
            first_error=level.first_error or (f"{level.rejected} rejected by a full queue" if level.rejected else None),
        )


def tuned_spec(serving: ServingConfig, model_dir: Path, cpus: float, profile: dict[str, Any]) -> InferenceServiceSpec:
    """The InferenceService spec that renders `serving` on a pod with `cpus`: what the manifest holds."""
    from inferop_operator.spec import Model, Profile, Tensor, parse_spec

    model = Model(
        name=serving.name,
        storage_uri=f"hostpath://{model_dir.resolve()}",
        profile=Profile.model_validate(profile),
        weights=serving.weights,
        sha256=serving.model_sha256,
        inputs=[Tensor.of(t) for t in serving.inputs],
        outputs=[Tensor.of(t) for t in serving.outputs],
        processing=serving.processing,
    )
    batching: dict[str, Any] = {
        "maxBatchSize": serving.max_batch_size,
        "maxQueueDelayMicroseconds": serving.max_queue_delay_microseconds,
    }
    if serving.max_queue_size is not None:
        batching["maxQueueSize"] = serving.max_queue_size
    raw: dict[str, Any] = {
        "model": model.model_dump(by_alias=True, exclude_none=True),
        # Instances that take turns stay derived: set, they would all execute at once.
        **({} if serving.take_turns else {"instances": serving.instances}),
        "threads": {"intraOp": serving.intra_op_threads, "interOp": serving.inter_op_threads},
        "batching": batching,
        "resources": {"limits": {"cpu": f"{cpus:g}"}},
    }
    if serving.request_timeout_microseconds is not None:
        raw["timeouts"] = {"requestSeconds": serving.request_timeout_microseconds / 1e6}
    return parse_spec(raw)


def format_table(trials: list[Trial], p99_budget_ms: float | None, winner: Trial | None) -> str:
    header = (
        f"{'#':>3} {'instances':>9} {'intra':>5} {'inter':>5} {'maxBatch':>8} {'delay us':>8} "
        f"{'samples/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'batch':>6} {'errors':>6} {'s':>5}"
    )
    rows = [header]
    for index, t in enumerate(trials, 1):
        s = t.settings
        mark = " <- best" if t is winner else "" if t.feasible(p99_budget_ms) else " (out of budget)"
        if t.failure:
            mark = f" failed: {t.failure[:80]}"
        elif t.errors:
            mark = f" {t.errors} failed requests: {(t.first_error or '')[:80]}"
        rows.append(
            f"{index:>3} {s.layout.instances:>9} {s.layout.intra_op:>5} {s.layout.inter_op:>5} {s.max_batch_size:>8} "
            f"{s.max_queue_delay_us:>8} {t.throughput:>10.1f} {t.p50_ms:>8.1f} {t.p99_ms:>8.1f} {t.mean_batch:>6.2f} "
            f"{t.errors:>6} {t.seconds:>5.1f}{mark}"
        )
    return "\n".join(rows)


def build_figure(model: str, trials: list[Trial], p99_budget_ms: float | None, winner: Trial | None) -> Figure:
    """Throughput against p99 for every error-free trial, the Pareto front joined, the budget and winner marked."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.6), layout="constrained")
    axis = figure.subplots()
    clean = [t for t in trials if t.feasible(None)]
    axis.scatter([t.p99_ms for t in clean], [t.throughput for t in clean], color="0.6", label="config tried")
    front = pareto_front(trials)
    axis.plot([t.p99_ms for t in front], [t.throughput for t in front], marker="o", color="C0", label="Pareto front")
    if p99_budget_ms is not None:
        axis.axvline(p99_budget_ms, color="C3", linestyle="--", label=f"p99 budget {p99_budget_ms:g} ms")
    if winner is not None:
        axis.scatter(
            [winner.p99_ms],
            [winner.throughput],
            marker="*",
            s=220,
            color="C1",
            zorder=3,
            label=winner.settings.describe(),
        )
    axis.set_xlabel("p99 latency (ms)")
    axis.set_ylabel("samples / s")
    axis.set_xlim(0, max([t.p99_ms for t in clean] + [p99_budget_ms or 0], default=1) * 1.08)
    axis.set_ylim(0, max([t.throughput for t in clean], default=1) * 1.08)
    axis.set_title(f"{model}: throughput against p99, {len(trials)} configs measured")
    figure.legend(loc="outside lower center", ncols=2)
    return figure


def write_outputs(
    out: Path,
    model: str,
    trials: list[Trial],
    p99_budget_ms: float | None,
    winner: Trial | None,
    written: dict[str, str] | None = None,
) -> list[Path]:
    """The table (trials.csv), every trial as JSON lines (trials.jsonl, also appended while running) and the
    Pareto plot: what tune keeps even when interrupted. `written` adds files (config.pbtxt, the manifest)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    csv = out / "trials.csv"
    keys = list(trials[0].as_dict()) if trials else []
    csv.write_text("\n".join([",".join(keys), *(",".join(_csv(t.as_dict()[k]) for k in keys) for t in trials)]) + "\n")
    paths.append(csv)
    jsonl = out / "trials.jsonl"
    jsonl.write_text("".join(json.dumps(t.as_dict()) + "\n" for t in trials))
    paths.append(jsonl)
    if trials:
        plot = out / "pareto.png"
        build_figure(model, trials, p99_budget_ms, winner).savefig(plot, dpi=110)
        paths.append(plot)
    for name, text in (written or {}).items():
        (out / name).write_text(text)
        paths.append(out / name)
    return paths


def _csv(value: Any) -> str:
    text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
    return f'"{text}"' if "," in text or '"' in text else text


# --- the command line ---


def _positive_ints(flag: str, text: str, allow_zero: bool = False) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        values = ()
    if not values or min(values) < (0 if allow_zero else 1):
        kind = "integers >= 0" if allow_zero else "positive integers"
        raise TuneError(
            f"{flag} {text!r}: expected comma-separated {kind}, like {'0,1000,4000' if allow_zero else '1,2,4,8'}"
        )
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, default=Path("model_repo"), help="model repository (default model_repo)")
    parser.add_argument("--model", required=True, help="the model to tune, a directory of --repo")
    parser.add_argument("--cpus", required=True, help="the pod's CPU limit, as a CFS quota: 2, 1.5, 1500m")
    parser.add_argument("--p99-ms", type=float, help="p99 latency budget in ms; unset: the most throughput")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop callers per trial (default 16)")
    parser.add_argument("--batch", type=int, default=1, help="samples per request (default 1)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per trial (default 4)")
    parser.add_argument(
        "--batch-sizes",
        default=",".join(map(str, DEFAULT_BATCH_SIZES)),
        help=f"maxBatchSize values to try (default {','.join(map(str, DEFAULT_BATCH_SIZES))})",
    )
    parser.add_argument(
        "--queue-delays-us",
        default=",".join(map(str, DEFAULT_QUEUE_DELAYS_US)),
        help=f"maxQueueDelayMicroseconds values to try (default {','.join(map(str, DEFAULT_QUEUE_DELAYS_US))})",
    )
    parser.add_argument("--exhaustive", action="store_true", help="measure every config of the grid, not a climb")
    parser.add_argument("--out", type=Path, help="where results go (default out/tune/MODEL)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


@dataclass(frozen=True)
class TuneRequest:
    """The command line, validated: every bad value is refused here, before a server starts."""

    model_dir: Path
    serving: ServingConfig
    grid: Grid
    start: Settings
    p99_budget_ms: float | None
    concurrency: int
    batch: int
    seconds: float
    out: Path

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TuneRequest:
        from inferop.limits import LimitsError, PodLimits, cgroup_unavailable_reason
        from inferop.serving.localrepo import model_dirs
        from inferop_core.tritonconfig import parse_model_config, read_serving_config

        try:
            cpus = PodLimits.from_strings(args.cpus, None, None).cpus
        except LimitsError as error:
            raise TuneError(str(error)) from None
        assert cpus is not None
        unavailable = cgroup_unavailable_reason()
        if unavailable is not None:  # refused now, not after the first trial's server has been set up
            raise TuneError(f"--cpus {args.cpus}: every trial runs inside this CPU limit, in a cgroup: {unavailable}")
        model_dir = args.repo / args.model
        models = model_dirs(args.repo)
        if model_dir not in models:
            names = ", ".join(p.name for p in models)
            raise TuneError(f"--model {args.model!r}: no such model in {args.repo} (it holds: {names})")
        serving = read_serving_config(parse_model_config((model_dir / "config.pbtxt").read_text()))
        if serving.device != "cpu":
            raise TuneError(f"--model {args.model!r}: tune measures CPU serving; this config runs on a GPU")
        for flag, value in (("--concurrency", args.concurrency), ("--batch", args.batch)):
            if value < 1:
                raise TuneError(f"{flag} {value}: must be >= 1")
        for flag, number in (("--seconds", args.seconds), ("--p99-ms", args.p99_ms)):
            if number is not None and not (math.isfinite(number) and number > 0):
                raise TuneError(f"{flag} {number:g}: must be a positive number")
        batch_sizes = _positive_ints("--batch-sizes", args.batch_sizes)
        delays = _positive_ints("--queue-delays-us", args.queue_delays_us, allow_zero=True)
        if serving.max_batch_size == 0:  # no batch axis: nothing to batch, one request at a time
            batch_sizes, delays = (0,), (serving.max_queue_delay_microseconds,)
        elif args.batch > min(batch_sizes):
            raise TuneError(
                f"--batch {args.batch}: requests of {args.batch} samples exceed maxBatchSize {min(batch_sizes)} "
                "of --batch-sizes; try batch sizes of at least the request's"
            )
        grid = Grid(cpus, thread_layouts(cpus), batch_sizes, delays)
        return cls(
            model_dir=model_dir,
            serving=serving,
            grid=grid,
            start=grid.start(serving.max_batch_size, serving.max_queue_delay_microseconds),
            p99_budget_ms=args.p99_ms,
            concurrency=args.concurrency,
            batch=args.batch,
            seconds=args.seconds,
            out=args.out or Path("out") / "tune" / args.model,
        )

    def measure(self) -> TritonTrials:
        return TritonTrials(self.model_dir, self.serving, self.grid.cpus, self.concurrency, self.batch, self.seconds)

    def profile(self) -> dict[str, Any]:
        """The model's profile read off its file, for the manifest's memory estimate."""
        import onnx

        from inferop_export.profile import profile_onnx

        batched = self.serving.max_batch_size > 0
        shapes = {t.name: [1, *t.dims] if batched else list(t.dims) for t in self.serving.inputs}
        model = onnx.load(str(next(self.model_dir.glob("[0-9]*/model.onnx"))))
        return profile_onnx(model, input_shapes=shapes).as_spec()


def winner_files(request: TuneRequest, winner: Trial) -> dict[str, str]:
    """The winning config.pbtxt and a manifest that renders the very same config on a pod with the tuned CPUs."""
    import yaml

    from inferop_core.tritonconfig import render_model_config
    from inferop_export.manifest import build_manifest
    from inferop_operator.plan import plan_service

    tuned = winner.settings.apply(request.serving)
    spec = tuned_spec(tuned, request.model_dir, request.grid.cpus, request.profile())
    config = render_model_config(plan_service(spec).serving)
    if config != render_model_config(tuned):
        raise AssertionError("the manifest would render another config than the one measured")
    manifest = build_manifest(spec, cpus=f"{request.grid.cpus:g}")
    header = (
        f"# Written by `inferop tune` for {tuned.name}: {winner.throughput:.1f} samples/s at p99 "
        f"{winner.p99_ms:.1f} ms with {request.concurrency} callers, measured under {request.grid.cpus:g} CPU(s).\n"
    )
    return {"config.pbtxt": config, "inferenceservice.yaml": header + yaml.safe_dump(manifest, sort_keys=False)}


def run(args: argparse.Namespace) -> int:
    try:
        request = TuneRequest.from_args(args)
    except InferopError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    grid = request.grid
    how = "every config" if args.exhaustive else f"a climb from {request.start.describe()}"
    print(
        f"tuning {request.serving.name} under {grid.cpus:g} CPU(s): {grid.size} configs in the grid "
        f"({len(grid.layouts)} thread layouts x {len(grid.batch_sizes)} batch sizes x {len(grid.queue_delays_us)} "
        f"queue delays), {how}; {request.concurrency} callers x {request.seconds:g} s each",
        file=sys.stderr,
        flush=True,
    )
    request.out.mkdir(parents=True, exist_ok=True)
    log = request.out / "trials.jsonl"
    log.write_text("")

    def record(trial: Trial) -> None:
        with log.open("a") as file:
            file.write(json.dumps(trial.as_dict()) + "\n")
        verdict = trial.failure or (f"{trial.errors} failed requests" if trial.errors else "")
        print(
            f"  [{len(search.trials)}] {trial.settings.describe()}: {trial.throughput:.1f} samples/s, "
            f"p99 {trial.p99_ms:.1f} ms {verdict}".rstrip(),
            file=sys.stderr,
            flush=True,
        )

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # SIGTERM (kill, a pod's shutdown) stops as Ctrl-C does

    signal.signal(signal.SIGTERM, stop)
    search = Search(request.measure(), request.p99_budget_ms, on_trial=record)
    began = time.monotonic()
    try:
        search.sweep(grid) if args.exhaustive else search.climb(grid, request.start)
    except KeyboardInterrupt:
        winner = best_trial(search.trials, request.p99_budget_ms)
        write_outputs(request.out, request.serving.name, search.trials, request.p99_budget_ms, winner)
        print(format_table(search.trials, request.p99_budget_ms, winner))
        print(
            f"interrupted after {len(search.trials)} trial(s) in {time.monotonic() - began:.0f} s: what was measured "
            f"is kept in {request.out}",
            file=sys.stderr,
        )
        return 130
    seconds = time.monotonic() - began
    trials = search.trials
    try:
        winner = require_best(trials, request.p99_budget_ms)
    except TuneError as error:
        write_outputs(request.out, request.serving.name, trials, request.p99_budget_ms, None)
        print(format_table(trials, request.p99_budget_ms, None))
        print(f"error: {error}", file=sys.stderr)
        return 1
    paths = write_outputs(
        request.out, request.serving.name, trials, request.p99_budget_ms, winner, winner_files(request, winner)
    )
    summary = {
        "model": request.serving.name,
        "cpus": grid.cpus,
        "p99BudgetMs": request.p99_budget_ms,
        "search": "exhaustive" if args.exhaustive else "climb",
        "gridSize": grid.size,
        "trials": len(trials),
        "seconds": round(seconds, 1),
        "best": winner.as_dict(),
        "files": [str(p) for p in paths],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_table(trials, request.p99_budget_ms, winner))
        print(
            f"best: {winner.settings.describe()}: {winner.throughput:.1f} samples/s, p99 {winner.p99_ms:.1f} ms; "
            f"{len(trials)} of {grid.size} configs measured in {seconds:.0f} s"
        )
        print(f"files: {', '.join(str(p) for p in paths)}")
    return 0
