-- dead_index.lua: add dead letters to the browsable index, dropping the oldest
-- beyond the bound, with the dead-letter log's offset they were read up to; or
-- forget entries (replayed or purged). See src/admin/dead_index.rs and
-- src/admin/dead_log.rs.
--
-- KEYS[1]  the index: a sorted set of summaries scored by when (ms)
--          (`prefix:{dead}:v2:index`)
-- KEYS[2]  the entries: a hash from summary to the whole entry's JSON
--          (`prefix:{dead}:v2:entries`)
-- KEYS[3]  add only: the log's offset, the next to read (`prefix:{dead}:v2:offset`)
-- ARGV[1]  what to do: `add` or `forget`
-- ARGV[2]  the field sets' common beginning (`prefix:{dead}:v2:by:`): a summary's
--          value V of field F is in the sorted set `prefix:{dead}:v2:by:F:V`, scored
--          as in the index. The sets are named here from the summaries, those of
--          the entries dropped included, which the caller cannot know: they share
--          the index's hash tag, so on a cluster they are in its slot. Beside them,
--          the set `prefix:{dead}:v2:by:values:tenant` holds every tenant the index
--          has an entry of (the console's tenant filter reads it).
-- add:     ARGV[3] the bound: entries kept at most; ARGV[4] the log's offset
--          after these entries (set in KEYS[3]; empty: left as it is); then for
--          each entry three: the summary (a JSON array: when, id, reason, policy,
--          channel, tag, nonce, tenant, print), when (ms), the entry's JSON
-- forget:  ARGV[3..] the summaries to forget
--
-- Returns the entries the index holds afterwards.

-- the fields a filter names, by their place in a summary (Lua counts from 1)
local FIELDS = { id = 2, reason = 3, policy = 4, channel = 5, recipient = 6, tenant = 8, print = 9 }
local by = ARGV[2]
local TENANTS = by .. 'values:tenant'

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
    local tenant = cjson.decode(summary)[FIELDS.tenant]
    if type(tenant) == 'string' and redis.call('EXISTS', by .. 'tenant:' .. tenant) == 0 then
      redis.call('SREM', TENANTS, tenant)
    end
  end
end

if ARGV[1] == 'forget' then
  drop(ARGV, 3)
  return redis.call('ZCARD', KEYS[1])
end

for i = 5, #ARGV, 3 do
  local summary, when = ARGV[i], ARGV[i + 1]
  redis.call('ZADD', KEYS[1], when, summary)
  redis.call('HSET', KEYS[2], summary, ARGV[i + 2])
  for _, set in ipairs(sets_of(summary)) do redis.call('ZADD', set, when, summary) end
  local tenant = cjson.decode(summary)[FIELDS.tenant]
  if type(tenant) == 'string' then redis.call('SADD', TENANTS, tenant) end
end
if ARGV[4] ~= '' then redis.call('SET', KEYS[3], ARGV[4]) end
local bound = tonumber(ARGV[3])
local n = redis.call('ZCARD', KEYS[1])
if n > bound then
  drop(redis.call('ZRANGE', KEYS[1], 0, n - bound - 1), 1)
  n = bound
end
return n
