-- rate.lua: GCRA send rate, one key per channel, shared by every worker.
--
-- The key holds the theoretical arrival time (TAT) in integer microseconds of Redis
-- TIME, written with %.0f (Lua's tostring keeps only 14 digits). A missing key means
-- a full bucket. burst = how many jobs may go at once from a full bucket.
--
-- KEYS[1]  the channel's key
-- ARGV[1]  emission interval in microseconds (period / rate, integer, >= 1)
-- ARGV[2]  burst (integer, >= 1)
-- ARGV[3]  cost of this job (integer, >= 0)
--
-- Returns {allowed, remaining, retry_after_us, reset_after_us, tat_us}
--   allowed: 1 yes, 0 not yet (retry after retry_after_us), -1 never (cost > burst)
--   remaining: jobs that could still go right now after this one
--   reset_after_us: time until the bucket is full again
--   tat_us: the TAT this call left (absolute); a refund of this take passes it
--           back, so it can give back only what the take added and is unspent
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local tat = tonumber(redis.call('GET', key) or now)
if tat < now then tat = now end
local tolerance = interval * burst

if cost > burst then
  return {-1, 0, -1, tat - now, tat}
end

local new_tat = tat + interval * cost
local allow_at = new_tat - tolerance
if allow_at > now then
  return {0, 0, allow_at - now, tat - now, tat}
end

local remaining = math.floor((now - allow_at) / interval)
if cost > 0 then
  local ttl_ms = math.ceil((new_tat - now) / 1000)
  redis.call('SET', key, string.format('%.0f', new_tat), 'PX', string.format('%.0f', math.max(ttl_ms, 1)))
end
return {1, remaining, 0, new_tat - now, new_tat}
