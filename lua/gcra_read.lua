-- gcra_read.lua: the read that rate.lua and lanes.lua share, put before each of
-- them when the worker loads it (src/redis/scripts.rs), so that both read a
-- channel's rate key the same way.
--
-- read_tat(key, interval, now) reads the channel's theoretical arrival time (TAT,
-- integer µs of Redis TIME) and the throttle a provider's 429 may have left on it
-- (lua/throttle.lua writes `tat:P:R`: paused until P, then ramping back over R).
-- Returns:
--   tat       the TAT, never before now (a missing key: a full bucket)
--   interval  the interval in force: ten times the configured one until P, then
--             shrinking so that the rate climbs linearly from a tenth of the
--             configured rate to all of it at P + R; the configured one after
--   ramp      the suffix `:P:R` to keep with the next TAT while ramping, else ''
--   ramp_end  P + R while ramping, else 0
local function read_tat(key, interval, now)
  local raw = redis.call('GET', key)
  local tat, ramp, ramp_end = now, '', 0
  if raw then
    local c = string.find(raw, ':', 1, true)
    if c then
      local p, r = string.match(string.sub(raw, c), '^:(%d+):(%d+)$')
      p, r = tonumber(p), tonumber(r)
      if p and now < p + r then
        ramp, ramp_end = string.sub(raw, c), p + r
        local share = 0.1
        if now > p then share = 0.1 + 0.9 * (now - p) / r end
        interval = math.ceil(interval / share)
      end
      raw = string.sub(raw, 1, c - 1)
    end
    tat = tonumber(raw)
  end
  if tat < now then tat = now end
  return tat, interval, ramp, ramp_end
end

