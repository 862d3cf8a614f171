"""The Triton pods meet the Pod Security Standard "restricted", for every storage scheme but hostpath://.

Our API server (Kubernetes 1.20) has no PodSecurity admission, so the standard's rules are applied here, as
https://kubernetes.io/docs/concepts/security/pod-security-standards/ states them (baseline, then restricted),
to every container of the rendered pod template, init containers included. The chart's operator Deployment gets
the same check in tests/kube/test_chart.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from inferop_operator.builders import Service, build_deployment
from inferop_operator.plan import plan_service
from inferop_operator.spec import parse_spec
from tests import specs

# Baseline: capabilities a container may add; restricted: the only one it may add (after dropping ALL).
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(template: dict[str, Any]) -> list[str]:
    """Every rule of the Pod Security Standard "restricted" (baseline's included) that the pod template
    (`metadata` and `spec`) breaks, one line each; empty when it complies."""
    pod = template.get("spec") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    pod_context = pod.get("securityContext") or {}
    found = []
    # Baseline
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"{field}: host namespaces are forbidden")
    if (pod_context.get("windowsOptions") or {}).get("hostProcess"):
        found.append("pod: hostProcess is forbidden")
    for volume in pod.get("volumes") or []:
        kind = next(key for key in volume if key != "name")
        if kind == "hostPath":
            found.append(f"volume {volume['name']}: hostPath volumes are forbidden (baseline)")
        elif kind not in RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: type {kind} is not allowed")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl.get('name')} is not a safe sysctl")
    if any(
        value not in ("runtime/default", "") and not value.startswith("localhost/")
        for value in (
            v for k, v in annotations.items() if k.startswith("container.apparmor.security.beta.kubernetes.io/")
        )
    ):
        found.append("an AppArmor profile other than runtime/default or localhost/*")
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_context.get("runAsUser") == 0:
        found.append("pod: runAsUser 0")
    containers = [
        *(("init container", c) for c in pod.get("initContainers") or []),
        *(("container", c) for c in pod.get("containers") or []),
        *(("ephemeral container", c) for c in pod.get("ephemeralContainers") or []),
    ]
    for role, container in containers:
        where = f"{role} {container.get('name')}"
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{where}: privileged")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            found.append(f"{where}: hostProcess")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"{where}: hostPort {port['hostPort']}")
        if context.get("procMount") not in (None, "Default"):
            found.append(f"{where}: procMount {context['procMount']}")
        options = {**(pod_context.get("seLinuxOptions") or {}), **(context.get("seLinuxOptions") or {})}
        if options.get("type") not in SELINUX_TYPES or options.get("user") or options.get("role"):
            found.append(f"{where}: seLinuxOptions {options}")
        capabilities = context.get("capabilities") or {}
        added = set(capabilities.get("add") or [])
        if added - BASELINE_CAPABILITIES:
            found.append(f"{where}: adds capabilities {sorted(added - BASELINE_CAPABILITIES)}")
        # Restricted
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation must be false")
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{where}: capabilities must drop ALL")
        if added - {"NET_BIND_SERVICE"}:
            found.append(f"{where}: may add only NET_BIND_SERVICE, adds {sorted(added)}")
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"{where}: runAsNonRoot must be true (pod or container)")
        if context.get("runAsUser") == 0:
            found.append(f"{where}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost, is {seccomp}")
    return found


def pod_template(storage_uri: str, **sections: Any) -> dict[str, Any]:
    raw = specs.raw_spec(**sections)
    raw["model"]["storageUri"] = storage_uri
    spec = parse_spec(raw)
    service = Service(
        name="conv-net", namespace="models", uid="uid-1", spec=spec, plan=plan_service(spec), image="t", fetch_image="f"
    )
    return dict(build_deployment(service)["spec"]["template"])


class TestRestricted:
    @pytest.mark.parametrize(
        "storage_uri",
        [
            "pvc://models/conv-net",
            "pvc://models",
            "oci://ghcr.io/acme/conv-net-model:1",
            "s3://models/conv_net",
            "https://example.com/conv_net.tar.gz",
        ],
    )
    @pytest.mark.parametrize(
        "sections",
        [{}, {"runtime": {"cpuScheduling": "normal"}}, {"networkPolicy": {"enabled": True}}],
        ids=["defaults", "normal scheduling", "network policy"],
    )
    def test_pvc_and_oci_pods_comply(self, storage_uri: str, sections: dict[str, Any]) -> None:
        template = pod_template(storage_uri, **sections)
        assert len(template["spec"]["initContainers"]) == (1 if storage_uri.startswith("pvc://") else 2)
        assert restricted_violations(template) == []

    def test_hostpath_pods_break_it_with_their_hostpath_volume_and_nothing_else(self) -> None:
        """hostpath:// is for single-node development clusters (kind): it mounts a node directory, which
        "restricted" forbids, and "baseline" too. Nothing else of the pod breaks the standard."""
        template = pod_template("hostpath:///srv/models/conv-net")
        assert restricted_violations(template) == ["volume model-source: hostPath volumes are forbidden (baseline)"]

    @pytest.mark.parametrize(
        ("change", "violation"),
        [
            (lambda pod: pod["spec"].update(hostNetwork=True), "hostNetwork: host namespaces are forbidden"),
            (
                lambda pod: pod["spec"]["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
                "container triton: allowPrivilegeEscalation must be false",
            ),
            (
                lambda pod: pod["spec"]["initContainers"][0]["securityContext"]["capabilities"].update(
                    add=["SYS_ADMIN"]
                ),
                "init container layout-model: adds capabilities ['SYS_ADMIN']",
            ),
            (
                lambda pod: pod["spec"]["initContainers"][0]["securityContext"].pop("capabilities"),
                "init container layout-model: capabilities must drop ALL",
            ),
            (
                lambda pod: (
                    [c["securityContext"].pop("runAsNonRoot") for c in pod["spec"]["containers"]]
                    and pod["spec"]["securityContext"].pop("runAsNonRoot")
                ),
                "container triton: runAsNonRoot must be true (pod or container)",
            ),
            (
                lambda pod: pod["spec"]["securityContext"].pop("seccompProfile"),
                "container triton: seccompProfile must be RuntimeDefault or Localhost, is None",
            ),
            (
                lambda pod: pod["spec"]["containers"][0]["ports"][0].update(hostPort=8000),
                "container triton: hostPort 8000",
            ),
            (
                lambda pod: pod["spec"]["volumes"].append({"name": "nfs", "nfs": {"server": "x", "path": "/"}}),
                "volume nfs: type nfs is not allowed",
            ),
        ],
        ids=["host network", "escalation", "added capability", "no drop", "root", "no seccomp", "host port", "nfs"],
    )
    def test_the_check_catches_each_breach(self, change: Any, violation: str) -> None:
        template = copy.deepcopy(pod_template("pvc://models/conv-net"))
        change(template)
        assert violation in restricted_violations(template)
