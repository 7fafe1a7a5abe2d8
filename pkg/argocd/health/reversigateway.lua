-- Argo CD health of reversi.dev/ReversiGateway (resource.customizations.health.reversi.dev_ReversiGateway).
-- Progressing while pods roll out or load the manifest set (Reconciling=True); Healthy when
-- every pod serves the desired set (Ready=True).
local function assess()
  local s, m = before("Waiting for the controller to render the gateway")
  if s ~= nil then return s, m end
  s, m = after()
  if s == "Degraded" and obj.status.manifests ~= nil and obj.status.manifests.lastLoadError ~= nil and obj.status.manifests.lastLoadError ~= "" then
    m = m .. " (last load error: " .. obj.status.manifests.lastLoadError .. ")"
  end
  return s, m
end
local hs = {}
hs.status, hs.message = assess()
return hs
