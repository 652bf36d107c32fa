-- digest_claim.lua: the digests due to close (their window has ended, or they are
-- full), each claimed for a lease: a closer that dies mid-close lets another one
-- claim it again once the lease is over.
--
-- KEYS[1]  the index: a sorted set of digest keys by the instant they close (ms)
-- ARGV[1]  the lease, ms
-- ARGV[2]  the most to claim
--
-- Returns the digest keys claimed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local until_ms = string.format('%.0f', now + tonumber(ARGV[1]))
for _, member in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', until_ms, member)
end
return due
