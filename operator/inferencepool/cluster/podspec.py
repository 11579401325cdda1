"""Pure translation of a Pod (as the API server returns it, camelCase dict) into local processes to run.

A container runs locally when its image repository ends in `fake-engine` or `router`: its command is mapped
onto this package (`vllm ...` -> `python -m inferencepool fake-engine ...`, `inferencepool ...` ->
`python -m inferencepool ...`), `--host` is rewritten to the pod IP (a 127.x address, so every pod can use the
same port), and its environment is resolved the way a kubelet would (literal values with $(VAR) expansion,
downward-API fields, ConfigMap and Secret keys, envFrom). Volumes are materialised the way a kubelet mounts
them, but under a per-pod local folder instead of the container's own filesystem (two pods may mount the same
path): ConfigMap and Secret volumes become files, other volumes empty folders, and every argument or env
value that names a path under a mountPath is rewritten to the local folder. Pods with no such container are
simulated by kwok alone.

In the engine mode (`engine` given to plan_pod: `cluster up --engine vllm`), containers of the operator's vLLM
image run too, as a real `vllm serve` on this machine's CPUs: vllm_cpu.translate names every change.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from inferencepool.cluster import vllm_cpu

LOCAL_IMAGE_SUFFIXES = ("fake-engine", "router")
# ENTRYPOINT and CMD of images/<component>/Dockerfile, for containers that leave `command` or `args` unset.
IMAGE_DEFAULTS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fake-engine": (("vllm", "serve"), ()),
    "router": (("inferencepool",), ("router", "--host", "0.0.0.0", "--port", "8000")),
    # vLLM's own image (docker/Dockerfile, target vllm-openai)
    vllm_cpu.IMAGE_SUFFIX: (("vllm", "serve"), ()),
}
DEFAULT_GRACE_SECONDS = 30
# Variables a kubelet would set that must not leak in: with them, clients try in-cluster config, which has no
# service-account token here; the processes use KUBECONFIG instead.
_DROPPED_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
# The Service table the runner keeps (there is no cluster DNS here); engine_sim/lmcache_p2p.py reads it.
LOCAL_HOSTS_ENV = "INFERENCEPOOL_LOCAL_HOSTS"
_PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "VIRTUAL_ENV", "PYTHONPATH", LOCAL_HOSTS_ENV)
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class PlanError(ValueError):
    """The pod cannot be run locally; the message names the container and the field."""


class ObjectLookup(Protocol):
    """ConfigMap and Secret data (Secret values base64-decoded); None when the object is missing."""

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None: ...

    def secret(self, namespace: str, name: str) -> Mapping[str, str] | None: ...


@dataclass(frozen=True)
class Probe:
    kind: Literal["http", "tcp"]
    port: int
    path: str = "/"


@dataclass(frozen=True)
class VolumeFiles:
    """A pod volume as local files: `files` maps paths relative to `local_dir` to their content."""

    name: str
    local_dir: str
    files: Mapping[str, str]


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    probe: Probe
    volumes: tuple[VolumeFiles, ...] = ()
    # What the engine mode changed from the container the operator wrote, for the pod's log.
    changes: tuple[vllm_cpu.Change, ...] = ()


@dataclass(frozen=True)
class PodPlan:
    namespace: str
    name: str
    uid: str
    ip: str
    grace_seconds: int
    restart: bool
    containers: tuple[ContainerPlan, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def image_repository(image: str) -> str:
    """`registry:5000/org/name:tag@sha256:...` -> `registry:5000/org/name`."""
    name = image.split("@", 1)[0]
    colon, slash = name.rfind(":"), name.rfind("/")
    return name[:colon] if colon > slash else name


def local_image_kind(image: str, real_engine: bool = False) -> str | None:
    """Which of the runnable images this is; vLLM's own only in the engine mode."""
    repository = image_repository(image)
    suffixes = (*LOCAL_IMAGE_SUFFIXES, vllm_cpu.IMAGE_SUFFIX) if real_engine else LOCAL_IMAGE_SUFFIXES
    return next((suffix for suffix in suffixes if repository.endswith(suffix)), None)


def runs_locally(pod: Mapping[str, Any], real_engine: bool = False) -> bool:
    containers = pod.get("spec", {}).get("containers", [])
    return any(local_image_kind(c.get("image", ""), real_engine) for c in containers)


def expand_references(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes $(VAR) expansion: known variables are replaced, unknown ones kept, `$$` escapes a `$`."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(replace, text)


def local_command(argv: Sequence[str], python: str, container: str) -> list[str]:
    """Map the container's command line onto this package, run by `python`."""
    if not argv:
        raise PlanError(f"container {container!r}: no command and no args")
    head, rest = os.path.basename(argv[0]), list(argv[1:])
    if head == "vllm":
        return [python, "-m", "inferencepool", "fake-engine", *rest]
    if head == "inferencepool":
        return [python, "-m", "inferencepool", *rest]
    if head == "lmcache_controller":  # the fake-engine image's stand-in for LMCache's controller
        return [python, "-m", "inferencepool.engine_sim.lmcache_controller", *rest]
    if _PYTHON.fullmatch(head) and len(rest) >= 2 and rest[0] == "-m":
        if rest[1] == "inferencepool":
            return [python, "-m", "inferencepool", *rest[2:]]
        if rest[1] == "vllm.entrypoints.openai.api_server":
            return [python, "-m", "inferencepool", "fake-engine", *rest[2:]]
    raise PlanError(
        f"container {container!r}: the local pod runner runs `vllm ...`, `inferencepool ...`, "
        f"`lmcache_controller ...` or `python -m inferencepool ...`, not {' '.join(argv)!r}"
    )


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == flag and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def with_flag(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """Set `flag` to `value`, replacing `flag V` or `flag=V`, or appending it."""
    result: list[str] = []
    replaced = False
    skip_next = False
    for index, arg in enumerate(argv):
        if skip_next:
            skip_next = False
            continue
        if arg == flag and index + 1 < len(argv):
            result += [flag, value]
            replaced = skip_next = True
        elif arg.startswith(flag + "="):
            result.append(f"{flag}={value}")
            replaced = True
        else:
            result.append(arg)
    return result if replaced else [*result, flag, value]


def _container_port(container: Mapping[str, Any]) -> int | None:
    ports = [p for p in container.get("ports", []) if p.get("protocol", "TCP") == "TCP"]
    named = [p for p in ports if p.get("name") == "http"]
    chosen = (named or ports)[:1]
    return int(chosen[0]["containerPort"]) if chosen else None


def _resolve_port(value: Any, container: Mapping[str, Any], default: int) -> int:
    if value is None:
        return default
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports", []):
        if port.get("name") == value:
            return int(port["containerPort"])
    raise PlanError(f"container {container.get('name')!r}: probe port {value!r} names no container port")


def readiness_probe(container: Mapping[str, Any], port: int) -> Probe:
    probe = container.get("readinessProbe") or {}
    if "httpGet" in probe:
        http = probe["httpGet"]
        return Probe("http", _resolve_port(http.get("port"), container, port), http.get("path", "/"))
    if "tcpSocket" in probe:
        return Probe("tcp", _resolve_port(probe["tcpSocket"].get("port"), container, port))
    return Probe("tcp", port)


def _field_value(pod: Mapping[str, Any], path: str, container: str) -> str:
    metadata, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs", [])),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
    }
    if path in simple:
        return str(simple[path] or "")
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return str(metadata.get(match.group(1), {}).get(match.group(2), ""))
    raise PlanError(f"container {container!r}: fieldRef {path!r} is not supported")


def _key_ref(
    kind: str, ref: Mapping[str, Any], namespace: str, lookup: ObjectLookup, container: str, variable: str
) -> str | None:
    name, key, optional = ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional", False))
    data = lookup.config_map(namespace, name) if kind == "ConfigMap" else lookup.secret(namespace, name)
    if data is not None and key in data:
        return data[key]
    if optional:
        return None
    missing = (
        f"{kind} {namespace}/{name} not found"
        if data is None
        else f"{kind} {namespace}/{name} has no key {key!r}"
    )
    raise PlanError(f"container {container!r}: env {variable}: {missing}")


def resolve_env(pod: Mapping[str, Any], container: Mapping[str, Any], lookup: ObjectLookup) -> dict[str, str]:
    namespace = pod["metadata"]["namespace"]
    cname = container.get("name", "")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if field not in source:
                continue
            ref = source[field]
            data = (
                lookup.config_map(namespace, ref["name"])
                if kind == "ConfigMap"
                else lookup.secret(namespace, ref["name"])
            )
            if data is None:
                if ref.get("optional", False):
                    continue
                raise PlanError(f"container {cname!r}: envFrom: {kind} {namespace}/{ref['name']} not found")
            env.update({prefix + key: value for key, value in data.items()})
    for variable in container.get("env", []):
        name = variable["name"]
        if "valueFrom" not in variable:
            env[name] = expand_references(variable.get("value", ""), env)
            continue
        source = variable["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = _field_value(pod, source["fieldRef"]["fieldPath"], cname)
        elif "configMapKeyRef" in source:
            value = _key_ref("ConfigMap", source["configMapKeyRef"], namespace, lookup, cname, name)
        elif "secretKeyRef" in source:
            value = _key_ref("Secret", source["secretKeyRef"], namespace, lookup, cname, name)
        else:
            raise PlanError(
                f"container {cname!r}: env {name}: only fieldRef, configMapKeyRef and secretKeyRef"
            )
        if value is not None:
            env[name] = value
    return env


def _projected_files(
    data: Mapping[str, str] | None, source: Mapping[str, Any], what: str, volume: str
) -> dict[str, str] | None:
    if data is None:
        if source.get("optional", False):
            return {}
        raise PlanError(f"volume {volume!r}: {what} not found")
    items = source.get("items")
    if not items:
        return dict(data)
    files = {}
    for item in items:
        if item["key"] not in data:
            raise PlanError(f"volume {volume!r}: {what} has no key {item['key']!r}")
        files[item.get("path", item["key"])] = data[item["key"]]
    return files


def pod_volumes(pod: Mapping[str, Any], lookup: ObjectLookup, volume_root: str) -> dict[str, VolumeFiles]:
    """Every volume of the pod as files under `volume_root/<volume name>` (empty for emptyDir, PVC, ...)."""
    namespace = pod["metadata"]["namespace"]
    volumes: dict[str, VolumeFiles] = {}
    for volume in pod.get("spec", {}).get("volumes", []):
        name = volume["name"]
        files: dict[str, str] | None = {}
        if "configMap" in volume:
            source = volume["configMap"]
            data = lookup.config_map(namespace, source.get("name", ""))
            files = _projected_files(data, source, f"ConfigMap {namespace}/{source.get('name')}", name)
        elif "secret" in volume:
            source = volume["secret"]
            data = lookup.secret(namespace, source.get("secretName", ""))
            files = _projected_files(data, source, f"Secret {namespace}/{source.get('secretName')}", name)
        volumes[name] = VolumeFiles(name, os.path.join(volume_root, name), files or {})
    return volumes


def mount_table(container: Mapping[str, Any], volumes: Mapping[str, VolumeFiles]) -> list[tuple[str, str]]:
    """(mountPath, local path) pairs, longest mountPath first so nested mounts win."""
    table = []
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"])
        if volume is None:
            raise PlanError(
                f"container {container.get('name')!r}: volumeMount {mount['name']!r} has no volume"
            )
        local = os.path.join(volume.local_dir, mount["subPath"]) if mount.get("subPath") else volume.local_dir
        table.append((mount["mountPath"].rstrip("/") or "/", local))
    return sorted(table, key=lambda pair: len(pair[0]), reverse=True)


def relocate(value: str, mounts: Sequence[tuple[str, str]]) -> str:
    """A path under a mountPath, as seen inside the container, -> the same path in the local folder."""
    for mount_path, local in mounts:
        if value == mount_path or value.startswith(mount_path + "/"):
            return local + value[len(mount_path) :]
    return value


def process_env(base: Mapping[str, str], pod_env: Mapping[str, str], kubeconfig: str) -> dict[str, str]:
    env = {key: base[key] for key in _PASSED_ENV if key in base}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(pod_env)
    for key in _DROPPED_ENV:
        env.pop(key, None)
    env["KUBECONFIG"] = kubeconfig
    return env


def container_argv(container: Mapping[str, Any], kind: str) -> list[str]:
    """Kubernetes' rule: `command` replaces ENTRYPOINT (and drops CMD); `args` replaces CMD."""
    entrypoint, cmd = IMAGE_DEFAULTS[kind]
    if container.get("command"):
        return [*container["command"], *container.get("args", [])]
    return [*entrypoint, *(container["args"] if container.get("args") else cmd)]


def plan_container(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    kind: str,
    python: str,
    lookup: ObjectLookup,
    base_env: Mapping[str, str],
    kubeconfig: str,
    volumes: Mapping[str, VolumeFiles],
    engine: vllm_cpu.CpuEngine | None = None,
    cores: Sequence[int] = (),
) -> ContainerPlan:
    name = container.get("name", "")
    ip = pod["status"]["podIP"]
    mounts = mount_table(container, volumes)
    pod_env = {key: relocate(value, mounts) for key, value in resolve_env(pod, container, lookup).items()}
    argv = [relocate(expand_references(arg, pod_env), mounts) for arg in container_argv(container, kind)]
    env = process_env(base_env, pod_env, kubeconfig)
    changes: tuple[vllm_cpu.Change, ...] = ()
    if kind == vllm_cpu.IMAGE_SUFFIX:
        if engine is None:
            raise PlanError(f"container {name!r}: vLLM's image runs only in the runner's engine mode")
        try:
            command = vllm_cpu.translate(argv, env, engine, cores, ip)
        except vllm_cpu.TranslationError as error:
            raise PlanError(f"container {name!r}: {error}") from error
        argv, env, changes = list(command.argv), dict(command.env), command.changes
        local = with_flag(argv, "--host", ip)
    else:
        local = with_flag(local_command(argv, python, name), "--host", ip)
    declared = _flag_value(local, "--port")
    if declared is not None:
        if not declared.isdigit():
            raise PlanError(f"container {name!r}: --port {declared!r} is not a number")
        port = int(declared)
    else:
        container_port = _container_port(container)
        if container_port is None:
            raise PlanError(f"container {name!r}: no --port argument and no TCP containerPort")
        port = container_port
        local = with_flag(local, "--port", str(port))
    return ContainerPlan(
        name=name,
        argv=tuple(local),
        env=env,
        port=port,
        probe=readiness_probe(container, port),
        volumes=tuple(volumes[m["name"]] for m in container.get("volumeMounts", [])),
        changes=changes,
    )


def plan_pod(
    pod: Mapping[str, Any],
    python: str,
    lookup: ObjectLookup,
    base_env: Mapping[str, str],
    kubeconfig: str,
    volume_root: str,
    engine: vllm_cpu.CpuEngine | None = None,
    cores: Sequence[int] = (),
) -> PodPlan:
    """The processes a Running pod with an IP needs; `containers` is empty for a pod kwok alone simulates.

    `volume_root` is the pod's own local folder for its volumes (see the module docstring). `engine`: the
    engine mode's real vLLM, whose processes of this pod bind to `cores`.
    """
    metadata, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    ip = status.get("podIP")
    if not ip:
        raise PlanError(f"pod {metadata['namespace']}/{metadata['name']} has no pod IP yet")
    volumes = pod_volumes(pod, lookup, volume_root)
    containers = []
    for container in spec.get("containers", []):
        kind = local_image_kind(container.get("image", ""), engine is not None)
        if kind is not None:
            containers.append(
                plan_container(
                    pod, container, kind, python, lookup, base_env, kubeconfig, volumes, engine, cores
                )
            )
    grace = spec.get("terminationGracePeriodSeconds")
    return PodPlan(
        namespace=metadata["namespace"],
        name=metadata["name"],
        uid=metadata["uid"],
        ip=ip,
        grace_seconds=DEFAULT_GRACE_SECONDS if grace is None else int(grace),
        restart=spec.get("restartPolicy", "Always") != "Never",
        containers=tuple(containers),
    )


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status", {})
    return bool(status.get("podIP")) and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )


def service_hosts(
    services: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> dict[str, list[str]]:
    """What cluster DNS would answer here: `<service>.<namespace>.svc` -> the IPs of the ready pods its
    selector picks (a headless Service's answer; there is no kube-proxy for ClusterIPs on loopback)."""
    table: dict[str, list[str]] = {}
    for service in services:
        metadata = service.get("metadata", {})
        selector = service.get("spec", {}).get("selector") or {}
        if not selector:
            continue
        namespace = metadata.get("namespace", "default")
        addresses = sorted(
            pod["status"]["podIP"]
            for pod in pods
            if pod.get("metadata", {}).get("namespace") == namespace
            and not pod.get("metadata", {}).get("deletionTimestamp")
            and all((pod.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in selector.items())
            and _pod_ready(pod)
        )
        table[f"{metadata.get('name')}.{namespace}.svc"] = addresses
    return table
