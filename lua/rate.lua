-- rate.lua: GCRA send rate, one key per channel, shared by every worker.
--
-- The key holds the theoretical arrival time (TAT) in integer microseconds of Redis
-- TIME. A missing key means a full bucket. burst = how many jobs may go at once
-- from a full bucket.
--
-- After a provider's 429 (lua/throttle.lua) the value is `tat:P:R` (read by
-- read_tat and kept by write_tat, lua/gcra.lua, which the worker puts before this
-- script): the channel resumes at P and ramps over R (µs): before P and at P the
-- interval is ten times the configured one, then it shrinks so that the rate
-- climbs linearly from a tenth to all of the configured rate at P + R. The suffix
-- rides along in the one GET and SET every take already does, so a throttle costs
-- no read of its own; it is dropped at the first write after P + R. The tolerance
-- (burst intervals) follows the interval in force, so a slowed channel still lets
-- a job through as soon as its interval has passed.
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
-- Returns the fields of GCRA (lua/gcra.lua) by name, and RATE's below. Granted job
-- i (1..granted) took the span ending at tat_us - interval * cost * (granted - i),
-- and a refund of it passes that end, so it can give back only what it added and
-- is unspent.
local RATE = {
  interval_us = 7,      -- present only while paused or ramping: the interval in force
}
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local asking = tonumber(ARGV[4] or '1')
local now = gcra_now()

local tat, ramp, ramp_end
tat, interval, ramp, ramp_end = read_tat(key, interval, now)
local tolerance = interval * burst
-- the interval in force goes back only while paused or ramping
local pacing = nil
if ramp ~= '' then pacing = interval end

if cost > burst then
  return gcra_reply({allowed = ALLOWED.never, remaining = 0, retry_after_us = -1,
    reset_after_us = tat - now, tat_us = tat, granted = 0})
end

local allow_at = tat + interval * cost - tolerance
if allow_at > now then
  return gcra_reply({allowed = ALLOWED.not_yet, remaining = 0,
    retry_after_us = allow_at - now, reset_after_us = tat - now, tat_us = tat,
    granted = 0, interval_us = pacing}, RATE)
end

-- the first job fits; so do as many more as leave allow_at <= now
local granted = asking
if cost > 0 then
  granted = math.min(asking, 1 + math.floor((now - allow_at) / (interval * cost)))
end
local new_tat = tat + interval * cost * granted
local remaining = math.floor((now - (new_tat - tolerance)) / interval)
if cost > 0 then write_tat(key, new_tat, ramp, ramp_end, now) end
return gcra_reply({allowed = ALLOWED.yes, remaining = remaining, retry_after_us = 0,
  reset_after_us = new_tat - now, tat_us = new_tat, granted = granted,
  interval_us = pacing}, RATE)
