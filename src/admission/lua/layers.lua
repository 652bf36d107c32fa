-- Section `layers`: the caps each job meets, by job number (a job meeting none has
-- no entry).
local layers = {}
do
  local at = section('layers')
  if at then
    local b = at + 1
    for _ = 1, tonumber(ARGV[at]) do
      local k, count = tonumber(ARGV[b]), tonumber(ARGV[b + 1])
      local list = {}
      for i = 1, count do
        local c = b + 3 * i - 1
        list[i] = {key = ARGV[c], plan = plans[tonumber(ARGV[c + 1])], holds = ARGV[c + 2] == '1'}
      end
      layers[k] = list
      b = b + 2 + 3 * count
    end
  end
end

-- The rest of a job's admission when it meets caps, once its own key said it is
-- neither a duplicate nor reserved: `times` are its policy's remembered sends;
-- `lims`, its limits (nil: none). Returns the code and its payload.
local function admit_layers(key, member, plan, times, list, lims)
  local policy_full = is_full(plan, times)
  local refused = policy_full and not plan.shadow
  local blocks = {times}
  for i = 1, #list do
    local l = list[i]
    if not l.plan.valid then return ANSWER.replan end
    if l.holds then
      local entries = redis.call('ZRANGE', l.key, '0', '-1', 'WITHSCORES')
      local t = remembered(l.key, member, l.plan, entries)
      blocks[i + 1] = t
      if is_full(l.plan, t) then refused = true end
    else
      redis.call('ZREMRANGEBYSCORE', l.key, '-inf', l.plan.below_cutoff)
      blocks[i + 1] = {}
    end
  end
  if refused then
    local payload = {#blocks}
    for i = 1, #blocks do
      payload[#payload + 1] = #blocks[i]
      as_ms(blocks[i], payload)
    end
    return ANSWER.layered, payload
  end
  local at, which = limits_refuse(lims)
  if at then
    return ANSWER.limited, {at, which}
  end
  record(key, member, plan)
  for i = 1, #list do
    record(list[i].key, member, list[i].plan)
  end
  take_limits(lims)
  if policy_full then return ANSWER.shadowed, as_ms(times) end
  return ANSWER.admitted
end
