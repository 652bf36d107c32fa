-- route_claim.lua: claim a routed step's move to its next channel, for one of the
-- two ways it moves on: F (the sender reported it failed) or E (its escalation
-- came back unanswered). Whichever claims first moves it on; the other way finds
-- it claimed and sends nothing. The same way claims again (a feedback or an
-- escalation handled again after a crash): the next step's admission then finds
-- the first copy's send, so the step goes out once.
--
-- KEYS[1]  the step's state (src/fallback/state.rs: first byte P pending,
--          A answered, F or E claimed; second byte what answers it; then the
--          next step)
-- ARGV[1]  the way: F | E
--
-- Returns the state as it was, with P first when this call may move it on (the
-- claim is this way's), or the one letter of its state otherwise; false when no
-- state is kept.
local v = redis.call('GET', KEYS[1])
if not v then return false end
local state = string.sub(v, 1, 1)
if state == 'P' then
  redis.call('SETRANGE', KEYS[1], 0, ARGV[1])
  return v
end
if state == ARGV[1] then return 'P' .. string.sub(v, 2) end
return state
