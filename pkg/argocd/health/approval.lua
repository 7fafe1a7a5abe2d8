-- Argo CD health of reversi.dev/Approval (resource.customizations.health.reversi.dev_Approval).
-- Healthy when the decision was Counted; Degraded when Rejected (status.message says why: the
-- approver lacks the roles, is the run's actor, the request is decided, ...) or when its
-- request does not exist.
local function assess()
  local s, m = before("Waiting for the controller to count the approval")
  if s ~= nil then return s, m end
  s, m = working()
  if s ~= nil then return s, m end
  local msg = obj.status.message
  if msg == nil or msg == "" then msg = say("Ready") end
  if obj.status.result == "Counted" then return "Healthy", "Counted: " .. msg end
  if obj.status.result == "Rejected" then return "Degraded", "Rejected: " .. msg end
  return after()
end
local hs = {}
hs.status, hs.message = assess()
return hs
