-- digest_close.lua: close a digest: no item joins it from here on (its group's next
-- job opens a new one), and its items are read in the order they were folded. A
-- second close of the same digest (its first closer died before it was done) reads
-- the same items.
--
-- KEYS[1]  the digest's hash
-- KEYS[2]  its items (hash: job id -> item JSON)
-- KEYS[3]  their order (list of job ids)
-- ARGV[1]  `now`: close it even if its close is ahead (a flush); else `due`
--
-- Returns an array that opens with one of CLOSE (src/redis/digest/close.rs reads
-- it by the same names; a test checks that both sides agree): {gone} when the
-- digest is gone (done already); {not_yet, closes at (ms)} when its close was
-- moved ahead by a later item (sliding) and it stays open; else {closed, head,
-- settings, Redis time (ms), item JSON...}.
local CLOSE = {
  gone = 0,
  closed = 1,
  not_yet = 2,
}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then return {tostring(CLOSE.gone)} end
local m = redis.call('HMGET', KEYS[1], 'id', 'group', 'state', 'head', 'spec', 'close_at')
local open = m[2] and redis.call('HGET', m[2], 'open') == m[1]
-- a sliding digest whose close an item moved (and still open, not full): not yet
if ARGV[1] ~= 'now' and m[3] ~= 'closing' and open and tonumber(m[6]) > now then
  return {tostring(CLOSE.not_yet), m[6]}
end
if m[3] ~= 'closing' then
  if open then redis.call('HDEL', m[2], 'open') end
  redis.call('HSET', KEYS[1], 'state', 'closing', 'closed_at', string.format('%.0f', now))
end
local out = {tostring(CLOSE.closed), m[4], m[5], string.format('%.0f', now)}
local ids = redis.call('LRANGE', KEYS[3], 0, -1)
for i = 1, #ids, 500 do
  local part = {}
  for j = i, math.min(i + 499, #ids) do part[#part + 1] = ids[j] end
  local items = redis.call('HMGET', KEYS[2], unpack(part))
  for _, item in ipairs(items) do
    if item then out[#out + 1] = item end
  end
end
return out
