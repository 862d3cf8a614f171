"""The README's quickstart, run as it stands: its shell block, step by step, in one shell, as a user pastes it.

The shell works in a scratch copy of this checkout and has a network namespace of its own, so port 8000, the node's
link and its iptables chains are the test's alone and nothing else on the machine can answer a call the README
makes; the cluster's state is the copy's (`INFEROP_CLUSTER_DIR`) and PATH holds the system's directories only, so
kubectl and helm come from `cluster up`'s export line. The copy keeps the files' times and links this checkout's
`.venv`, so the README's `make install` finds the install made for these files and does nothing: `make install`
and `make tools` on a clean clone are what CI runs first.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from inferop.paths import repo_root
from inferop_devtools.cluster.tools import kube_tools
from tests.node.helpers import cli, traces

pytestmark = pytest.mark.integration

QUICKSTART = "## Five minutes: from a model to a called endpoint"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STEP = re.compile(r"^# (\d+)\. ")
# What `inferop infer` prints for a board model: the policy line, the best move and value (weights line aside).
ANSWER = re.compile(r"^(policy  .*|best move .*)$", re.MULTILINE)


def quickstart(readme: str) -> list[tuple[str, str]]:
    """The README's quickstart block cut at its numbered comments: (the step's first line, its text); what comes
    before step 1 is the install."""
    after = readme[readme.index(QUICKSTART) :]
    block = after[after.index("```sh\n") + len("```sh\n") : after.index("\n```", after.index("```sh\n"))]
    steps: list[tuple[str, list[str]]] = [("install", [])]
    for line in block.splitlines():
        if STEP.match(line):
            steps.append((line, []))
        steps[-1][1].append(line)
    return [(title, "\n".join(lines)) for title, lines in steps]


class Shell:
    """One bash that reads commands as a terminal would, stopping at the first that fails (`set -e`, as a user
    stops at an error); each `run` writes a text to it and reads what it printed up to a marker."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        start = "ip link set lo up && exec bash --noprofile --norc -e -o pipefail -s"
        self.process = subprocess.Popen(
            ["unshare", "--net", "--", "bash", "--noprofile", "--norc", "-c", start],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, text: str, timeout: float) -> str:
        """What `text` printed; the test fails with it when the shell ends (a command failed) or time runs out."""
        assert self.process.stdin is not None
        marker = f"@@done-{uuid.uuid4().hex}"
        self.process.stdin.write(f"{text}\necho {marker}\n")
        self.process.stdin.flush()
        printed: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                pytest.fail(f"no end within {timeout:g} s of:\n{text}\nprinted:\n{''.join(printed)}")
            if line is None:
                code = self.process.wait(timeout=10)
                pytest.fail(f"the shell stopped (exit {code}) in:\n{text}\nprinted:\n{''.join(printed)}")
            if line.strip() == marker:
                return "".join(printed)
            printed.append(line)

    def close(self) -> None:
        """End the shell and whatever it left in its network: a server the README started in the background and
        the test stopped before its step stopped it runs in its own process group."""
        network = os.readlink(f"/proc/{self.process.pid}/ns/net") if self.process.poll() is None else None
        self.process.kill()
        self.process.wait(timeout=10)
        if network is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = [pid for pid in processes_in(network) if pid != os.getpid()]
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 15
            while left and time.monotonic() < deadline and processes_in(network):
                time.sleep(0.2)


def processes_in(network: str) -> list[int]:
    """The processes in network namespace `network` (as /proc/PID/ns/net reads, e.g. net:[4026532XXX])."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "net") == network:
                    found.append(int(entry.name))
    return found


def scratch_copy(target: Path) -> Path:
    """This checkout's files as git sees them (committed or not, ignored ones aside), with their times, and its
    `.venv` linked: a clone of the working tree whose install is this one's."""
    root = repo_root()
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = root / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to(root / ".venv")
    return target


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[tuple[Shell, Path]]:
    """The user's shell in a scratch copy; afterwards its cluster is down whatever happened."""
    if subprocess.run(["make", "-q", "install"], cwd=repo_root(), check=False).returncode != 0:
        pytest.fail("this checkout's .venv is older than its pyproject files: `make install` first")
    checkout = scratch_copy(tmp_path / "inferop")
    state_dir = tmp_path / "cluster"
    env = {"HOME": os.environ["HOME"], "PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "INFEROP_CLUSTER_DIR": str(state_dir)}
    if "INFEROP_CACHE" in os.environ:  # `make test` sets it for everything it runs
        env["INFEROP_CACHE"] = os.environ["INFEROP_CACHE"]
    user = Shell(checkout, env)
    try:
        yield user, state_dir
    finally:
        if user.process.poll() is None:
            subprocess.run(  # the README's last step, where the test stopped before it
                ["nsenter", f"--net=/proc/{user.process.pid}/ns/net", "--", *cli_command("down", state_dir)],
                capture_output=True, timeout=120, check=False,
            )  # fmt: skip
        user.close()
        cli("down", "--state-dir", str(state_dir))


def cli_command(action: str, state_dir: Path) -> list[str]:
    return [str(repo_root() / ".venv" / "bin" / "inferop"), "cluster", action, "--state-dir", str(state_dir)]


def timed(user: Shell, text: str) -> tuple[str, float]:
    """What the README's `text` printed, and how long it took (the first `cluster up` on a machine builds its parts,
    so it may take half an hour)."""
    started = time.monotonic()
    printed = user.run(text, timeout=1800)
    return printed, time.monotonic() - started


def served(user: Shell) -> int:
    """How many requests the conv net's Triton in the pod answered, from its metrics, read inside the container."""
    read = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8002/metrics').read().decode())"
    metrics = user.run(f'kubectl exec deploy/conv-net -c triton -- python3 -c "{read}"', 60)
    found = re.search(r'^nv_inference_request_success\{model="conv_net",version="1"\} (\d+)', metrics, re.MULTILINE)
    assert found, metrics
    return int(found.group(1))


def test_the_readme_quickstart_runs_as_written(shell: tuple[Shell, Path], measured: Callable[[str], None]) -> None:
    user, state_dir = shell
    steps = quickstart((repo_root() / "README.md").read_text())
    assert [title.split(".")[0] for title, _ in steps] == ["install", "# 1", "# 2", "# 3", "# 4", "# 5"], steps
    before = traces(state_dir)
    printed: dict[str, str] = {}
    took: list[str] = []
    for title, text in steps:
        if title.startswith("# 4."):
            # Read the pod's count of answers before and after the step's call: the call must be one of them.
            forward, call = text.split("\ninferop infer", 1)
            printed[title], spent = timed(user, forward)
            before_call = served(user)
            answer, spent_calling = timed(user, f"inferop infer{call}")
            printed[title] += answer
            spent += spent_calling
            assert served(user) == before_call + 1, "the call through the port-forward did not reach the pod"
            assert "Handling connection for 18000" in printed[title], printed[title]
            assert "STATUS: deployed" in printed[title], printed[title]  # helm's, for the chart
            # kubectl and helm were the project's, from `cluster up`'s PATH, not the machine's.
            found = user.run("command -v kubectl helm", 10).split()
            assert found == [str(kube_tools() / "kubectl"), str(kube_tools() / "helm")], found
        else:
            printed[title], spent = timed(user, text)
        took.append(f"{re.split(r'[:(,]', title.removeprefix('# '))[0].strip()} {spent:.1f} s")
        if title.startswith("# 2."):
            # The step stopped the server it started: nothing answers on its port (in the shell's own network).
            answers = user.run("(exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && echo open || echo closed", 10)
            assert answers.strip() == "closed", "step 2 left its server running"
    measured("; ".join(took))
    # The pod's answer is the local server's: same model, same seeded board.
    local, pod = (ANSWER.findall(printed[step]) for step in (steps[2][0], steps[4][0]))
    assert local and pod == local, (local, pod)
    assert traces(state_dir) == before, "`inferop cluster down` left something of the node behind"
