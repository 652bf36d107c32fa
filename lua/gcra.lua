-- gcra.lua: what rate.lua and lanes.lua share, put before each of them when the
-- worker loads it (src/redis/scripts.rs): their reply's names, Redis time, the read
-- of a channel's rate key and the write of the TAT a take leaves, so that both
-- answer, read and write a channel's rate the same way.
--
-- The reply is an array; its fields by position (src/redis/rate.rs reads them by
-- the same names, and a test checks that both sides agree). Each script may add
-- fields of its own after these (RATE in rate.lua, LANE in lanes.lua).
local GCRA = {
  allowed = 1,          -- one of ALLOWED
  remaining = 2,        -- jobs that could still go right now after the granted ones
  retry_after_us = 3,   -- when not allowed: how long until it would be
  reset_after_us = 4,   -- time until the bucket is full again
  tat_us = 5,           -- the TAT the call left (absolute, µs of Redis time)
  granted = 6,          -- how many of the jobs asking may go (0 unless allowed yes)
}
-- What `allowed` says.
local ALLOWED = {
  yes = 1,              -- for the first `granted` jobs
  not_yet = 0,          -- retry after retry_after_us
  never = -1,           -- the cost is above the burst
}

-- The reply array of `fields` (name -> value) laid out by GCRA, then by `extra`
-- (the script's own fields, if any); a field left out must come after every field
-- given (Redis ends the array at the first one missing).
local function gcra_reply(fields, extra)
  local out = {}
  for name, at in pairs(GCRA) do out[at] = fields[name] end
  if extra then
    for name, at in pairs(extra) do out[at] = fields[name] end
  end
  return out
end

-- Redis time, in integer µs.
local function gcra_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

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

-- write_tat(key, new_tat, ramp, ramp_end, now) keeps the TAT a take left (with the
-- throttle's suffix while ramping) as long as it or the ramp matters. The TAT is
-- written with %.0f (Lua's tostring keeps only 14 digits).
local function write_tat(key, new_tat, ramp, ramp_end, now)
  local ttl_ms = math.ceil((math.max(new_tat, ramp_end) - now) / 1000)
  redis.call('SET', key, string.format('%.0f', new_tat) .. ramp, 'PX', string.format('%.0f', math.max(ttl_ms, 1)))
end

