-- Section `limits`: the limits each job meets (`[limits.NAME]`), by job number (a
-- job meeting none has no entry). Each limit is a GCRA bucket whose key holds its
-- theoretical arrival time (TAT, integer microseconds of Redis TIME, written with
-- %.0f); a missing key is a full bucket. A job of cost c passes a limit of
-- interval I and burst B when max(TAT, now) + I * c - I * B <= now; taking it
-- leaves TAT = max(TAT, now) + I * c, and the key expires at that TAT (an idle
-- bucket is a full one: nothing is lost when it goes).
-- A quota (a cap with scope `tenant` or `sender`) comes as a limit of interval 0:
-- its key is a counter of one calendar period, burst the count it allows, cost
-- the period's end (ms); a job passes while the counter is below the count, and
-- taking it adds one, the key expiring at the period's end.
--
-- The jobs of one call mostly share buckets (one for all, one per tenant), so the
-- call names each distinct bucket once and every job names its buckets by number.
-- Every bucket's key is read once, by one MGET, when the section is read; the
-- jobs then check and take from that state in order (each seeing the takes of the
-- ones before it), and each bucket taken from is written once, by one SET, after
-- the last job (`write_limits`): the call is atomic, so this is exactly what a
-- GET and a SET per job would leave.
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- A bucket a `throttled` feedback paused (lua/throttle.lua, as a channel's rate)
-- holds `tat:P:R`: paused until P, then ramping back over R (µs). Sets the state's
-- TAT, the share of the limit's rate in force now (nil: all of it; ten per cent
-- until P, then growing linearly to all at P + R, as lua/gcra.lua's read_tat), the
-- suffix to keep while ramping ('' after) and P + R (0 after).
local function parse_bucket(st)
  st.ramp, st.ramp_end = '', 0
  local raw = st.raw
  if not raw then st.tat = 0 return end
  local c = string.find(raw, ':', 1, true)
  if not c then st.tat = tonumber(raw) return end
  local p, r = string.match(string.sub(raw, c), '^:(%d+):(%d+)$')
  p, r = tonumber(p), tonumber(r)
  st.tat = tonumber(string.sub(raw, 1, c - 1))
  if not p or now_us >= p + r then return end
  local share = 0.1
  if now_us > p then share = 0.1 + 0.9 * (now_us - p) / r end
  st.share, st.ramp, st.ramp_end = share, string.sub(raw, c), p + r
end

-- The buckets by number: key, interval, burst, a counter's period's end (ms) and
-- the state of its key (shared by the buckets of one key).
local b_interval, b_burst, b_expires, b_state = {}, {}, {}, {}
-- The limits of job k (none: `lim_n[k]` nil): the entries lim_at[k] + 1 ..
-- lim_at[k] + lim_n[k] of `l_bucket` (bucket numbers), all taking the job's cost
-- `lim_cost[k]`; `l_next` holds what a take would leave (a TAT, or a count),
-- once checked. Flat arrays: a job's limits cost no table of their own.
local lim_at, lim_n, lim_cost = {}, {}, {}
local l_bucket, l_next = {}, {}
do
  local at = section('limits')
  if at then
    local argv = ARGV
    local d = tonumber(argv[at])
    local states, keys = {}, {}
    for i = 1, d do
      local a = at + 4 * i - 3
      local key = argv[a]
      if not states[key] then
        states[key] = true
        keys[#keys + 1] = key
      end
      b_interval[i], b_burst[i] = tonumber(argv[a + 1]), tonumber(argv[a + 2])
      b_expires[i] = tonumber(argv[a + 3])
    end
    for from = 1, #keys, 1000 do
      local last = math.min(from + 999, #keys)
      local raw = redis.call('MGET', unpack(keys, from, last))
      -- each key's state: its value as read (false: missing), parsed on its first
      -- use (`parse_bucket`, or as a counter)
      for i = from, last do states[keys[i]] = {key = keys[i], raw = raw[i - from + 1]} end
    end
    for i = 1, d do b_state[i] = states[argv[at + 4 * i - 3]] end
    local b = at + 1 + 4 * d
    local e = 0
    for _ = 1, tonumber(argv[b]) do
      local k, cost, count = tonumber(argv[b + 1]), tonumber(argv[b + 2]), tonumber(argv[b + 3])
      lim_at[k], lim_n[k], lim_cost[k] = e, count, cost
      for i = 1, count do l_bucket[e + i] = tonumber(argv[b + 3 + i]) end
      e = e + count
      b = b + 3 + count
    end
  end
end

-- Job k's limits, as the admission passes them on (nil: it meets none).
local function limits_of(k)
  if lim_n[k] then return k end
  return nil
end

-- Whether every limit of job `k` (nil: none) admits it now. Nothing is changed
-- but `l_next` (what a take leaves). Returns nil when all do; else the instant
-- (ms, rounded up) at which the latest of the refusing ones allows, and that
-- limit's number among the job's.
local function limits_refuse(k)
  if not k then return nil end
  local e, cost = lim_at[k], lim_cost[k]
  local latest, which = nil, nil
  for i = 1, lim_n[k] do
    local n = l_bucket[e + i]
    local st, interval, allow_at = b_state[n], b_interval[n], nil
    if interval == 0 then
      -- a quota's counter: its instant, when full, is its period's end
      local count = st.count
      if not count then
        count = tonumber(st.raw or '0')
        st.count = count
      end
      l_next[e + i] = count + 1
      if count >= b_burst[n] then allow_at = b_expires[n] * 1000 end
    else
      local tat = st.tat
      if not tat then
        parse_bucket(st)
        tat = st.tat
      end
      if st.share then interval = math.ceil(interval / st.share) end
      if tat < now_us then tat = now_us end
      l_next[e + i] = tat + interval * cost
      local at = tat + interval * (cost - b_burst[n])
      if at > now_us then allow_at = at end
    end
    if allow_at and (not latest or allow_at > latest) then
      latest, which = allow_at, i
    end
  end
  if not latest then return nil end
  return math.ceil(latest / 1000), which
end

-- The buckets' states taken from, in the order of their first take (written by
-- `write_limits`).
local taken = {}

-- Take every limit of job `k` (nil: none), once `limits_refuse` said all admit.
local function take_limits(k)
  if not k then return end
  local e = lim_at[k]
  for i = 1, lim_n[k] do
    local n = l_bucket[e + i]
    local st = b_state[n]
    if not st.taken then
      st.taken = true
      taken[#taken + 1] = st
    end
    if b_interval[n] == 0 then
      st.count, st.expires = l_next[e + i], b_expires[n]
    else
      st.tat = l_next[e + i]
    end
  end
end

-- The TATs (or counts) job k's takes left, in its limits' order, then their
-- number, appended to `payload`.
local function taken_by(k, payload)
  local e, n = lim_at[k], lim_n[k]
  local m = #payload
  for i = 1, n do payload[m + i] = l_next[e + i] end
  payload[m + n + 1] = n
end

-- Write every bucket taken from, once: a counter expiring at its period's end; a
-- TAT (with its ramp while it lasts) expiring when the bucket is full again.
local function write_limits()
  for i = 1, #taken do
    local st = taken[i]
    if st.count then
      redis.call('SET', st.key, string.format('%.0f', st.count),
        'PXAT', string.format('%.0f', st.expires))
    else
      redis.call('SET', st.key, string.format('%.0f', st.tat) .. st.ramp,
        'PXAT', string.format('%.0f', math.ceil(math.max(st.tat, st.ramp_end) / 1000)))
    end
  end
end
