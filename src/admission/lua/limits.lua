-- Section `limits`: the limits each job meets (`[limits.NAME]`). Each limit is a
-- GCRA bucket whose key holds its theoretical arrival time (TAT, integer
-- microseconds of Redis TIME, written as an integer: `INT`); a missing key is a
-- full bucket.
-- A job of cost c passes a limit of interval I and burst B when max(TAT, now) +
-- I * c - I * B <= now; taking it leaves TAT = max(TAT, now) + I * c, and the key
-- expires once the bucket is full again, at the end of the second after the TAT's
-- (`expiry_ms`: an idle bucket is a full one, nothing is lost when it goes).
-- A quota (a cap with scope `tenant` or `sender`) comes as a limit of interval 0:
-- its key is a counter of one calendar period, burst the count it allows, cost
-- the period's end (ms); a job passes while the counter is below the count, and
-- taking it adds one, the key expiring at the period's end.
--
-- The jobs of one call mostly share buckets (one for all, one per tenant), so the
-- call names each distinct bucket once, with the total its jobs would take from
-- it, and every job names its buckets by number; the buckets of one limit come
-- together, after their interval, burst and end, sent once. Every bucket's key is
-- read once, by one MGET, when the section is read; each bucket taken from is
-- written once, after the last job (`write_limits`: an INCRBY when its expiry
-- stays, else a SET): the call is atomic, so this is exactly what a GET and a SET
-- per job would leave.
--
-- When every bucket admits its total (the usual case: limits are there for the
-- peaks), every job of the call passes its limits whatever the jobs before it
-- took: a GCRA admitting a cost admits any smaller one. The call is then `sure`:
-- no job's limits are read or checked, a job that took adds nothing, and only
-- the jobs that met limits and did not take (refused by their caps) are read, to
-- take their cost off their buckets' totals. Otherwise every job is checked and
-- takes in order, each seeing the takes of the ones before it.
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- How a TAT is written: %d (Lua formats it as a C `long`: exact to 2^53 where that
-- has 64 bits, as on 64-bit Linux and macOS, and twice as fast as %.0f), else %.0f.
local INT = string.format('%d', 2 ^ 53) == '9007199254740992' and '%d' or '%.0f'
-- The library functions every bucket calls, looked up once (a global's lookup
-- and its field's cost as much as the call).
local format, tonumber_ = string.format, tonumber

-- The distinct keys of the call's buckets, by number: the key, its value as read
-- (false: missing) and its state, parsed once: a TAT (or a counter's count), and
-- for a bucket a `throttled` feedback paused (lua/throttle.lua, as a channel's
-- rate: `tat:P:R`, paused until P, then ramping back over R µs) the share of the
-- limit's rate in force now (false: all of it; ten per cent until P, then growing
-- linearly to all at P + R, as lua/gcra.lua's read_tat), the suffix to keep while
-- ramping and P + R (both nil after); whether a job took from it, and a
-- counter's period's end; for a plain TAT, the TAT as read. Flat arrays: a key
-- costs no table of its own.
local k_name, k_raw, k_tat, k_share, k_ramp, k_ramp_end = {}, {}, {}, {}, {}, {}
local k_taken, k_expires, k_read = {}, {}, {}

-- When a bucket's key holding a plain TAT (no ramp) expires: at the end of the
-- second after the one its TAT is in (ms), or later. Every script that writes a
-- plain TAT keeps to this (lua/throttle.lua too; lua/refund.lua only lowers a
-- TAT and keeps the expiry), so a take whose TAT stays in the second of the one
-- read keeps the key's expiry (INCRBY) instead of setting it anew. The suite's
-- `a_throttle_naming_a_sender_pauses_that_sender_only` holds throttle.lua to it.
local function expiry_ms(tat_us)
  return (tat_us - tat_us % 1000000) / 1000 + 2000
end

-- Key j's TAT, share, ramp and its end, from its value; and for a plain TAT, the
-- TAT as read.
local function parse_bucket(j)
  local raw = k_raw[j]
  if not raw then k_tat[j] = 0 return end
  local tat = tonumber_(raw)
  if tat then
    k_tat[j], k_read[j] = tat, tat
    return
  end
  local c = string.find(raw, ':', 1, true)
  local p, r = string.match(string.sub(raw, c), '^:(%d+):(%d+)$')
  p, r = tonumber(p), tonumber(r)
  k_tat[j] = tonumber(string.sub(raw, 1, c - 1))
  if not p or now_us >= p + r then return end
  local share = 0.1
  if now_us > p then share = 0.1 + 0.9 * (now_us - p) / r end
  k_share[j], k_ramp[j], k_ramp_end[j] = share, string.sub(raw, c), p + r
end

-- The buckets by number: interval (a throttled one's, stretched by its share),
-- burst, a counter's period's end (ms), the total the call's jobs would take, its
-- key's number and its base: the TAT a first take starts from (max(TAT, now)), or
-- a counter's count. The worker works out the TAT each take left from the bases
-- (the reply's tail, `limits_tail`).
local b_interval, b_burst, b_expires, b_total, b_key, b_base = {}, {}, {}, {}, {}, {}
local b_count = 0
-- The buckets whose interval in force is stretched (throttled), by number.
local b_stretched = {}
-- Which jobs meet limits (`lim_has`: a byte a job, '1' when it does) and what
-- they meet (`lim_words`: for each of them in order, its cost and its buckets'
-- numbers, space-separated, one job from the next by ';'); once read, job k's
-- cost and its buckets: the entries lim_at[k] + 1 .. lim_at[k] + lim_n[k] of
-- `l_bucket`; `l_next` holds what a take would leave (a TAT, or a count), once
-- checked.
local lim_has, lim_words = nil, nil
local lim_at, lim_n, lim_cost = {}, {}, {}
local l_bucket, l_next = {}, {}
local l_read = false
-- Whether every bucket admits its total, no two sharing a key.
local sure = false

-- Every job's cost and buckets, read from `lim_words` on first use (a sure call
-- whose jobs all took never reads them).
local function read_jobs()
  if l_read then return end
  l_read = true
  local k, used = 0, 0
  for seg in string.gmatch(lim_words, '[^;]+') do
    repeat k = k + 1 until k > jobs or string.byte(lim_has, k) == 49
    local n, cost = 0, nil
    for word in string.gmatch(seg, '%d+') do
      if cost then
        n = n + 1
        l_bucket[used + n] = tonumber(word)
      else
        cost = tonumber(word)
      end
    end
    lim_at[k], lim_n[k], lim_cost[k] = used, n, cost
    used = used + n
  end
end

-- Bucket i's base and interval in force, and whether it admits its total.
local function admits_total(i)
  local j = b_key[i]
  if b_interval[i] == 0 then
    local count = tonumber(k_raw[j] or '0')
    k_tat[j] = count
    b_base[i] = count
    return count + b_total[i] <= b_burst[i]
  end
  if not k_tat[j] then parse_bucket(j) end
  if k_share[j] then
    b_interval[i] = math.ceil(b_interval[i] / k_share[j])
    b_stretched[#b_stretched + 1] = i
  end
  local base = k_tat[j]
  if base < now_us then base = now_us end
  b_base[i] = base
  return base + b_interval[i] * (b_total[i] - b_burst[i]) <= now_us
end

do
  local at = section('limits')
  if at then
    local argv = ARGV
    local groups = tonumber(argv[at])
    local a, d = at + 1, 0
    local number = {}
    for _ = 1, groups do
      local interval, burst = tonumber(argv[a]), tonumber(argv[a + 1])
      local expires, n = tonumber(argv[a + 2]), tonumber(argv[a + 3])
      a = a + 4
      for _ = 1, n do
        local key = argv[a]
        local j = number[key]
        if not j then
          j = #k_name + 1
          number[key], k_name[j] = j, key
        end
        d = d + 1
        b_key[d], b_interval[d], b_burst[d], b_expires[d] = j, interval, burst, expires
        b_total[d] = tonumber_(argv[a + 1])
        a = a + 2
      end
    end
    b_count = d
    if #k_name <= 1000 then
      k_raw = redis.call('MGET', unpack(k_name))
    else
      for from = 1, #k_name, 1000 do
        local last = math.min(from + 999, #k_name)
        local raw = redis.call('MGET', unpack(k_name, from, last))
        for j = from, last do k_raw[j] = raw[j - from + 1] end
      end
    end
    sure = #k_name == d
    for i = 1, d do
      if not admits_total(i) then sure = false end
    end
    lim_has, lim_words = argv[a], argv[a + 1]
  end
end

-- Job k's limits, as the admission passes them on (nil: it meets none).
local function limits_of(k)
  if lim_has and string.byte(lim_has, k) == 49 then return k end
  return nil
end

-- Whether every limit of job `k` (nil: none) admits it now. Nothing is changed
-- but `l_next` (what a take leaves). Returns nil when all do; else the instant
-- (ms, rounded up) at which the latest of the refusing ones allows, and that
-- limit's number among the job's.
local function limits_refuse(k)
  if not k or sure then return nil end
  read_jobs()
  local e, cost = lim_at[k], lim_cost[k]
  local latest, which = nil, nil
  for i = 1, lim_n[k] do
    local n = l_bucket[e + i]
    local j, interval, allow_at = b_key[n], b_interval[n], nil
    if interval == 0 then
      -- a quota's counter: its instant, when full, is its period's end
      l_next[e + i] = k_tat[j] + 1
      if k_tat[j] >= b_burst[n] then allow_at = b_expires[n] * 1000 end
    else
      local tat = math.max(k_tat[j], now_us)
      l_next[e + i] = tat + interval * cost
      local at = tat + interval * (cost - b_burst[n])
      if at > now_us then allow_at = at end
    end
    if allow_at and (not latest or allow_at > latest) then
      latest, which = allow_at, i
    end
  end
  if not latest then return nil end
  return math.ceil(latest / 1000), which
end

-- The jobs that took (by number), and the keys taken from, in the order of their
-- first take (written by `write_limits`).
local took, taken = {}, {}

-- Key j now holds `value` (a TAT, or a counter's count expiring at `expires`).
local function took_from(j, value, expires)
  if not k_taken[j] then
    k_taken[j] = true
    taken[#taken + 1] = j
  end
  k_tat[j], k_expires[j] = value, expires
end

-- Take every limit of job `k` (nil: none), once `limits_refuse` said all admit.
local function take_limits(k)
  if not k then return end
  took[k] = true
  if sure then return end
  local e = lim_at[k]
  for i = 1, lim_n[k] do
    local n = l_bucket[e + i]
    took_from(b_key[n], l_next[e + i], b_interval[n] == 0 and b_expires[n])
  end
end

-- Write key j's TAT `tat` (with its ramp while it lasts), expiring once the
-- bucket is full again (`expiry_ms`, or the ramp's end). A plain TAT that stays
-- in the second of the one read keeps its key's expiry: INCRBY by what was added
-- keeps the TTL and changes an integer in place (cheaper than a SET of the whole
-- value); it answers the new TAT, or an error when the value is not one INCRBY
-- reads (no script writes such a value; it is then set whole).
local function write_tat(j, tat)
  local ramp, read = k_ramp[j], k_read[j]
  if not ramp and read and read - read % 1000000 == tat - tat % 1000000 and
      redis.pcall('INCRBY', k_name[j], format(INT, tat - read)) == tat then
    return
  end
  local expires = expiry_ms(tat)
  if ramp then expires = math.max(expires, math.ceil(k_ramp_end[j] / 1000)) end
  redis.call('SET', k_name[j], format(INT, tat) .. (ramp or ''), 'PXAT', format(INT, expires))
end

-- Write a counter's count, expiring at its period's end (ms).
local function write_count(j, count, expires)
  redis.call('SET', k_name[j], format(INT, count), 'PXAT', format(INT, expires))
end

-- A sure call's takes, written: each bucket's total, less the costs of the jobs
-- that met it and did not take, from its base (no two buckets share a key).
local function take_totals()
  for k = 1, jobs do
    if not took[k] and limits_of(k) then
      read_jobs()
      local e = lim_at[k]
      for i = 1, lim_n[k] do
        local n = l_bucket[e + i]
        b_total[n] = b_total[n] - (b_interval[n] == 0 and 1 or lim_cost[k])
      end
    end
  end
  for n = 1, b_count do
    if b_total[n] > 0 then
      local j = b_key[n]
      if b_interval[n] == 0 then
        write_count(j, b_base[n] + b_total[n], b_expires[n])
      else
        write_tat(j, b_base[n] + b_interval[n] * b_total[n])
      end
    end
  end
end

-- Write every key taken from, once: a counter expiring at its period's end; a
-- TAT (with its ramp while it lasts) expiring once the bucket is full again
-- (`expiry_ms`, or the ramp's end), its expiry kept when it stays the same.
local function write_limits()
  if sure then return take_totals() end
  for i = 1, #taken do
    local j = taken[i]
    if k_expires[j] then
      write_count(j, k_tat[j], k_expires[j])
    else
      write_tat(j, k_tat[j])
    end
  end
end

-- The reply's tail when the call carries limits, appended to `out` after its `n`
-- values: each bucket's base, by number; then how many buckets have an interval
-- in force other than the one sent (throttled, stretched), and for each its
-- number and that interval.
local function limits_tail(out, n)
  if not lim_has then return end
  for i = 1, b_count do out[n + i] = b_base[i] end
  n = n + b_count + 1
  out[n] = #b_stretched
  for s = 1, #b_stretched do
    local i = b_stretched[s]
    out[n + 2 * s - 1], out[n + 2 * s] = i, b_interval[i]
  end
end
