-- The kstatus reading every Reversi health script starts with (pkg/argocd puts it in front of
-- each kind's script: Argo CD has no shared prelude).
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
