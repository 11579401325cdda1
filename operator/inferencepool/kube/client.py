"""A small, typed door to the API server for what kopf does not do: server-side apply, reads of children.

Built on the official client's ApiClient (auth from kubeconfig or in-cluster config, TLS, retries), but
speaking plain dicts: builders produce dicts, and the API server's JSON is compared with them. Calls are
blocking; the operator's handlers and the autoscaler run them in worker threads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from inferencepool.api import labels

APPLY_CONTENT_TYPE: Final = "application/apply-patch+yaml"  # JSON is YAML, so the body is sent as JSON
REQUEST_TIMEOUT_SECONDS: Final = 30


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if subresource is not None:
            base += f"/{subresource}"
        return base


RESOURCES: Final[dict[tuple[str, str], Resource]] = {
    ("v1", "ConfigMap"): Resource("", "v1", "configmaps"),
    ("v1", "Secret"): Resource("", "v1", "secrets"),
    ("v1", "Service"): Resource("", "v1", "services"),
    ("v1", "ServiceAccount"): Resource("", "v1", "serviceaccounts"),
    ("v1", "PersistentVolumeClaim"): Resource("", "v1", "persistentvolumeclaims"),
    ("v1", "Pod"): Resource("", "v1", "pods"),
    ("apps/v1", "StatefulSet"): Resource("apps", "v1", "statefulsets"),
    ("apps/v1", "Deployment"): Resource("apps", "v1", "deployments"),
    ("policy/v1", "PodDisruptionBudget"): Resource("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io/v1", "NetworkPolicy"): Resource("networking.k8s.io", "v1", "networkpolicies"),
    ("rbac.authorization.k8s.io/v1", "Role"): Resource("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): Resource(
        "rbac.authorization.k8s.io", "v1", "rolebindings"
    ),
    (f"{labels.GROUP}/{labels.VERSION}", labels.KIND): Resource(labels.GROUP, labels.VERSION, labels.PLURAL),
    # Cluster-scoped, to install the CRD and make namespaces (benchmark, tests); the operator needs neither.
    ("v1", "Namespace"): Resource("", "v1", "namespaces", namespaced=False),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): Resource(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False
    ),
}


def resource_of(api_version: str, kind: str) -> Resource:
    try:
        return RESOURCES[(api_version, kind)]
    except KeyError:
        raise ValueError(f"no REST mapping for {api_version} {kind}") from None


class KubeError(Exception):
    """A non-2xx answer from the API server, with its status code and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def load_configuration(kubeconfig: str | None = None) -> k8s_client.Configuration:
    """In-cluster config when running in a pod (and no kubeconfig is named), else the kubeconfig."""
    configuration = k8s_client.Configuration()
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
            return configuration
        except k8s_config.ConfigException:
            pass
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return configuration


class Kube:
    def __init__(self, configuration: k8s_client.Configuration, pool_size: int = 16) -> None:
        # The default pool of 4 connections would serialise a reconcile of many children behind each other.
        configuration.connection_pool_maxsize = pool_size
        self.configuration = configuration
        self.api = k8s_client.ApiClient(configuration)

    def close(self) -> None:
        self.api.close()

    def _request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        """One call; None for 404 on reads, KubeError for any other failure."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, post = self.api.param_serialize(
            method, path, query_params=query, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(
            method, url, headers, body, post, _request_timeout=REQUEST_TIMEOUT_SECONDS
        )
        response.read()
        payload: dict[str, Any] = json.loads(response.data) if response.data else {}
        if 200 <= response.status < 300:
            return payload
        if response.status == 404 and method == "GET":
            return None
        raise KubeError(response.status, str(payload.get("reason", "")), str(payload.get("message", payload)))

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._request("GET", resource_of(api_version, kind).path(namespace, name))

    def apply(self, manifest: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply of `manifest` under `field_manager`; returns the object as stored."""
        meta = manifest["metadata"]
        resource = resource_of(manifest["apiVersion"], manifest["kind"])
        query = [("fieldManager", field_manager), ("force", "true" if force else "false")]
        path = resource.path(meta.get("namespace", ""), meta["name"])
        result = self._request("PATCH", path, query, manifest, APPLY_CONTENT_TYPE)
        assert result is not None
        return result

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Plain create (POST), as `kubectl create` does; KubeError 409 when it exists."""
        resource = resource_of(manifest["apiVersion"], manifest["kind"])
        result = self._request(
            "POST", resource.path(manifest["metadata"].get("namespace", "")), None, manifest
        )
        assert result is not None
        return result

    def apply_status(self, manifest: dict[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply on the status subresource (`manifest` carries apiVersion, kind, metadata,
        status)."""
        meta = manifest["metadata"]
        resource = resource_of(manifest["apiVersion"], manifest["kind"])
        query = [("fieldManager", field_manager), ("force", "true")]
        result = self._request(
            "PATCH",
            resource.path(meta["namespace"], meta["name"], "status"),
            query,
            manifest,
            APPLY_CONTENT_TYPE,
        )
        assert result is not None
        return result

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete with background propagation (garbage collection removes what it owns); absent is fine."""
        try:
            self._request("DELETE", resource_of(api_version, kind).path(namespace, name))
        except KubeError as error:
            if error.status != 404:
                raise

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        result = self._request(
            "GET", resource_of(api_version, kind).path(namespace), [("labelSelector", label_selector)]
        )
        return list((result or {}).get("items", []))
