-- lease_end.lua: end a lease taken with `SET key token NX PX ms`, if it is still
-- the taker's (a lease that ran out and was taken by another is left to it). See
-- src/admin/dead_log.rs.
--
-- KEYS[1]  the lease
-- ARGV[1]  the taker's token
--
-- Returns 1 when it was ended, 0 when it was not the taker's any more.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
