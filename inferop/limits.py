"""A pod's CPU and memory limits on this machine, with the kernel's cgroups as the kubelet sets them.

A Kubernetes CPU limit is a CFS quota per 100 ms period and a memory limit is a hard cgroup limit whose breach
OOM-kills; a local server or benchmark without them measures another machine than the pod's. Both cgroup v1
(separate cpu, cpuset and memory hierarchies) and v2 (one unified hierarchy) are supported. The files' formats
live in pure functions, so both versions are unit-tested on any host.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import math
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from inferop_core.errors import InferopError
from inferop_core.quantity import format_bytes, parse_quantity

CFS_PERIOD_US = 100_000  # the kubelet's CFS period: a CPU limit is a quota of CPU time per 100 ms
MIN_CFS_QUOTA_US = 1_000  # the kernel refuses smaller quotas; the kubelet rounds up to it
MIN_MEMORY_BYTES = 16 * 2**20  # below this not even a Python interpreter starts: surely a typo
CONTROLLERS = ("cpu", "cpuset", "memory")
PARENT = "inferop"  # every pod cgroup lives under it, as the kubelet's live under kubepods
DESTROY_TIMEOUT_S = 10.0
MOUNTS = Path("/proc/mounts")
MEMINFO = Path("/proc/meminfo")
PROC_CGROUP = Path("/proc/self/cgroup")
UNAVAILABLE = (
    "cgroups are not writable here (neither cgroup v1 cpu/cpuset/memory hierarchies nor a cgroup v2 mount with "
    "the cpu, cpuset and memory controllers): run as root on a Linux host"
)
WITHOUT_LIMITS = "or run without --cpus, --memory and --cpuset"

_names = itertools.count()


class LimitsError(InferopError, RuntimeError):
    """A limit is invalid or cannot be applied here; the message says what failed and how to fix it."""


@dataclass(frozen=True)
class PodLimits:
    """A pod's resource limits: what `resources.limits` and a static CPU manager policy give a container."""

    cpus: float | None = None  # CFS quota of cpus * 100 ms per 100 ms period
    memory_bytes: int | None = None  # hard limit, swap included: a breach OOM-kills, as in a pod
    cpuset: str | None = None  # CPUs the processes may run on, e.g. "1" or "0-1"

    @classmethod
    def from_strings(cls, cpus: str | None, memory: str | None, cpuset: str | None) -> PodLimits:
        """Parse command-line values ("1.5"/"500m", "1Gi"/"900Mi", "0-1"); errors name the flag and the value."""
        cpu_limit = None
        if cpus is not None:
            cpu_limit = _quantity(cpus, "--cpus", "1, 1.5, 500m")
            if cpu_limit * CFS_PERIOD_US < MIN_CFS_QUOTA_US:
                raise LimitsError(
                    f"--cpus {cpus!r}: must be at least 10m (the kernel's smallest CFS quota, 1 ms per 100 ms)"
                )
        memory_limit = None
        if memory is not None:
            memory_limit = math.ceil(_quantity(memory, "--memory", "1Gi, 900Mi, 512M"))
            if memory_limit < MIN_MEMORY_BYTES:
                raise LimitsError(f"--memory {memory!r}: must be at least 16Mi (a memory limit in bytes: 1Gi, 900Mi)")
        cpu_set = None
        if cpuset is not None:
            try:
                wanted = parse_cpu_list(cpuset)
            except ValueError as error:
                raise LimitsError(f"--cpuset {cpuset!r}: {error} (examples: 1, 0-1, 0,2-3)") from None
            available = os.sched_getaffinity(0)
            if not wanted <= available:
                raise LimitsError(
                    f"--cpuset {cpuset!r}: CPUs {format_cpu_list(wanted - available)} are not available to this "
                    f"process (available: {format_cpu_list(available)})"
                )
            cpu_set = format_cpu_list(wanted)
        return cls(cpus=cpu_limit, memory_bytes=memory_limit, cpuset=cpu_set)

    @property
    def empty(self) -> bool:
        return self.cpus is None and self.memory_bytes is None and self.cpuset is None

    def describe(self) -> str:
        parts = []
        if self.cpus is not None:
            parts.append(f"cpus={self.cpus:g} (CFS quota)")
        if self.cpuset is not None:
            parts.append(f"cpuset={self.cpuset}")
        if self.memory_bytes is not None:
            parts.append(f"memory={format_bytes(self.memory_bytes)}")
        return ", ".join(parts) or "no limits"

    def cpu_list(self) -> set[int] | None:
        return None if self.cpuset is None else parse_cpu_list(self.cpuset)


def _quantity(value: str, flag: str, examples: str) -> float:
    try:
        number = parse_quantity(value, flag)
    except ValueError:
        raise LimitsError(f"{flag} {value!r}: not a Kubernetes quantity (examples: {examples})") from None
    if not number > 0:
        raise LimitsError(f"{flag} {value!r}: must be positive (examples: {examples})")
    return number


# --- the cgroup files' formats, both versions ---


def parse_cpu_list(text: str) -> set[int]:
    """The kernel's CPU list format ("0-2,4"), as in cpuset.cpus and /sys/devices/system/cpu/online."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part.strip()!r} is not a CPU number or range")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"range {part.strip()!r} ends before it starts")
        cpus.update(range(low, high + 1))
    return cpus


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The shortest CPU list text: {0, 1, 2, 4} -> "0-2,4"."""
    ranges: list[str] = []
    for _, run in itertools.groupby(enumerate(sorted(cpus)), key=lambda pair: pair[1] - pair[0]):
        members = [cpu for _, cpu in run]
        ranges.append(str(members[0]) if len(members) == 1 else f"{members[0]}-{members[-1]}")
    return ",".join(ranges)


def cfs_quota_us(cpus: float) -> int:
    return max(MIN_CFS_QUOTA_US, round(cpus * CFS_PERIOD_US))


def cpu_max_text(cpus: float | None) -> str:
    """cgroup v2's cpu.max: "$QUOTA $PERIOD" in microseconds, "max" for no quota."""
    return f"{'max' if cpus is None else cfs_quota_us(cpus)} {CFS_PERIOD_US}"


def parse_flat_keyed(text: str) -> dict[str, int]:
    """Files of "key value" lines: cpu.stat (both versions), memory.events (v2), memory.oom_control (v1)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def cpu_stats_from(text: str, version: int) -> dict[str, float]:
    """Periods and throttling from cpu.stat: v1 counts throttled_time in ns, v2 throttled_usec in us."""
    stat = parse_flat_keyed(text)
    throttled = stat.get("throttled_time", 0) / 1e9 if version == 1 else stat.get("throttled_usec", 0) / 1e6
    return {
        "periods": float(stat.get("nr_periods", 0)),
        "throttled_periods": float(stat.get("nr_throttled", 0)),
        "throttled_seconds": throttled,
    }


def oom_kills_from(text: str) -> int:
    """The "oom_kill" count of v1's memory.oom_control or v2's memory.events (same key in both)."""
    return parse_flat_keyed(text).get("oom_kill", 0)


def parse_mounts(text: str) -> tuple[dict[str, Path], list[Path]]:
    """From /proc/mounts: v1 controller -> its hierarchy's mount point (co-mounted ones share one), and the
    cgroup2 mount points."""
    v1: dict[str, Path] = {}
    v2: list[Path] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        # Mount points escape blanks as octal (\040).
        where = Path(fields[1].encode().decode("unicode_escape"))
        if fields[2] == "cgroup":
            for option in fields[3].split(","):
                if option in CONTROLLERS:
                    v1.setdefault(option, where)
        elif fields[2] == "cgroup2":
            v2.append(where)
    return v1, v2


def describe_usage(usage: dict[str, float | int | str | None]) -> str:
    """One line a person reads after a run: peak memory against the limit, OOM kills and CPU throttling."""
    limit = usage.get("limit_memory_bytes")
    memory = f"peak memory {format_bytes(float(usage['memory_peak_bytes'] or 0))}"
    if limit:
        memory += f" of {format_bytes(float(limit))}"
    text = f"{memory}, {usage['oom_kills']} OOM kills"
    if usage.get("limit_cpus"):
        text += (
            f", CPU throttled in {usage['cpu_throttled_periods']:.0f} of {usage['cpu_periods']:.0f} periods "
            f"({float(usage['cpu_throttled_seconds'] or 0):.1f}s)"
        )
    return text


def read_pod_usage(memory_dir: Path, cpu_dir: Path | None = None) -> dict[str, float | int | str | None]:
    """What a running pod's cgroup directories (as `inferop serve` prints them) measured so far, for a
    client that did not create them; the version is told by the files each holds."""
    v1 = (memory_dir / "memory.max_usage_in_bytes").is_file()
    peak = memory_dir / ("memory.max_usage_in_bytes" if v1 else "memory.peak")
    current = int((memory_dir / ("memory.usage_in_bytes" if v1 else "memory.current")).read_text())
    usage: dict[str, float | int | str | None] = {
        "memory_current_bytes": current,
        "memory_peak_bytes": int(peak.read_text()) if peak.is_file() else current,
        "oom_kills": oom_kills_from((memory_dir / ("memory.oom_control" if v1 else "memory.events")).read_text()),
        "cgroup_version": 1 if v1 else 2,
    }
    if cpu_dir is not None:
        text = (cpu_dir / "cpu.stat").read_text()
        cpu = cpu_stats_from(text, 1 if "throttled_time" in text else 2)
        usage |= {
            "limit_cpus": True,  # throttling is what describe_usage shows where a quota exists
            "cpu_periods": cpu["periods"],
            "cpu_throttled_periods": cpu["throttled_periods"],
            "cpu_throttled_seconds": cpu["throttled_seconds"],
        }
    return usage


# --- what this process may still take ---


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo's "Key:   123 kB" lines, in bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key.strip()] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return values


def own_cgroup(proc_cgroup: str, version: int) -> str | None:
    """This process's cgroup path in /proc/self/cgroup: v1's memory hierarchy line, v2's "0::" line."""
    for line in proc_cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        v1 = version == 1 and "memory" in controllers.split(",")
        if v1 or (version == 2 and number == "0" and not controllers):
            return path
    return None


def cgroup_headroom(limit: str, usage: str, stat: str, version: int) -> int | None:
    """Bytes a memory cgroup may still be charged before its limit: the limit less its working set (usage less
    the inactive file pages the kernel reclaims first, as the kubelet counts it); None without a limit."""
    if limit.strip() == "max":
        return None
    inactive = parse_flat_keyed(stat).get("total_inactive_file" if version == 1 else "inactive_file", 0)
    return int(limit) - max(int(usage) - inactive, 0)


def memory_headroom() -> tuple[int, str]:
    """Bytes this process may still take, and what sets that: the least over its memory cgroup and the cgroup's
    ancestors (v1 memory.limit_in_bytes, v2 memory.max) of the limit less the working set, and the machine's
    MemAvailable. A cgroup or file it cannot read limits nothing."""
    try:
        available = parse_meminfo(MEMINFO.read_text())["MemAvailable"]
    except (OSError, KeyError):
        return sys.maxsize, "no /proc/meminfo to read"
    where = f"MemAvailable in {MEMINFO}"
    try:
        v1, v2 = parse_mounts(MOUNTS.read_text())
        proc_cgroup = PROC_CGROUP.read_text()
    except OSError:
        return available, where
    version, root = (1, v1["memory"]) if "memory" in v1 else (2, v2[0]) if v2 else (0, None)
    path = own_cgroup(proc_cgroup, version) if root is not None else None
    if root is None or path is None:
        return available, where
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes") if version == 1 else ("memory.max", "memory.current")
    directory = root / path.lstrip("/")
    while directory.is_relative_to(root):
        try:
            limit, usage, stat = ((directory / name).read_text() for name in (*names, "memory.stat"))
            headroom = cgroup_headroom(limit, usage, stat, version)
        except (OSError, ValueError):
            headroom = None
        if headroom is not None and headroom < available:
            cgroup = "/" + str(directory.relative_to(root)).removeprefix(".")
            available, where = headroom, f"cgroup v{version} {cgroup}: {names[0]} {format_bytes(int(limit))}"
        if directory == root:
            break
        directory = directory.parent
    return max(available, 0), where


# --- finding a writable hierarchy ---


@dataclass(frozen=True)
class _Hierarchy:
    version: int
    roots: dict[str, Path]  # controller -> mount point (all the same on v2)


def _find_hierarchy() -> tuple[_Hierarchy | None, str]:
    """v1 when its cpu, cpuset and memory hierarchies are writable, else a v2 mount offering those controllers;
    v1 first because a hybrid host's v2 mount has no controllers. Else None and what was found."""
    try:
        v1, v2 = parse_mounts(MOUNTS.read_text())
    except OSError as error:
        return None, f"{UNAVAILABLE} ({MOUNTS}: {error.strerror})"
    found = []
    if set(v1) == set(CONTROLLERS):
        readonly = sorted(str(path) for path in set(v1.values()) if not os.access(path, os.W_OK))
        if not readonly:
            return _Hierarchy(1, dict(v1)), ""
        found.append(f"v1 hierarchies not writable: {', '.join(readonly)}")
    elif v1:
        found.append(f"v1 without {', '.join(c for c in CONTROLLERS if c not in v1)}")
    for root in v2:
        try:
            offered = set((root / "cgroup.controllers").read_text().split())
        except OSError:
            offered = set()
        if not offered >= set(CONTROLLERS):
            found.append(f"v2 at {root} without {', '.join(c for c in CONTROLLERS if c not in offered)}")
        elif not os.access(root, os.W_OK):
            found.append(f"v2 at {root} not writable")
        else:
            return _Hierarchy(2, dict.fromkeys(CONTROLLERS, root)), ""
    return None, f"{UNAVAILABLE} (found: {'; '.join(found) or 'no cgroup mounts'})"


def cgroup_unavailable_reason() -> str | None:
    """None when a pod cgroup can be made here (v1 or v2); else why not."""
    hierarchy, reason = _find_hierarchy()
    return None if hierarchy else reason


# --- a pod's cgroup ---


class PodCgroup:
    """One cgroup per served pod, in every hierarchy the limits need; a context manager.

    It lives at the top of each hierarchy under `inferop/`, as the kubelet's pods live under `kubepods/`: on
    cgroup v2 only a cgroup without processes may hand controllers to children, which rules out nesting under
    the caller's own cgroup. The shared `inferop/` parent stays, so concurrent pods never race on its removal.
    A memory cgroup is always made, so peaks are measured without a memory limit too. On a memory breach v2
    kills the whole pod (memory.oom.group), v1 the largest process in it.
    """

    def __init__(self, limits: PodLimits, name: str | None = None) -> None:
        self.limits = limits
        self.name = name or f"{PARENT}-{os.getpid()}-{next(_names)}"
        if "/" in self.name or self.name in ("", ".", ".."):
            raise LimitsError(f"cgroup name {self.name!r}: must be one path component")
        self.version = 0
        self.paths: dict[str, Path] = {}  # controller -> this pod's directory (one shared directory on v2)
        self._procs: list[bytes] = []  # cgroup.procs of each directory, encoded ahead for join() in a fork
        self._seen_peak = 0  # highest memory_current() sample, for v2 kernels without memory.peak
        self._peak_fd: int | None = None  # v2 memory.peak opened for a reset: it resets for this descriptor only
        self._peak_from_samples = False

    @property
    def directories(self) -> list[Path]:
        return sorted(set(self.paths.values()))

    @property
    def path(self) -> str:
        """Its path below each hierarchy's root: the container id cAdvisor gives its series."""
        return f"/{PARENT}/{self.name}"

    def create(self) -> PodCgroup:
        hierarchy, reason = _find_hierarchy()
        if hierarchy is None:
            raise LimitsError(f"{reason}; {WITHOUT_LIMITS}")
        needed = ["memory"]
        if self.limits.cpus is not None:
            needed.append("cpu")
        if self.limits.cpuset is not None:
            needed.append("cpuset")
        self.version = hierarchy.version
        try:
            if self.version == 1:
                self._create_v1(hierarchy.roots, needed)
            else:
                self._create_v2(hierarchy.roots["memory"], needed)
        except BaseException:
            self.destroy()
            raise
        self._procs = [os.fsencode(path / "cgroup.procs") for path in self.directories]
        return self

    def _create_v1(self, roots: dict[str, Path], needed: list[str]) -> None:
        for controller in needed:
            parent = roots[controller] / PARENT
            parent.mkdir(exist_ok=True)
            if controller == "cpuset" and not (parent / "cpuset.cpus").read_text().strip():
                # A new v1 cpuset is empty, and a cgroup without cpus or mems cannot hold a task.
                _write(parent / "cpuset.cpus", (roots[controller] / "cpuset.cpus").read_text().strip())
                _write(parent / "cpuset.mems", (roots[controller] / "cpuset.mems").read_text().strip())
            self.paths[controller] = self._make(parent)
        if self.limits.cpus is not None:
            self.limit_cpu(self.limits.cpus)
        if self.limits.cpuset is not None:
            cpuset = self.paths["cpuset"]
            _write(cpuset / "cpuset.cpus", self.limits.cpuset)
            _write(cpuset / "cpuset.mems", (cpuset.parent / "cpuset.mems").read_text().strip())
        if self.limits.memory_bytes is not None:
            self.limit_memory(self.limits.memory_bytes)

    def _create_v2(self, root: Path, needed: list[str]) -> None:
        parent = root / PARENT
        _enable_controllers(root, needed)
        parent.mkdir(exist_ok=True)
        _enable_controllers(parent, needed)
        pod = self._make(parent)
        self.paths = dict.fromkeys(needed, pod)
        if self.limits.cpus is not None:
            self.limit_cpu(self.limits.cpus)
        if self.limits.cpuset is not None:
            _write(pod / "cpuset.cpus", self.limits.cpuset)
        if self.limits.memory_bytes is not None:
            self.limit_memory(self.limits.memory_bytes)

    def _make(self, parent: Path) -> Path:
        path = parent / self.name
        try:
            path.mkdir()
        except FileExistsError:
            raise LimitsError(f"cgroup {path} exists already: another pod has the name {self.name!r}") from None
        except OSError as error:
            raise LimitsError(f"cannot create cgroup {path}: {error.strerror}") from None
        return path

    def limit_cpu(self, cpus: float) -> None:
        """Set the pod's CPU quota (cpus x the CFS period), also while it runs: a benchmark moves CPU between a server
        and its callers without restarting either. Only for a pod created with a CPU limit."""
        cpu = self._dir("cpu")
        if self.version == 1:
            _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(cfs_quota_us(cpus)))
        else:
            _write(cpu / "cpu.max", cpu_max_text(cpus))
        self.limits = replace(self.limits, cpus=cpus)

    def limit_memory(self, limit: int) -> None:
        """Set the pod's memory limit, swap included (a breach OOM-kills, as in a pod), also while it runs: a limit
        below what it holds is refused by the kernel once it cannot reclaim enough (EBUSY)."""
        memory = self._dir("memory")
        if self.version == 1:
            swap = memory / "memory.memsw.limit_in_bytes"  # memory + swap: the same limit means no swap
            if swap.exists() and int(swap.read_text()) < limit:  # the kernel keeps memsw at least the limit
                _write(swap, str(limit))
            _write(memory / "memory.limit_in_bytes", str(limit))
            if swap.exists():
                _write(swap, str(limit))
        else:
            _write(memory / "memory.max", str(limit))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (memory / name).exists():
                    _write(memory / name, value)
        self.limits = replace(self.limits, memory_bytes=limit)

    def join(self) -> None:
        """Move the calling process into the pod: as a subprocess's preexec_fn, the child and everything it
        starts are inside. Plain os calls only, since it runs between fork and exec."""
        pid = str(os.getpid()).encode()
        for procs in self._procs:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def pids(self) -> list[int]:
        return sorted(_pids_in(self.directories))

    def memory_current(self) -> int:
        """Bytes charged to the pod now (v1 memory.usage_in_bytes, v2 memory.current)."""
        current = int(self._memory_file("memory.usage_in_bytes", "memory.current").read_text())
        self._seen_peak = max(self._seen_peak, current)
        return current

    def memory_peak(self) -> int:
        """Most bytes charged since creation or reset_peak(): v1 memory.max_usage_in_bytes, v2 memory.peak.
        A v2 kernel older than 5.19 has no memory.peak, and one older than 6.12 cannot reset it: then this is
        the highest memory_current() sample, a lower bound of the true peak."""
        if self.version == 1:
            return int((self._dir("memory") / "memory.max_usage_in_bytes").read_text())
        if self._peak_fd is not None:
            return int(os.pread(self._peak_fd, 64, 0))
        peak = self._dir("memory") / "memory.peak"
        if peak.exists() and not self._peak_from_samples:
            return int(peak.read_text())
        self.memory_current()
        return self._seen_peak

    def reset_peak(self) -> None:
        """Start measuring the peak afresh, e.g. after a warm-up."""
        if self.version == 1:
            _write(self._dir("memory") / "memory.max_usage_in_bytes", "0")
            return
        self._close_peak()
        peak = self._dir("memory") / "memory.peak"
        with contextlib.suppress(OSError):  # memory.peak is read-only before Linux 6.12
            fd = os.open(peak, os.O_RDWR)
            try:
                os.write(fd, b"reset\n")
            except OSError:
                os.close(fd)
                raise
            self._peak_fd = fd
            return
        self._peak_from_samples = True
        self._seen_peak = 0
        self.memory_current()

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer has killed in the pod (v1 memory.oom_control, v2 memory.events)."""
        return oom_kills_from(self._memory_file("memory.oom_control", "memory.events").read_text())

    def cpu_stats(self) -> dict[str, float]:
        """CFS periods and throttling from cpu.stat; zeros without a CPU limit, since nothing is throttled."""
        if "cpu" not in self.paths:
            return cpu_stats_from("", self.version)
        return cpu_stats_from((self.paths["cpu"] / "cpu.stat").read_text(), self.version)

    def usage(self) -> dict[str, float | int | str | None]:
        """Everything measured, with the limits, ready for JSON."""
        cpu = self.cpu_stats()
        return {
            "memory_current_bytes": self.memory_current(),
            "memory_peak_bytes": self.memory_peak(),
            "oom_kills": self.oom_kills(),
            "cpu_periods": cpu["periods"],
            "cpu_throttled_periods": cpu["throttled_periods"],
            "cpu_throttled_seconds": cpu["throttled_seconds"],
            "limit_cpus": self.limits.cpus,
            "limit_memory_bytes": self.limits.memory_bytes,
            "limit_cpuset": self.limits.cpuset,
            "cgroup_version": self.version,
        }

    def destroy(self, timeout: float = DESTROY_TIMEOUT_S) -> None:
        """SIGKILL whatever is left inside, wait until the pod is empty and remove its directories.
        Idempotent; raises LimitsError if processes or directories outlive `timeout`."""
        self._close_peak()
        remove_cgroups(list(self.directories), timeout, f"cgroup {self.name}")
        self.paths = {}
        self._procs = []

    def _dir(self, controller: str) -> Path:
        if controller not in self.paths:
            raise LimitsError(f"cgroup {self.name} has no {controller} directory: create() it first")
        return self.paths[controller]

    def _memory_file(self, v1_name: str, v2_name: str) -> Path:
        return self._dir("memory") / (v1_name if self.version == 1 else v2_name)

    def _close_peak(self) -> None:
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None

    def __enter__(self) -> PodCgroup:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _enable_controllers(cgroup: Path, controllers: list[str]) -> None:
    """Let `cgroup`'s children use `controllers` (v2 cgroup.subtree_control), writing only what is missing."""
    control = cgroup / "cgroup.subtree_control"
    missing = [c for c in controllers if c not in control.read_text().split()]
    if not missing:
        return
    try:
        control.write_text(" ".join(f"+{c}" for c in missing))
    except OSError as error:
        hint = ""
        if error.errno == errno.EBUSY:
            hint = (
                " (cgroup v2 hands controllers only to children of a cgroup that holds no processes itself: "
                "run on the host as root, where the top cgroup is exempt, or in a container with a delegated "
                "cgroup namespace)"
            )
        raise LimitsError(
            f"cannot enable the {', '.join(missing)} controllers in {control}: {error.strerror}{hint}"
        ) from None


def remove_cgroups(roots: Iterable[Path], timeout: float, name: str) -> None:
    """SIGKILL every process in the cgroups `roots` and the cgroups below them until none is left, then remove them
    all, deepest first. Idempotent; raises LimitsError naming `name` if a process or a directory outlives
    `timeout`."""
    roots = [root for root in roots if root.is_dir()]
    deadline = time.monotonic() + timeout

    def tree() -> list[Path]:  # deepest first
        found = {root for root in roots if root.is_dir()}
        found |= {path for root in roots if root.is_dir() for path in root.rglob("*") if path.is_dir()}
        return sorted(found, key=lambda path: len(path.parts), reverse=True)

    while left := _pids_in(tree()):
        for root in roots:
            kill = root / "cgroup.kill"  # v2 since Linux 5.14: also catches processes forking now
            if kill.exists():
                _write(kill, "1")
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise LimitsError(f"processes {sorted(left)} survive SIGKILL in {name}")
        time.sleep(0.02)
    for directory in tree():
        while True:
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as error:
                # The kernel lets go of a cgroup's last exited tasks asynchronously.
                if error.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise LimitsError(f"cannot remove cgroup {directory}: {error.strerror}") from None
                time.sleep(0.02)


def _pids_in(directories: Iterable[Path]) -> set[int]:
    pids: set[int] = set()
    for directory in directories:
        with contextlib.suppress(FileNotFoundError):
            pids.update(int(pid) for pid in (directory / "cgroup.procs").read_text().split())
    return pids


def _write(path: Path, value: str) -> None:
    """Write a cgroup file; the kernel answers a bad value with an errno that names nothing, so we name it."""
    try:
        path.write_text(value)
    except OSError as error:
        raise LimitsError(f"cannot write {value!r} to {path}: {error.strerror}") from None
