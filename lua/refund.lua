-- refund.lua: give back `cost` jobs of a channel's GCRA rate (the job that took them
-- was refused by its recipient's caps, or its dispatch failed).
--
-- KEYS[1]  the channel's key (as in rate.lua)
-- ARGV[1]  emission interval in microseconds
-- ARGV[2]  cost to give back
--
-- Returns the new TAT minus now in microseconds (0 when the bucket is full again).
local key = KEYS[1]
local tat = redis.call('GET', key)
if not tat then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local new_tat = tonumber(tat) - tonumber(ARGV[1]) * tonumber(ARGV[2])
if new_tat <= now then
  redis.call('DEL', key)
  return 0
end
redis.call('SET', key, string.format('%.0f', new_tat), 'PX', string.format('%.0f', math.max(math.ceil((new_tat - now) / 1000), 1)))
return new_tat - now
