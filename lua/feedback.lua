-- feedback.lua: apply one feedback about a recipient, once: give a failed send back,
-- suppress the recipient on a channel, or only mark it (delivered, read: which
-- answers a routed step's pending escalation). Every key is the
-- recipient's (one hash slot), so the mark and what it marks are written together.
--
-- KEYS[1]  the mark of this feedback (job id and event)
-- KEYS[2]  the recipient's suppressions (hash: field = channel,
--          value = kind:since_ms:until_ms, until 0: until removed)
-- KEYS[3]  the job's route state after its step on this channel (note: a pending
--          escalation answered; see src/fallback/state.rs: the first byte is P
--          pending, A answered, F or E moved on; the second says what answers it, d a
--          delivery or a read, r a read alone, - nothing: it does not escalate)
-- KEYS[4..] the recipient's keys of every configured policy (give_back, note)
-- ARGV[1]  how long the mark is kept, ms (0: no mark; the admin's edits)
-- ARGV[2]  what: give_back | suppress | unsuppress | note
-- give_back, note: ARGV[3] the job's member (its id's hash, as in lua/admit/)
-- note: ARGV[4] the event, delivered | read
-- suppress: ARGV[3] channel, ARGV[4] kind bit (1 bounced, 2 complained,
--           4 unsubscribed), ARGV[5] how long, ms (0: until removed)
-- unsuppress: ARGV[3] channel
--
-- Returns {applied, now ms, at}, applied one of APPLIED (src/feedback/apply.rs reads
-- it by the same names; a test checks that both sides agree); at: for give_back and
-- note the time (ms) the job's send was recorded (0: none); for suppress the
-- `until` kept.
local APPLIED = {
  again = 0,            -- this feedback was applied before: nothing done
  first = 1,            -- applied by this call
}
if ARGV[1] ~= '0' and redis.call('EXISTS', KEYS[1]) == 1 then return {APPLIED.again, 0, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local what = ARGV[2]
local at = 0

if what == 'give_back' or what == 'note' then
  for i = 4, #KEYS do
    local score = redis.call('ZSCORE', KEYS[i], ARGV[3])
    if score then
      score = tonumber(score)
      at = math.max(at, (score - score % 2) / 2)
      if what == 'give_back' then redis.call('ZREM', KEYS[i], ARGV[3]) end
    end
  end
  if what == 'note' then
    local state = redis.call('GETRANGE', KEYS[3], 0, 1)
    local by = string.sub(state, 2, 2)
    if string.sub(state, 1, 1) == 'P' and (by == 'd' or (by == 'r' and ARGV[4] == 'read')) then
      -- answered: the escalation that comes back finds it so and sends nothing
      redis.call('SET', KEYS[3], 'A', 'KEEPTTL')
    end
  end
elseif what == 'suppress' or what == 'unsuppress' then
  local hash = KEYS[2]
  if what == 'suppress' then
    local ttl = tonumber(ARGV[5])
    local till = 0
    if ttl > 0 then till = now + ttl end
    local old = redis.call('HGET', hash, ARGV[3])
    local keep = false
    if old then
      local o = tonumber(string.match(old, ':(%d+)$'))
      -- the one that lasts longer stays: "until removed" outlasts any bounce
      keep = o == 0 or (till ~= 0 and o > now and o >= till)
      if keep then at = o end
    end
    if not keep then
      redis.call('HSET', hash, ARGV[3], ARGV[4] .. ':' .. now .. ':' .. till)
      at = till
    end
  else
    redis.call('HDEL', hash, ARGV[3])
  end
  -- the hash lives as long as its longest suppression; lapsed ones go
  local fields = redis.call('HGETALL', hash)
  local forever, last = false, 0
  for i = 1, #fields, 2 do
    local till = tonumber(string.match(fields[i + 1], ':(%d+)$')) or 0
    if till == 0 then
      forever = true
    elseif till <= now then
      redis.call('HDEL', hash, fields[i])
    else
      last = math.max(last, till)
    end
  end
  if forever then
    redis.call('PERSIST', hash)
  elseif last > 0 then
    redis.call('PEXPIREAT', hash, string.format('%.0f', last))
  end
end

if ARGV[1] ~= '0' then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
end
return {APPLIED.first, now, at}
