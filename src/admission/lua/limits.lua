-- Section `limits`: the limits each job meets (`[limits.NAME]`), by job number (a
-- job meeting none has no entry). Each limit is a GCRA bucket whose key holds its
-- theoretical arrival time (TAT, integer microseconds of Redis TIME, written with
-- %.0f); a missing key is a full bucket. A job of cost c passes a limit of
-- interval I and burst B when max(TAT, now) + I * c - I * B <= now; taking it
-- leaves TAT = max(TAT, now) + I * c, and the key expires at that TAT (an idle
-- bucket is a full one: nothing is lost when it goes).
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

-- Whether every limit of `list` (nil: none) admits its job's cost now. Nothing is
-- written. Returns nil when all do (each limit then knows the TAT a take leaves);
-- else the instant (ms, rounded up) at which the latest of the refusing ones
-- allows, and that limit's number in `list`.
local function limits_refuse(list)
  if not list then return nil end
  local latest, which = nil, nil
  for i = 1, #list do
    local l = list[i]
    local tat = tonumber(redis.call('GET', l.key) or '0')
    if tat < now_us then tat = now_us end
    local allow_at = tat + l.interval * (l.cost - l.burst)
    if allow_at > now_us and (not latest or allow_at > latest) then
      latest, which = allow_at, i
    end
    l.tat = tat + l.interval * l.cost
  end
  if not latest then return nil end
  return math.ceil(latest / 1000), which
end

-- Take every limit of `list` (nil: none), once `limits_refuse` said all admit.
local function take_limits(list)
  if not list then return end
  for i = 1, #list do
    local l = list[i]
    redis.call('SET', l.key, string.format('%.0f', l.tat),
      'PXAT', string.format('%.0f', math.ceil(l.tat / 1000)))
  end
end
