"""One end-to-end scenario on a real cluster: install with the chart (monitoring on), apply
examples/demo-cpu.yaml, send traffic through the router, check routing, scaling and the dashboard's queries.

    python e2e/run.py --cluster local            # the local control plane (what CI runs; no Docker)
    python e2e/run.py --cluster kind             # kind, with images built from images/ (needs Docker, kind)

Only creating the cluster, getting images onto it, reaching the router, running the operator and running
Prometheus differ between providers (the `Provider` classes); every step and check is shared, so CI tests
what kind users run. Needs: the venv (`make test` makes it), Go (for the monitoring CRDs, from the Go module
proxy), and for `local` Debian's prometheus package (`apt-get install -y prometheus`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from inferencepool.api import labels
from inferencepool.api.crd import crd_yaml
from inferencepool.api.pods import http_url, is_ready
from inferencepool.observability import dashboard, localprom, scrape
from inferencepool.observability import metrics as op

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "inferencepool-operator"
POOL_FILE = ROOT / "examples" / "demo-cpu.yaml"
OPERATOR_NAMESPACE = "inferencepool-system"
# The Prometheus Operator's CRDs (PodMonitor, PrometheusRule), from its Go module: the API server validates
# the chart's monitors and rules against their real schemas. kind gets no Prometheus Operator, only the CRDs.
PROMETHEUS_OPERATOR = ("github.com/prometheus-operator/prometheus-operator", "v0.85.0")
MONITORING_CRDS = ("monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml")
# Metrics the scenario cannot produce: router errors (a healthy pool has none). vLLM's NIXL connector metrics
# are required: the fake engine exports them, and the long prompts are disaggregated (KV read over NIXL).
NO_DATA_EXPECTED = frozenset({"inferencepool_router_upstream_errors"})
PROMETHEUS_IMAGE = "prom/prometheus:v2.55.1"
LONG_PROMPT = " ".join(f"Paragraph {i} of a long design document." for i in range(1200))


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def run(argv: list[str], *, env: dict[str, str] | None = None, input_text: str | None = None) -> str:
    result = subprocess.run(
        argv, input=input_text, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def eventually(
    what: str,
    check: Callable[[], Any],
    timeout: float,
    every: float = 2.0,
    explain: Callable[[], str] | None = None,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(every)


def go_module_dir(module: str, version: str) -> Path:
    """A Go module's files, through `go mod download` (the Go module proxy, cached in GOMODCACHE)."""
    info = json.loads(run(["go", "mod", "download", "-json", f"{module}@{version}"]))
    if "Error" in info:
        raise RuntimeError(f"go mod download {module}@{version}: {info['Error']}")
    return Path(info["Dir"])


class Cluster:
    """kubectl and helm against the provider's cluster."""

    def __init__(self, kubeconfig: Path, helm: str) -> None:
        self.kubeconfig = kubeconfig
        self.helm = helm
        self.env = {"KUBECONFIG": str(kubeconfig)}

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        from inferencepool.cluster.paths import kubectl_binary

        return run([kubectl_binary(), *args], env=self.env, input_text=input_text)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))


class Provider:
    """What differs between clusters. Subclasses: LocalProvider, KindProvider."""

    name = "provider"

    def up(self) -> Path:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def chart_values(self) -> list[str]:
        return []

    def start_operator(self, cluster: Cluster, namespace: str, workdir: Path) -> str | None:
        """Make sure an operator runs; its metrics address (host:port) when this machine can reach it."""
        return None

    def stop_operator(self) -> None:
        pass

    def router_url(self, cluster: Cluster, namespace: str, pool: str) -> str:
        raise NotImplementedError

    def prometheus(
        self, cluster: Cluster, workdir: Path, operator_metrics: str | None
    ) -> localprom.LocalPrometheus:
        raise NotImplementedError

    def stop_prometheus(self) -> None:
        pass


class LocalProvider(Provider):
    """The local control plane: kwok nodes, this project's images run as local processes at their pod IPs.

    The operator's pod from the chart is simulated by kwok (its image is not run here), so the operator runs
    as a local process with the same flags; Prometheus runs here too and finds pods through the API server.
    """

    name = "local"

    def __init__(self, state_dir: Path | None, kubeconfig: Path | None) -> None:
        self.state_dir = state_dir
        self.given_kubeconfig = kubeconfig
        self.started = False
        self.operator: subprocess.Popen[bytes] | None = None
        self.discovery: localprom.PodDiscovery | None = None

    def up(self) -> Path:
        if self.given_kubeconfig is not None:
            return self.given_kubeconfig
        from inferencepool.cluster import controlplane
        from inferencepool.cluster.components import Layout
        from inferencepool.cluster.paths import default_state_dir

        state_dir = (self.state_dir or default_state_dir()).absolute()
        self.state_dir = state_dir
        self.started = not all(controlplane.running_components(Layout(state_dir)).values())
        return Path(controlplane.up(state_dir))

    def down(self) -> None:
        if self.started and self.state_dir is not None:
            from inferencepool.cluster import controlplane

            controlplane.down(self.state_dir)

    def start_operator(self, cluster: Cluster, namespace: str, workdir: Path) -> str | None:
        port = localprom.free_port()
        log = (workdir / "operator.log").open("w")
        self.operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferencepool",
                "operator",
                "--namespace",
                namespace,
                "--metrics-port",
                str(port),
            ],
            env={**os.environ, **cluster.env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        print(f"    operator pid {self.operator.pid}, log {workdir / 'operator.log'}, metrics on :{port}")
        return f"127.0.0.1:{port}"

    def stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.terminate()
            try:
                self.operator.wait(30)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait()

    def router_url(self, cluster: Cluster, namespace: str, pool: str) -> str:
        # Services get no endpoints for loopback pod IPs here: go to the router pod (as the router does).
        selector = f"{labels.LABEL_POOL}={pool},{labels.LABEL_ROLE}=router"
        pods = cluster.json("get", "pods", "-n", namespace, "-l", selector)["items"]
        # Newest first, none that is going away: after a rollout the old pod may still look Ready for a while.
        pods = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
        pods.sort(key=lambda pod: str(pod["metadata"].get("creationTimestamp", "")), reverse=True)
        urls = [url for pod in pods if is_ready(pod) and (url := http_url(pod)) is not None]
        if not urls:
            raise AssertionError(f"no ready router pod for {namespace}/{pool}")
        return urls[0]

    def prometheus(
        self, cluster: Cluster, workdir: Path, operator_metrics: str | None
    ) -> localprom.LocalPrometheus:
        # Debian's Prometheus is built without Kubernetes discovery: the pods are listed here and handed to it
        # as a file, with the labels Kubernetes discovery gives (the PodMonitors' relabelling reads those).
        prometheus, self.discovery = localprom.start_for_cluster(
            workdir / "prometheus",
            lambda: cluster.json("get", "pods", "-A")["items"],
            operator_metrics,
            interval="2s",
        )
        return prometheus

    def stop_prometheus(self) -> None:
        if self.discovery is not None:
            self.discovery.stop()


class KindProvider(Provider):
    """kind (Docker): images built from images/ and loaded into the nodes; the chart's operator Deployment
    runs the operator image; Prometheus runs in the cluster with the same scrape configs (in-cluster service
    discovery) and is reached, like the router's Service, through `kubectl port-forward`."""

    name = "kind"
    images = {
        "operator": "inferencepool/operator:0.1.0",
        "router": "inferencepool/router:0.1.0",
        "fake-engine": "inferencepool/fake-engine:0.1.0",
    }

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        self.forwards: list[subprocess.Popen[bytes]] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="e2e-kind-"))

    def up(self) -> Path:
        run(["kind", "create", "cluster", "--name", self.cluster_name, "--wait", "180s"])
        kubeconfig = self.workdir / "kubeconfig"
        kubeconfig.write_text(run(["kind", "get", "kubeconfig", "--name", self.cluster_name]))
        for component, tag in self.images.items():
            say(f"building and loading {tag}")
            run(
                [
                    "docker",
                    "build",
                    "-f",
                    str(ROOT / "images" / component / "Dockerfile"),
                    "-t",
                    tag,
                    str(ROOT),
                ]
            )
            run(["kind", "load", "docker-image", tag, "--name", self.cluster_name])
        return kubeconfig

    def down(self) -> None:
        for forward in self.forwards:
            forward.terminate()
        run(["kind", "delete", "cluster", "--name", self.cluster_name])

    def _forward(self, cluster: Cluster, namespace: str, target: str, remote: int) -> str:
        port = localprom.free_port()
        from inferencepool.cluster.paths import kubectl_binary

        forward = subprocess.Popen(
            [kubectl_binary(), "-n", namespace, "port-forward", target, f"{port}:{remote}"],
            env={**os.environ, **cluster.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.forwards.append(forward)
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url + "/metrics" if remote != 9090 else url + "/-/ready", timeout=2),
            ):
                return True
            return False

        eventually(f"port-forward to {target}", answers, 60)
        return url

    def router_url(self, cluster: Cluster, namespace: str, pool: str) -> str:
        return self._forward(cluster, namespace, f"service/{pool}", 80)

    def prometheus(
        self, cluster: Cluster, workdir: Path, operator_metrics: str | None
    ) -> localprom.LocalPrometheus:
        from inferencepool.observability import alerts

        configs = localprom.cluster_scrape_configs(None, "5s")
        configs.append(
            scrape.scrape_config(
                scrape.OPERATOR,
                "inferencepool-operator",
                "5s",
                kubernetes_sd={"namespaces": {"names": [OPERATOR_NAMESPACE]}},
            )
        )
        config = {
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
            "rule_files": ["/etc/prometheus/rules.yaml"],
            "scrape_configs": configs,
        }
        rules = alerts.rule_groups(alerts.Thresholds())
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(in_cluster_prometheus(config, rules)))
        cluster.kubectl(
            "-n", "e2e-prometheus", "rollout", "status", "deployment/prometheus", "--timeout=180s"
        )
        url = self._forward(cluster, "e2e-prometheus", "deployment/prometheus", 9090)
        # Only the query side of LocalPrometheus is used: the server is the cluster's.
        return localprom.LocalPrometheus(url, subprocess.Popen(["true"]), workdir)


def in_cluster_prometheus(config: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    """A List: namespace, RBAC to discover pods, config and rules, one Prometheus Deployment."""
    ns, meta = "e2e-prometheus", {"name": "prometheus", "namespace": "e2e-prometheus"}
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "e2e-prometheus"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "e2e-prometheus"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "e2e-prometheus",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": ns}],
            },
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": meta,
                "data": {"prometheus.yml": yaml.safe_dump(config), "rules.yaml": yaml.safe_dump(rules)},
            },
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": {
                    "selector": {"matchLabels": {"app": "prometheus"}},
                    "template": {
                        "metadata": {"labels": {"app": "prometheus"}},
                        "spec": {
                            "serviceAccountName": "prometheus",
                            "containers": [
                                {
                                    "name": "prometheus",
                                    "image": PROMETHEUS_IMAGE,
                                    "args": ["--config.file=/etc/prometheus/prometheus.yml"],
                                    "ports": [{"containerPort": 9090}],
                                    "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus"}],
                                }
                            ],
                            "volumes": [{"name": "config", "configMap": {"name": "prometheus"}}],
                        },
                    },
                },
            },
        ],
    }


def install(cluster: Cluster, provider: Provider, release: str) -> None:
    say("installing the Prometheus Operator's CRDs (PodMonitor, PrometheusRule) from its Go module")
    crds = go_module_dir(*PROMETHEUS_OPERATOR) / "example" / "prometheus-operator-crd"
    for name in MONITORING_CRDS:
        cluster.kubectl("apply", "--server-side", "-f", str(crds / name))
    say("installing the InferencePool CRD (server-side apply), then the chart with monitoring on")
    # --force-conflicts: a CRD an earlier `helm install` created is Helm's field manager's; Helm never updates
    # it, so this apply takes it over (the chart is then installed with --skip-crds).
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=crd_yaml())
    cluster.kubectl("wait", "--for=condition=Established", "crd/inferencepools.serving.inferencepool.dev")
    out = run(
        [
            cluster.helm,
            "upgrade",
            "--install",
            release,
            str(CHART),
            "-n",
            OPERATOR_NAMESPACE,
            "--create-namespace",
            "--skip-crds",
            "--set",
            "monitoring.enabled=true",
            "--set",
            f"fullnameOverride={release}",
            *provider.chart_values(),
        ],
        env=cluster.env,
    )
    print("    " + out.strip().splitlines()[0])
    kinds = {
        (o["kind"], o["metadata"]["name"])
        for o in cluster.json("get", "podmonitors,prometheusrules,configmaps", "-n", OPERATOR_NAMESPACE)[
            "items"
        ]
    }
    wanted = {
        ("PodMonitor", f"{release}-engines"),
        ("PodMonitor", f"{release}-routers"),
        ("PodMonitor", f"{release}-operator"),
        ("PrometheusRule", release),
        ("ConfigMap", f"{release}-dashboard"),
    }
    missing = wanted - kinds
    assert not missing, f"the chart did not install {missing}"


def pool_document(namespace: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(POOL_FILE.read_text())
    document["metadata"]["namespace"] = namespace
    return document


def condition(pool: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (pool.get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def router_counts(url: str, family_name: str, label: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels[label]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == family_name
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def complete(url: str, model: str, prompt: str, max_tokens: int = 16) -> int:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


@contextlib.contextmanager
def load(resolve: Callable[[], str], model: str, threads: int = 3) -> Iterator[None]:
    """Streams completions from `threads` threads; the router's address is looked up again after a failed
    connection (on the local cluster a rolled router pod has a new IP)."""
    stop = threading.Event()

    def stream() -> None:
        n, url = 0, resolve()
        while not stop.is_set():
            n += 1
            # Mostly short prompts (direct), every 4th long (through prefill), every 25th for a model the
            # pool does not serve (the router refuses it): every panel of the dashboard gets data.
            prompt = LONG_PROMPT if n % 4 == 0 else f"tell me more about prefixes, take {n % 5}"
            try:
                complete(url, "not-served" if n % 25 == 0 else model, prompt, max_tokens=24)
            except OSError:
                time.sleep(1)
                with contextlib.suppress(Exception):
                    url = resolve()

    workers = [threading.Thread(target=stream, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)


def scenario(provider: Provider, cluster: Cluster, workdir: Path, timeout: float) -> None:
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    release = f"inferencepool-e2e-{namespace[4:]}"
    install(cluster, provider, release)
    cluster.kubectl("create", "namespace", namespace)
    say(f"starting the operator ({provider.name})")
    operator_metrics = provider.start_operator(cluster, namespace, workdir)
    try:
        document = pool_document(namespace)
        pool, model = document["metadata"]["name"], document["spec"]["model"]["servedName"]
        say(f"applying {POOL_FILE.relative_to(ROOT)} in {namespace}; waiting for Ready")
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(document))
        eventually(
            "the pool to be Ready",
            lambda: (
                condition(cluster.json("get", "pdpool", pool, "-n", namespace), "Ready").get("status")
                == "True"
            ),
            timeout,
        )
        say("starting Prometheus with the chart's scrape configs and alert rules")
        prometheus = provider.prometheus(cluster, workdir, operator_metrics)
        try:
            check_routing_scaling_and_dashboard(
                provider, cluster, prometheus, namespace, pool, model, timeout
            )
        finally:
            prometheus.stop()
            provider.stop_prometheus()
        say("done: routing, scaling, dashboard queries and alerts checked")
    finally:
        provider.stop_operator()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
        with contextlib.suppress(RuntimeError):
            run([cluster.helm, "uninstall", release, "-n", OPERATOR_NAMESPACE], env=cluster.env)


def check_routing_scaling_and_dashboard(
    provider: Provider,
    cluster: Cluster,
    prometheus: localprom.LocalPrometheus,
    namespace: str,
    pool: str,
    model: str,
    timeout: float,
) -> None:
    url = provider.router_url(cluster, namespace, pool)
    say(f"routing through {url}: a short prompt goes direct, a long one through prefill")
    before = router_counts(url, "inferencepool_router_requests", "route")
    assert complete(url, model, "Why is decode memory-bound?") == 200
    assert complete(url, model, LONG_PROMPT) == 200
    assert complete(url, "not-served", "hello") == 404, (
        "the router must refuse a model the pool does not serve"
    )
    after = router_counts(url, "inferencepool_router_requests", "route")
    grown = {route for route, count in after.items() if count > before.get(route, 0)}
    assert grown == {"direct", "disaggregated"}, f"routes taken: {grown}"

    # The dashboard's scaling annotation is `changes()` of the desired replicas: Prometheus must hold a sample
    # from before the decision, and its first scrape of the operator can come after a fast one.
    before_scaling = f'{op.DESIRED_REPLICAS}{{namespace="{namespace}", pool="{pool}", role="decode"}}'
    assert prometheus.wait_for(before_scaling, 60), f"Prometheus has not scraped {before_scaling}"
    say("scaling: decode's ITL target set below what the engines do, under load; decode must grow")
    autoscaling = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 4,
        "target": {"itlMilliseconds": 1, "percentile": 90},
        "windowSeconds": 6,
        "intervalSeconds": 2,
    }
    patch = {"spec": {"decode": {"autoscaling": autoscaling}}}
    cluster.kubectl("-n", namespace, "patch", "pdpool", pool, "--type=merge", "-p", json.dumps(patch))

    def settled() -> bool:
        current = cluster.json("get", "pdpool", pool, "-n", namespace)
        observed = (current.get("status") or {}).get("observedGeneration")
        return bool(
            observed == current["metadata"]["generation"]
            and condition(current, "Progressing").get("status") == "False"
            and condition(current, "Ready").get("status") == "True"
        )

    eventually("the new spec rolled out", settled, timeout)

    def scaled_up() -> dict[str, Any] | None:
        status = cluster.json("get", "pdpool", pool, "-n", namespace).get("status") or {}
        last = status.get("decode", {}).get("lastScaling")
        return last if last and last["replicas"] > last["fromReplicas"] else None

    with load(lambda: provider.router_url(cluster, namespace, pool), model):

        def explain() -> str:
            return cluster.kubectl("get", "pdpool,pods", "-n", namespace, "-o", "wide") + json.dumps(
                cluster.json("get", "pdpool", pool, "-n", namespace).get("status"), indent=1
            )

        last = eventually("decode scaled up (status.decode.lastScaling)", scaled_up, timeout, explain=explain)
        statefulset = cluster.json("get", "statefulset", f"{pool}-decode", "-n", namespace)
        assert statefulset["spec"]["replicas"] >= last["replicas"] > last["fromReplicas"], last
        print(
            f"    decode {last['fromReplicas']} -> {last['replicas']} ({last['reason']}): {last['message']}"
        )

        say("the dashboard's queries and the alert rules, on what Prometheus scraped")
        problems = localprom.dashboard_problems(prometheus, namespace, pool, NO_DATA_EXPECTED, 120)
        assert not problems, "dashboard queries without data:\n" + "\n".join(problems)
        unhealthy = [rule for rule in prometheus.rules() if rule.get("health") != "ok"]
        assert not unhealthy, f"rules Prometheus cannot evaluate: {unhealthy}"
        missed = prometheus.wait_for(
            f'ALERTS{{alertname="InferencePoolLatencyTargetMissed", namespace="{namespace}", role="decode"}}',
            60,
        )
        assert missed, "InferencePoolLatencyTargetMissed is not pending for decode (ITL target 1 ms)"
        checked = [q for _, q in dashboard.queries() if not any(name in q.expr for name in NO_DATA_EXPECTED)]
        alert = missed[0]["metric"]["alertstate"]
        print(f"    {len(checked)} panel queries returned data; decode latency alert {alert}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cluster", choices=("local", "kind"), default="local")
    parser.add_argument("--kubeconfig", type=Path, default=None, help="local: use this running cluster")
    parser.add_argument("--state-dir", type=Path, default=None, help="local: the cluster's state directory")
    parser.add_argument("--kind-name", default="inferencepool-e2e", help="kind: the cluster's name")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for each step")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    args = parser.parse_args(argv)

    from inferencepool.cluster import build

    provider: Provider = (
        LocalProvider(args.state_dir, args.kubeconfig)
        if args.cluster == "local"
        else KindProvider(args.kind_name)
    )
    say(f"cluster: {provider.name}")
    kubeconfig = provider.up()
    try:
        # kind users bring their own helm; the local provider has the one its control plane build made.
        helm = shutil.which("helm") if args.cluster == "kind" else None
        cluster = Cluster(kubeconfig, helm or str(build.ensure_binaries() / "helm"))
        workdir = Path(tempfile.mkdtemp(prefix="e2e-"))
        print(f"    logs and Prometheus data in {workdir} (kept if a step fails)")
        scenario(provider, cluster, workdir, args.timeout)
        shutil.rmtree(workdir, ignore_errors=True)
    finally:
        if not args.keep and args.kubeconfig is None:
            provider.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
