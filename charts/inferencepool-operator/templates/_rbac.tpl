{{/* The operator's rules on namespaced resources: in its ClusterRole, or in a Role per watched namespace. */}}
{{- define "inferencepool-operator.namespacedRules" -}}
# The pools: watch them, record kopf's progress in their annotations, write their status. Never their spec
# (kopf patches metadata only). finalizers/update lets owner references block deletion where the
# OwnerReferencesPermissionEnforcement admission plugin is on.
- apiGroups: [serving.inferencepool.dev]
  resources: [inferencepools]
  verbs: [get, list, watch, patch]
- apiGroups: [serving.inferencepool.dev]
  resources: [inferencepools/status]
  verbs: [get, patch]
- apiGroups: [serving.inferencepool.dev]
  resources: [inferencepools/finalizers]
  verbs: [update]
# Children, written with server-side apply (an apply that creates needs create as well as patch), and watched
# so that one deleted by hand is applied again. No delete: garbage collection removes them through their
# owner references.
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts]
  verbs: [get, list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch]
# The router's Role grants get/list/watch on Pods; RBAC lets the operator grant only what it holds itself.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# References a pool names: the model cache PVC, and the HF token Secret (existence and key only; see
# rbac.readSecrets and rbac.secretNames in values.yaml).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
{{- if .Values.rbac.readSecrets }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
  {{- with .Values.rbac.secretNames }}
  resourceNames: {{ toJson . }}
  {{- end }}
{{- end }}
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
