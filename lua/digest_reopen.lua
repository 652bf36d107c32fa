-- digest_reopen.lua: a `held` digest, closed and sent as a job, was refused when it
-- went (another layer of caps, a send window, quiet hours): it opens again and goes
-- on collecting until the next instant it may go. Jobs held meanwhile opened the
-- group's next digest: their items join this one, in the order they were folded,
-- and that digest goes. A full digest (max_items) only waits: the group's next jobs
-- go to the next digest.
--
-- KEYS[1]  the digest's hash
-- KEYS[2]  its items
-- KEYS[3]  their order
-- ARGV[1]  when it closes now (ms)
-- ARGV[2]  the base of its keys (`prefix:{tag}/`)
-- ARGV[3]  how long its keys are kept past that, ms (`redis.record_ttl`)
--
-- Returns one of REOPEN (src/redis/digest/reopen.rs reads it by the same names; a
-- test checks that both sides agree): reopened, or gone when the digest is gone
-- (sent, or never there).
local REOPEN = {
  gone = 0,
  reopened = 1,
}
if redis.call('EXISTS', KEYS[1]) == 0 then return REOPEN.gone end
local base = ARGV[2]
local m = redis.call('HMGET', KEYS[1], 'id', 'group', 'count', 'max')
local id, group = m[1], m[2]
-- a full digest (max_items) takes no more: it only waits
local full = tonumber(m[3]) >= tonumber(m[4])
local other = redis.call('HGET', group, 'open')
if not full and other and other ~= id then
  local om, oi, oo = base .. 'dgm/' .. other, base .. 'dgi/' .. other, base .. 'dgo/' .. other
  for _, job in ipairs(redis.call('LRANGE', oo, 0, -1)) do
    local item = redis.call('HGET', oi, job)
    if item and redis.call('HSETNX', KEYS[2], job, item) == 1 then
      redis.call('RPUSH', KEYS[3], job)
      redis.call('HINCRBY', KEYS[1], 'count', 1)
      redis.call('SET', base .. 'dgj/' .. job, id, 'KEEPTTL')
    end
  end
  redis.call('DEL', om, oi, oo)
  redis.call('SREM', base .. 'dgs', other)
end
if not full then redis.call('HSET', group, 'open', id) end
redis.call('HSET', KEYS[1], 'state', 'open', 'close_at', ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = math.max(tonumber(ARGV[1]) - now, 0) + tonumber(ARGV[3])
for _, k in ipairs({KEYS[1], KEYS[2], KEYS[3], group}) do redis.call('PEXPIRE', k, ttl) end
return REOPEN.reopened
