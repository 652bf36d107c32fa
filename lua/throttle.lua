-- throttle.lua: a provider answered 429 on a channel: pause the channel's GCRA rate
-- for every worker, then ramp back (see rate.lua), once per feedback.
--
-- The pause is retry_after when the sender gave one, else the backoff doubled at
-- each 429 since the last one more than max_backoff ago; either way at most
-- max_backoff. The TAT is pushed so that no take is allowed before the resume
-- instant P, and `:P:R` is appended for the ramp. A pause that already reaches
-- further stays as it is.
--
-- KEYS[1]  the channel's rate key (as in rate.lua)
-- KEYS[2]  the channel's throttle state: a hash {strikes, last (ms)}
-- KEYS[3]  the mark of this feedback (the same feedback twice acts once)
-- ARGV[1]  how long the mark is kept, ms
-- ARGV[2]  emission interval µs, ARGV[3] burst (as in rate.lua)
-- ARGV[4]  retry_after ms (-1: none given)
-- ARGV[5]  backoff ms, ARGV[6] max backoff ms
-- ARGV[7]  ramp ms (0: the configured rate at once after the pause)
--
-- Returns {applied, pause ms, resume ms}, applied one of APPLIED (as in
-- lua/feedback.lua; src/feedback/apply.rs reads it by the same names).
local APPLIED = {
  again = 0,            -- this feedback was applied before: nothing done
  first = 1,            -- applied by this call
}
if redis.call('EXISTS', KEYS[3]) == 1 then return {APPLIED.again, 0, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local interval, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local retry, backoff, max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local ramp = tonumber(ARGV[7]) * 1000

local strikes = tonumber(redis.call('HGET', KEYS[2], 'strikes') or '0')
local last = tonumber(redis.call('HGET', KEYS[2], 'last') or '0')
if now_ms - last > max then strikes = 0 end
strikes = strikes + 1
redis.call('HSET', KEYS[2], 'strikes', strikes, 'last', now_ms)
redis.call('PEXPIRE', KEYS[2], string.format('%.0f', 2 * max))
local pause = retry
if pause < 0 then pause = backoff * 2 ^ math.min(strikes - 1, 40) end
pause = math.min(pause, max)
local resume = now + pause * 1000

local raw = redis.call('GET', KEYS[1])
local tat = now
if raw then
  local c = string.find(raw, ':', 1, true)
  if c then
    local p = tonumber(string.match(string.sub(raw, c), '^:(%d+):'))
    if p and p >= resume then
      redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
      return {APPLIED.first, pause, math.floor(p / 1000)}
    end
    raw = string.sub(raw, 1, c - 1)
  end
  tat = math.max(tonumber(raw), now)
end
-- allow_at = tat + first - first * burst (rate.lua, with the interval in force
-- `first`: ten times the configured one while ramping) must be resume
local first = interval
if ramp > 0 then first = interval * 10 end
local new_tat = math.max(tat, resume + first * (burst - 1))
local value = string.format('%.0f', new_tat)
if ramp > 0 then value = value .. ':' .. string.format('%.0f', resume) .. ':' .. string.format('%.0f', ramp) end
-- the key lasts while the pause and ramp do, and for a plain TAT at least to the
-- end of the second after its own (as src/admission/lua/limits.lua's expiry_ms
-- has a limit's bucket expire)
local expires = math.max(math.ceil(math.max(new_tat, resume + ramp) / 1000) + 1,
  (math.floor(new_tat / 1000000) + 2) * 1000)
redis.call('SET', KEYS[1], value, 'PXAT', string.format('%.0f', expires))
redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
return {APPLIED.first, pause, math.floor(resume / 1000)}
