"""The API server takes a pool's NetworkPolicies as written, and applying them again stores nothing new.

(No CNI enforces them on the local control plane; tests/unit/test_builders_security_network.py judges who they
admit.)
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from tests.support.cluster import TestCluster

from inferencepool.api.v1alpha1 import InferencePool
from inferencepool.builders import pool_children

REPO = Path(__file__).resolve().parents[2]


def test_network_policies_apply_and_reapply_as_a_no_op(cluster: TestCluster, namespace: str) -> None:
    document = yaml.safe_load((REPO / "examples" / "llama-3.1-8b.yaml").read_text())
    document["metadata"].update(namespace=namespace, uid="1f0c7a52-0000-4000-8000-000000000001")
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    document["spec"]["networkPolicy"] = {"enabled": True, "allowFrom": [monitoring]}
    policies = [
        c for c in pool_children(InferencePool.model_validate(document)) if c["kind"] == "NetworkPolicy"
    ]
    assert len(policies) == 4  # prefill, decode, router, LMCache controller
    for policy in policies:
        policy["metadata"].pop("ownerReferences")  # the pool itself is not created here
    text = "\n---\n".join(yaml.safe_dump(p) for p in policies)

    def apply() -> dict[str, str]:
        result = cluster.kubectl(
            "apply", "--server-side", "--field-manager=test", "-o", "json", "-f", "-", input_text=text
        )
        assert result.returncode == 0, result.stderr
        items = json.loads(result.stdout)["items"]
        return {item["metadata"]["name"]: item["metadata"]["resourceVersion"] for item in items}

    first = apply()
    assert apply() == first
