-- preferences.lua: replace one recipient's preferences hash whole, or remove it.
-- The hash is read by admit.lua's preferences section; see src/admin/preferences.rs.
--
-- KEYS[1]  the recipient's hash (`prefix:{tag}/prefs`)
-- ARGV[1]  the set's JSON, or "" to remove the hash
-- ARGV[2]  updated_at (ms)
-- ARGV[3]  the recipient, ARGV[4] its tenant ("" for none): kept for export
-- ARGV[5..] the opt-out fields and, with quiet hours, `quiet` and `qa:PRIORITY`
--          for each priority they allow, each stored as ARGV[2] (the version)
--
-- Returns 1 if the hash existed before, else 0.
local existed = redis.call('DEL', KEYS[1])
if ARGV[1] == '' then return existed end
local args = {'set', ARGV[1], 'updated_at', ARGV[2], 'recipient', ARGV[3], 'tenant', ARGV[4]}
for i = 5, #ARGV do
  args[#args + 1] = ARGV[i]
  args[#args + 1] = ARGV[2]
end
redis.call('HSET', KEYS[1], unpack(args))
return existed
