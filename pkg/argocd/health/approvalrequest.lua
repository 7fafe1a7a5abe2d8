-- Argo CD health of reversi.dev/ApprovalRequest (resource.customizations.health.reversi.dev_ApprovalRequest).
-- Suspended while Pending or Escalated: the request waits for a person (an Approval), not for
-- the controller. Healthy once Approved with the controller's signed decision; Degraded when
-- Denied or Expired (the call stays blocked), when an Approval was not counted for want of the
-- admission stamp, or when the status is not the controller's (Stalled).
-- BEGIN common: the same in every Reversi health script (pkg/argocd checks it).
-- Argo CD runs this without the string library (no useOpenLibs): only base and table.
local function condition(t)
  if obj.status == nil or obj.status.conditions == nil then return nil end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == t then return c end
  end
  return nil
end
local function holds(t, s)
  local c = condition(t)
  return c ~= nil and c.status == s
end
-- say is "<type>: <reason>: <message>" of a condition, leaving out the empty parts.
local function say(t)
  local c = condition(t)
  if c == nil then return t .. " is not reported" end
  local m = t
  if c.reason ~= nil and c.reason ~= "" then m = m .. ": " .. c.reason end
  if c.message ~= nil and c.message ~= "" then m = m .. ": " .. c.message end
  return m
end
-- before: nothing to judge yet (no status, or a status of an older generation).
local function before(waiting)
  if obj.status == nil or obj.status.conditions == nil or #obj.status.conditions == 0 then
    return "Progressing", waiting
  end
  local gen = obj.metadata.generation
  local seen = obj.status.observedGeneration
  if seen == nil and condition("Ready") ~= nil then seen = condition("Ready").observedGeneration end
  if gen ~= nil and seen ~= nil and seen < gen then
    return "Progressing", "Waiting for generation " .. gen .. " to be observed (status describes " .. seen .. ")"
  end
  return nil, nil
end
-- working: Stalled=True → Degraded, else Reconciling=True → Progressing, else nil.
local function working()
  if holds("Stalled", "True") then return "Degraded", say("Stalled") end
  if holds("Reconciling", "True") then return "Progressing", say("Reconciling") end
  return nil, nil
end
-- after: the kstatus reading: working, then Ready.
local function after()
  local s, m = working()
  if s ~= nil then return s, m end
  if holds("Ready", "True") then return "Healthy", condition("Ready").message or "" end
  if holds("Ready", "False") then return "Degraded", say("Ready") end
  return "Progressing", say("Ready")
end
-- END common
local function assess()
  local s, m = before("Waiting for the controller to count approvals")
  if s ~= nil then return s, m end
  s, m = working()
  if s ~= nil then return s, m end
  local phase = obj.status.phase
  local msg = obj.status.message
  if msg == nil or msg == "" then msg = say("Ready") end
  if phase == "Approved" then
    if obj.status.decision == nil then
      return "Degraded", "Approved but status.decision (the controller's signature) is missing: the gateway keeps the call held"
    end
    return "Healthy", "Approved: " .. msg
  end
  if phase == "Denied" or phase == "Expired" then return "Degraded", phase .. ": " .. msg end
  if phase == "Pending" or phase == "Escalated" then
    local r = condition("Ready")
    if r ~= nil and r.reason == "ApprovalNotStamped" then return "Degraded", say("Ready") end
    return "Suspended", phase .. ": " .. msg
  end
  return after()
end
local hs = {}
hs.status, hs.message = assess()
return hs
