"""How the operator is wired into kopf: settings and credentials (no cluster needed)."""

from __future__ import annotations

import kopf
from kubernetes import client as k8s_client

from inferencepool.api import labels
from inferencepool.controller import runtime


def test_watches_time_out_and_kopf_keeps_its_records_out_of_spec_and_status() -> None:
    settings = kopf.OperatorSettings()
    runtime.configure_settings(settings)
    assert settings.watching.server_timeout is not None and settings.watching.client_timeout is not None
    assert 0 < settings.watching.server_timeout < settings.watching.client_timeout
    assert settings.watching.connect_timeout
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert isinstance(settings.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)
    assert settings.persistence.progress_storage.prefix == labels.GROUP


def test_credentials_come_from_the_clients_configuration() -> None:
    configuration = k8s_client.Configuration(host="https://127.0.0.1:6443")
    configuration.api_key = {"BearerToken": "abc"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.ssl_ca_cert = "/tmp/ca.crt"
    info = runtime.connection_info(configuration)
    assert (info.server, info.scheme, info.token, info.ca_path) == (
        "https://127.0.0.1:6443",
        "Bearer",
        "abc",
        "/tmp/ca.crt",
    )
    certificates = k8s_client.Configuration(host="https://h")
    certificates.cert_file, certificates.key_file = "/c.crt", "/c.key"
    info = runtime.connection_info(certificates)
    assert (info.token, info.certificate_path, info.private_key_path) == (None, "/c.crt", "/c.key")
