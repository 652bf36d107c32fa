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
  st.parsed, st.ramp, st.ramp_end = true, '', 0
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

-- A quota's counter: the count it holds.
local function parse_counter(st)
  st.parsed, st.count = true, tonumber(st.raw or '0')
end

-- The buckets by number (each {st = its key's state, interval, burst}), and the
-- limits by job number: a flat list of triples (bucket, the job's cost, and the
-- TAT or count a take leaves, once checked), its length in `n`.
local limits = {}
do
  local at = section('limits')
  if at then
    local d = tonumber(ARGV[at])
    local buckets, states, keys = {}, {}, {}
    for i = 1, d do
      local a = at + 3 * i - 2
      local key = ARGV[a]
      if not states[key] then
        states[key] = true
        keys[#keys + 1] = key
      end
      buckets[i] = {key = key, interval = tonumber(ARGV[a + 1]), burst = tonumber(ARGV[a + 2])}
    end
    for from = 1, #keys, 1000 do
      local last = math.min(from + 999, #keys)
      local raw = redis.call('MGET', unpack(keys, from, last))
      -- each key's state: its value as read (false: missing), parsed on its first
      -- use (`parse_bucket`, `parse_counter`)
      for i = from, last do states[keys[i]] = {key = keys[i], raw = raw[i - from + 1]} end
    end
    for i = 1, d do buckets[i].st = states[buckets[i].key] end
    local b = at + 1 + 3 * d
    for _ = 1, tonumber(ARGV[b]) do
      local k, count = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
      local list = {n = count}
      for i = 1, count do
        local c = b + 1 + 2 * i
        list[3 * i - 2], list[3 * i - 1] = buckets[tonumber(ARGV[c])], tonumber(ARGV[c + 1])
      end
      limits[k] = list
      b = b + 2 + 2 * count
    end
  end
end

-- Whether every limit of `list` (nil: none) admits its job now. Nothing is
-- changed but `list`'s third values (what a take leaves). Returns nil when all do;
-- else the instant (ms, rounded up) at which the latest of the refusing ones
-- allows, and that limit's number in `list`.
local function limits_refuse(list)
  if not list then return nil end
  local latest, which = nil, nil
  for i = 1, list.n do
    local l, cost = list[3 * i - 2], list[3 * i - 1]
    local st = l.st
    local allow_at
    if not st.parsed then
      if l.interval == 0 then parse_counter(st) else parse_bucket(st) end
    end
    if l.interval == 0 then
      -- a quota's counter: its instant, when full, is its period's end
      list[3 * i] = st.count + 1
      if st.count >= l.burst then allow_at = cost * 1000 end
    else
      local interval = l.interval
      if st.share then interval = math.ceil(interval / st.share) end
      local tat = st.tat
      if tat < now_us then tat = now_us end
      list[3 * i] = tat + interval * cost
      local at = tat + interval * (cost - l.burst)
      if at > now_us then allow_at = at end
    end
    if allow_at and (not latest or allow_at > latest) then
      latest, which = allow_at, i
    end
  end
  if not latest then return nil end
  return math.ceil(latest / 1000), which
end

-- The buckets taken from, in the order of their first take (written by
-- `write_limits`).
local taken = {}

-- Take every limit of `list` (nil: none), once `limits_refuse` said all admit.
local function take_limits(list)
  if not list then return end
  for i = 1, list.n do
    local l = list[3 * i - 2]
    local st = l.st
    if not st.taken then
      st.taken = true
      taken[#taken + 1] = st
    end
    if l.interval == 0 then
      st.count, st.expires = list[3 * i], list[3 * i - 1]
    else
      st.tat = list[3 * i]
    end
  end
end

-- The TATs (or counts) `list`'s takes left, in its order, appended to `payload`.
local function taken_by(list, payload)
  for i = 1, list.n do payload[#payload + 1] = list[3 * i] end
  payload[#payload + 1] = list.n
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
