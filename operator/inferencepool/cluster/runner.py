"""The local pod runner: the kubelet's part for pods of this project's images, on loopback.

It watches every pod. A Running pod (kwok gave it a 127.x IP) whose containers use the fake-engine or router
image gets one local process per such container (podspec.plan_pod), bound to the pod IP; once each process
answers its readiness probe (or accepts connections on its port) the runner sets the process-ready annotation
and kwok's pod-ready-on-signal stage turns the pod Ready. Pods of other images are annotated at once. When a
process exits the annotation is removed (the pod goes NotReady) and, unless restartPolicy is Never, it is
restarted with backoff. When a pod is deleted the runner sends SIGTERM, waits for the process up to the grace
period (SIGKILL after), then removes the annotation so kwok's pod-delete stage lets the pod go.

In the engine mode (<state>/runner/engine.json, written by `cluster up --engine vllm`), pods of the operator's
vLLM image run as real `vllm serve` (vllm_cpu.translate, every change written at the head of the pod's log),
each bound to the core(s) the fewest running engines use, and no more than the mode's max_engines at once (the
rest wait, with an event saying why). A real engine answers /health after minutes; the pod turns Ready then.

Processes run in their own sessions and are recorded under <state>/runner/pods/<uid>.json, so a restarted
runner adopts the ones still alive (and stops those whose pod is gone) instead of starting duplicates.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import queue
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferencepool.api.labels import ANNOTATION_PROCESS_READY
from inferencepool.api.v1alpha1 import kubernetes_time
from inferencepool.cluster import podspec, procs, vllm_cpu
from inferencepool.cluster.components import Layout
from inferencepool.cluster.podspec import ContainerPlan, PlanError, PodPlan, Probe, VolumeFiles

log = logging.getLogger("inferencepool.cluster.runner")

TICK_SECONDS = 0.2
SERVICE_TABLE_SECONDS = 1.0  # how often the Service table (podspec.service_hosts) is refreshed
CORES_SECONDS = 2.0  # how often real engines' threads are checked against their cores (vllm_cpu.strays)
PLAN_RETRY_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 30.0
EVENT_SOURCE = "inferencepool-pod-runner"


@dataclass
class RunningContainer:
    plan: ContainerPlan
    record: procs.ProcessRecord | None
    restarts: int = 0
    restart_at: float | None = None


@dataclass
class ManagedPod:
    plan: PodPlan
    containers: dict[str, RunningContainer]
    ready: bool = False
    stop_deadline: float | None = None
    killed: bool = False
    # The cores its real engine is bound to (engine mode); empty for other pods.
    cores: tuple[int, ...] = ()

    def records(self) -> list[procs.ProcessRecord]:
        return [c.record for c in self.containers.values() if c.record is not None]

    def alive(self) -> list[procs.ProcessRecord]:
        return [record for record in self.records() if procs.is_alive(record)]


@dataclass
class ApiLookup:
    """ConfigMap/Secret reads for env resolution."""

    api: Any
    cache: dict[tuple[str, str, str], Mapping[str, str] | None] = field(default_factory=dict)

    def _read(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "ConfigMap":
                obj = self.api.read_namespaced_config_map(name, namespace)
                return dict(obj.data or {})
            obj = self.api.read_namespaced_secret(name, namespace)
            return {key: base64.b64decode(value).decode() for key, value in (obj.data or {}).items()}
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self._read("ConfigMap", namespace, name)

    def secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self._read("Secret", namespace, name)


def write_volumes(volumes: Iterable[VolumeFiles]) -> None:
    """Write each volume's files (fresh on every start, as a kubelet refreshes ConfigMap volumes)."""
    for volume in volumes:
        root = Path(volume.local_dir)
        root.mkdir(parents=True, exist_ok=True)
        for relative, content in volume.files.items():
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            procs.write_atomically(target, content)


def probe_passes(ip: str, probe: Probe, timeout: float = 0.5) -> bool:
    if probe.kind == "tcp":
        try:
            with socket.create_connection((ip, probe.port), timeout=timeout):
                return True
        except OSError:
            return False
    try:
        with urllib.request.urlopen(f"http://{ip}:{probe.port}{probe.path}", timeout=timeout) as response:
            return 200 <= int(response.status) < 400
    except (OSError, urllib.error.URLError, ValueError):
        return False


def read_engine(path: Path) -> vllm_cpu.CpuEngine | None:
    """The engine mode from its file; None when the file is absent (vLLM's image stays kwok's)."""
    try:
        return vllm_cpu.CpuEngine.from_json(path.read_text())
    except FileNotFoundError:
        return None


def write_engine(path: Path, engine: vllm_cpu.CpuEngine | None) -> None:
    if engine is None:
        path.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        procs.write_atomically(path, engine.to_json())


def backoff_seconds(restarts: int) -> float:
    return float(min(MAX_BACKOFF_SECONDS, 2 ** max(0, restarts - 1)))


def _now_rfc3339() -> str:
    return kubernetes_time(datetime.datetime.now(datetime.UTC))


class PodRunner:
    def __init__(
        self, api: Any, layout: Layout, python: str = sys.executable, cpus: tuple[int, ...] | None = None
    ) -> None:
        self.api = api
        self.layout = layout
        self.python = python
        self.pods_dir = layout.runner / "pods"
        # Under logs/, which `cluster down` keeps for a post-mortem.
        self.logs_dir = layout.logs / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.objects: dict[str, dict[str, Any]] = {}
        self.managed: dict[str, ManagedPod] = {}
        self.retry_at: dict[str, float] = {}
        self.reported_errors: dict[str, str] = {}
        self.services_file = layout.runner / "services.json"
        self.base_env = {**os.environ, podspec.LOCAL_HOSTS_ENV: str(self.services_file)}
        self.last_tick = 0.0
        self.last_services = 0.0
        self.last_cores = 0.0
        self.service_table: dict[str, list[str]] | None = None
        self.cpus = cpus if cpus is not None else tuple(sorted(os.sched_getaffinity(0)))

    # --- talking to the API server ---
    def _annotate(self, pod: Mapping[str, Any], value: str | None) -> None:
        from kubernetes.client.exceptions import ApiException

        metadata = pod["metadata"]
        # The uid makes the API server refuse the patch if a new pod with the same name replaced this one.
        body = {"metadata": {"uid": metadata["uid"], "annotations": {ANNOTATION_PROCESS_READY: value}}}
        try:
            self.api.patch_namespaced_pod(metadata["name"], metadata["namespace"], body)
        except ApiException as error:
            if error.status not in (404, 409):
                raise

    def _event(self, pod: Mapping[str, Any], reason: str, message: str, warning: bool = False) -> None:
        from kubernetes.client.exceptions import ApiException

        metadata = pod["metadata"]
        now = _now_rfc3339()
        body = {
            "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata["uid"],
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": EVENT_SOURCE},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.api.create_namespaced_event(metadata["namespace"], body)
        except ApiException as error:
            log.warning(
                "cannot record event %s on %s/%s: %s", reason, metadata["namespace"], metadata["name"], error
            )

    # --- records
    def _record_path(self, uid: str) -> Path:
        return self.pods_dir / f"{uid}.json"

    def _volume_root(self, uid: str) -> Path:
        return self.pods_dir / uid / "volumes"

    def _forget(self, uid: str) -> None:
        self._record_path(uid).unlink(missing_ok=True)
        shutil.rmtree(self.pods_dir / uid, ignore_errors=True)

    def _save(self, managed: ManagedPod) -> None:
        plan = managed.plan
        data = {
            "namespace": plan.namespace,
            "name": plan.name,
            "uid": plan.uid,
            "ip": plan.ip,
            "containers": {
                name: json.loads(c.record.to_json())
                for name, c in managed.containers.items()
                if c.record is not None
            },
        }
        procs.write_atomically(self._record_path(plan.uid), json.dumps(data, indent=2) + "\n")

    def _saved_records(self, uid: str) -> dict[str, procs.ProcessRecord]:
        try:
            data = json.loads(self._record_path(uid).read_text())
        except (OSError, ValueError):
            return {}
        return {
            name: procs.ProcessRecord.from_json(json.dumps(raw)) for name, raw in data["containers"].items()
        }

    def pod_log(self, plan: PodPlan, container: str) -> Path:
        return self.logs_dir / f"{plan.namespace}_{plan.name}_{container}.log"

    # --- process lifecycle
    def _start(self, managed: ManagedPod, running: RunningContainer, pod: Mapping[str, Any]) -> None:
        plan = managed.plan
        log_path = self.pod_log(plan, running.plan.name)
        with log_path.open("a") as handle:
            handle.write(
                f"--- {_now_rfc3339()} pod {plan.key} uid {plan.uid}: {' '.join(running.plan.argv)}\n"
            )
            for change in running.plan.changes:
                handle.write(f"--- engine mode: {change.describe()}\n")
        write_volumes(running.plan.volumes)
        running.record = procs.spawn(running.plan.argv, log_path, env=running.plan.env)
        running.restart_at = None
        self._save(managed)
        log.info(
            "started %s/%s pid %d on %s:%d",
            plan.key,
            running.plan.name,
            running.record.pid,
            plan.ip,
            running.plan.port,
        )
        self._event(
            pod,
            "Started",
            f"local process {running.record.pid} for container {running.plan.name} on "
            f"{plan.ip}:{running.plan.port} (log {log_path})",
        )

    def _begin_stop(self, managed: ManagedPod, grace_seconds: int) -> None:
        if managed.stop_deadline is not None:
            return
        managed.stop_deadline = time.monotonic() + grace_seconds
        for record in managed.alive():
            procs.signal_group(record, signal.SIGTERM)
        log.info("stopping %s (SIGTERM, grace %ds)", managed.plan.key, grace_seconds)

    def _adopt_or_start(self, pod: Mapping[str, Any], plan: PodPlan) -> ManagedPod:
        saved = self._saved_records(plan.uid)
        containers = {c.name: RunningContainer(plan=c, record=None) for c in plan.containers}
        managed = ManagedPod(plan=plan, containers=containers)
        adopted_all = True
        for name, running in containers.items():
            record = saved.get(name)
            if record is not None and procs.is_alive(record):
                running.record = record
                log.info("adopted %s/%s pid %d", plan.key, name, record.pid)
            else:
                adopted_all = False
                self._start(managed, running, pod)
        # Processes that were already running and already announced stay Ready across a runner restart; a
        # process started afresh makes the pod NotReady until it answers its probe.
        annotated = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_PROCESS_READY) == "true"
        managed.ready = adopted_all and annotated
        if annotated and not adopted_all:
            self._annotate(pod, None)
        self._save(managed)
        return managed

    # --- reconciling
    def sync(self, pods: list[dict[str, Any]]) -> None:
        """A full list: forget pods that are gone (stopping their processes), then reconcile every pod."""
        current = {pod["metadata"]["uid"]: pod for pod in pods}
        for uid in list(self.objects):
            if uid not in current:
                self.deleted(self.objects[uid])
        self.objects = dict(current)
        for record_file in self.pods_dir.glob("*.json"):
            uid = record_file.stem
            if uid not in current and uid not in self.managed:
                stale = list(self._saved_records(uid).values())
                procs.terminate(stale, grace_seconds=10)
                record_file.unlink(missing_ok=True)
        for uid in current:
            self.reconcile(uid)

    def deleted(self, pod: Mapping[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        self.objects.pop(uid, None)
        self.retry_at.pop(uid, None)
        managed = self.managed.get(uid)
        if managed is not None:
            self._begin_stop(managed, managed.plan.grace_seconds)

    def update(self, pod: dict[str, Any]) -> None:
        self.objects[pod["metadata"]["uid"]] = pod
        self.reconcile(pod["metadata"]["uid"])

    def reconcile(self, uid: str) -> None:
        pod = self.objects.get(uid)
        if pod is None:
            return
        metadata, status = pod["metadata"], pod.get("status", {})
        annotated = (metadata.get("annotations") or {}).get(ANNOTATION_PROCESS_READY) == "true"
        managed = self.managed.get(uid)
        if metadata.get("deletionTimestamp"):
            grace = metadata.get("deletionGracePeriodSeconds")
            if managed is not None:
                self._begin_stop(managed, managed.plan.grace_seconds if grace is None else int(grace))
                return
            # A previous runner may have died while this pod's process drained: finish that first (rare, so
            # blocking here is acceptable), then let kwok delete the pod.
            leftovers = [r for r in self._saved_records(uid).values() if procs.is_alive(r)]
            if leftovers:
                procs.terminate(leftovers, podspec.DEFAULT_GRACE_SECONDS if grace is None else int(grace))
            self._forget(uid)
            if annotated:
                self._annotate(pod, None)
            return
        if managed is not None or status.get("phase") != "Running" or not status.get("podIP"):
            return
        engine = read_engine(self.layout.engine_file)
        if engine is not None and not engine.covers(metadata["namespace"]):
            engine = None
        if not podspec.runs_locally(pod, engine is not None):
            if not annotated:
                self._annotate(pod, "true")
            return
        if time.monotonic() < self.retry_at.get(uid, 0.0):
            return
        real_engine = engine is not None and podspec.runs_locally(pod, True) and not podspec.runs_locally(pod)
        cores: tuple[int, ...] = ()
        try:
            if engine is not None and real_engine:
                cores = self._engine_slot(engine)
            plan = podspec.plan_pod(
                pod,
                self.python,
                ApiLookup(self.api),
                self.base_env,
                str(self.layout.kubeconfig),
                str(self._volume_root(uid)),
                engine,
                cores,
            )
        except PlanError as error:
            self.retry_at[uid] = time.monotonic() + PLAN_RETRY_SECONDS
            if self.reported_errors.get(uid) != str(error):
                self.reported_errors[uid] = str(error)
                log.warning("cannot run %s/%s: %s", metadata["namespace"], metadata["name"], error)
                self._event(pod, "FailedToStart", str(error), warning=True)
            if annotated:
                self._annotate(pod, None)
            return
        self.retry_at.pop(uid, None)
        self.reported_errors.pop(uid, None)
        self.managed[uid] = self._adopt_or_start(pod, plan)
        self.managed[uid].cores = cores

    def _engine_slot(self, engine: vllm_cpu.CpuEngine) -> tuple[int, ...]:
        """The cores for one more real engine, or PlanError when the mode's limit of engines is running."""
        if not os.access(engine.binary, os.X_OK):
            raise PlanError(f"engine mode: {engine.binary} not found (make real-engine installs it)")
        engines = [managed for managed in self.managed.values() if managed.cores]
        if len(engines) >= engine.max_engines:
            raise PlanError(
                f"engine mode: {len(engines)} real engines run already, the most this machine is given "
                f"(max_engines {engine.max_engines}, ~4.2 GiB each); this pod waits for one to stop"
            )
        try:
            return vllm_cpu.pick_cores(self.cpus, [core for m in engines for core in m.cores])
        except vllm_cpu.TranslationError as error:
            raise PlanError(str(error)) from error

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.last_tick < TICK_SECONDS:
            return
        self.last_tick = now
        if now - self.last_services >= SERVICE_TABLE_SECONDS:
            self.last_services = now
            self.write_service_table()
        if now - self.last_cores >= CORES_SECONDS:
            self.last_cores = now
            self.keep_engines_on_cores()
        for uid in [uid for uid, at in self.retry_at.items() if at <= now]:
            self.reconcile(uid)
        for uid, managed in list(self.managed.items()):
            self._tick_pod(uid, managed, now)

    def _tick_pod(self, uid: str, managed: ManagedPod, now: float) -> None:
        pod = self.objects.get(uid)
        if managed.stop_deadline is not None:
            if managed.alive():
                if now >= managed.stop_deadline and not managed.killed:
                    managed.killed = True
                    for record in managed.alive():
                        procs.signal_group(record, signal.SIGKILL)
                return
            del self.managed[uid]
            self._forget(uid)
            log.info("stopped %s", managed.plan.key)
            if pod is not None:
                self._annotate(pod, None)
            return
        for name, running in managed.containers.items():
            if running.record is not None and not procs.is_alive(running.record):
                running.record = None
                running.restarts += 1
                message = f"local process of container {name} exited"
                log.warning("%s: %s", managed.plan.key, message)
                if pod is not None:
                    if managed.ready:
                        self._annotate(pod, None)
                    self._event(
                        pod, "ProcessExited", f"{message}; log {self.pod_log(managed.plan, name)}", True
                    )
                managed.ready = False
                if managed.plan.restart:
                    running.restart_at = now + backoff_seconds(running.restarts)
            if (
                running.record is None
                and running.restart_at is not None
                and now >= running.restart_at
                and pod
            ):
                self._start(managed, running, pod)
        if managed.ready or pod is None:
            return
        if all(
            c.record is not None and probe_passes(managed.plan.ip, c.plan.probe)
            for c in managed.containers.values()
        ):
            managed.ready = True
            self._annotate(pod, "true")
            log.info("%s is ready", managed.plan.key)

    def keep_engines_on_cores(self) -> None:
        """Move each real engine's threads that are bound outside the cores it was given back onto them."""
        engines = {
            record.pid: managed
            for managed in self.managed.values()
            if managed.cores and managed.stop_deadline is None
            for record in managed.alive()
        }
        if not engines:
            return
        for session, threads in procs.session_threads(engines).items():
            cores = engines[session].cores
            affinities: dict[int, frozenset[int]] = {}
            for thread in threads:
                try:
                    affinities[thread] = frozenset(os.sched_getaffinity(thread))
                except OSError:
                    continue  # it exited meanwhile
            for thread in vllm_cpu.strays(affinities, cores, self.cpus):
                try:
                    os.sched_setaffinity(thread, cores)
                except OSError:
                    continue
                log.info("%s: thread %d moved back onto cores %s", engines[session].plan.key, thread, cores)

    def write_service_table(self) -> None:
        """Publish Service addresses for the local processes (the file named by INFERENCEPOOL_LOCAL_HOSTS)."""
        response = self.api.list_service_for_all_namespaces(_preload_content=False)
        services = json.loads(response.data)["items"]
        table = podspec.service_hosts(services, list(self.objects.values()))
        if table != self.service_table:
            procs.write_atomically(self.services_file, json.dumps(table, indent=1, sort_keys=True) + "\n")
            self.service_table = table

    def stop_all(self, timeout: float) -> None:
        for managed in self.managed.values():
            self._begin_stop(managed, int(timeout))
        records = [record for managed in self.managed.values() for record in managed.records()]
        procs.terminate(records, timeout)
        for uid in list(self.managed):
            self._forget(uid)
        self.managed.clear()


def _watch(api: Any, events: queue.Queue[tuple[str, Any]], stop: threading.Event) -> None:
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    while not stop.is_set():
        try:
            response = api.list_pod_for_all_namespaces(_preload_content=False)
            listing = json.loads(response.data)
            events.put(("SYNC", listing["items"]))
            version = listing["metadata"]["resourceVersion"]
            watcher = watch.Watch()
            for event in watcher.stream(
                api.list_pod_for_all_namespaces,
                resource_version=version,
                timeout_seconds=300,
                allow_watch_bookmarks=True,
                deserialize=False,
            ):
                if stop.is_set():
                    watcher.stop()
                    return
                if event["type"] == "BOOKMARK":
                    continue
                events.put((event["type"], event["object"]))
        except (ApiException, KeyError, OSError, ValueError) as error:
            # Expired resource versions, API server restarts, broken connections: list again.
            log.info("pod watch restarts after: %s", error)
            stop.wait(1.0)
        except Exception:
            log.exception("pod watch failed; listing again")
            stop.wait(1.0)


def run_forever(layout: Layout) -> int:
    from kubernetes import client, config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(layout.kubeconfig)))
    runner = PodRunner(api, layout)
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=_watch, args=(api, events, stop), daemon=True, name="pod-watch").start()
    ready_marker = layout.runner / "ready"
    ready_marker.unlink(missing_ok=True)
    log.info("pod runner %d watching pods", os.getpid())
    while not stop.is_set():
        try:
            kind, payload = events.get(timeout=TICK_SECONDS)
        except queue.Empty:
            kind, payload = "", None
        try:
            if kind == "SYNC":
                runner.sync(payload)
                procs.write_atomically(ready_marker, f"{os.getpid()}\n")
            elif kind == "DELETED":
                runner.deleted(payload)
            elif kind in ("ADDED", "MODIFIED"):
                runner.update(payload)
            runner.tick()
        except Exception:
            # One bad pod or a transient API error must not take every other pod's process down with it.
            log.exception("pod runner step failed")
            time.sleep(TICK_SECONDS)
    log.info("pod runner stopping its processes")
    runner.stop_all(timeout=10.0)
    ready_marker.unlink(missing_ok=True)
    log.info("pod runner stopped")
    return 0
