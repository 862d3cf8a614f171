"""What an export holds at its peak: the bound it states before the work (the model's size, the batches it runs),
refused with the flag that lowers it where the process's cgroup cannot hold it; int8's fallback search on Inception V3
finishing inside a memory cgroup of its stated bound; and a killed export leaving the repository as it was."""

from __future__ import annotations

import hashlib
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferop.limits import PodCgroup, PodLimits, cgroup_unavailable_reason
from inferop_core.quantity import parse_quantity
from tests.helpers import TINY
from tests.user_models import upsampler

pytest.importorskip("torch", reason="install the export distribution: make install")

from inferop_export.exporter import install
from inferop_export.memory import OVERHEAD, ExportMemory, MemoryShortfall, check_fits, export_runs

MiB, GiB = 2**20, 2**30
INFEROP = Path(sys.executable).with_name("inferop")
TINY_FLAGS = [f"--{name}={value}" for name, value in TINY.items()]
CGROUPS = cgroup_unavailable_reason()
needs_cgroups = pytest.mark.skipif(CGROUPS is not None, reason=str(CGROUPS))
BOUND = re.compile(r"memory: at most (\S+) resident")
PEAK = re.compile(r"cost: [0-9.]+s, peak resident memory (\S+)")


class TestTheBound:
    def test_int8_s_search_holds_the_weights_six_times_and_the_gate_s_two_batches(self) -> None:
        memory = ExportMemory(1000 * MiB, 100 * MiB, 10 * MiB, export_runs(8, 8))
        # parity and capacity: 2 x 100 + 2 x 8 x 10 = 360 MiB; the search: 6 x 100 + 2 x 16 x 10 = 920 MiB.
        assert memory.largest.flag == "--gate-batch"
        assert memory.need_bytes == 920 * MiB + OVERHEAD
        assert memory.bound_bytes == 1000 * MiB + 920 * MiB + OVERHEAD
        assert memory.describe() == (
            "at most 2.06Gi resident: 1000Mi held now + 6 x 100Mi of weights + 2 x 16 x 10Mi of activations (int8's "
            "search: the gate runs fp32 and int8 on 8 samples each) + 192Mi"
        )

    def test_fp32_runs_the_parity_check_and_the_capacity_measure_only(self) -> None:
        memory = ExportMemory(0, 100 * MiB, 10 * MiB, export_runs(64, None))
        assert memory.largest.flag == "--max-batch-size"
        assert memory.need_bytes == 200 * MiB + 2 * 64 * 10 * MiB + OVERHEAD


class TestRefusedBeforeTheWork:
    SEARCH = ExportMemory(1 * GiB, 100 * MiB, 10 * MiB, export_runs(8, 64))  # 600 + 2 x 128 x 10 = 3160 MiB

    def test_enough_memory_passes(self) -> None:
        check_fits(self.SEARCH, self.SEARCH.need_bytes, "MemAvailable")

    def test_a_search_that_does_not_fit_names_gate_batch_and_what_it_needs_at_its_least(self) -> None:
        with pytest.raises(MemoryShortfall) as refused:
            check_fits(self.SEARCH, 2 * GiB, "cgroup v1 /pod: memory.limit_in_bytes 3Gi")
        # At --gate-batch 1: 6 x 100 + 2 x 2 x 10 = 640 MiB, still above the parity check's 360.
        assert str(refused.value).startswith("the export needs 3.27Gi more memory (at most 4.27Gi resident: ")
        assert str(refused.value).endswith(
            "this process may take only 2Gi more (cgroup v1 /pod: memory.limit_in_bytes 3Gi): lower --gate-batch: at "
            "its least it needs 832Mi more"
        )

    def test_where_even_the_least_does_not_fit_it_asks_for_memory_too(self) -> None:
        with pytest.raises(MemoryShortfall, match=r"lower --gate-batch: at its least it needs 832Mi more, so give it "):
            check_fits(self.SEARCH, 512 * MiB, "MemAvailable")

    def test_a_run_no_flag_lowers_asks_for_memory(self) -> None:
        parity = ExportMemory(0, 0, 100 * MiB, export_runs(1, None))
        with pytest.raises(MemoryShortfall, match=r"\(the parity check at batch 8\) .*: give it more memory$"):
            check_fits(parity, 1 * GiB, "MemAvailable")


def test_a_gate_batch_below_one_is_refused_naming_the_flag(tmp_path: Path) -> None:
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_export.precision import PrecisionError

    with pytest.raises(PrecisionError, match=r"^--gate-batch 0: must be at least 1$"):
        export_model(conv_net(**TINY), tmp_path / "repo", quiet=True, precision="int8", gate_batch=0)
    assert not (tmp_path / "repo").exists()


def export_in(pod: PodCgroup, *args: str | Path) -> subprocess.Popen[str]:
    """`inferop export ...` started inside `pod`, its report and progress piped."""
    command = [str(INFEROP), "export", *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pod.join)


@pytest.mark.integration
@needs_cgroups
def test_the_fallback_search_of_inception_v3_finishes_in_a_cgroup_of_its_stated_bound(tmp_path: Path) -> None:
    """Every compute node int8 fails the gate on random weights, so the whole search runs: four more quantizations,
    three measures of the noise. The cgroup's limit is the bound the export states before its work, set as it
    states it; on 30 validation samples (`--gate agreement=0.9` judges that few) holding every tensor of both models
    for every sample, as the search did before, took 5.7 GB."""
    rng = np.random.default_rng(0)
    for name, samples in (("calibration", 16), ("validation", 30)):
        np.savez(tmp_path / f"{name}.npz", images=rng.standard_normal((samples, 3, 299, 299), dtype=np.float32))
    sets = ["--calibration", tmp_path / "calibration.npz", "--validation", tmp_path / "validation.npz"]
    with PodCgroup(PodLimits()) as pod:
        export = export_in(
            pod, "inception_v3", "--precision", "int8", *sets, "--gate", "agreement=0.9", "--repo", tmp_path / "repo"
        )
        assert export.stderr is not None
        said, bound = [], None
        for line in export.stderr:
            said.append(line)
            if stated := BOUND.search(line):
                bound = round(parse_quantity(stated[1]))
                pod.limit_memory(bound)
                break
        _, rest = export.communicate(timeout=900)
        err = "".join(said) + rest
        assert bound is not None, err
        assert export.returncode == 1, err
        assert "inception_v3: int8 fails its accuracy gate (logits: top-1 agreement" in err
        assert "first and last compute nodes in fp32: fails" in err  # the search ran to its end
        assert pod.oom_kills() == 0
        assert pod.memory_peak() <= bound
        peak = PEAK.search(err)
        assert peak is not None and parse_quantity(peak[1]) <= bound
    assert not (tmp_path / "repo").exists()


@pytest.mark.integration
@needs_cgroups
def test_an_export_its_cgroup_cannot_hold_is_refused_before_the_work_and_the_flag_lowers_it(tmp_path: Path) -> None:
    """A model of 64 MiB of activations a sample: int8's gate at 32 samples a model would need 8 GiB more."""
    model = upsampler(tmp_path / "upsampler.onnx")
    rng = np.random.default_rng(0)
    for name, samples in (("calibration", 64), ("validation", 300)):
        np.savez(tmp_path / f"{name}.npz", image=rng.standard_normal((samples, 1, 32, 32), dtype=np.float32))
    args = ["onnx", model, "--precision", "int8", "--calibration", tmp_path / "calibration.npz"]
    args += ["--validation", tmp_path / "validation.npz", "--repo", tmp_path / "repo"]
    with PodCgroup(PodLimits(memory_bytes=2 * GiB)) as pod:
        refused = export_in(pod, *args, "--gate-batch", "32")
        _, err = refused.communicate(timeout=300)
        assert refused.returncode == 2, err
        file = "memory.limit_in_bytes" if pod.version == 1 else "memory.max"
        assert f"more ({pod_cgroup(pod)}: {file} 2Gi): lower --gate-batch: at its least it needs " in err
        assert "[3/8]" not in err and not (tmp_path / "repo").exists()  # nothing but the fp32 file's checks ran

        served = export_in(pod, *args, "--gate-batch", "1")
        _, err = served.communicate(timeout=600)
        assert served.returncode == 0, err
        assert pod.oom_kills() == 0
    assert (tmp_path / "repo" / "upsampler" / "1" / "model.onnx").is_file()


def pod_cgroup(pod: PodCgroup) -> str:
    return f"cgroup v{pod.version} {pod.path}"


def contents(repo: Path) -> dict[str, str]:
    """Every file under `repo` (hidden ones too) and the digest of its bytes."""
    return {
        str(path.relative_to(repo)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(repo.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("before", ["nothing", "an earlier export"])
def test_an_export_killed_after_writing_its_model_leaves_the_repository_as_it_was(tmp_path: Path, before: str) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    if before == "an earlier export":
        written = subprocess.run(
            [INFEROP, "export", "conv_net", *TINY_FLAGS, "--repo", repo], capture_output=True, text=True, check=False
        )
        assert written.returncode == 0, written.stderr
    kept = contents(repo)
    export = subprocess.Popen(
        [INFEROP, "export", "conv_net", *TINY_FLAGS, "--seed", "1", "--repo", repo],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert export.stderr is not None
    for line in export.stderr:  # the other weights are written, and being checked
        if line.startswith("[2/6] onnx.checker ..."):
            export.send_signal(signal.SIGKILL)
            break
    export.communicate(timeout=60)
    assert export.returncode == -signal.SIGKILL
    assert contents(repo) == kept
    assert sorted(path.name for path in repo.iterdir()) == sorted({Path(name).parts[0] for name in kept})


def test_a_new_model_directory_replaces_the_old_one_whole(tmp_path: Path) -> None:
    old, new = tmp_path / "repo" / "net", tmp_path / "work" / "net"
    files = {old: ["config.pbtxt", "labels.txt", "1/model.onnx"], new: ["config.pbtxt", "1/model.onnx"]}
    for directory, names in files.items():
        for name in names:
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(f"{directory.parent.name} {name}")
    install(new, old)
    assert contents(tmp_path / "repo") == contents(tmp_path / "work")  # the old labels are gone, nothing beside
