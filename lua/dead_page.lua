-- dead_page.lua: one page of the dead-letter index's summaries that every set
-- given holds, newest first, and how many they hold in all. Reads only. See
-- src/admin/dead_index.rs and lua/dead_index.lua, which keeps the sets.
--
-- KEYS     the sets to intersect: the index (`prefix:{dead}:v2:index`) alone for no
--          filter, else one field set (`prefix:{dead}:v2:by:F:V`) per field filtered
--          on; all scored by when (ms), all in the index's hash tag
-- ARGV[1]  how many to skip, newest first
-- ARGV[2]  how many to return at most; 0: all
-- ARGV[3]  the lowest score (ms) selected, `-inf` for none
-- ARGV[4]  the highest score selected, `+inf` for none; `(ms` leaves ms out
--
-- One set is one range of it. For several, the smallest one's summaries are looked
-- up in the others from its newest or its oldest, whichever end the page is
-- nearer, only as far as the page reaches (a page in the middle of a large
-- intersection walks furthest); only their count is the whole intersection's
-- (ZINTERCARD, in Redis, without making it).
--
-- Returns { the count in all, { the page's summaries } }.
local offset, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local low, high = ARGV[3] or '-inf', ARGV[4] or '+inf'

-- a time range: the sets' summaries within it (one range of one set, or their
-- intersection's, which is made), newest first, and one page of them
if low ~= '-inf' or high ~= '+inf' then
  local within
  if #KEYS == 1 then
    within = redis.call('ZRANGE', KEYS[1], high, low, 'BYSCORE', 'REV')
  else
    local all = redis.call('ZINTER', #KEYS, unpack(KEYS))
    within = {}
    local lo = tonumber(low) or -math.huge
    local hi_open = string.sub(high, 1, 1) == '('
    local hi = tonumber(hi_open and string.sub(high, 2) or high) or math.huge
    for i = #all, 1, -1 do
      local at = tonumber(redis.call('ZSCORE', KEYS[1], all[i]))
      if at >= lo and (at < hi or (not hi_open and at == hi)) then within[#within + 1] = all[i] end
    end
  end
  local page, stop = {}, #within
  if limit > 0 then stop = math.min(#within, offset + limit) end
  for i = offset + 1, stop do page[#page + 1] = within[i] end
  return { #within, page }
end

-- one set: its count and one range of it
if #KEYS == 1 then
  local stop = -1
  if limit > 0 then stop = offset + limit - 1 end
  return { redis.call('ZCARD', KEYS[1]), redis.call('ZRANGE', KEYS[1], offset, stop, 'REV') }
end

-- several, all of them (a replay or a purge): their intersection, oldest first
if limit == 0 then
  local all = redis.call('ZINTER', #KEYS, unpack(KEYS))
  local page = {}
  for i = #all, 1, -1 do page[#page + 1] = all[i] end
  return { #all, page }
end

-- several, one page: the count of their intersection (Redis 7.0; before it, the
-- intersection's length), then the smallest set walked from whichever end the page
-- is nearer, each summary kept if every other set holds it, until the page is full
local count = redis.pcall('ZINTERCARD', #KEYS, unpack(KEYS))
if type(count) ~= 'number' then count = #redis.call('ZINTER', #KEYS, unpack(KEYS)) end
local sets = {}
for i, key in ipairs(KEYS) do sets[i] = { key = key, n = redis.call('ZCARD', key) } end
table.sort(sets, function(a, b) return a.n < b.n end)

-- what every set holds, from the newest (`newest`) or the oldest: `take` after `skip`
local function walk(newest, skip, take)
  local found, seen, from = {}, 0, 0
  while seen < skip + take and from < sets[1].n do
    local chunk
    if newest then
      chunk = redis.call('ZRANGE', sets[1].key, from, from + 499, 'REV')
    else
      chunk = redis.call('ZRANGE', sets[1].key, from, from + 499)
    end
    for _, summary in ipairs(chunk) do
      local everywhere = true
      for i = 2, #sets do
        if not redis.call('ZSCORE', sets[i].key, summary) then everywhere = false break end
      end
      if everywhere then
        seen = seen + 1
        if seen > skip and seen <= skip + take then found[#found + 1] = summary end
      end
    end
    from = from + 500
  end
  return found
end

if offset + limit <= count - offset then return { count, walk(true, offset, limit) } end
local take = math.min(limit, count - offset)
if take <= 0 then return { count, {} } end
local oldest_first = walk(false, count - offset - take, take)
local page = {}
for i = #oldest_first, 1, -1 do page[#page + 1] = oldest_first[i] end
return { count, page }
