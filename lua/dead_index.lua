-- dead_index.lua: add one dead letter to the browsable index, dropping the oldest
-- beyond the bound. See src/admin/dead_index.rs.
--
-- KEYS[1]  the index: a sorted set of summaries scored by when (ms)
--          (`prefix:{dead}:index`)
-- KEYS[2]  the entries: a hash from summary to the whole entry's JSON
--          (`prefix:{dead}:entries`)
-- ARGV[1]  the summary (a JSON array: when, id, reason, policy, channel, tag, nonce)
-- ARGV[2]  when (ms)
-- ARGV[3]  the entry's JSON
-- ARGV[4]  the bound: entries kept at most
--
-- Returns the entries the index holds afterwards.
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local bound = tonumber(ARGV[4])
local n = redis.call('ZCARD', KEYS[1])
if n > bound then
  local old = redis.call('ZRANGE', KEYS[1], 0, n - bound - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - bound - 1)
  for i = 1, #old, 1000 do
    redis.call('HDEL', KEYS[2], unpack(old, i, math.min(i + 999, #old)))
  end
  n = bound
end
return n
