-- refund.lua: give back what one take of a channel's GCRA rate added and is still
-- unspent (the job that took it was refused by its recipient's caps, or its
-- dispatch failed).
--
-- The take moved the TAT from T - interval * cost to T (rate.lua's tat_us). By the
-- time of the refund, the part of that span already in the past has been spent:
-- the bucket refilled through it whether or not the job went out. So the credit
-- is interval * cost, less what lies before now: min(interval * cost, T - now),
-- never negative. A refund after the bucket refilled credits nothing, and a
-- refund never lets more through than if the take had not happened.
--
-- KEYS[1]  the channel's key (as in rate.lua)
-- ARGV[1]  emission interval in microseconds
-- ARGV[2]  cost to give back
-- ARGV[3]  the TAT the take left (rate.lua's tat_us), in microseconds
--
-- Returns the credit given back in microseconds, or REFUND.nothing (0: nothing owed;
-- src/redis/refund.rs names it the same; a test checks that both sides agree).
local REFUND = {
  nothing = 0,
}
local key = KEYS[1]
local raw = redis.call('GET', key)
if not raw then return REFUND.nothing end
-- a throttle's ramp (`:P:R`, see rate.lua) stays as it is
local ramp, tat = '', raw
local c = string.find(raw, ':', 1, true)
if c then ramp, tat = string.sub(raw, c), string.sub(raw, 1, c - 1) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local credit = math.min(tonumber(ARGV[1]) * tonumber(ARGV[2]), tonumber(ARGV[3]) - now)
if credit <= 0 then return REFUND.nothing end
local new_tat = tonumber(tat) - credit
if new_tat <= now and ramp == '' then
  redis.call('DEL', key)
else
  new_tat = math.max(new_tat, now)
  redis.call('SET', key, string.format('%.0f', new_tat) .. ramp, 'KEEPTTL')
end
return credit
