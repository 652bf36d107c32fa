-- admit.lua: for each job, check every rule of its recipient's policy (and of the
-- caps it meets: the layers section below) and, if all pass, record the send. One
-- call may carry many jobs (the engine batches the admissions that are waiting at
-- the same moment into one call); they are decided in order, each seeing the sends
-- recorded for the ones before it.
--
-- One sorted set per (recipient, policy[, channel]), and one per (recipient,
-- cap[, channel]) for the caps (all in the recipient's hash slot). member = a hash of the job id,
-- score = admitted_ms * 2 + state, where state 0 = reserved (dispatch in progress)
-- and 1 = committed (dispatch confirmed; set by the worker with ZADD XX).
-- Time comes from Redis TIME (milliseconds, integers), so every worker shares one clock.
--
-- The jobs of one call mostly share a plan (the same policy in the same time zone
-- on the same local day), so each distinct plan is sent once and every job names
-- its plan by number: two arguments per job instead of nine, which is most of what
-- Redis spends reading a job's arguments.
--
-- KEYS[k]  the sorted set of job k's recipient
-- ARGV[1]  lease ms: a reservation younger than this belongs to a live worker
-- ARGV[2]  dedupe ms: keep every send at least this long, to recognise duplicates
-- ARGV[3]  E, the number of jobs whose key is not among KEYS (on a Redis Cluster: a
--          call declares one key, which routes it to the node that owns its slot,
--          and carries the keys of the other jobs that node owns as arguments; the
--          worker loads the script there with the flag allow-cross-slot-keys)
-- ARGV[4]  P, the number of plans; then P plans, each of 5 + 2n values:
--   valid_from ms  } the local day the caller planned for: calendar starts below
--   valid_until ms } are only right while valid_from <= now < valid_until
--   calendar expiry ms: when a send made today stops counting (0 if no calendar rule)
--   shadow: 1 if the policy is in shadow mode (a refused job is recorded all the
--   same and answers 6), else 0
--   n, the number of rules, then n pairs (limit, bound): bound > 0 is the inclusive
--   start (ms) of a calendar window; bound < 0 is minus the length (ms) of a rolling one
-- then, for each job k in order: member (job id hash), plan number (1..P)
-- then the keys of jobs #KEYS + 1 .. #KEYS + E, in order
-- then, only when some job of the call meets caps (the layers section; a call whose
-- jobs meet none ends above, and runs exactly as without caps):
--   the word "L"; Q, the number of jobs that meet caps; then for each of them:
--   k, its number in the call (1..jobs); L, its number of layers; then L triples:
--     key (the cap's sorted set, in the slot of the job's key), plan number
--     (1..P), holds (1: the cap may refuse the job; 0: it only counts it)
--
-- Returns one flat array: now (ms), then for each job in order its code and what
-- follows that code (a flat reply spares Redis and the caller a table per job):
--   1                 admitted, recorded with score now*2 (in its key and in every
--                     layer's)
--   0, m, t1 .. tm    refused; t = times (ms) of the m sends still remembered
--   6, m, t1 .. tm    a shadow policy's rules would refuse it; recorded as admitted
--                     (score now*2) all the same; t as for 0
--   2                 duplicate: this job was already dispatched (its own key says:
--                     its layers are not read)
--   3, reserved_at    another worker holds a live reservation for this job
--   4                 now is outside [valid_from, valid_until): plan again with now
--   5                 the key holds something else than a sorted set
--   7                 the key is not on this node (a Redis Cluster whose slots moved
--                     since the worker last read their owners): nothing was
--                     written for this job; ask again with its key declared
--   8, n, then n blocks (m, t1 .. tm)
--                     a job with layers, refused by its policy or a cap that holds
--                     it: block 1 is the times of its policy's remembered sends,
--                     block 1 + i those of its i-th layer (m = 0 for a layer that
--                     only counts); nothing was recorded
-- A job with layers is admitted only when its policy (unless in shadow mode) and
-- every layer that holds it pass; it is then recorded in its key and every layer's.
--   12                as 1, and 13, m, t1 .. tm as 6, for a job that took over its
--                     own abandoned reservation (older than the lease): its earlier
--                     dispatch may have gone out, so the worker never frees the
--                     recipient's slot for it (it keeps the reservation instead)
--   9, kind, since, until  suppressed (see the suppression section below): nothing
--                     was written for this job
--   10, what          opted out (see the preferences section below): nothing was
--                     written for this job
--   11, version       quiet hours to compute (the preferences section): nothing
--                     was written for this job
--   14, version, m, t1 .. tm
--   15, version, n, then n blocks (m, t1 .. tm)
--                     as 0 and 8, for a job whose recipient has quiet hours (of
--                     that version) that do not allow its priority (the preferences
--                     section, when the worker's version was the stored one): the
--                     worker pushes the instant the caps give past them, one instant
--                     for both; without the preferences section, or without such
--                     quiet hours, a refusal answers 0 or 8 as always
--
-- Suppression section (optional, after the layers section if any, else after the
-- keys of the undeclared jobs; opened by the word "S"; the worker sends it only while
-- some recipient may be suppressed, so without suppressions a call carries and does
-- nothing more):
--   ARGV[s]            L, the length of the key prefix: a job's suppressions are the
--                      hash named by the first L + 19 bytes of its key (`prefix:{tag}`)
--                      followed by `/suppressed`; field = channel, value =
--                      kind:since_ms:until_ms (kind 1 bounced, 2 complained, 4
--                      unsubscribed; until 0: until removed)
--   ARGV[s+1 .. s+P]   each plan's suppressed_by mask (the sum of the kinds' bits)
--   ARGV[s+P+k]        job k's channel
--   A job whose channel's field holds a kind in its plan's mask, with until 0 or after
--   now, answers 8 before anything else is read or written for it.
--
-- Preferences section (optional, after the suppression section if any, else where
-- that would begin; opened by the word "P"; the worker sends it only while the key
-- `prefix:preferences` says some recipient has a set, so without preferences a call
-- carries and does nothing more):
--   ARGV[r]            L, the key prefix's length: a job's preferences are the hash
--                      named by the first L + 19 bytes of its key followed by
--                      `/prefs`; fields `c:CATEGORY`, `h:CHANNEL`,
--                      `p:CATEGORY:CHANNEL` hold 1 when the recipient opted out
--                      (`quiet` = the set's version while it has quiet hours, and
--                      `qa:PRIORITY` for each priority they allow)
--   then five values per job: its category, channel and priority, and what the
--   worker knows of its recipient's quiet hours: the version it computed them for
--   and the instant (ms) before which they do not begin (0 0: nothing known); an
--   empty category: the job's policy is required, nothing is read for it
--   A job opted out answers 10, what (1 its category, 2 its channel, 3 the pair)
--   before anything else is read or written for it. A job whose recipient has quiet
--   hours that do not allow its priority, when the worker's version is not the
--   stored one or now is past the instant it gave, answers 11, version: nothing was
--   written; the worker computes the quiet hours (pure) and asks again, or delays it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local dedupe = tonumber(ARGV[2])

-- Each plan, resolved against now once for all its jobs: whether now lies in its
-- day, every rule's limit and start (ms * 2, as scores are), the oldest score any
-- rule or the duplicate check still needs, and the key's expiry after a send.
local plans = {}
local undeclared = tonumber(ARGV[3])
local a = 5
for p = 1, tonumber(ARGV[4]) do
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
  plans[p] = plan
  a = a + 5 + 2 * nrules
end
local score = string.format('%.0f', now * 2)
-- whether the job being admitted took over its own abandoned reservation
local inherited = false

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

-- ===== layers (caps) =====
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

-- The rest of a job's admission when it meets caps, once its own key said it is
-- neither a duplicate nor reserved: `times` are its policy's remembered sends.
local function admit_layers(key, member, plan, times, layers)
  local policy_full = is_full(plan, times)
  local refused = policy_full and not plan.shadow
  local blocks = {times}
  for i = 1, #layers do
    local l = layers[i]
    if not l.plan.valid then return 4 end
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
  if refused then return 8, blocks end
  redis.call('ZADD', key, score, member)
  redis.call('PEXPIREAT', key, plan.expire_at)
  for i = 1, #layers do
    local l = layers[i]
    redis.call('ZADD', l.key, score, member)
    redis.call('PEXPIREAT', l.key, l.plan.expire_at)
  end
  if policy_full then return 6, times end
  return 1
end
-- ===== end of layers =====

-- One job's verdict: its code, and the reserved time (3) or the remembered send
-- scores (0). Numbers given to redis.call are strings: Lua would format each with
-- sprintf.
local function admit(key, member, plan, layers)
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

  if existing then
    if existing % 2 == 1 then
      return 2
    end
    local reserved_at = (existing - existing % 2) / 2
    if now - reserved_at < lease then
      -- a write (the key's expiry set again), so that a WAIT after this call
      -- covers the reservation too, whichever connection recorded it
      redis.call('PEXPIREAT', key, plan.expire_at)
      return 3, reserved_at
    end
    -- an abandoned reservation (its worker died before confirming, perhaps after
    -- its dispatch went out): decided afresh, but it stays counted until this
    -- admission replaces it (a refusal leaves it), and the admission says it
    -- inherited it (12, 13) so that the worker keeps it rather than free it
    inherited = true
  end

  if not plan.valid then
    return 4
  end

  -- forget what no rule and no duplicate check needs any more
  local times = remembered(key, member, plan, entries)
  if layers then
    return admit_layers(key, member, plan, times, layers)
  end

  for r = 1, #plan.limits do
    local start2, count = plan.starts2[r], 0
    for i = 1, #times do
      if times[i] >= start2 then count = count + 1 end
    end
    if count >= plan.limits[r] then
      if not plan.shadow then
        return 0, times
      end
      redis.call('ZADD', key, score, member)
      redis.call('PEXPIREAT', key, plan.expire_at)
      return 6, times
    end
  end

  redis.call('ZADD', key, score, member)
  redis.call('PEXPIREAT', key, plan.expire_at)
  return 1
end

-- A job whose key cannot be read (another type was written there, or it lives on
-- another node) answers 5 or 7 and leaves the others of the call unharmed; its
-- first command is a read, so it has written nothing.
local function failure(e)
  local text = type(e) == 'table' and e.err or tostring(e)
  if string.find(text, 'non local key', 1, true) or string.find(text, 'MOVED', 1, true)
    or string.find(text, 'ASK', 1, true) then
    return 7
  end
  return 5
end
local out = {now}
local n = 1
local jobs = #KEYS + undeclared
local tail = a + 2 * jobs - #KEYS - 1

-- ===== the layers section (opened by "L"), by job number =====
local layers = {}
local b = a + 2 * jobs + undeclared
if ARGV[b] == 'L' then
  b = b + 2
  for _ = 1, tonumber(ARGV[b - 1]) do
    local list = {}
    for i = 1, tonumber(ARGV[b + 1]) do
      local c = b + 3 * i - 1
      list[i] = {key = ARGV[c], plan = plans[tonumber(ARGV[c + 1])], holds = ARGV[c + 2] == '1'}
    end
    layers[tonumber(ARGV[b])] = list
    b = b + 2 + 3 * #list
  end
end

-- >>> suppression: the optional section (opened by "S") after the layers (see the header)
local supp_at = nil
if ARGV[b] == 'S' then supp_at = b + 1 end
local function suppressed(key, k, p)
  local mask = tonumber(ARGV[supp_at + p])
  if mask == 0 then return nil end
  local hash = string.sub(key, 1, tonumber(ARGV[supp_at]) + 19) .. '/suppressed'
  local v = redis.call('HGET', hash, ARGV[supp_at + tonumber(ARGV[4]) + k])
  if not v then return nil end
  local kind, since, till = string.match(v, '^(%d+):(%d+):(%d+)$')
  kind, since, till = tonumber(kind), tonumber(since), tonumber(till)
  if not kind or math.floor(mask / kind) % 2 == 0 then return nil end
  if till ~= 0 and till <= now then return nil end
  return 9, {kind, since, till}
end
-- <<< suppression

-- >>> preferences: the optional section (opened by "P") after the suppressions
local pref_at = nil
-- the job's recipient's quiet hours' version, when they do not allow its priority
local quiet_version = nil
local r = b
if supp_at then r = supp_at + tonumber(ARGV[4]) + jobs + 1 end
if ARGV[r] == 'P' then pref_at = r + 1 end
local function opted_out(key, k)
  local at = pref_at + 5 * k - 4
  local category = ARGV[at]
  if category == '' then return nil end
  local channel = ARGV[at + 1]
  local hash = string.sub(key, 1, tonumber(ARGV[pref_at]) + 19) .. '/prefs'
  local v = redis.call('HMGET', hash, 'c:' .. category, 'h:' .. channel,
    'p:' .. category .. ':' .. channel, 'quiet', 'qa:' .. ARGV[at + 2])
  for i = 1, 3 do
    if v[i] then return 10, i end
  end
  if v[4] and not v[5] then
    if v[4] ~= ARGV[at + 3] or now >= tonumber(ARGV[at + 4]) then
      return 11, tonumber(v[4])
    end
    -- outside them now: a refusal says so (14, 15), for one instant with the caps'
    quiet_version = tonumber(v[4])
  end
  return nil
end
-- <<< preferences

for k = 1, jobs do
  local key = KEYS[k] or ARGV[tail + k]
  inherited = false
  quiet_version = nil
  -- >>> suppression: one HGET per job, only when the section is present
  local ok, code, extra = true, nil, nil
  if supp_at then
    ok, code, extra = pcall(suppressed, key, k, tonumber(ARGV[a + 1]))
  end
  -- <<< suppression
  -- >>> preferences: one HMGET per job, only when the section is present
  if ok and not code and pref_at then
    ok, code, extra = pcall(opted_out, key, k)
  end
  -- <<< preferences
  if ok and not code then
    ok, code, extra = pcall(admit, key, ARGV[a], plans[tonumber(ARGV[a + 1])], layers[k])
  end
  if not ok then code = failure(code) end
  if inherited and (code == 1 or code == 6) then code = code == 1 and 12 or 13 end
  -- >>> preferences: a refusal carries the quiet hours' version (14, 15)
  if quiet_version and (code == 0 or code == 8) then
    out[n + 1] = code == 0 and 14 or 15
    out[n + 2] = quiet_version
    n = n + 2
  else
    n = n + 1
    out[n] = code
  end
  -- <<< preferences
  if code == 3 or code == 10 or code == 11 then
    n = n + 1
    out[n] = extra
  elseif code == 9 then
    for i = 1, 3 do
      n = n + 1
      out[n] = extra[i]
    end
  elseif code == 0 or code == 6 or code == 13 then
    n = n + 1
    out[n] = #extra
    for i = 1, #extra do
      n = n + 1
      out[n] = (extra[i] - extra[i] % 2) / 2
    end
  elseif code == 8 then
    n = n + 1
    out[n] = #extra
    for l = 1, #extra do
      local t = extra[l]
      n = n + 1
      out[n] = #t
      for i = 1, #t do
        n = n + 1
        out[n] = (t[i] - t[i] % 2) / 2
      end
    end
  end
  a = a + 2
end
return out
