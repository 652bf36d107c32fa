-- digest_fold.lua: fold one job into the open digest of its group (recipient and
-- tenant, channel, digest key or category), opening one if the group has none. One
-- script, so two workers folding into the same group at once open one digest, not
-- two; a job folded before (a redelivery: its worker died before the ack) is not
-- folded again, whatever became of its digest since.
--
-- KEYS[1]  the group's hash: `open` (the id of its open digest), `seq`
-- KEYS[2]  the job's mark: the id of the digest that holds it (kept ARGV[8] ms)
-- (and, built from ARGV[1] in the same hash slot: `dgm/ID` the digest, `dgi/ID` its
-- items, `dgo/ID` their order, `dgs` the recipient's open digests)
-- ARGV[1]  the base of the digest's keys (`prefix:{tag}/`, the group's hash slot)
-- ARGV[2]  the group's hash (in the digest's id)
-- ARGV[3]  the job id
-- ARGV[4]  the item (JSON: id, at, exp, payload)
-- ARGV[5]  the digest's head (JSON: recipient, channel, category, tenant, ...), kept
--          from its first item
-- ARGV[6]  the settings it opens with (`mode,window_ms,max_window_ms,max_items,keep,keep_from`)
-- ARGV[7]  window, ms
-- ARGV[8]  how long marks are kept, ms (`redis.record_ttl`)
-- ARGV[9]  sliding: the longest it stays open, ms (0: a fixed window); each item then
--          moves its close to `window` after it, up to this after the first
-- ARGV[10] the job's collapse key ('' for none): of the items with one key, the digest
--          keeps the newest (the one folded last)
-- ARGV[11] held: the instant the digest closes (ms; the caps' next allowed instant),
--          for the digest it opens (0: its window from now)
--
-- Returns {code, digest id, digest key, closes at (ms), full}, the code one of FOLD
-- (src/redis/digest/fold.rs reads it by the same names; a test checks that both
-- sides agree): opened, joined, or again (the job was folded before, into that
-- digest); full 1 when this item made it reach its max_items (the group's next job
-- opens a new one).
local FOLD = {
  joined = 0,
  opened = 1,
  again = 2,
}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local base, job = ARGV[1], ARGV[3]
local keep_ms = tonumber(ARGV[8])

local held = redis.call('GET', KEYS[2])
if held then
  local meta = base .. 'dgm/' .. held
  local close_at = tonumber(redis.call('HGET', meta, 'close_at') or '0')
  return {FOLD.again, held, meta, close_at, 0}
end

local id = redis.call('HGET', KEYS[1], 'open')
local meta
if id then
  meta = base .. 'dgm/' .. id
  if redis.call('EXISTS', meta) == 0 then id = nil end
end
local code = FOLD.joined
local close_at
if not id then
  local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  id = 'dg-' .. ARGV[2] .. '-' .. string.format('%.0f', now) .. '-' .. seq
  meta = base .. 'dgm/' .. id
  close_at = now + tonumber(ARGV[7])
  if tonumber(ARGV[11]) > 0 then close_at = tonumber(ARGV[11]) end
  local max = string.match(ARGV[6], '^[^,]*,[^,]*,[^,]*,([^,]*)')
  redis.call('HSET', KEYS[1], 'open', id)
  redis.call('HSET', meta, 'id', id, 'head', ARGV[5], 'spec', ARGV[6], 'max', max,
    'opened_at', string.format('%.0f', now), 'close_at', string.format('%.0f', close_at),
    'count', 0, 'group', KEYS[1], 'state', 'open')
  if tonumber(ARGV[9]) > 0 then
    redis.call('HSET', meta, 'slide', ARGV[7], 'until', string.format('%.0f', now + tonumber(ARGV[9])))
  end
  -- the recipient's open digests (`admin recipient`)
  redis.call('SADD', base .. 'dgs', id)
  code = FOLD.opened
else
  local m = redis.call('HMGET', meta, 'close_at', 'slide', 'until')
  close_at = tonumber(m[1])
  -- sliding: this item moves the close (the settings it opened with)
  if m[2] then
    local moved = math.min(tonumber(m[3]), now + tonumber(m[2]))
    if moved > close_at then
      close_at = moved
      redis.call('HSET', meta, 'close_at', string.format('%.0f', close_at))
    end
  end
end
local items, order = base .. 'dgi/' .. id, base .. 'dgo/' .. id
redis.call('HSET', items, job, ARGV[4])
redis.call('RPUSH', order, job)
local count = redis.call('HINCRBY', meta, 'count', 1)
if ARGV[10] ~= '' then
  local field = 'c:' .. ARGV[10]
  local older = redis.call('HGET', meta, field)
  if older and older ~= job then
    -- replaced: its place in the order stays, and is skipped when the digest closes
    redis.call('HDEL', items, older)
    count = redis.call('HINCRBY', meta, 'count', -1)
  end
  redis.call('HSET', meta, field, job)
end
redis.call('SET', KEYS[2], id, 'PX', keep_ms)
local full = 0
if count >= tonumber(redis.call('HGET', meta, 'max')) then
  full = 1
  redis.call('HDEL', KEYS[1], 'open')
end
-- a safety net: what no closer ever closes goes away on its own
local ttl = math.max(close_at - now, 0) + keep_ms
for _, k in ipairs({meta, items, order}) do redis.call('PEXPIRE', k, ttl) end
redis.call('PEXPIRE', KEYS[1], ttl)
if redis.call('PTTL', base .. 'dgs') < ttl then redis.call('PEXPIRE', base .. 'dgs', ttl) end
return {code, id, meta, close_at, full}
