"""The local cluster's real node: images written without a registry, the node's pure builders, then `inferop cluster
up` on this machine with containerd, runc, the CNI plugins, the kubelet and kube-proxy, a pod that runs for real
under the limits the kubelet sets, and `inferop cluster down` leaving nothing behind."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from inferop.paths import repo_root
from inferop.serving.localrepo import PYTHON_MODEL
from inferop_devtools.cluster import tools
from inferop_devtools.cluster.controlplane import KUBERNETES_1_37, ControlPlane, Layout
from inferop_devtools.cluster.images import ImageError, Images, ImageSpec, archive_reference, write_archive
from inferop_devtools.cluster.local_images import operator_image, triton_image
from inferop_devtools.cluster.node import (
    LINKS,
    NODE_NAME,
    POD_CIDR,
    Node,
    NodeError,
    NodeLayout,
    NodeSite,
    cni_network,
    containerd_config,
    daemon_commands,
    holder_command,
    kubelet_config,
    network_commands,
    probe_runs,
    start_with_node,
)
from tests.helpers import ExportedRepo, serving, wait_for
from tests.node.helpers import DELETE_SECONDS, INFEROP, Cluster, cli, one_cpu, traces

OPERATOR_IMAGE = "the node's operator image"  # a parameter's placeholder for the reference `up` made

SITE = NodeSite.of(Path("/state"))


class TestImages:
    def spec(self, tmp_path: Path, **changes: Any) -> ImageSpec:
        """An image of a tree, a program and some bytes, the files made the first time."""
        if not (tmp_path / "tree").exists():
            (tmp_path / "tree" / "lib").mkdir(parents=True)
            (tmp_path / "tree" / "lib" / "data.txt").write_text("data")
            (tmp_path / "tree" / "alias").symlink_to("lib/data.txt")
            (tmp_path / "program").write_text("#!/bin/sh\n")
            (tmp_path / "program").chmod(0o755)
        settings: dict[str, Any] = {
            "files": {"opt/app": tmp_path / "tree", "bin/program": tmp_path / "program", "etc/motd": b"hi\n"},
            "entrypoint": ("/bin/program",),
            "links": {"bin/sh-alias": "program"},
        }
        return ImageSpec("example", **(settings | changes))

    def layer(self, archive: Path) -> dict[str, tarfile.TarInfo]:
        with tarfile.open(archive) as outer:
            member = outer.extractfile("layer.tar")
            assert member is not None
            with tarfile.open(fileobj=io.BytesIO(member.read())) as layer:
                return {info.name: info for info in layer.getmembers()}

    def test_the_same_files_give_the_same_archive_and_reference(self, tmp_path: Path) -> None:
        first = write_archive(self.spec(tmp_path), tmp_path / "a.tar")
        second = write_archive(self.spec(tmp_path), tmp_path / "b.tar")
        assert first == second == archive_reference(tmp_path / "a.tar")
        assert first.startswith("inferop.local/example:")
        assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
        (tmp_path / "tree" / "lib" / "data.txt").write_text("other")
        assert write_archive(self.spec(tmp_path), tmp_path / "c.tar") != first

    def test_a_layer_holds_parents_first_links_as_links_and_root_owned_entries(self, tmp_path: Path) -> None:
        write_archive(self.spec(tmp_path), tmp_path / "image.tar")
        entries = self.layer(tmp_path / "image.tar")
        names = list(entries)
        assert (
            names.index("opt")
            < names.index("opt/app")
            < names.index("opt/app/lib")
            < names.index("opt/app/lib/data.txt")
        )
        assert entries["opt/app/alias"].issym() and entries["opt/app/alias"].linkname == "lib/data.txt"
        assert entries["bin/sh-alias"].linkname == "program"
        assert entries["bin/program"].mode == 0o755 and entries["etc/motd"].size == 3
        assert {(info.uid, info.gid, info.mtime) for info in entries.values()} == {(0, 0, 0)}

    def test_the_config_says_how_the_image_runs(self, tmp_path: Path) -> None:
        write_archive(self.spec(tmp_path, env=("A=1",), workdir="/opt/app"), tmp_path / "image.tar")
        with tarfile.open(tmp_path / "image.tar") as outer:
            manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
            config = json.load(outer.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        assert config["config"]["Entrypoint"] == ["/bin/program"]
        assert config["config"]["Env"] == ["A=1"] and config["config"]["WorkingDir"] == "/opt/app"
        assert config["rootfs"]["diff_ids"][0].startswith("sha256:")

    def test_a_missing_file_or_a_path_given_twice_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(ImageError, match="nowhere: no such file"):
            write_archive(self.spec(tmp_path, files={"x": tmp_path / "nowhere"}), tmp_path / "image.tar")
        twice = {"bin/program": tmp_path / "program"}
        with pytest.raises(ImageError, match="/bin/program is given twice"):
            write_archive(self.spec(tmp_path, files=twice, links={"bin/program": "x"}), tmp_path / "image.tar")
        assert not (tmp_path / "image.tar").exists()

    def test_an_archive_is_written_once_per_content(self, tmp_path: Path) -> None:
        images = Images(tmp_path / "cache")
        path, reference = images.archive(self.spec(tmp_path))
        written = path.stat().st_mtime_ns
        assert images.archive(self.spec(tmp_path)) == (path, reference)
        assert path.stat().st_mtime_ns == written
        (tmp_path / "program").write_text("#!/bin/sh\nexit 1\n")
        changed, _ = images.archive(self.spec(tmp_path))
        assert changed != path and not path.exists()  # the stale archive goes


class TestNodeBuilders:
    def test_each_state_dir_gets_a_node_of_its_own(self) -> None:
        other = NodeSite.of(Path("/other"))
        assert (SITE.netns, SITE.host_link, SITE.link) != (other.netns, other.host_link, other.link)
        assert len(SITE.host_link) <= 15  # a network interface's name
        assert SITE.link.subnet_of(LINKS) and SITE.link.prefixlen == 30
        assert SITE.host_address != SITE.node_address and {SITE.host_address, SITE.node_address} == set(
            map(str, SITE.link.hosts())
        )

    def test_the_link_joins_the_node_s_namespace_to_the_host_and_routes_through_it(self) -> None:
        commands = [" ".join(argv) for argv in network_commands(SITE)]
        assert commands[0] == f"ip netns add {SITE.netns}"
        assert f"ip addr add {SITE.host_address}/30 dev {SITE.host_link}" in commands
        assert f"ip -n {SITE.netns} route add default via {SITE.host_address}" in commands
        assert not [c for c in commands if "route" in c and "-n" not in c]  # no route on the host

    def test_pods_get_a_bridge_of_the_node_and_leave_it_masqueraded(self) -> None:
        bridge = cni_network()["plugins"][0]
        assert (bridge["type"], bridge["isGateway"], bridge["ipMasq"]) == ("bridge", True, True)
        assert bridge["ipam"]["ranges"] == [[{"subnet": POD_CIDR}]]

    def test_the_kubelet_authenticates_callers_and_asks_the_apiserver_who_may_do_what(self) -> None:
        config = kubelet_config(SITE, NodeLayout(Path("/state/node")), Layout(Path("/state")))
        assert config["authentication"]["anonymous"] == {"enabled": False}
        assert config["authentication"]["webhook"] == {"enabled": True}
        assert config["authorization"] == {"mode": "Webhook"}
        assert (config["readOnlyPort"], config["address"]) == (0, SITE.node_address)
        assert (config["cgroupDriver"], config["cgroupRoot"]) == ("cgroupfs", f"/{SITE.cgroup_root}")
        # containerd's default socket, in the node's own /run: where the kubelet's cAdvisor looks for containers.
        assert config["containerRuntimeEndpoint"] == "unix:///run/containerd/containerd.sock"

    def test_containerd_runs_sandboxes_without_lowering_oom_scores(self) -> None:
        toml = containerd_config(NodeLayout(Path("/state/node")), "inferop.local/pause:abc")
        assert 'sandbox_image = "inferop.local/pause:abc"' in toml
        assert "restrict_oom_score_adj = true" in toml and "SystemdCgroup = false" in toml

    def test_the_node_s_mounts_stay_in_its_namespace(self) -> None:
        argv = holder_command(SITE, NodeLayout(Path("/state/node")))
        assert argv[:2] == ["nsenter", f"--net=/run/netns/{SITE.netns}"]
        assert "--propagation=slave" in argv  # the host's mounts seen, none of the node's shown to the host
        assert "mount --bind /state/node/private/run /run" in argv[-1]

    def test_kube_router_enforces_policies_and_leaves_routes_and_services_to_the_node(self) -> None:
        layout = NodeLayout(Path("/state/node"))
        argv = daemon_commands(SITE, layout, Path("/kube"), Path("/addons"))["kube-router"]
        assert argv[0] == "/addons/kube-router"
        assert {"--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--enable-cni=false"} <= set(
            argv
        )
        assert f"--kubeconfig={layout.config('kube-router.kubeconfig')}" in argv


# ------------------------------------------------------------------------------------------- a real node


def busybox_pod(name: str, image: str, script: str, memory: str = "64Mi", **labels: str) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", script],
        "resources": {"limits": {"cpu": "250m", "memory": memory}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1},
    }


WEB = "mkdir -p /www && echo hello-from-a-pod > /www/index.html && echo serving && exec httpd -f -p 8080 -h /www"


@pytest.mark.integration
def test_up_starts_a_node_where_a_pod_runs_under_the_kubelet_s_limits(kube: Cluster, busybox: str) -> None:
    node = json.loads(kube.run("get", "node", NODE_NAME, "-o", "json"))
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.")
    kube.apply(busybox_pod("web", busybox, WEB, app="web"))
    kube.run("wait", "--for=condition=Ready", "pod/web", "--timeout=60s")
    status = kube.pod("web")["status"]
    assert status["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert status["podIP"].startswith(POD_CIDR.rsplit(".", 1)[0])
    # The kernel's limit, as the kubelet wrote it into the container's cgroup.
    limit = kube.run("exec", "web", "--", "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert int(limit) == 64 * 2**20
    assert "serving" in kube.run("logs", "web")
    # The same cgroups from the host, where the drills read a container's memory, CPU and processes.
    site, uid, container_id = (
        NodeSite.of(kube.state_dir),
        kube.pod("web")["metadata"]["uid"],
        status["containerStatuses"][0]["containerID"],
    )
    cgroups = site.container_cgroups(uid, container_id)
    assert int((cgroups["memory"] / "memory.limit_in_bytes").read_text()) == 64 * 2**20
    cpu = next(cgroup for name, cgroup in cgroups.items() if "cpu" in name.split(","))
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == int((cpu / "cpu.cfs_period_us").read_text()) // 4  # 250m
    (server,) = site.container_pids(uid, container_id)
    assert Path(f"/proc/{server}/cmdline").read_bytes().split(b"\0")[0] == b"httpd"


@pytest.mark.integration
def test_port_forward_and_services_reach_the_pod(kube: Cluster, busybox: str) -> None:
    kube.apply(
        busybox_pod("web", busybox, WEB, app="web"),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
    )  # fmt: skip
    kube.run("wait", "--for=condition=Ready", "pod/web", "--timeout=60s")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    forward = subprocess.Popen(
        [kube.kubectl, "port-forward", "pod/web", f"{port}:8080"], env=kube.env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert forward.stdout is not None and "Forwarding from" in forward.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            assert answer.read() == b"hello-from-a-pod\n"
    finally:
        forward.terminate()
        forward.wait()
    # From another pod: the Service's ClusterIP (kube-proxy's rules) and the apiserver's `kubernetes` Service.
    calls = (
        'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 5 $WEB_SERVICE_HOST 80; '
        'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 5 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT'
    )
    kube.apply(busybox_pod("caller", busybox, calls))
    wait_for(lambda: kube.pod("caller")["status"].get("phase") == "Succeeded", 60, "the caller pod to finish")
    said = kube.run("logs", "caller")
    assert "hello-from-a-pod" in said
    assert "Client sent an HTTP request to an HTTPS server" in said  # the apiserver, through its Service


def reaches(kube: Cluster, namespace: str, pod: str, address: str, port: int) -> bool:
    """Whether `pod` gets the web page of `address`:`port` (busybox's nc: a refused connection prints nothing)."""
    call = f'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 3 {address} {port}'
    return "hello-from-a-pod" in kube.run("exec", "-n", namespace, pod, "--", "sh", "-c", call, check=False)


@pytest.mark.integration
def test_a_network_policy_open_to_the_gateway_alone_refuses_the_pods_beside_it(kube: Cluster, busybox: str) -> None:
    """The NetworkPolicy the operator renders with networkPolicy.inferenceFrom gateway, enforced on the node by
    kube-router: the Gateway's Envoy pods (labelled as Envoy Gateway labels them, in its namespace) reach http, a pod
    beside the service is refused on http and grpc at its first packet, so no request body of its reaches Triton;
    the node itself (the kubelet's probes) still reaches the pod. Without the policy the same pod is answered."""
    from inferop_operator.builders import Routing, Service, build_network_policy, envoy_pod_labels
    from inferop_operator.plan import plan_service
    from inferop_operator.spec import ENVOY_GATEWAY_NAMESPACE, GatewayRef, parse_spec
    from tests.specs import raw_spec

    spec = parse_spec(raw_spec(networkPolicy={"enabled": True, "inferenceFrom": "gateway"}))
    gateway = GatewayRef(name="inference", namespace="models")
    service = Service("web", "default", "uid", spec, plan_service(spec), "unused", routing=Routing(gateway=gateway))
    policy = build_network_policy(service)
    del policy["metadata"]["ownerReferences"]  # no InferenceService owns it here: the garbage collector would take it
    # Triton's http and grpc ports, each a web server here
    serve = WEB.replace("exec httpd -f -p 8080", "httpd -p 8001 -h /www && exec httpd -f -p 8000")
    server = busybox_pod("server", busybox, serve, **policy["spec"]["podSelector"]["matchLabels"])
    envoy = busybox_pod(
        "envoy",
        busybox,
        "exec sleep 600",
        **envoy_pod_labels("inference", "models"),
    )
    envoy["metadata"]["namespace"] = ENVOY_GATEWAY_NAMESPACE
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ENVOY_GATEWAY_NAMESPACE}}
    kube.apply(namespace, server, envoy, busybox_pod("beside", busybox, "exec sleep 600"))
    try:
        kube.run("wait", "--for=condition=Ready", "pod/server", "pod/beside", "--timeout=60s")
        kube.run("wait", "--for=condition=Ready", "pod/envoy", "-n", ENVOY_GATEWAY_NAMESPACE, "--timeout=60s")
        address = kube.pod("server")["status"]["podIP"]
        assert reaches(kube, "default", "beside", address, 8000) and reaches(kube, "default", "beside", address, 8001)
        kube.apply(policy)
        wait_for(lambda: not reaches(kube, "default", "beside", address, 8000), 30, "kube-router to apply the policy")
        assert reaches(kube, ENVOY_GATEWAY_NAMESPACE, "envoy", address, 8000)
        assert not reaches(kube, "default", "beside", address, 8001)
        assert not reaches(kube, ENVOY_GATEWAY_NAMESPACE, "envoy", address, 8001)  # the gateway routes http only
        page = f"import urllib.request; print(urllib.request.urlopen('http://{address}:8000/', timeout=5).read())"
        assert "hello-from-a-pod" in kube.run_in_node(sys.executable, "-c", page)
    finally:
        kube.run("delete", "networkpolicy", "web", "--ignore-not-found", check=False)
        kube.run("delete", "namespace", ENVOY_GATEWAY_NAMESPACE, "--wait=false", check=False)


@pytest.mark.integration
def test_a_pod_over_its_memory_limit_is_oom_killed_by_the_kernel(kube: Cluster, busybox: str) -> None:
    kube.apply(busybox_pod("hungry", busybox, "head -c 200000000 /dev/zero | tail -c 199999999 >/dev/null"))
    terminated = wait_for(
        lambda: (kube.pod("hungry")["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("terminated"),
        60,
        "the hungry pod to end",
    )
    assert terminated["reason"] == "OOMKilled", terminated


@pytest.mark.integration
def test_an_exported_model_serves_on_the_node_as_the_operator_renders_it(
    kube: Cluster, operator: Path, tmp_path: Path, measured: Callable[[str], None]
) -> None:
    """The README's path on the local cluster: export, the CRD, the operator, apply the manifest; the pod runs the
    Deployment the operator rendered in the local Triton image, and answers through `kubectl port-forward` as
    `inferop serve` answers on the same model."""
    from inferop.serving.tritonserver import free_port

    repo, manifest = tmp_path / "model_repo", tmp_path / "conv-net.yaml"
    export = subprocess.run([*INFEROP, "export", "conv_net", "--repo", str(repo), "--manifest", str(manifest)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert export.returncode == 0, export.stderr
    applied = time.monotonic()
    kube.run("apply", "-f", str(manifest))
    try:
        ready = kube.run("wait", "--for=condition=Ready", "infsvc/conv-net", "--timeout=120s", check=False, timeout=130)
        assert "condition met" in ready, kube.run("describe", "infsvc,pods", check=False)
        measured(f"conv-net Ready {time.monotonic() - applied:.1f} s after kubectl apply")
        (pod,) = json.loads(kube.run("get", "pods", "-l", "app.kubernetes.io/instance=conv-net", "-o", "json"))["items"]
        (triton,) = pod["status"]["containerStatuses"]
        assert triton["containerID"].startswith("containerd://") and triton["ready"]
        assert triton["image"] == kube.env["INFEROP_TRITON_IMAGE"]
        port = free_port()
        forward = subprocess.Popen([kube.kubectl, "port-forward", "service/conv-net", f"{port}:8000"], env=kube.env,
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert forward.stdout is not None and "Forwarding from" in forward.stdout.readline()
            boards = np.random.default_rng(7).integers(-1, 2, size=(4, 1, 8, 7)).astype(np.float32)
            on_the_node = answers(f"127.0.0.1:{port}", boards)
        finally:
            forward.terminate()
            forward.wait()
        with serving(repo) as url:
            locally = answers(url, boards)
        for name in ("policy", "value"):
            np.testing.assert_allclose(on_the_node[name], locally[name], rtol=1e-6, atol=1e-7)
    finally:
        kube.run("delete", "-f", str(manifest), "--wait=true", check=False, timeout=DELETE_SECONDS)


@pytest.mark.integration
def test_an_image_pipeline_serves_photographs_on_the_node_as_in_process(
    kube: Cluster, operator: Path, tmp_path: Path, measured: Callable[[str], None]
) -> None:
    """Inception V3 exported with --pipeline image and applied as it is: one Triton pod runs the ensemble, its stages
    (the image's backend inferop_pipeline) and the model; photographs sent as JPEG and PNG bytes get the top labels
    that decoding, the model and top-k in process give, and bytes that are no image a 400 that says so; each stage's
    process runs one thread in every math library (the model, one instance, the pod's CPUs)."""
    import onnxruntime as ort
    from tritonclient.utils import InferenceServerException

    from inferop.serving.tritonserver import free_port
    from inferop_core.threads import THREAD_ENV
    from inferop_core.tritonconfig import PipelineConfig
    from inferop_export.pipeline import ask, encodings, photographs
    from tests.helpers import image_classifier, pipeline_in_process, python_stubs

    repo, manifest = tmp_path / "model_repo", tmp_path / "inception-v3.yaml"
    export = subprocess.run(
        [*INFEROP, "export", "inception_v3", "--pipeline", "image", "--instances", "1", "--repo", str(repo),
         "--manifest", str(manifest)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    applied = time.monotonic()
    kube.run("apply", "-f", str(manifest))
    try:
        ready = kube.run("wait", "--for=condition=Ready", "infsvc/inception-v3", "--timeout=240s", check=False,
                         timeout=250)  # fmt: skip
        assert "condition met" in ready, kube.run("describe", "infsvc,pods", check=False)
        measured(f"inception-v3 pipeline Ready {time.monotonic() - applied:.1f} s after kubectl apply")
        model = repo / "inception_v3_model"
        reference = {
            "config": PipelineConfig(name="inception_v3", model=image_classifier()),
            "session": ort.InferenceSession(str(model / "1" / "model.onnx"), providers=["CPUExecutionProvider"]),
            "labels": (model / "labels.txt").read_text().splitlines(),
        }
        port = free_port()
        forward = subprocess.Popen([kube.kubectl, "port-forward", "service/inception-v3", f"{port}:8000"],
                                   env=kube.env, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert forward.stdout is not None and "Forwarding from" in forward.stdout.readline()
            url = f"127.0.0.1:{port}"
            for name, photo in photographs().items():
                for encoding in ("jpeg75x1", "png"):
                    data = encodings(photo)[encoding]
                    labels, probabilities = ask(url, "inception_v3", data)
                    expected = pipeline_in_process(reference, data)
                    assert labels == expected[0], (name, encoding)
                    np.testing.assert_allclose(probabilities, expected[1], rtol=1e-3, atol=1e-6)
            with pytest.raises(InferenceServerException) as refused:
                ask(url, "inception_v3", b"%PDF-1.7 a document")
            assert refused.value.status() == "400" and "not a JPEG or PNG image" in refused.value.message()
        finally:
            forward.terminate()
            forward.wait()
        # Each stage's process started its math libraries with one thread, the model's with the container's count.
        deployment = json.loads(kube.run("get", "deployment", "inception-v3", "-o", "json"))
        container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "triton")
        variables = {e["name"]: e["value"] for e in container["env"] if e["name"] in THREAD_ENV}
        if (os.cpu_count() or 1) > 1:  # one instance on the pod's CPUs: the model's count is not the stages' 1
            assert variables != dict.fromkeys(THREAD_ENV, "1"), variables
        for member in ("inception_v3_pre", "inception_v3_post", "inception_v3_model"):
            stubs = python_stubs(member)
            wanted = variables if member.endswith("_model") else dict.fromkeys(THREAD_ENV, "1")
            assert stubs and all(stub.variables == wanted for stub in stubs.values()), (member, stubs, wanted)
        measured(f"thread variables on the node: the stages' 1, the model's {variables}")
    finally:
        kube.run("delete", "-f", str(manifest), "--wait=true", check=False, timeout=DELETE_SECONDS)


@pytest.mark.parametrize(
    ("model", "changes", "reason", "said"),
    [
        # The image is the init container's too, which the kubelet starts first.
        ("conv_net", {"runtime": {"image": "inferop.local/no-such-image:1"}}, "ImagePullFailed",
         'container layout-model of pod bad-.* cannot pull image "inferop.local/no-such-image:1"'),
        # An image without tritonserver (the operator's: its shell lays the model out, then `exec tritonserver`
        # fails): the server's container exits at each start.
        ("conv_net", {"runtime": {"image": OPERATOR_IMAGE}}, "CrashLoopBackOff",
         "container triton of pod bad-.* keeps crashing .*exited with code 127"),
        # A manifest that understates Inception V3 (1 MiB of weights, a server of 1 MiB): the plan's limit holds
        # the estimate, the kernel kills the server that loads the real 91 MiB of weights.
        ("inception_v3", {"runtime": {"memoryOverhead": "1Mi"},
                          "model.profile": {"weightBytes": 2**20, "activationBytesPerSample": 1024}},
         "OOMKilled", "container triton of pod bad-.* was OOM-killed at its memory limit of [0-9.]+Mi, above the "
         "memory model's estimate"),
    ],
    ids=["missing-image", "no-server-in-the-image", "memory-below-need"],
)  # fmt: skip
@pytest.mark.integration
def test_the_kubelet_s_reasons_reach_the_status_with_the_fix(
    kube: Cluster, operator: Path, model_repo: ExportedRepo, model: str, changes: dict[str, Any], reason: str,
    said: str,
) -> None:  # fmt: skip
    if changes.get("runtime", {}).get("image") == OPERATOR_IMAGE:
        values = yaml.safe_load(Path(kube.env["INFEROP_CHART_VALUES"]).read_text())
        changes = {"runtime": {"image": f"{values['image']['repository']}:{values['image']['tag']}"}}
    kube.apply(one_cpu("bad", model_repo, model, changes))
    try:

        def pods_healthy() -> dict[str, Any] | None:
            found = json.loads(kube.run("get", "infsvc", "bad", "-o", "json"))
            conditions = (found.get("status") or {}).get("conditions") or []
            condition = next((c for c in conditions if c["type"] == "PodsHealthy"), None)
            return condition if condition and condition["status"] == "False" else None

        condition = wait_for(pods_healthy, 120, f"PodsHealthy False ({reason})", interval=1)
        assert condition["reason"] == reason, condition
        assert re.search(said, condition["message"]), condition
    finally:
        kube.run("delete", "infsvc", "bad", "--wait=true", check=False, timeout=DELETE_SECONDS)


@pytest.mark.integration
def test_helm_install_runs_the_operator_as_a_pod_that_serves_a_model(
    kube: Cluster, exported_tiny: ExportedRepo
) -> None:
    """The chart with the node's images: the operator runs as a pod under the chart's RBAC and security context,
    reaches the apiserver through the `kubernetes` Service, and reconciles an InferenceService into a Triton pod
    that answers."""
    namespace = "inferop-system"
    helm = [str(tools.helm()), "--kubeconfig", kube.env["KUBECONFIG"]]
    install = [*helm, "install", "inferop", str(repo_root() / "charts" / "inferop"), "--namespace", namespace,
               "--create-namespace", "-f", kube.env["INFEROP_CHART_VALUES"], "--wait", "--timeout", "120s"]  # fmt: skip
    installed = subprocess.run(install, capture_output=True, text=True, check=False, timeout=150)
    try:
        assert installed.returncode == 0, installed.stderr + kube.run("describe", "pods", "-n", namespace, check=False)
        (operator,) = json.loads(kube.run("get", "pods", "-n", namespace, "-o", "json"))["items"]
        (container,) = operator["status"]["containerStatuses"]
        assert container["ready"] and container["image"].startswith("inferop.local/operator:")
        manifest = one_cpu("tiny", exported_tiny, "conv_net")
        kube.apply(manifest)
        ready = kube.run("wait", "--for=condition=Ready", "infsvc/tiny", "--timeout=120s", check=False, timeout=130)
        assert "condition met" in ready, kube.run("logs", "-n", namespace, "deploy/inferop", check=False)
    finally:
        kube.run("delete", "infsvc", "--all", "--wait=true", check=False, timeout=DELETE_SECONDS)
        subprocess.run([*helm, "uninstall", "inferop", "--namespace", namespace, "--wait"], capture_output=True)


# Callers of a pod, run in the node's network namespace (pod addresses are routed there only): an open loop at
# RATE requests/s for SECONDS, each waiting at most TIMEOUT; prints when it began and every outcome.
CALLERS = """
import json, sys
import numpy as np
from inferop.openloop import run_open_loop
url, model, dims, rate, seconds, timeout = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), *map(float, sys.argv[4:])
board = np.zeros((1, *dims), dtype=np.float32)
result = run_open_loop(url, model, board, rate, seconds, timeout=timeout, drain=timeout)
print(json.dumps({"started_at": result.started_at,
                  "outcomes": [[o.sent_at, o.finished_at, o.kind] for o in result.outcomes]}))
"""


@pytest.mark.integration
def test_a_stalled_model_is_restarted_by_the_kubelet_running_the_rendered_probe(
    kube: Cluster, operator: Path, model_repo: ExportedRepo, measured: Callable[[str], None]
) -> None:
    """The hang drill's fault on a real pod: every execution blocks from a moment on (the fault lives in the
    process, as a deadlock does). The kubelet runs the operator's exec probe, restarts the container, and callers
    get answers again with nobody acting."""
    stall_file = "/tmp/inferop-stall"  # the pod's /tmp, an emptyDir: the restarted server sees it too, and serves
    changes = {"runtime": {"env": [{"name": "INFEROP_FAULT_STALL_FILE", "value": stall_file}]},
               "timeouts": {"requestSeconds": 2}}  # fmt: skip
    manifest = one_cpu("stall", model_repo, "conv_net", changes)
    kube.apply(manifest)
    try:
        pod = kube.ready_pod("stall")
        name, address = pod["metadata"]["name"], pod["status"]["podIP"]
        dims = manifest["spec"]["model"]["inputs"][0]["dims"]
        callers = subprocess.Popen(
            NodeSite.of(kube.state_dir).in_network(sys.executable, "-c", CALLERS,
                                                  f"{address}:8000", "conv_net", json.dumps(dims), "10", "60", "5"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(8)  # healthy traffic first, as in the hang drill
        kube.run("exec", name, "-c", "triton", "--", "touch", stall_file)
        stalled_at = time.monotonic()
        out, err = callers.communicate(timeout=120)
        assert callers.returncode == 0, err
        run = json.loads(out)
        container = kube.pod(name)["status"]["containerStatuses"][0]
        events = kube.run("get", "events", "--field-selector", f"involvedObject.name={name}")
    finally:
        kube.run("delete", "infsvc", "stall", "--wait=false", check=False)  # the fixture waits for its pods
    assert container["restartCount"] >= 1, container
    assert "Liveness probe failed" in events and "failed liveness probe, will be restarted" in events, events
    outcomes = [
        (run["started_at"] + sent, run["started_at"] + finished, kind) for sent, finished, kind in run["outcomes"]
    ]
    failed = [finished for sent, finished, kind in outcomes if kind != "ok" and sent >= stalled_at]
    assert failed, "the stall failed no call"
    last = max(sent for sent, _, _ in outcomes)
    tail = [kind for sent, _, kind in outcomes if sent > last - 10]
    assert tail and set(tail) == {"ok"}, f"the last 10 s of calls: {Counter(tail)}"
    first_good = min(finished for _, finished, kind in outcomes if kind == "ok" and finished > min(failed))
    measured(
        f"stalled conv net: restarted {container['restartCount']} time(s) by the kubelet, first good answer "
        f"{first_good - stalled_at:.1f} s after the stall, {Counter(kind for _, _, kind in outcomes)}"
    )


def liveness_probes(kube: Cluster, pod: str) -> Counter[str]:
    """How many times the kubelet has run `pod`'s liveness probe, by result, from its own probe metrics."""
    return probe_runs(kube.run("get", "--raw", f"/api/v1/nodes/{NODE_NAME}/proxy/metrics/probes"), pod)


@pytest.mark.integration
def test_the_kubelet_leaves_an_overloaded_model_alone(
    kube: Cluster, operator: Path, model_repo: ExportedRepo, measured: Callable[[str], None]
) -> None:
    """Heavy healthy load is no stall: the conv net on a quarter of a CPU, offered more than it serves, its queue
    full and requests timing out of it, completes executions all along; every run of the rendered exec probe that
    the kubelet makes passes, and it restarts nothing."""
    manifest = one_cpu("busy", model_repo, "conv_net", {"timeouts": {"requestSeconds": 4}})
    for bound in ("requests", "limits"):
        manifest["spec"]["resources"][bound]["cpu"] = "250m"
    kube.apply(manifest)
    try:
        pod = kube.ready_pod("busy")
        name, address = pod["metadata"]["name"], pod["status"]["podIP"]
        (triton,) = (c for c in pod["spec"]["containers"] if c["name"] == "triton")
        dims = manifest["spec"]["model"]["inputs"][0]["dims"]
        before = liveness_probes(kube, name)
        # 1,000 arrivals a second: several times what a quarter CPU answers, within the callers' file limit.
        callers = subprocess.run(
            NodeSite.of(kube.state_dir).in_network(sys.executable, "-c", CALLERS,
                                                  f"{address}:8000", "conv_net", json.dumps(dims), "1000", "15", "10"),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert callers.returncode == 0, callers.stderr
        after = liveness_probes(kube, name)
        container = kube.pod(name)["status"]["containerStatuses"][0]
        events = kube.run("get", "events", "--field-selector", f"involvedObject.name={name}")
    finally:
        kube.run("delete", "infsvc", "busy", "--wait=false", check=False)  # the fixture waits for its pods
    kinds = Counter(kind for _, _, kind in json.loads(callers.stdout)["outcomes"])
    runs = after - before
    assert kinds["rejected"] + kinds["timed_out"] > 0, f"not overloaded: {kinds}"
    assert runs["successful"] >= 15 // triton["livenessProbe"]["periodSeconds"] - 1, runs
    assert set(runs) == {"successful"}, runs
    assert container["restartCount"] == 0 and "Liveness probe failed" not in events, events
    measured(f"overloaded conv net at 250m: {dict(kinds)}; the kubelet's liveness probe runs {dict(runs)}, 0 restarts")


def answers(url: str, boards: np.ndarray) -> dict[str, np.ndarray]:
    """The conv net's outputs for `boards` from the Triton at `url` (HTTP, binary tensors)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=30)
    try:
        request = httpclient.InferInput("board", list(boards.shape), "FP32")
        request.set_data_from_numpy(boards, binary_data=True)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in ("policy", "value")]
        result = client.infer("conv_net", [request], outputs=outputs)
        return {name: result.as_numpy(name) for name in ("policy", "value")}
    finally:
        client.close()


@pytest.mark.integration
def test_down_leaves_no_process_mount_namespace_link_cgroup_or_rule(
    cluster: tuple[Cluster, str, dict[str, Any]],
) -> None:
    kube, _, before = cluster
    assert traces(kube.state_dir)["netns"] and traces(kube.state_dir)["cgroups"]  # there while it runs
    recorded = Node(Layout(kube.state_dir)).recorded()
    assert recorded is not None
    pids = {process["pid"] for process in recorded["processes"].values()}
    down = cli("down", "--state-dir", str(kube.state_dir))
    assert down.returncode == 0, down.stderr
    assert traces(kube.state_dir) == before
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert not kube.state_dir.exists()


@pytest.mark.integration
def test_a_start_that_fails_midway_stops_what_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node failing once the link and the control plane run (here: its start raises, as a containerd that never
    answers would): nothing of either is left, and the error reaches the caller."""
    state_dir = tmp_path / "cluster"
    plane = ControlPlane(state_dir, release=KUBERNETES_1_37, address=NodeSite.of(state_dir).host_address)
    before = traces(state_dir)
    running: dict[str, int] = {}

    def fails(self: Node, server: str, kubeconfig_path: Path, timeout: float = 120.0) -> dict[str, float]:
        running.update(plane.pids())
        raise NodeError("containerd did not answer")

    monkeypatch.setattr(Node, "up", fails)
    with pytest.raises(NodeError, match="containerd did not answer"):
        start_with_node(plane, timeout=60)
    assert set(running) >= {"etcd", "kube-apiserver"}  # it had started them
    assert not [pid for pid in running.values() if Path(f"/proc/{pid}").exists()]
    assert traces(state_dir) == before


@pytest.mark.integration
def test_a_machine_without_what_the_node_needs_is_told_what_is_missing_and_nothing_starts(tmp_path: Path) -> None:
    state_dir = tmp_path / "cluster"
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("nsenter", "unshare", "mount", "openssl"):  # `ip` and `iptables` left out
        (tools / name).symlink_to(subprocess.run(["which", name], capture_output=True, text=True).stdout.strip())
    up = cli("up", "--state-dir", str(state_dir), env={**os.environ, "PATH": str(tools)})
    assert up.returncode == 1
    assert "the `ip` command (Debian package iproute2)" in up.stderr
    assert "the `iptables` command (Debian package iptables)" in up.stderr
    assert not (Path("/run/netns") / NodeSite.of(state_dir).netns).exists()
    assert not (state_dir / "state.json").exists()


class TestLocalImages:
    def test_triton_is_laid_out_as_nvidia_s_images_with_an_onnxruntime_backend(self, tmp_path: Path) -> None:
        (tmp_path / "onnxruntime" / "onnxruntime").mkdir(parents=True)
        spec = triton_image(tmp_path / "files", tmp_path / "onnxruntime")
        assert (
            spec.files["usr/local/lib/python3.11/dist-packages/onnxruntime"] == tmp_path / "onnxruntime" / "onnxruntime"
        )
        assert spec.files[""] == tmp_path / "files" / "rootfs-bookworm"
        assert {"opt/tritonserver/bin/tritonserver", "opt/tritonserver/lib"} <= set(spec.files)
        # Triton maps platform onnxruntime_onnx to the backend `onnxruntime`: here, a Python-based one.
        assert spec.files["opt/tritonserver/backends/onnxruntime/model.py"] == PYTHON_MODEL
        assert spec.files["opt/tritonserver/backends/python/triton_python_backend_stub"].parent.name == "3.11"
        assert "PATH=/opt/tritonserver/bin:" in " ".join(spec.env)

    def test_the_operator_runs_unprivileged_from_its_own_packages(self, tmp_path: Path) -> None:
        spec = operator_image(tmp_path / "files", tmp_path / "site")
        assert spec.entrypoint == ("inferop", "operator")
        assert spec.user == "10001:10001"  # numeric: the kubelet checks runAsNonRoot without /etc/passwd
        assert spec.files["opt/inferop/bin/inferop"] == tmp_path / "site" / "inferop"
        assert "PYTHONDONTWRITEBYTECODE=1" in spec.env  # the chart's root filesystem is read-only
