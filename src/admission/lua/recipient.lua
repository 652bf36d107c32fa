-- One job's admission on its recipient's key: the code and its payload, once the
-- key said the job is neither a duplicate nor reserved by a live worker.
local function admit_fresh(key, member, plan, entries, list, lims)
  if not plan.valid then
    return ANSWER.replan
  end
  -- forget what no rule and no duplicate check needs any more
  local times = remembered(key, member, plan, entries)
  if list then
    return admit_layers(key, member, plan, times, list, lims)
  end
  local full = is_full(plan, times)
  if full and not plan.shadow then
    return ANSWER.refused, as_ms(times)
  end
  local at, which = limits_refuse(lims)
  if at then
    return ANSWER.limited, {at, which}
  end
  record(key, member, plan)
  take_limits(lims)
  if full then
    return ANSWER.shadowed, as_ms(times)
  end
  return ANSWER.admitted
end

-- One job's admission: its code, flags and payload. Numbers given to redis.call
-- are strings: Lua would format each with sprintf.
local function admit(key, member, plan, list, lims)
  -- With rules, one ZRANGE reads every remembered send (the key is trimmed to the
  -- longest window, so it is short) and answers the duplicate check too.
  local entries = {}
  local existing
  if plan.has_rules then
    entries = redis.call('ZRANGE', key, '0', '-1', 'WITHSCORES')
    for i = 1, #entries, 2 do
      if entries[i] == member then existing = tonumber(entries[i + 1]) end
    end
  else
    existing = redis.call('ZSCORE', key, member)
    if existing then existing = tonumber(existing) end
  end
  if not existing then
    local code, payload = admit_fresh(key, member, plan, entries, list, lims)
    return code, 0, payload
  end
  if existing % 2 == 1 then
    return ANSWER.duplicate, 0
  end
  local reserved_at = (existing - existing % 2) / 2
  if now - reserved_at < lease then
    -- a write (the key's expiry set again), so that a WAIT after this call covers
    -- the reservation too, whichever connection recorded it
    redis.call('PEXPIREAT', key, plan.expire_at)
    return ANSWER.reserved, 0, {reserved_at}
  end
  -- an abandoned reservation (its worker died before confirming, perhaps after its
  -- dispatch went out): decided afresh, but it stays counted until this admission
  -- replaces it (a refusal leaves it), and the answer says it inherited it
  local code, payload = admit_fresh(key, member, plan, entries, list, lims)
  if code == ANSWER.admitted or code == ANSWER.shadowed then
    return code, FLAG.inherited, payload
  end
  return code, 0, payload
end
