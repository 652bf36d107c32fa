-- dead_index.lua: add one dead letter to the browsable index, dropping the oldest
-- beyond the bound; or forget entries (replayed or purged). See
-- src/admin/dead_index.rs.
--
-- KEYS[1]  the index: a sorted set of summaries scored by when (ms)
--          (`prefix:{dead}:index`)
-- KEYS[2]  the entries: a hash from summary to the whole entry's JSON
--          (`prefix:{dead}:entries`)
-- ARGV[1]  what to do: `add` or `forget`
-- ARGV[2]  the field sets' common beginning (`prefix:{dead}:by:`): a summary's
--          value V of field F is in the sorted set `prefix:{dead}:by:F:V`, scored
--          as in the index. The sets are named here from the summaries, those of
--          the entries dropped included, which the caller cannot know: they share
--          the index's hash tag, so on a cluster they are in its slot.
-- add:     ARGV[3] the summary (a JSON array: when, id, reason, policy, channel,
--          tag, nonce), ARGV[4] when (ms), ARGV[5] the entry's JSON,
--          ARGV[6] the bound: entries kept at most
-- forget:  ARGV[3..] the summaries to forget
--
-- Returns the entries the index holds afterwards.

-- the fields a filter names, by their place in a summary (Lua counts from 1)
local FIELDS = { id = 2, reason = 3, policy = 4, channel = 5, recipient = 6 }
local by = ARGV[2]

-- the field sets that hold `summary`: one per field it has a value for
local function sets_of(summary)
  local s = cjson.decode(summary)
  local sets = {}
  for name, at in pairs(FIELDS) do
    if type(s[at]) == 'string' then sets[#sets + 1] = by .. name .. ':' .. s[at] end
  end
  return sets
end

-- take `summaries` from `first` on out of the index, the entries and the field sets
local function drop(summaries, first)
  for i = first, #summaries do
    local summary = summaries[i]
    redis.call('ZREM', KEYS[1], summary)
    redis.call('HDEL', KEYS[2], summary)
    for _, set in ipairs(sets_of(summary)) do redis.call('ZREM', set, summary) end
  end
end

if ARGV[1] == 'forget' then
  drop(ARGV, 3)
  return redis.call('ZCARD', KEYS[1])
end

local summary, when = ARGV[3], ARGV[4]
redis.call('ZADD', KEYS[1], when, summary)
redis.call('HSET', KEYS[2], summary, ARGV[5])
for _, set in ipairs(sets_of(summary)) do redis.call('ZADD', set, when, summary) end
local bound = tonumber(ARGV[6])
local n = redis.call('ZCARD', KEYS[1])
if n > bound then
  drop(redis.call('ZRANGE', KEYS[1], 0, n - bound - 1), 1)
  n = bound
end
return n
