-- Section `preferences`: whether job k's recipient opted out of it or has quiet
-- hours to compute first (the code and its payload); else nil, and the quiet hours'
-- version when they do not allow the job but the worker knows them (a refusal then
-- carries it, for one instant with the caps').
local preferences_at = section('preferences')
local function preferences(key, k)
  local at = preferences_at + 5 * k - 4
  local category = ARGV[at]
  if category == '' then return nil end
  local channel = ARGV[at + 1]
  local hash = string.sub(key, 1, tonumber(ARGV[preferences_at]) + 19) .. '/prefs'
  local v = redis.call('HMGET', hash, 'c:' .. category, 'h:' .. channel,
    'p:' .. category .. ':' .. channel, 'quiet', 'qa:' .. ARGV[at + 2])
  if v[1] then return ANSWER.opted_out, {OPTED_OUT.category} end
  if v[2] then return ANSWER.opted_out, {OPTED_OUT.channel} end
  if v[3] then return ANSWER.opted_out, {OPTED_OUT.pair} end
  if v[4] and not v[5] then
    if v[4] ~= ARGV[at + 3] or now >= tonumber(ARGV[at + 4]) then
      return ANSWER.quiet_hours, {tonumber(v[4])}
    end
    return nil, nil, tonumber(v[4])
  end
  return nil
end
