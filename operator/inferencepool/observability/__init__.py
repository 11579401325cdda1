"""What a person running pools looks at: the operator's own metrics, how Prometheus scrapes the operator,
routers and engines, the alert rules and the Grafana dashboard (all built here, in code, as the one source the
chart's copies are generated from), and the Argo CD health check for InferencePool."""
