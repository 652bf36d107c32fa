-- admit.lua: for each job, check every rule of its recipient's policy and, if all
-- pass, record the send. One call may carry many jobs (the engine batches the
-- admissions that are waiting at the same moment into one call); they are decided
-- in order, each seeing the sends recorded for the ones before it.
--
-- One sorted set per (recipient, policy[, channel]). member = a hash of the job id,
-- score = admitted_ms * 2 + state, where state 0 = reserved (dispatch in progress)
-- and 1 = committed (dispatch confirmed; set by the worker with ZADD XX).
-- Time comes from Redis TIME (milliseconds, integers), so every worker shares one clock.
--
-- KEYS[k]  the sorted set of job k's recipient (on a cluster, one job per call)
-- ARGV[1]  lease ms: a reservation younger than this belongs to a live worker
-- ARGV[2]  dedupe ms: keep every send at least this long, to recognise duplicates
-- then, for each job k in order, a block of 5 + 2n values:
--   member (job id hash)
--   valid_from ms  } the local day the caller planned for: calendar starts below
--   valid_until ms } are only right while valid_from <= now < valid_until
--   calendar expiry ms: when a send made today stops counting (0 if no calendar rule)
--   n, the number of rules, then n pairs (limit, bound): bound > 0 is the inclusive
--   start (ms) of a calendar window; bound < 0 is minus the length (ms) of a rolling one
--
-- Returns one reply per job, in order, each one of
--   {1, now}                   admitted, recorded with score now*2
--   {0, now, t1, t2, ...}      refused; t = times (ms) of the sends still remembered
--   {2, now}                   duplicate: this job was already dispatched
--   {3, now, reserved_at}      another worker holds a live reservation for this job
--   {4, now}                   now is outside [valid_from, valid_until): plan again with now
--   {5, now}                   the key holds something else than a sorted set
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local dedupe = tonumber(ARGV[2])

local function admit(key, member, valid_from, valid_until, calendar_expiry, first, nrules)
  local has_rules = nrules > 0
  -- With rules, one ZRANGE reads every remembered send (the key is trimmed to the
  -- longest window, so it is short) and answers the duplicate check too.
  local entries = {}
  local existing
  if has_rules then
    entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      if entries[i] == member then existing = tonumber(entries[i + 1]) end
    end
  else
    existing = redis.call('ZSCORE', key, member)
    if existing then existing = tonumber(existing) end
  end

  if existing then
    if existing % 2 == 1 then
      return {2, now}
    end
    local reserved_at = (existing - existing % 2) / 2
    if now - reserved_at < lease then
      return {3, now, reserved_at}
    end
    -- an abandoned reservation (its worker died before confirming): admit afresh
    redis.call('ZREM', key, member)
  end

  if now < valid_from or now >= valid_until then
    return {4, now}
  end

  local cutoff = now - dedupe + 1
  local expire_at = math.max(calendar_expiry, now + dedupe)
  local starts, limits = {}, {}
  for r = 0, nrules - 1 do
    local limit, bound = tonumber(ARGV[first + 2 * r]), tonumber(ARGV[first + 2 * r + 1])
    local start = bound
    if bound < 0 then
      start = now + bound + 1
      expire_at = math.max(expire_at, now - bound)
    end
    limits[#limits + 1] = limit
    starts[#starts + 1] = start
    if start < cutoff then cutoff = start end
  end

  -- forget what no rule and no duplicate check needs any more
  local cutoff2 = cutoff * 2
  local stale = not has_rules
  local times = {}
  for i = 2, #entries, 2 do
    local s = tonumber(entries[i])
    if s < cutoff2 then
      stale = true
    elseif entries[i - 1] ~= member then
      times[#times + 1] = s
    end
  end
  if stale then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. string.format('%.0f', cutoff2))
  end

  for r = 1, #limits do
    local start2, count = starts[r] * 2, 0
    for i = 1, #times do
      if times[i] >= start2 then count = count + 1 end
    end
    if count >= limits[r] then
      local reply = {0, now}
      for i = 1, #times do
        reply[#reply + 1] = (times[i] - times[i] % 2) / 2
      end
      return reply
    end
  end

  redis.call('ZADD', key, string.format('%.0f', now * 2), member)
  redis.call('PEXPIREAT', key, string.format('%.0f', expire_at))
  return {1, now}
end

-- A job whose key cannot be read (another type was written there) answers
-- {5, now} and leaves the others of the call unharmed; its first command is a read,
-- so it has written nothing.
local replies = {}
local a = 3
for k = 1, #KEYS do
  local nrules = tonumber(ARGV[a + 4])
  local ok, reply = pcall(admit, KEYS[k], ARGV[a], tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), a + 5, nrules)
  if ok then replies[k] = reply else replies[k] = {5, now} end
  a = a + 5 + 2 * nrules
end
return replies
