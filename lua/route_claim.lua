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
-- Returns {code, state}, the code one of CLAIM (src/fallback/state.rs reads it by
-- the same names; a test checks that both sides agree): ours, with the state as it
-- was and P first, when this call may move it on (the claim is this way's); theirs,
-- with the one letter of its state, otherwise; none, with '', when no state is kept.
local CLAIM = {
  none = 0,
  ours = 1,
  theirs = 2,
}
local v = redis.call('GET', KEYS[1])
if not v then return {CLAIM.none, ''} end
local state = string.sub(v, 1, 1)
if state == 'P' then
  redis.call('SETRANGE', KEYS[1], 0, ARGV[1])
  return {CLAIM.ours, v}
end
if state == ARGV[1] then return {CLAIM.ours, 'P' .. string.sub(v, 2)} end
return {CLAIM.theirs, state}
