-- release.lua: give back a recipient's send that one admission reserved (its
-- dispatch was refused, it was parked in a lane, it was paused), in its key and in
-- the keys of the caps it was counted toward.
--
-- Only that admission's own reservation is removed: the member must still hold the
-- score it recorded (reserved, at the admission's time). Another attempt of the same
-- job may have taken the reservation over since (after the lease, when this one
-- was slow), or confirmed its dispatch: the slot is then that attempt's, and giving
-- it back here would let another job have a send that may have gone out.
--
-- KEYS     the recipient's sorted set, then the caps' (all in one hash slot)
-- ARGV[1]  member (the job id's hash)
-- ARGV[2]  the admission's score (admitted ms * 2: reserved)
--
-- Returns how many keys it was removed from.
local removed = 0
for i = 1, #KEYS do
  local s = redis.call('ZSCORE', KEYS[i], ARGV[1])
  if s and tonumber(s) == tonumber(ARGV[2]) then
    removed = removed + redis.call('ZREM', KEYS[i], ARGV[1])
  end
end
return removed
