-- Argo CD health of reversi.dev/ReversiRun (resource.customizations.health.reversi.dev_ReversiRun).
-- The gateway writes this status. Healthy while Active or Idle and once RolledBack; Progressing
-- while RollingBack; Degraded when PartiallyRolledBack (some steps are not undone: see
-- status.rollback.steps).
local function assess()
  local s, m = before("Waiting for the gateway to report the run")
  if s ~= nil then return s, m end
  s, m = working()
  if s ~= nil then return s, m end
  local phase = obj.status.phase
  if phase == "PartiallyRolledBack" then
    m = "PartiallyRolledBack: " .. say("Ready")
    if obj.status.rollback ~= nil and obj.status.rollback.message ~= nil and obj.status.rollback.message ~= "" then
      m = m .. " (" .. obj.status.rollback.message .. ")"
    end
    return "Degraded", m
  end
  if phase == "RollingBack" then return "Progressing", "RollingBack: " .. say("Ready") end
  s, m = after()
  if s == "Healthy" and phase ~= nil then m = phase .. ": " .. m end
  return s, m
end
local hs = {}
hs.status, hs.message = assess()
return hs
