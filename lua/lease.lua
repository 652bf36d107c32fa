-- lease.lua: renew or end a lease taken with `SET key token NX PX ms`, if it is
-- still the taker's (a lease that ran out and was taken by another is left to
-- it). See src/admin/dead_log.rs.
--
-- KEYS[1]  the lease
-- ARGV[1]  the taker's token
-- ARGV[2]  renew: the lease's new time to live (ms); absent: end it
--
-- Returns 1 when it was renewed or ended, 0 when it was not the taker's any more.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return redis.call('DEL', KEYS[1])
