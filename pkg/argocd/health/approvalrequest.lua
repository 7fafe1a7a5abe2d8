-- Argo CD health of reversi.dev/ApprovalRequest (resource.customizations.health.reversi.dev_ApprovalRequest).
-- Suspended while Pending or Escalated: the request waits for a person (an Approval), not for
-- the controller. Healthy once Approved with the controller's signed decision; Degraded when
-- Denied or Expired (the call stays blocked), when an Approval was not counted for want of the
-- admission stamp, or when the status is not the controller's (Stalled).
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
