-- collapse.lua: of the jobs of one recipient that share a collapse key, is this one
-- the newest? The newest is the one a worker saw first the latest (its first-seen
-- time, kept in its headers as it goes round the delay ladder); an older one that
-- comes back is superseded. Ties (the same millisecond) go to the one registered
-- first, so exactly one job of a key is ever the newest.
--
-- KEYS[1]  the recipient's hash of collapse keys (same hash slot as its sets)
-- ARGV[1]  the collapse key (the field)
-- ARGV[2]  the job id
-- ARGV[3]  the job's first-seen time, ms
-- ARGV[4]  how long to keep the hash after this write, ms
--
-- Returns {code, newer id}, the code one of COLLAPSE (src/redis/collapse.rs reads
-- it by the same names; a test checks that both sides agree): {newest, ''} if this
-- job is the newest (now registered as such), {superseded, newer id} if a newer
-- job holds the key.
local COLLAPSE = {
  superseded = 0,
  newest = 1,
}
local key, field, id = KEYS[1], ARGV[1], ARGV[2]
local seen = tonumber(ARGV[3])
local current = redis.call('HGET', key, field)
if current then
  local sep = string.find(current, ':', 1, true)
  local their_seen = tonumber(string.sub(current, 1, sep - 1))
  local their_id = string.sub(current, sep + 1)
  if their_id ~= id and their_seen >= seen then
    return {COLLAPSE.superseded, their_id}
  end
end
redis.call('HSET', key, field, string.format('%.0f', seen) .. ':' .. id)
redis.call('PEXPIRE', key, ARGV[4])
return {COLLAPSE.newest, ''}
