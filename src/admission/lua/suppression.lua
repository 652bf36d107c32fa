-- Section `suppression`: whether job k is suppressed on its channel by a kind its
-- plan is held by (the code and its payload), else nil.
local suppression_at = section('suppression')
local function suppressed(key, k)
  local mask = tonumber(ARGV[suppression_at + job_plan(k)])
  if mask == 0 then return nil end
  local hash = string.sub(key, 1, tonumber(ARGV[suppression_at]) + 19) .. '/suppressed'
  local channel = ARGV[suppression_at + tonumber(ARGV[ARG.plans]) + k]
  local v = redis.call('HGET', hash, channel)
  if not v then return nil end
  local kind, since, till = string.match(v, '^(%d+):(%d+):(%d+)$')
  kind, since, till = tonumber(kind), tonumber(since), tonumber(till)
  if not kind or math.floor(mask / kind) % 2 == 0 then return nil end
  if till ~= 0 and till <= now then return nil end
  return ANSWER.suppressed, {kind, since, till}
end
