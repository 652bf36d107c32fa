-- Redis time, each plan resolved against it once for all its jobs, and where a
-- job's arguments are.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[ARG.lease])
local dedupe = tonumber(ARGV[ARG.dedupe])
local score = string.format('%.0f', now * 2)

-- One plan at ARGV[a]: whether now lies in its day, every rule's limit and start
-- (ms * 2, as scores are), the oldest score any rule or the duplicate check still
-- needs, and the key's expiry after a send; and where the next plan starts.
local function resolve_plan(a)
  local valid_from, valid_until = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local nrules = tonumber(ARGV[a + 4])
  local plan = {
    valid = now >= valid_from and now < valid_until,
    shadow = ARGV[a + 3] == '1',
    has_rules = nrules > 0,
    limits = {},
    starts2 = {},
  }
  local cutoff = now - dedupe + 1
  local expire_at = math.max(tonumber(ARGV[a + 2]), now + dedupe)
  for r = 0, nrules - 1 do
    local limit, bound = tonumber(ARGV[a + 5 + 2 * r]), tonumber(ARGV[a + 6 + 2 * r])
    local start = bound
    if bound < 0 then
      start = now + bound + 1
      expire_at = math.max(expire_at, now - bound)
    end
    plan.limits[r + 1] = limit
    plan.starts2[r + 1] = start * 2
    if start < cutoff then cutoff = start end
  end
  plan.cutoff2 = cutoff * 2
  plan.below_cutoff = '(' .. string.format('%.0f', cutoff * 2)
  plan.expire_at = string.format('%.0f', expire_at)
  return plan, a + 5 + 2 * nrules
end

local plans = {}
local jobs_at = ARG.first_plan
for p = 1, tonumber(ARGV[ARG.plans]) do
  plans[p], jobs_at = resolve_plan(jobs_at)
end
local jobs = #KEYS + tonumber(ARGV[ARG.undeclared])
local keys_at = jobs_at + 2 * jobs - #KEYS - 1

-- Job k's key, member and plan number.
local function job_key(k) return KEYS[k] or ARGV[keys_at + k] end
local function job_member(k) return ARGV[jobs_at + 2 * k - 2] end
local function job_plan(k) return tonumber(ARGV[jobs_at + 2 * k - 1]) end

-- Where section `name` of ARG starts, or nil when the call does not carry it.
local function section(name)
  local at = tonumber(ARGV[ARG[name]])
  if at == 0 then return nil end
  return at
end

-- A key's remembered sends other than `member`'s (their scores), from its ZRANGE
-- `entries`; what `plan` no longer needs is trimmed.
local function remembered(key, member, plan, entries)
  local stale = not plan.has_rules
  local times = {}
  for i = 2, #entries, 2 do
    local s = tonumber(entries[i])
    if s < plan.cutoff2 then
      stale = true
    elseif entries[i - 1] ~= member then
      times[#times + 1] = s
    end
  end
  if stale then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', plan.below_cutoff)
  end
  return times
end

-- Whether a rule of `plan` is full with `times` (scores).
local function is_full(plan, times)
  for r = 1, #plan.limits do
    local start2, count = plan.starts2[r], 0
    for i = 1, #times do
      if times[i] >= start2 then count = count + 1 end
    end
    if count >= plan.limits[r] then return true end
  end
  return false
end

-- Scores as times (ms), appended to `out` (a new table when nil).
local function as_ms(times, out)
  out = out or {}
  for i = 1, #times do
    out[#out + 1] = (times[i] - times[i] % 2) / 2
  end
  return out
end

-- Record a send of `member` in `key` now.
local function record(key, member, plan)
  redis.call('ZADD', key, score, member)
  redis.call('PEXPIREAT', key, plan.expire_at)
end
