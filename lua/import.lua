-- import.lua: import a past send (for migrating from another system), committed,
-- and keep the recipient's sorted set at least until that send stops counting.
--
-- KEYS[1]  the recipient's sorted set (see src/admission/lua/)
-- ARGV[1]  member (job id hash)
-- ARGV[2]  score: sent_ms * 2 + 1 (committed)
-- ARGV[3]  expire-at ms: when the send stops counting for every rule and leaves the
--          dedupe window; the key's expiry is raised to it, never lowered
--
-- Returns {code, expire_at}, the code one of IMPORT (src/redis/import.rs reads it
-- by the same names; a test checks that both sides agree): added if recorded, known
-- if this job id was already there (left untouched); expire_at = the key's expiry
-- afterwards (ms, -1 if none).
local IMPORT = {
  known = 0,
  added = 1,
}
local key = KEYS[1]
local existed = redis.call('EXISTS', key)
local added = IMPORT.known
if redis.call('ZADD', key, 'NX', ARGV[2], ARGV[1]) == 1 then added = IMPORT.added end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local target = tonumber(ARGV[3])
local ttl = redis.call('PTTL', key)
if existed == 0 or (ttl >= 0 and now + ttl < target) then
  redis.call('PEXPIREAT', key, ARGV[3])
  return {added, target}
end
if ttl < 0 then
  return {added, -1}
end
return {added, now + ttl}
