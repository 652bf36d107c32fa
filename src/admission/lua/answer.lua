-- A job whose key cannot be read (another type was written there, or it lives on
-- another node) answers `wrong_type` or `elsewhere` and leaves the others of the
-- call unharmed; its first command is a read, so it has written nothing.
local function failure(e)
  local text = type(e) == 'table' and e.err or tostring(e)
  if string.find(text, 'non local key', 1, true) or string.find(text, 'MOVED', 1, true)
    or string.find(text, 'ASK', 1, true) then
    return ANSWER.elsewhere
  end
  return ANSWER.wrong_type
end

-- Job k's answer: code, flags, payload, and the quiet hours' version (or nil).
local function answer(k)
  local key = job_key(k)
  local ok, code, payload, quiet = true, nil, nil, nil
  if suppression_at then
    ok, code, payload = pcall(suppressed, key, k)
  end
  if ok and not code and preferences_at then
    ok, code, payload, quiet = pcall(preferences, key, k)
  end
  if not ok then return failure(code), 0 end
  if code then return code, 0, payload end
  local flags
  local lims = limits_of(k)
  ok, code, flags, payload = pcall(admit, key, job_member(k), plans[job_plan(k)], layers[k], lims)
  if not ok then return failure(code), 0 end
  if lims and (code == ANSWER.admitted or code == ANSWER.shadowed) then
    flags = flags + FLAG.taken
  end
  if quiet and (code == ANSWER.refused or code == ANSWER.layered) then
    return code, flags + FLAG.quiet, payload, quiet
  end
  return code, flags, payload
end

local out = {now}
local n = 1
for k = 1, jobs do
  local code, flags, payload, quiet = answer(k)
  out[n + 1] = code
  out[n + 2] = flags
  n = n + 2
  if quiet then
    n = n + 1
    out[n] = quiet
  end
  local m = payload and #payload or 0
  n = n + 1
  out[n] = m
  for i = 1, m do out[n + i] = payload[i] end
  n = n + m
end
-- every bucket the jobs took from, written once; then, when the call carries
-- limits, each bucket's base and interval
write_limits()
limits_tail(out, n)
return out
