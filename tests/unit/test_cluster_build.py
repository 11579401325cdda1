"""Pure parts of the control-plane build and layout: versions, cache key, go commands, stages, nodes, PKI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from inferencepool.api.labels import ANNOTATION_PROCESS_READY
from inferencepool.cluster import build, components, controlplane, pki, procs, stages
from inferencepool.cluster.paths import gomod_dir


def test_versions_come_from_the_wrapper_modules() -> None:
    versions = build.versions_from_gomod(gomod_dir())
    assert versions.kubernetes.startswith("v1.37.")
    assert versions.etcd.startswith("v3.")
    assert (gomod_dir() / "k8s-build" / "go.sum").is_file()
    assert (gomod_dir() / "etcd-build" / "go.sum").is_file()


def test_required_version_reads_both_go_mod_forms_and_names_a_missing_module() -> None:
    assert build.required_version("require k8s.io/kubernetes v1.37.2\n", "k8s.io/kubernetes") == "v1.37.2"
    block = "require (\n\tgo.etcd.io/etcd/server/v3 v3.7.3\n)\n"
    assert build.required_version(block, "go.etcd.io/etcd/server/v3") == "v3.7.3"
    with pytest.raises(build.BuildError, match=r"does not require sigs\.k8s\.io/kwok"):
        build.required_version(block, "sigs.k8s.io/kwok")


def test_cache_key_changes_with_every_input() -> None:
    versions = build.Versions(kubernetes="v1.37.2", etcd="v3.7.3")
    files = {"k8s-build/go.mod": b"a", "k8s-build/go.sum": b"b"}
    key = build.cache_key(versions, files, "go1.26.8 linux amd64")
    assert key == build.cache_key(versions, dict(files), "go1.26.8 linux amd64")
    assert key != build.cache_key(
        build.Versions(kubernetes="v1.37.3", etcd="v3.7.3"), files, "go1.26.8 linux amd64"
    )
    assert key != build.cache_key(versions, {**files, "k8s-build/go.sum": b"c"}, "go1.26.8 linux amd64")
    assert key != build.cache_key(versions, files, "go1.27.0 linux amd64")


def test_kube_binaries_are_stamped_with_their_version() -> None:
    flags = build.kube_ldflags("v1.37.2")
    assert "-X k8s.io/component-base/version.gitVersion=v1.37.2" in flags
    assert "-X k8s.io/client-go/pkg/version.gitMinor=37" in flags
    with pytest.raises(build.BuildError, match="not a Kubernetes version"):
        build.kube_ldflags("1.37")


def test_build_steps_cover_every_binary_without_cgo_dependencies(tmp_path: Path) -> None:
    steps = build.build_steps(
        build.Versions(kubernetes="v1.37.2", etcd="v3.7.3"), tmp_path / "src", tmp_path / "o"
    )
    outputs = [name for step in steps for name in step.outputs]
    assert sorted(outputs) == sorted(build.BINARIES)
    kube = steps[0]
    assert kube.cwd == tmp_path / "src" / "k8s-build"
    assert "k8s.io/kubernetes/cmd/kube-apiserver" in kube.argv
    assert any(arg.endswith("sigs.k8s.io/kwok/cmd/kwok@v0.8.0") for step in steps for arg in step.argv)
    assert any(step.env.get("GOBIN") == str(tmp_path / "o") for step in steps)


def test_go_version_parsing() -> None:
    assert build.parse_go_version("go1.26.8 linux amd64") == (1, 26)
    with pytest.raises(build.BuildError):
        build.parse_go_version("devel")


def _stage(name: str) -> dict[str, Any]:
    return next(stage for stage in stages.pod_stages() if stage["metadata"]["name"] == name)


def test_pod_stages_replace_kwoks_instant_ready_stage() -> None:
    names = [stage["metadata"]["name"] for stage in stages.pod_stages()]
    assert names == [
        "pod-start",
        "pod-ready-on-signal",
        "pod-unready-on-signal",
        "pod-steady-ready",
        "pod-steady-not-ready",
        "pod-delete",
    ]
    ready = _stage("pod-ready-on-signal")
    assert ready["spec"]["selector"]["matchAnnotations"] == {ANNOTATION_PROCESS_READY: "true"}
    # Only pod-start hands out IPs: each PodIPsWith call takes a fresh address.
    templates = {
        s["metadata"]["name"]: s["spec"]["next"].get("statusTemplate", "") for s in stages.pod_stages()
    }
    assert [name for name, text in templates.items() if "PodIPsWith" in text] == ["pod-start"]
    delete = _stage("pod-delete")
    keys = {expr["key"] for expr in delete["spec"]["selector"]["matchExpressions"]}
    assert ".metadata.deletionTimestamp" in keys
    assert f'.metadata.annotations["{ANNOTATION_PROCESS_READY}"]' in keys


def test_kwok_config_is_valid_yaml_with_node_stages_first() -> None:
    node_stage = "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata: {name: node-initialize}\n"
    documents = list(yaml.safe_load_all(stages.kwok_config_yaml(node_stage)))
    assert [d["metadata"]["name"] for d in documents][:2] == ["node-initialize", "pod-start"]


def test_nodes_get_gpus_and_disjoint_loopback_pod_ranges() -> None:
    first, second = components.node_manifest(0, 20, gpus=8), components.node_manifest(1, 20, gpus=8)
    assert first["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert first["spec"]["podCIDR"] == "127.20.0.0/24"
    assert second["spec"]["podCIDR"] == "127.20.1.0/24"
    assert first["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    with pytest.raises(ValueError, match="out of range"):
        components.node_pod_cidr(20, 256)


def test_apiserver_flags_fit_kubernetes_1_37_on_loopback(tmp_path: Path) -> None:
    config = components.ClusterConfig(1, 2, 3, 4, 5, 20)
    argv = components.component_argv("kube-apiserver", tmp_path, components.Layout(tmp_path), config, "py")
    assert "--endpoint-reconciler-type=none" in argv
    assert "--bind-address=127.0.0.1" in argv
    assert "--secure-port=3" in argv
    kwok = components.component_argv("kwok", tmp_path, components.Layout(tmp_path), config, "py")
    assert "--cidr=127.20.0.0/16" in kwok
    assert components.ClusterConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="unknown component"):
        components.component_argv("kubelet", tmp_path, components.Layout(tmp_path), config, "py")


def test_pki_has_a_serving_and_client_certificate_signed_by_the_ca(tmp_path: Path) -> None:
    generated = pki.generate(tmp_path / "pki", components.service_ip())
    assert generated.complete()
    ca = x509.load_pem_x509_certificate(generated.ca_cert.read_bytes())
    admin = x509.load_pem_x509_certificate(generated.admin_cert.read_bytes())
    admin.verify_directly_issued_by(ca)
    sans = admin.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    assert "10.96.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    usages = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
    assert b"BEGIN RSA PRIVATE KEY" in generated.admin_key.read_bytes()
    assert generated.admin_key.stat().st_mode & 0o077 == 0


def test_process_records_survive_their_starter_and_stop_by_group(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    # The child notes SIGTERM but keeps running, so only the SIGKILL after the grace period ends it.
    script = (
        "import pathlib, signal, sys, time\n"
        "marker = pathlib.Path(sys.argv[1])\n"
        "signal.signal(signal.SIGTERM, lambda *_: marker.write_text('TERM'))\n"
        "marker.write_text('ready')\n"
        "while True: time.sleep(0.05)\n"
    )
    record = procs.spawn([sys.executable, "-c", script, str(marker)], tmp_path / "p.log")
    try:
        deadline = time.monotonic() + 20
        while not marker.is_file() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert procs.is_alive(record)
        assert procs.read_record(_written(tmp_path / "rec.json", record)) == record
        # A record with the right PID but another start time is a different process.
        assert not procs.is_alive(procs.ProcessRecord(record.pid, record.start_ticks + 1, record.argv))
        procs.terminate([record], grace_seconds=3.0)
        assert not procs.is_alive(record)
        assert marker.read_text() == "TERM"
    finally:
        subprocess.run(["kill", "-9", str(record.pid)], check=False, capture_output=True)


def _written(path: Path, record: procs.ProcessRecord) -> Path:
    procs.write_atomically(path, record.to_json())
    return path


def _matches(stage: dict[str, Any], values: dict[str, str | None]) -> bool:
    """Evaluate a stage selector the way kwok does, for the operators our stages use."""
    selector = stage["spec"]["selector"]
    for key, wanted in selector.get("matchAnnotations", {}).items():
        if values[f'.metadata.annotations["{key}"]'] != wanted:
            return False
    for expression in selector.get("matchExpressions", []):
        value, operator = values[expression["key"]], expression["operator"]
        ok = {
            "In": value in expression.get("values", []),
            "NotIn": value not in expression.get("values", []),
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }[operator]
        if not ok:
            return False
    return True


@pytest.mark.parametrize("deleted", [False, True])
@pytest.mark.parametrize("phase", ["Pending", "Running"])
@pytest.mark.parametrize("ready", ["True", "False", None])
@pytest.mark.parametrize("annotation", ["true", "false", None])
def test_pod_stages_never_overlap(
    deleted: bool, phase: str, ready: str | None, annotation: str | None
) -> None:
    """kwok plays a random one of the matching stages, so at most one may match any pod state."""
    values = {
        ".metadata.deletionTimestamp": "2026-01-01T00:00:00Z" if deleted else None,
        ".status.phase": phase,
        '.status.conditions.[] | select( .type == "Ready" ) | .status': ready,
        f'.metadata.annotations["{ANNOTATION_PROCESS_READY}"]': annotation,
    }
    matching = [stage["metadata"]["name"] for stage in stages.pod_stages() if _matches(stage, values)]
    if deleted:
        assert matching == ([] if annotation == "true" else ["pod-delete"])
    elif phase == "Pending":
        assert matching == ["pod-start"]
    else:
        # Every settled Running state has exactly one stage, so a restarted kwok relearns every pod IP.
        assert len(matching) == 1, matching
        if annotation == "true" and ready != "True":
            assert matching == ["pod-ready-on-signal"]
        if annotation != "true" and ready == "True":
            assert matching == ["pod-unready-on-signal"]


def test_pod_ranges_are_leased_one_per_running_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controlplane, "_leases_dir", lambda: tmp_path / "leases")
    first, second = components.Layout(tmp_path / "a"), components.Layout(tmp_path / "b")
    octet = controlplane.claim_pod_octet(first, preferred=None)
    # `first` counts as running while one of its recorded processes is alive (this test's own process).
    me = procs.ProcessRecord(os.getpid(), procs.start_ticks(os.getpid()) or 0, ("pytest",))
    procs.write_atomically(first.pid_file("etcd"), me.to_json())
    assert controlplane.claim_pod_octet(second, preferred=None) != octet
    with pytest.raises(controlplane.ClusterError, match=r"in use by the running cluster in .*/a"):
        controlplane.claim_pod_octet(second, preferred=octet)
    assert controlplane.claim_pod_octet(first, preferred=octet) == octet
    # Once `first` stops, its range is free again.
    first.pid_file("etcd").unlink()
    assert controlplane.claim_pod_octet(second, preferred=octet) == octet


def test_a_cluster_still_starting_keeps_its_pod_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controlplane, "_leases_dir", lambda: tmp_path / "leases")
    first, second = components.Layout(tmp_path / "a"), components.Layout(tmp_path / "b")
    # `up` on `first` holds its lock from the claim until its components run; none is running yet.
    with controlplane._locked(first.lock):
        octet = controlplane.claim_pod_octet(first, preferred=None)
        assert controlplane.claim_pod_octet(second, preferred=None) != octet
    assert controlplane.claim_pod_octet(second, preferred=octet) == octet
