-- Argo CD health of reversi.dev/ManifestRegistry (resource.customizations.health.reversi.dev_ManifestRegistry).
-- Suspended while spec.suspend is set; Degraded when the latest revision failed (the last good
-- rendering, status.artifact, is still served and named in the message).
local function assess()
  local s, m = before("Waiting for the controller to fetch the repository")
  if s ~= nil then return s, m end
  if obj.spec ~= nil and obj.spec.suspend == true then
    return "Suspended", "Suspended: set spec.suspend to false to resume"
  end
  s, m = after()
  if s == "Degraded" and obj.status.artifact ~= nil and obj.status.artifact.revision ~= nil then
    m = m .. " (still serving " .. obj.status.artifact.revision .. ")"
  end
  return s, m
end
local hs = {}
hs.status, hs.message = assess()
return hs
