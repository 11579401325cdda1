-- Argo CD health check for InferencePool (serving.inferencepool.dev). Install it in argocd-cm as
-- resource.customizations.health.serving.inferencepool.dev_InferencePool (the chart's README shows how).
--
-- Healthy: the operator has seen the latest spec and the pool serves (Ready=True), even while the autoscaler
--   adds replicas or cannot add as many as it wants (ScalingLimited: said in the message; Prometheus alerts).
-- Progressing: no status yet, a spec the operator has not observed, engines still loading (Ready=False), or a
--   rollout of the latest generation in progress.
-- Degraded: the operator says something only the user can fix (Degraded=True: missing Secret, invalid spec).
-- Lua 5.1 (Argo CD runs gopher-lua): no integer division, no goto.
local hs = {}

local function find(conditions, kind)
  for _, condition in ipairs(conditions or {}) do
    if condition.type == kind then
      return condition
    end
  end
  return nil
end

local function describe(condition)
  local text = condition.reason or ""
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  return text
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report the pool's status"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = obj.status.conditions
local degraded = find(conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded)
  return hs
end

local ready = find(conditions, "Ready")
if ready == nil or ready.status ~= "True" then
  hs.status = "Progressing"
  if ready == nil then
    hs.message = "Waiting for the Ready condition"
  else
    hs.message = describe(ready)
  end
  return hs
end

local progressing = find(conditions, "Progressing")
if progressing ~= nil and progressing.status == "True" and progressing.reason ~= "WaitingForReplicas" then
  hs.status = "Progressing"
  hs.message = describe(progressing)
  return hs
end

hs.status = "Healthy"
hs.message = describe(ready)
local limited = find(conditions, "ScalingLimited")
if limited ~= nil and limited.status == "True" then
  hs.message = hs.message .. "; ScalingLimited " .. describe(limited)
end
return hs
