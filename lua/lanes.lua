-- lanes.lua: rate.lua for a job in a lane (urgent, normal, bulk): one GCRA per
-- channel shared by every lane and every worker, where a lower lane takes only
-- while the bucket keeps a reserve for the higher lanes that have jobs waiting.
--
-- A lane "has jobs waiting" while one of its takes was refused and its retry is
-- not over (field u: urgent, n: normal, an instant in µs). Normal keeps a minimum
-- share: its own GCRA at share_interval (field s, counted only while lanes
-- compete); while normal is owed its share and waits, urgent keeps the reserve
-- for it. The reserve is per waiting lane above (bulk behind urgent and normal
-- keeps two). Without waiting lanes every lane takes exactly as in rate.lua.
--
-- KEYS[1]  the channel's key (as in rate.lua)
-- KEYS[2]  the channel's lane state, a hash {u, n, s} in the same slot
-- ARGV[1..4] as rate.lua: interval_us, burst, cost, asking
-- ARGV[5]  lane: 0 urgent, 1 normal, 2 bulk
-- ARGV[6]  reserve per waiting lane above, µs of the bucket
-- ARGV[7]  normal's share as an interval, µs (0: no minimum share)
-- ARGV[8]  look-ahead, µs (optional, default 0): grant slots whose time comes within
--          this of now; the caller waits for each one's time before using it (one
--          asker per lane and worker takes the slots of the next moments for the
--          jobs waiting behind it, instead of each job asking at its slot's instant)
-- ARGV[9]  candidates (optional, default 0): the tenants whose jobs wait in the
--          asker's line; then per candidate three values: its member in the
--          schedule (`-`: no tenant, `t:NAME`), its stride (UNIT / weight) and how
--          many of its jobs wait in the line
-- KEYS[3]  (with candidates) the lane's schedule: a sorted set of each tenant's
--          pass, and `~vt`, the pass of the last slot given (same slot as KEYS[1])
-- KEYS[4]  (with candidates) when each tenant was last presented (µs), a sorted set
--
-- Returns the fields of GCRA (lua/gcra.lua) by name, and when allowed LANE's below;
-- granted slot i (0-based) is due at the first one's time + i spans. With
-- candidates, granted slot i goes to candidate reply[9 + i] (0-based): stride
-- scheduling, each slot to the candidate of lowest pass that still has a job
-- waiting, its pass then moved by its stride. A tenant not in the schedule, or
-- further behind than LAG, starts LAG behind `~vt`: a tenant that comes (back)
-- gets its share at once, with at most LAG of credit. A candidate SLACK ahead of
-- a tenant another line presented within ACTIVE takes no slot (the other line's
-- does): shares add up across workers. No candidate picked: not yet, retry after
-- one span.
local LANE = {
  first_slot_in_us = 7, -- the first granted slot's time less now (negative: due)
  span_us = 8,          -- the span of one job
}
local key, state = KEYS[1], KEYS[2]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local asking = tonumber(ARGV[4] or '1')
local lane = tonumber(ARGV[5])
local reserve = tonumber(ARGV[6])
local share = tonumber(ARGV[7])
local ahead = tonumber(ARGV[8] or '0')
local candidates = tonumber(ARGV[9] or '0')
local now = gcra_now()
local LAG = 4000000

local SLACK = 2000000   -- how far ahead of a tenant waiting elsewhere one here may go
local ACTIVE = 400000   -- µs: a tenant presented this recently is waiting somewhere

-- the lowest pass (at least `floor`) of a tenant presented by another line within
-- ACTIVE (among the 16 lowest of the schedule), nil when none
local function elsewhere(fair, seen, here, floor)
  local low = redis.call('ZRANGE', fair, 0, 15, 'WITHSCORES')
  for j = 1, #low, 2 do
    local m = low[j]
    if m ~= '~vt' and not here[m] then
      local t = redis.call('ZSCORE', seen, m)
      if t and tonumber(t) > now - ACTIVE then return math.max(tonumber(low[j + 1]), floor) end
    end
  end
  return nil
end

-- the candidates that up to `granted` slots go to, in order (0-based), as above;
-- fewer (none) when the candidates here are SLACK ahead of a tenant that waits in
-- another worker's line: that line takes the slot
local function fair_picks(fair, seen, granted)
  local vt = tonumber(redis.call('ZSCORE', fair, '~vt') or '0')
  local floor = vt - LAG
  local names, strides, left, pass, moved, here = {}, {}, {}, {}, {}, {}
  for i = 1, candidates do
    local at = 10 + (i - 1) * 3
    names[i] = ARGV[at]
    strides[i] = tonumber(ARGV[at + 1])
    left[i] = tonumber(ARGV[at + 2])
    pass[i] = math.max(tonumber(redis.call('ZSCORE', fair, names[i]) or floor), floor)
    here[names[i]] = true
    redis.call('ZADD', seen, string.format('%.0f', now), names[i])
  end
  local other = elsewhere(fair, seen, here, floor)
  local picks = {}
  for s = 1, granted do
    local best = nil
    for i = 1, candidates do
      if left[i] > 0 and (best == nil or pass[i] < pass[best]) then best = i end
    end
    -- a candidate whose jobs here are all served is still waiting (more may come
    -- to this line or wait in another's)
    local bound = other
    for i = 1, candidates do
      if left[i] == 0 and (bound == nil or pass[i] < bound) then bound = pass[i] end
    end
    if best == nil or (bound and pass[best] >= bound + SLACK) then break end
    picks[s] = best - 1
    if pass[best] > vt then vt = pass[best] end
    pass[best] = pass[best] + strides[best]
    left[best] = left[best] - 1
    moved[best] = true
  end
  for i = 1, candidates do
    if moved[i] then redis.call('ZADD', fair, string.format('%.0f', pass[i]), names[i]) end
  end
  redis.call('ZADD', fair, string.format('%.0f', vt), '~vt')
  -- a tenant LAG behind is as one not there: its entry goes
  redis.call('ZREMRANGEBYSCORE', fair, '-inf', '(' .. string.format('%.0f', vt - LAG))
  redis.call('ZREMRANGEBYSCORE', seen, '-inf', string.format('%.0f', now - 60000000))
  redis.call('PEXPIRE', fair, 3600000)
  redis.call('PEXPIRE', seen, 3600000)
  return picks
end

-- a provider's throttle (lua/throttle.lua) leaves `tat:P:R`: read and kept exactly
-- as rate.lua does (read_tat and write_tat, lua/gcra.lua, put before this script)
local tat, ramp, ramp_end
tat, interval, ramp, ramp_end = read_tat(key, interval, now)
if cost > burst then
  return gcra_reply({allowed = ALLOWED.never, remaining = 0, retry_after_us = -1,
    reset_after_us = tat - now, tat_us = tat, granted = 0})
end

local f = redis.call('HMGET', state, 'u', 'n', 's')
local urgent_waits = tonumber(f[1] or 0) > now
local normal_waits = tonumber(f[2] or 0) > now
local share_tat = tonumber(f[3] or 0)
local owed = share > 0 and share_tat <= now and normal_waits
local above = 0
if lane == 0 then
  if owed then above = 1 end
elseif lane == 1 then
  if urgent_waits and not owed then above = 1 end
else
  if urgent_waits then above = above + 1 end
  if normal_waits then above = above + 1 end
end
local tolerance = interval * burst - reserve * above
local keep_ms = math.ceil((interval * burst + share + interval * cost) / 1000) + 1000

local allow_at = tat + interval * cost - tolerance
if allow_at > now + ahead then
  local retry = math.min(allow_at - now, tat - now + interval * cost) - ahead
  if lane < 2 then
    -- this lane waits until its retry, and a little longer for the retry to arrive
    local until_us = now + retry + interval * cost + 20000
    redis.call('HSET', state, lane == 0 and 'u' or 'n', string.format('%.0f', until_us))
    redis.call('PEXPIRE', state, keep_ms + math.ceil(retry / 1000))
  end
  return gcra_reply({allowed = ALLOWED.not_yet, remaining = 0, retry_after_us = retry,
    reset_after_us = tat - now, tat_us = tat, granted = 0})
end

local granted = asking
if cost > 0 then
  granted = math.min(asking, 1 + math.floor((now + ahead - allow_at) / (interval * cost)))
end
local picks = {}
if candidates > 0 then
  picks = fair_picks(KEYS[3], KEYS[4], granted)
  if #picks == 0 then
    -- a tenant waiting in another worker's line is owed the slot: it takes it
    return gcra_reply({allowed = ALLOWED.not_yet, remaining = 0,
      retry_after_us = math.max(interval * cost, 2000), reset_after_us = tat - now,
      tat_us = tat, granted = 0})
  end
  granted = #picks
end
local new_tat = tat + interval * cost * granted
local remaining = math.max(0, math.floor((now - (new_tat - interval * burst)) / interval))
if cost > 0 then write_tat(key, new_tat, ramp, ramp_end, now) end
if lane == 1 and share > 0 and (urgent_waits or normal_waits) then
  -- normal's share is counted only while lanes compete; a slot it was owed but
  -- asked for late is still its own (up to one share interval back), so over time
  -- it gets at least its share
  local s = math.max(share_tat, now - share) + share * granted
  redis.call('HSET', state, 's', string.format('%.0f', s))
  redis.call('PEXPIRE', state, keep_ms + math.ceil((s - now) / 1000))
end
local out = gcra_reply({allowed = ALLOWED.yes, remaining = remaining, retry_after_us = 0,
  reset_after_us = new_tat - now, tat_us = new_tat, granted = granted,
  first_slot_in_us = allow_at - now, span_us = interval * cost}, LANE)
for i = 1, #picks do out[8 + i] = picks[i] end
return out
