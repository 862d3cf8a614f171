"""A pod's limits with the kernel's cgroups: flags parsed with errors naming them, both cgroup versions' files
read and written right, and, where cgroups are writable, processes placed, throttled, pinned and OOM-killed
as in a pod, tritonserver included."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferop import limits
from inferop.limits import (
    CFS_PERIOD_US,
    LimitsError,
    PodCgroup,
    PodLimits,
    cfs_quota_us,
    cgroup_headroom,
    cgroup_unavailable_reason,
    cpu_max_text,
    cpu_stats_from,
    describe_usage,
    format_cpu_list,
    memory_headroom,
    oom_kills_from,
    own_cgroup,
    parse_cpu_list,
    parse_meminfo,
    parse_mounts,
)
from tests.helpers import EXPORT_EXTRA, SERVE_EXTRA, SERVING, TINY, stopped_by_sigterm, wait_for

MiB = 2**20
CGROUPS = cgroup_unavailable_reason()
needs_cgroups = pytest.mark.skipif(CGROUPS is not None, reason=str(CGROUPS))
AVAILABLE = os.sched_getaffinity(0)


class TestFromStrings:
    @pytest.mark.parametrize(
        ("cpus", "memory", "cpuset", "expected"),
        [
            ("1.5", "1Gi", None, PodLimits(cpus=1.5, memory_bytes=2**30)),
            ("500m", "900Mi", None, PodLimits(cpus=0.5, memory_bytes=900 * MiB)),
            (None, "512M", None, PodLimits(memory_bytes=512_000_000)),
            ("10m", None, None, PodLimits(cpus=0.01)),
            (None, None, str(min(AVAILABLE)), PodLimits(cpuset=str(min(AVAILABLE)))),
            (None, None, None, PodLimits()),
        ],
    )
    def test_values_as_a_pod_spec_writes_them(
        self, cpus: str | None, memory: str | None, cpuset: str | None, expected: PodLimits
    ) -> None:
        assert PodLimits.from_strings(cpus, memory, cpuset) == expected

    def test_cpuset_is_written_in_the_kernels_shortest_form(self) -> None:
        text = ",".join(map(str, sorted(AVAILABLE)))
        parsed = PodLimits.from_strings(None, None, text)
        assert parsed.cpuset == format_cpu_list(AVAILABLE)
        assert parsed.cpu_list() == AVAILABLE

    @pytest.mark.parametrize(
        ("cpus", "memory", "cpuset", "message"),
        [
            ("-1", None, None, "--cpus '-1': must be positive"),
            ("0", None, None, "--cpus '0': must be positive"),
            ("lots", None, None, "--cpus 'lots': not a Kubernetes quantity (examples: 1, 1.5, 500m)"),
            ("1m", None, None, "--cpus '1m': must be at least 10m"),
            (None, "1Gb", None, "--memory '1Gb': not a Kubernetes quantity (examples: 1Gi, 900Mi, 512M)"),
            (None, "8Mi", None, "--memory '8Mi': must be at least 16Mi"),
            (None, "-1Gi", None, "--memory '-1Gi': must be positive"),
            (None, None, "one", "--cpuset 'one': 'one' is not a CPU number or range (examples: 1, 0-1, 0,2-3)"),
            (None, None, "3-1", "--cpuset '3-1': range '3-1' ends before it starts"),
            (None, None, "0,", "--cpuset '0,': '' is not a CPU number or range"),
        ],
    )
    def test_bad_value_names_the_flag_and_the_value(
        self, cpus: str | None, memory: str | None, cpuset: str | None, message: str
    ) -> None:
        with pytest.raises(LimitsError) as error:
            PodLimits.from_strings(cpus, memory, cpuset)
        assert str(error.value).startswith(message), error.value

    def test_cpuset_beyond_this_processs_cpus_names_those_available(self) -> None:
        missing = max(AVAILABLE) + 1
        with pytest.raises(LimitsError) as error:
            PodLimits.from_strings(None, None, f"{min(AVAILABLE)},{missing}")
        assert str(error.value) == (
            f"--cpuset '{min(AVAILABLE)},{missing}': CPUs {missing} are not available to this process "
            f"(available: {format_cpu_list(AVAILABLE)})"
        )


class TestDescribe:
    @pytest.mark.parametrize(
        ("pod", "text"),
        [
            (PodLimits(cpus=1, memory_bytes=2**30, cpuset="1"), "cpus=1 (CFS quota), cpuset=1, memory=1Gi"),
            (PodLimits(cpus=0.25), "cpus=0.25 (CFS quota)"),
            (PodLimits(memory_bytes=900 * MiB), "memory=900Mi"),
            (PodLimits(), "no limits"),
        ],
    )
    def test_limits(self, pod: PodLimits, text: str) -> None:
        assert pod.describe() == text
        assert pod.empty == (text == "no limits")

    def test_usage_with_cpu_and_memory_limits(self) -> None:
        usage: dict[str, float | int | str | None] = {
            "memory_peak_bytes": 512 * MiB,
            "oom_kills": 0,
            "cpu_periods": 300.0,
            "cpu_throttled_periods": 12.0,
            "cpu_throttled_seconds": 0.84,
            "limit_cpus": 1.0,
            "limit_memory_bytes": 2**30,
        }
        assert describe_usage(usage) == (
            "peak memory 512Mi of 1Gi, 0 OOM kills, CPU throttled in 12 of 300 periods (0.8s)"
        )

    def test_usage_without_limits_shows_the_peak(self) -> None:
        usage: dict[str, float | int | str | None] = {
            "memory_peak_bytes": 3 * MiB,
            "oom_kills": 1,
            "limit_cpus": None,
            "limit_memory_bytes": None,
        }
        assert describe_usage(usage) == "peak memory 3Mi, 1 OOM kills"


class TestCpuList:
    @pytest.mark.parametrize(
        ("text", "cpus", "canonical"),
        [("1", {1}, "1"), ("0-3", {0, 1, 2, 3}, "0-3"), ("0,2-3,7", {0, 2, 3, 7}, "0,2-3,7"), ("1,0", {0, 1}, "0-1")],
    )
    def test_round_trip(self, text: str, cpus: set[int], canonical: str) -> None:
        assert parse_cpu_list(text) == cpus
        assert format_cpu_list(cpus) == canonical


class TestCgroupFiles:
    """The files' formats, both versions, from texts as the kernel writes them."""

    @pytest.mark.parametrize(
        ("cpus", "quota", "cpu_max"),
        [(1.0, 100_000, "100000 100000"), (0.2, 20_000, "20000 100000"), (2.5, 250_000, "250000 100000")],
    )
    def test_cfs_quota_per_100ms_period(self, cpus: float, quota: int, cpu_max: str) -> None:
        assert CFS_PERIOD_US == 100_000
        assert cfs_quota_us(cpus) == quota
        assert cpu_max_text(cpus) == cpu_max

    def test_no_quota_is_max_in_cpu_max(self) -> None:
        assert cpu_max_text(None) == "max 100000"

    def test_quota_is_rounded_up_to_the_kernels_minimum(self) -> None:
        assert cfs_quota_us(0.001) == 1_000

    def test_v1_cpu_stat_counts_throttled_time_in_nanoseconds(self) -> None:
        text = "nr_periods 120\nnr_throttled 37\nthrottled_time 2500000000\nnr_bursts 0\nburst_time 0\n"
        assert cpu_stats_from(text, version=1) == {
            "periods": 120.0,
            "throttled_periods": 37.0,
            "throttled_seconds": 2.5,
        }

    def test_v2_cpu_stat_counts_throttled_time_in_microseconds(self) -> None:
        text = (
            "usage_usec 8123456\nuser_usec 8000000\nsystem_usec 123456\nnr_periods 120\nnr_throttled 37\n"
            "throttled_usec 2500000\nnr_bursts 0\nburst_usec 0\n"
        )
        assert cpu_stats_from(text, version=2) == {
            "periods": 120.0,
            "throttled_periods": 37.0,
            "throttled_seconds": 2.5,
        }

    def test_v2_cpu_stat_without_the_cpu_controller_has_no_periods(self) -> None:
        text = "usage_usec 8123456\nuser_usec 8000000\nsystem_usec 123456\n"
        assert cpu_stats_from(text, version=2) == {"periods": 0.0, "throttled_periods": 0.0, "throttled_seconds": 0.0}

    def test_v1_oom_control_oom_kills(self) -> None:
        assert oom_kills_from("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n") == 2

    def test_v2_memory_events_oom_kills(self) -> None:
        assert oom_kills_from("low 0\nhigh 0\nmax 412\noom 3\noom_kill 3\noom_group_kill 1\n") == 3

    def test_a_kernel_before_oom_kill_counters_reads_zero(self) -> None:
        assert oom_kills_from("oom_kill_disable 0\nunder_oom 0\n") == 0

    def test_mounts_of_a_v1_host_with_co_mounted_controllers(self) -> None:
        text = (
            "tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0\n"
            "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0\n"
            "cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,nodev,noexec,relatime,cpuset 0 0\n"
            "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0\n"
            "cgroup /sys/fs/cgroup/systemd cgroup rw,nosuid,nodev,noexec,relatime,xattr,name=systemd 0 0\n"
            "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
        )
        v1, v2 = parse_mounts(text)
        assert v1 == {
            "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
            "cpuset": Path("/sys/fs/cgroup/cpuset"),
            "memory": Path("/sys/fs/cgroup/memory"),
        }
        assert v2 == [Path("/sys/fs/cgroup/unified")]

    def test_mounts_of_a_v2_host(self) -> None:
        text = "sysfs /sys sysfs rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,nsdelegate 0 0\n"
        assert parse_mounts(text) == ({}, [Path("/sys/fs/cgroup")])

    def test_mount_points_with_blanks(self) -> None:
        assert parse_mounts("cgroup2 /mnt/my\\040cgroups cgroup2 rw 0 0\n") == ({}, [Path("/mnt/my cgroups")])


class TestMemoryHeadroom:
    """What this process may still take: its cgroups' limits less their working sets, and MemAvailable."""

    V1_CGROUP = "12:pids:/\n4:memory:/process_api/abc\n1:name=systemd:/\n0::/\n"
    V2_CGROUP = "0::/user.slice/job\n"

    def test_meminfo_in_bytes(self) -> None:
        text = "MemTotal:       24582416 kB\nMemAvailable:   22989220 kB\nHugePages_Total:       0\n"
        assert parse_meminfo(text) == {
            "MemTotal": 24582416 * 1024,
            "MemAvailable": 22989220 * 1024,
            "HugePages_Total": 0,
        }

    @pytest.mark.parametrize(
        ("version", "text", "path"),
        [(1, V1_CGROUP, "/process_api/abc"), (2, V2_CGROUP, "/user.slice/job"), (2, "4:memory:/x\n", None)],
    )
    def test_own_cgroup_by_version(self, version: int, text: str, path: str | None) -> None:
        assert own_cgroup(text, version) == path

    def test_v1_headroom_is_the_limit_less_usage_less_inactive_files(self) -> None:
        stat = "cache 100\ntotal_inactive_file 300\ninactive_file 7\n"
        assert cgroup_headroom("1000\n", "600\n", stat, 1) == 700

    def test_v2_headroom_and_no_limit(self) -> None:
        assert cgroup_headroom("1000\n", "600\n", "anon 500\ninactive_file 100\n", 2) == 500
        assert cgroup_headroom("max\n", "600\n", "inactive_file 100\n", 2) is None

    def layout(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limits_by_level: list[str]) -> None:
        """A cgroup v2 mount at tmp_path/cg whose path /a/b holds this process, each level with a limit of its
        own and 100 bytes in use, and a machine with 1 GiB available."""
        root = tmp_path / "cg"
        directory = root
        for level, limit in zip(["", "a", "b"], limits_by_level, strict=True):
            directory = directory / level
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "memory.max").write_text(limit + "\n")
            (directory / "memory.current").write_text("100\n")
            (directory / "memory.stat").write_text("inactive_file 0\n")
        (tmp_path / "mounts").write_text(f"cgroup2 {root} cgroup2 rw 0 0\n")
        (tmp_path / "cgroup").write_text("0::/a/b\n")
        (tmp_path / "meminfo").write_text(f"MemAvailable: {2**20} kB\n")
        for name, file in (("MOUNTS", "mounts"), ("PROC_CGROUP", "cgroup"), ("MEMINFO", "meminfo")):
            monkeypatch.setattr(limits, name, tmp_path / file)

    def test_the_tightest_ancestor_sets_it(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.layout(tmp_path, monkeypatch, ["max", "5000", "9000"])
        assert memory_headroom() == (4900, "cgroup v2 /a: memory.max 4.88Ki")

    def test_without_a_tighter_limit_the_machine_s_memory_sets_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.layout(tmp_path, monkeypatch, ["max", "max", str(2**40)])
        assert memory_headroom() == (2**30, f"MemAvailable in {tmp_path / 'meminfo'}")


class TestWhereCgroupsAre:
    """Which hierarchy is chosen, from a /proc/mounts and cgroup roots laid out in a temporary directory."""

    def mounts(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
        (tmp_path / "mounts").write_text(text)
        monkeypatch.setattr(limits, "MOUNTS", tmp_path / "mounts")

    def test_no_cgroups_says_how_to_get_them(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mounts(tmp_path, monkeypatch, "proc /proc proc rw 0 0\n")
        reason = cgroup_unavailable_reason()
        assert reason is not None
        assert reason.startswith(limits.UNAVAILABLE)
        assert "run as root on a Linux host" in reason
        assert "(found: no cgroup mounts)" in reason

    def test_v2_without_controllers_names_those_missing(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        (tmp_path / "unified").mkdir()
        (tmp_path / "unified" / "cgroup.controllers").write_text("hugetlb pids\n")
        self.mounts(tmp_path, monkeypatch, f"cgroup2 {tmp_path}/unified cgroup2 rw 0 0\n")
        assert f"v2 at {tmp_path}/unified without cpu, cpuset, memory" in str(cgroup_unavailable_reason())

    def test_v2_with_the_controllers_is_usable(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
        self.mounts(tmp_path, monkeypatch, f"cgroup2 {tmp_path} cgroup2 rw 0 0\n")
        assert cgroup_unavailable_reason() is None

    def test_incomplete_v1_names_the_missing_hierarchies(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mounts(tmp_path, monkeypatch, f"cgroup {tmp_path} cgroup rw,memory 0 0\n")
        assert "v1 without cpu, cpuset" in str(cgroup_unavailable_reason())

    def test_a_pod_cgroup_where_there_are_none_fails_saying_why(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.mounts(tmp_path, monkeypatch, "proc /proc proc rw 0 0\n")
        with pytest.raises(LimitsError, match="cgroups are not writable here") as refused:
            PodCgroup(PodLimits(cpus=1)).create()
        assert str(refused.value).endswith(f"; {limits.WITHOUT_LIMITS}")

    def test_measuring_a_pod_never_created_says_so(self) -> None:
        with pytest.raises(LimitsError, match=r"has no memory directory: create\(\) it first"):
            PodCgroup(PodLimits()).memory_peak()

    @pytest.mark.parametrize("name", ["a/b", "..", "."])
    def test_a_name_must_be_one_directory(self, name: str) -> None:
        with pytest.raises(LimitsError, match="must be one path component"):
            PodCgroup(PodLimits(), name=name)


# --- real cgroups ---


class Pods:
    """Pod cgroups and processes inside them, all removed at the end of a test."""

    def __init__(self) -> None:
        self.cgroups: list[PodCgroup] = []
        self.processes: list[subprocess.Popen[str]] = []

    def create(self, pod_limits: PodLimits) -> PodCgroup:
        cgroup = PodCgroup(pod_limits).create()
        self.cgroups.append(cgroup)
        return cgroup

    def start(self, cgroup: PodCgroup, code: str) -> subprocess.Popen[str]:
        """`python -c code` inside the pod; its stdin is a pipe, so closing it ends a child that reads it."""
        process = subprocess.Popen(
            [sys.executable, "-c", code],
            preexec_fn=cgroup.join,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.processes.append(process)
        return process

    def close(self) -> None:
        for cgroup in self.cgroups:
            cgroup.destroy()
        for process in self.processes:
            process.kill()
            process.communicate()


@pytest.fixture
def pods() -> Iterator[Pods]:
    made = Pods()
    yield made
    made.close()


WAIT_FOR_STDIN = "import sys; sys.stdin.read()"


@pytest.mark.integration
@needs_cgroups
class TestPodCgroup:
    def test_child_and_grandchild_are_in_the_pod(self, pods: Pods) -> None:
        cgroup = pods.create(PodLimits(cpus=1))
        parent = pods.start(
            cgroup,
            "import subprocess, sys\n"
            f"child = subprocess.Popen([sys.executable, '-c', {WAIT_FOR_STDIN!r}])\n"
            "print(child.pid, flush=True)\n"
            "sys.stdin.read()\n"
            "child.wait()\n",
        )
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        assert {parent.pid, grandchild} <= set(cgroup.pids())
        assert os.getpid() not in cgroup.pids()
        parent.communicate("", timeout=30)
        assert parent.returncode == 0
        assert cgroup.pids() == []
        # Memory is measured without a memory limit too.
        assert cgroup.memory_peak() > 0

    def test_busy_loop_in_a_fifth_of_a_cpu_is_throttled(self, pods: Pods) -> None:
        cgroup = pods.create(PodLimits(cpus=0.2))
        before = cgroup.cpu_stats()
        pods.start(cgroup, "while True: pass")

        def throttled() -> dict[str, float] | None:
            # The kernel counts a throttled period when the throttling starts, and adds its time when the next
            # period lifts it: read together, the count can be ahead of the time.
            stats = cgroup.cpu_stats()
            counted = stats["throttled_periods"] > before["throttled_periods"]
            return stats if counted and stats["throttled_seconds"] > before["throttled_seconds"] else None

        after = wait_for(throttled, timeout=30, what="CFS throttling of the busy loop, counted and timed")
        assert float(cgroup.usage()["cpu_throttled_periods"] or 0) >= after["throttled_periods"]

    def test_child_runs_on_the_cpuset_only(self, pods: Pods) -> None:
        cpu = max(AVAILABLE)
        cgroup = pods.create(PodLimits(cpuset=str(cpu)))
        child = pods.start(cgroup, "import os; print(sorted(os.sched_getaffinity(0)))")
        output, _ = child.communicate(timeout=30)
        assert output.strip() == str([cpu])
        assert cgroup.limits.cpu_list() == {cpu}

    def test_allocating_beyond_the_memory_limit_is_oom_killed(self, pods: Pods) -> None:
        limit = 64 * MiB
        cgroup = pods.create(PodLimits(memory_bytes=limit))
        assert cgroup.oom_kills() == 0
        # bytes * n writes every page: the allocation is charged as it happens, swap is no way out.
        child = pods.start(cgroup, "chunks = [b'x' * 2**20 for _ in range(300)]")
        child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL
        assert cgroup.oom_kills() >= 1
        assert 0.9 * limit <= cgroup.memory_peak() <= limit
        usage = cgroup.usage()
        assert usage["oom_kills"] == cgroup.oom_kills()
        assert usage["limit_memory_bytes"] == limit

    def test_a_limit_set_while_the_pod_runs_holds_from_then_on(self, pods: Pods) -> None:
        cgroup = pods.create(PodLimits())
        child = pods.start(cgroup, "import sys; sys.stdin.readline(); chunks = [b'x' * 2**20 for _ in range(300)]")
        cgroup.limit_memory(64 * MiB)
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL
        assert cgroup.oom_kills() >= 1 and cgroup.limits.memory_bytes == 64 * MiB

    def test_a_cpu_quota_set_while_the_pod_runs_holds_from_then_on(self, pods: Pods) -> None:
        """A benchmark moves CPU between a server and its callers without restarting either."""
        cgroup = pods.create(PodLimits(cpus=1))
        busy = (
            "import sys, time; sys.stdin.readline(); wall, cpu = time.monotonic(), time.process_time()\n"
            "while time.monotonic() - wall < 2: pass\n"
            "print(time.process_time() - cpu)"
        )
        child = pods.start(cgroup, busy)
        cgroup.limit_cpu(0.2)
        out, _ = child.communicate("go\n", timeout=60)
        assert float(out) < 0.6  # a fifth of a CPU for 2 s, where the quota of 1 CPU gave it nearly 2
        assert cgroup.limits.cpus == 0.2 and cgroup.cpu_stats()["throttled_periods"] > 5

    def test_a_process_in_a_pod_may_take_its_limit_less_what_it_holds(self, pods: Pods) -> None:
        limit = 512 * MiB
        cgroup = pods.create(PodLimits(memory_bytes=limit))
        child = pods.start(cgroup, "from inferop.limits import memory_headroom; print(*memory_headroom(), sep='|')")
        output, _ = child.communicate(timeout=60)
        available, where = output.strip().split("|")
        file = "memory.limit_in_bytes" if cgroup.version == 1 else "memory.max"
        assert where == f"cgroup v{cgroup.version} {cgroup.path}: {file} 512Mi"
        assert limit - cgroup.memory_peak() <= int(available) < limit

    def test_reset_peak_forgets_an_earlier_peak(self, pods: Pods) -> None:
        cgroup = pods.create(PodLimits())
        child = pods.start(cgroup, "chunk = b'x' * (48 * 2**20); print('allocated', flush=True); input()")
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "allocated"
        assert cgroup.memory_peak() >= 48 * MiB
        child.communicate("\n", timeout=30)
        cgroup.reset_peak()
        assert cgroup.memory_peak() < 16 * MiB

    def test_destroy_kills_what_is_left_and_removes_every_directory(self, pods: Pods) -> None:
        cgroup = pods.create(PodLimits(cpus=0.5, memory_bytes=256 * MiB, cpuset=str(min(AVAILABLE))))
        directories = cgroup.directories
        assert directories and all(path.is_dir() for path in directories)
        assert any(path.match(f"*/inferop/{cgroup.name}") for path in directories)
        child = pods.start(cgroup, WAIT_FOR_STDIN)
        wait_for(lambda: child.pid in cgroup.pids(), what="the child in the pod")
        cgroup.destroy()
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert not any(path.exists() for path in directories)
        cgroup.destroy()  # idempotent

    def test_same_name_twice_is_refused_naming_it(self, pods: Pods) -> None:
        cgroup = pods.create(PodLimits())
        with pytest.raises(LimitsError, match=f"another pod has the name '{cgroup.name}'"):
            PodCgroup(PodLimits(), name=cgroup.name).create()
        assert all(path.is_dir() for path in cgroup.directories)


# --- tritonserver in a pod ---


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with the tiny conv net only: a server on it starts in seconds."""
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    pytest.importorskip("torch", reason=EXPORT_EXTRA)
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_operator.spec import parse_serving

    repo = tmp_path_factory.mktemp("tiny_repo")
    export_model(conv_net(**TINY), repo, serving=parse_serving(SERVING["conv_net"]), quiet=True)
    return repo


def process_group(pgid: int) -> set[int]:
    found = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True, check=False)
    return {int(pid) for pid in found.stdout.split()}


@pytest.mark.integration
@needs_cgroups
class TestServerInAPod:
    def test_server_and_its_stub_run_in_the_pod(self, tiny_repo: Path) -> None:
        from inferop.serving.tritonserver import TritonServer, free_port

        pod_limits = PodLimits(cpus=1, memory_bytes=2**30)
        with TritonServer(tiny_repo, http_port=free_port(), limits=pod_limits) as server:
            assert server.cgroup is not None and server.process is not None
            directories = server.cgroup.directories
            group = process_group(server.process.pid)
            assert len(group) == 2  # the server and the conv net's stub
            assert group <= set(server.cgroup.pids())
            assert server.cgroup.memory_peak() > 0
        assert server.cgroup is None
        assert not any(path.exists() for path in directories)
        assert server.usage is not None
        assert int(server.usage["memory_peak_bytes"] or 0) > 16 * MiB
        assert server.usage["oom_kills"] == 0

    def test_server_beyond_its_memory_limit_names_the_oom_killer(self, tiny_repo: Path) -> None:
        from inferop.serving.tritonserver import ServerError, TritonServer, free_port

        server = TritonServer(tiny_repo, http_port=free_port(), limits=PodLimits(memory_bytes=32 * MiB))
        with pytest.raises(ServerError) as error:
            server.start(timeout=60)
        assert re.search(
            r"killed by the kernel's OOM killer at the memory limit 32Mi \(peak 3\d(\.\d)?Mi\)", str(error.value)
        ), error.value
        assert server.usage is not None and int(server.usage["oom_kills"] or 0) >= 1

    def test_serve_prints_the_limits_and_the_usage_on_stop(self, tiny_repo: Path, tmp_path: Path) -> None:
        from inferop.serving.tritonserver import free_port

        output = tmp_path / "serve.out"
        command = [str(Path(sys.executable).with_name("inferop")), "serve", "--repo", str(tiny_repo)]
        command += ["--http-port", str(free_port()), "--cpus", "1", "--memory", "1Gi", "--cpuset", str(max(AVAILABLE))]
        with open(output, "wb") as sink:
            cli = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        with stopped_by_sigterm(cli, output):

            def announced() -> re.Match[str] | None:
                if cli.poll() is not None:
                    pytest.fail(f"inferop serve exited with {cli.returncode}:\n{output.read_text()}")
                return re.search(r"^limits: (.+) \(cgroup v(\d): (.+)\)$", output.read_text(), re.MULTILINE)

            shown = wait_for(announced, timeout=120, what="inferop serve to report ready")
            assert shown.group(1) == f"cpus=1 (CFS quota), cpuset={max(AVAILABLE)}, memory=1Gi"
            cgroups = [Path(path) for path in shown.group(3).split(", ")]
            assert all((path / "cgroup.procs").read_text().split() for path in cgroups)
        assert re.search(
            r"^pod usage: peak memory \S+Mi of 1Gi, 0 OOM kills, CPU throttled in \d+ of \d+ periods",
            output.read_text(),
            re.MULTILINE,
        ), output.read_text()
        assert not any(path.exists() for path in cgroups)
