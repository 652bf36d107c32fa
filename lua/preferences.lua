-- preferences.lua: replace one recipient's preferences hash whole, or remove it.
-- The hash is read by the admission's preferences section (src/admission/lua/); see src/preferences/edit.rs.
--
-- KEYS[1]  the recipient's hash (`prefix:{tag}/prefs`)
-- ARGV[1]  the set's JSON, or "" to remove the hash
-- ARGV[2]  updated_at (ms)
-- ARGV[3]  the recipient, ARGV[4] its tenant ("" for none): kept for export
-- ARGV[5..] the opt-out fields and, with quiet hours, `quiet` and `qa:PRIORITY`
--          for each priority they allow, each stored as the set's version; or, for
--          a write that must find the set it read (a PATCH), `=`, then that set's
--          JSON ("" for none), then the fields
--
-- The version is updated_at, unless that is not above the version replaced (an
-- import keeps an older updated_at, or two writes share a millisecond): then the
-- version replaced + 1, so that a worker never takes a new set's quiet hours for
-- the old ones it computed.
--
-- Returns one of WRITE (src/redis/preferences.rs reads it by the same names; a
-- test checks that both sides agree): existed if the hash existed before, absent
-- if not; stale, writing nothing, when the set is no longer the one the caller
-- read (another write came between: read again).
local WRITE = {
  stale = -1,
  absent = 0,
  existed = 1,
}
local first = 5
if ARGV[5] == '=' then
  if (redis.call('HGET', KEYS[1], 'set') or '') ~= ARGV[6] then return WRITE.stale end
  first = 7
end
local old = tonumber(redis.call('HGET', KEYS[1], 'quiet') or '0') or 0
local existed = WRITE.absent
if redis.call('DEL', KEYS[1]) == 1 then existed = WRITE.existed end
if ARGV[1] == '' then return existed end
local version = tonumber(ARGV[2])
if version <= old then version = old + 1 end
version = string.format('%d', version)
local args = {'set', ARGV[1], 'updated_at', ARGV[2], 'recipient', ARGV[3], 'tenant', ARGV[4]}
for i = first, #ARGV do
  args[#args + 1] = ARGV[i]
  args[#args + 1] = version
end
redis.call('HSET', KEYS[1], unpack(args))
return existed
