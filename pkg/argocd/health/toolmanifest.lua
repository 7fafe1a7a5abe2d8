-- Argo CD health of reversi.dev/ToolManifest (resource.customizations.health.reversi.dev_ToolManifest).
-- Degraded when the spec is not Valid or the reversi.dev/signature annotation does not verify
-- (SignatureVerified=False): gateways do not enforce such a manifest. Healthy when Ready=True
-- (with no trusted keys in the namespace the Ready message says the signature is not checked).
local function assess()
  local s, m = before("Waiting for the controller to validate the manifest")
  if s ~= nil then return s, m end
  if holds("Reconciling", "True") then return "Progressing", say("Reconciling") end
  if holds("Valid", "False") then return "Degraded", say("Valid") end
  if holds("SignatureVerified", "False") then
    return "Degraded", say("SignatureVerified") .. " (gateways do not enforce this manifest: export it again from the signed registry, reversi manifests export --format crd)"
  end
  return after()
end
local hs = {}
hs.status, hs.message = assess()
return hs
