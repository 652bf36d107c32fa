-- lease.lua: renew or end a lease taken with `SET key token NX PX ms`, if it is
-- still the taker's (a lease that ran out and was taken by another is left to
-- it). See src/redis/lease.rs.
--
-- KEYS[1]  the lease
-- ARGV[1]  the taker's token
-- ARGV[2]  renew: the lease's new time to live (ms); absent: end it
--
-- Returns one of LEASE (src/redis/lease.rs reads it by the same names; a test
-- checks that both sides agree): kept when it was renewed or ended, lost when it
-- was not the taker's any more.
local LEASE = {
  lost = 0,
  kept = 1,
}
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return LEASE.lost
end
if ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
return LEASE.kept
