-- rate.lua: GCRA send rate, one key per channel, shared by every worker.
--
-- The key holds the theoretical arrival time (TAT) in integer microseconds of Redis
-- TIME, written with %.0f (Lua's tostring keeps only 14 digits). A missing key means
-- a full bucket. burst = how many jobs may go at once from a full bucket.
--
-- After a provider's 429 (lua/throttle.lua) the value is `tat:P:R` (read by
-- read_tat, lua/gcra_read.lua, which the worker puts before this script): the channel
-- resumes at P and ramps over R (µs): before P and at P the interval is ten times
-- the configured one, then it shrinks so that the rate climbs linearly from a tenth
-- to all of the configured rate at P + R. The suffix rides along in the one GET
-- and SET every take already does, so a throttle costs no read of its own; it is
-- dropped at the first write after P + R. The tolerance (burst intervals) follows
-- the interval in force, so a slowed channel still lets a job through as soon as
-- its interval has passed.
--
-- One call may take for several jobs (the worker batches the jobs of a channel
-- that ask at the same moment, so that a busy channel's key, one hash slot, is not
-- called once per job): it grants as many of them as the bucket holds now, in
-- order, each exactly as if it had come alone.
--
-- KEYS[1]  the channel's key
-- ARGV[1]  emission interval in microseconds (period / rate, integer, >= 1)
-- ARGV[2]  burst (integer, >= 1)
-- ARGV[3]  cost of each job (integer, >= 0)
-- ARGV[4]  jobs asking (integer, >= 1; 1 when absent)
--
-- Returns {allowed, remaining, retry_after_us, reset_after_us, tat_us, granted}
--   allowed: 1 yes (for the first `granted` jobs), 0 not yet (retry after
--            retry_after_us), -1 never (cost > burst)
--   remaining: jobs that could still go right now after the granted ones
--   reset_after_us: time until the bucket is full again
--   tat_us: the TAT this call left (absolute); granted job i (1..granted) took the
--           span ending at tat_us - interval * cost * (granted - i), and a refund of
--           it passes that end, so it can give back only what it added and is unspent
--   granted: how many of the jobs asking may go (0 unless allowed is 1)
--   interval_us: present only while paused or ramping: the interval in force
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local asking = tonumber(ARGV[4] or '1')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local tat, ramp, ramp_end
tat, interval, ramp, ramp_end = read_tat(key, interval, now)
local tolerance = interval * burst

if cost > burst then
  return {-1, 0, -1, tat - now, tat, 0}
end

local allow_at = tat + interval * cost - tolerance
if allow_at > now then
  if ramp ~= '' then return {0, 0, allow_at - now, tat - now, tat, 0, interval} end
  return {0, 0, allow_at - now, tat - now, tat, 0}
end

-- the first job fits; so do as many more as leave allow_at <= now
local granted = asking
if cost > 0 then
  granted = math.min(asking, 1 + math.floor((now - allow_at) / (interval * cost)))
end
local new_tat = tat + interval * cost * granted
local remaining = math.floor((now - (new_tat - tolerance)) / interval)
if cost > 0 then
  local ttl_ms = math.ceil((math.max(new_tat, ramp_end) - now) / 1000)
  redis.call('SET', key, string.format('%.0f', new_tat) .. ramp, 'PX', string.format('%.0f', math.max(ttl_ms, 1)))
end
if ramp ~= '' then return {1, remaining, 0, new_tat - now, new_tat, granted, interval} end
return {1, remaining, 0, new_tat - now, new_tat, granted}
