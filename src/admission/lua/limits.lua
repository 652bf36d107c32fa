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
local limits = {}
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
do
  local at = section('limits')
  if at then
    local b = at + 1
    for _ = 1, tonumber(ARGV[at]) do
      local k, count = tonumber(ARGV[b]), tonumber(ARGV[b + 1])
      local list = {}
      for i = 1, count do
        local c = b + 4 * i - 2
        list[i] = {key = ARGV[c], interval = tonumber(ARGV[c + 1]),
                   burst = tonumber(ARGV[c + 2]), cost = tonumber(ARGV[c + 3])}
      end
      limits[k] = list
      b = b + 2 + 4 * count
    end
  end
end

-- A bucket a `throttled` feedback paused (lua/throttle.lua, as a channel's rate)
-- holds `tat:P:R`: paused until P, then ramping back over R (µs). Returns the TAT,
-- the interval in force (ten times the limit's until P, then shrinking linearly
-- to the limit's at P + R, as lua/gcra.lua's read_tat), the suffix to keep while
-- ramping ('' after) and P + R (0 after).
local function limit_tat(raw, interval)
  if not raw then return 0, interval, '', 0 end
  local c = string.find(raw, ':', 1, true)
  if not c then return tonumber(raw), interval, '', 0 end
  local p, r = string.match(string.sub(raw, c), '^:(%d+):(%d+)$')
  p, r = tonumber(p), tonumber(r)
  local tat = tonumber(string.sub(raw, 1, c - 1))
  if not p or now_us >= p + r then return tat, interval, '', 0 end
  local share = 0.1
  if now_us > p then share = 0.1 + 0.9 * (now_us - p) / r end
  return tat, math.ceil(interval / share), string.sub(raw, c), p + r
end

-- Whether a quota's counter (`l.interval` 0) admits one more job now; its instant
-- (µs) when not: its period's end. It then knows the count a take leaves.
local function quota_refuses(l)
  local n = tonumber(redis.call('GET', l.key) or '0')
  l.tat = n + 1
  if n >= l.burst then return l.cost * 1000 end
  return nil
end

-- Whether a GCRA bucket admits its job's cost now; the instant (µs) at which it
-- would when not. It then knows the TAT a take leaves (and the throttle's ramp).
local function bucket_refuses(l)
  local tat, interval, ramp, ramp_end = limit_tat(redis.call('GET', l.key), l.interval)
  if tat < now_us then tat = now_us end
  local allow_at = tat + interval * (l.cost - l.burst)
  l.tat, l.ramp, l.ramp_end = tat + interval * l.cost, ramp, ramp_end
  if allow_at > now_us then return allow_at end
  return nil
end

-- Whether every limit of `list` (nil: none) admits its job now. Nothing is
-- written. Returns nil when all do (each limit then knows what a take leaves);
-- else the instant (ms, rounded up) at which the latest of the refusing ones
-- allows, and that limit's number in `list`.
local function limits_refuse(list)
  if not list then return nil end
  local latest, which = nil, nil
  for i = 1, #list do
    local l = list[i]
    local allow_at
    if l.interval == 0 then allow_at = quota_refuses(l) else allow_at = bucket_refuses(l) end
    if allow_at and (not latest or allow_at > latest) then
      latest, which = allow_at, i
    end
  end
  if not latest then return nil end
  return math.ceil(latest / 1000), which
end

-- Take every limit of `list` (nil: none), once `limits_refuse` said all admit.
local function take_limits(list)
  if not list then return end
  for i = 1, #list do
    local l = list[i]
    if l.interval == 0 then
      redis.call('SET', l.key, string.format('%.0f', l.tat), 'PXAT', string.format('%.0f', l.cost))
    else
      redis.call('SET', l.key, string.format('%.0f', l.tat) .. l.ramp,
        'PXAT', string.format('%.0f', math.ceil(math.max(l.tat, l.ramp_end) / 1000)))
    end
  end
end
