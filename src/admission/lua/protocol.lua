-- src/admission/lua/: for each job, check every rule of its recipient's policy (and of the
-- caps it meets) and, if all pass, record the send. One call may carry many jobs
-- (the engine batches the admissions that are waiting at the same moment into one
-- call); they are decided in order, each seeing the sends recorded for the ones
-- before it.
--
-- The script is joined from its parts when loaded (src/redis/scripts.rs), in this
-- order; each later part uses only what the earlier ones define:
--   protocol.lua     what the script takes and answers, by name (this part)
--   plans.lua        Redis time, each plan resolved against it, a job's arguments
--   limits.lua       the limits a job meets (the `limits` section)
--   layers.lua       the caps a job meets (the `layers` section)
--   recipient.lua    one job's admission on its recipient's key (and its layers')
--   suppression.lua  the `suppression` section
--   preferences.lua  the `preferences` section
--   answer.lua       every job in order, each answer added to the reply
--
-- One sorted set per (recipient, policy[, channel]), and one per (recipient,
-- cap[, channel]) for the caps (all in the recipient's hash slot). member = a hash
-- of the job id, score = admitted_ms * 2 + state, where state 0 = reserved (dispatch
-- in progress) and 1 = committed (dispatch confirmed; set by the worker with ZADD
-- XX). Time comes from Redis TIME (milliseconds, integers), so every worker shares
-- one clock.
--
-- KEYS[k]  the sorted set of job k's recipient (on a Redis Cluster a call declares
--          one key, which routes it to the node that owns its slot, and carries the
--          keys of the other jobs that node owns as arguments; the worker loads the
--          script there with the flag allow-cross-slot-keys)
--
-- ARGV opens with a header of fixed positions; every optional section starts where
-- the header says (0: the call does not carry it, and runs exactly as without it).
local ARG = {
  lease = 1,        -- ms: a reservation younger than this belongs to a live worker
  dedupe = 2,       -- ms: keep every send at least this long, to recognise duplicates
  undeclared = 3,   -- E, the number of jobs whose key is not among KEYS
  plans = 4,        -- P, the number of plans
  layers = 5,       -- where the layers section starts (0: no job meets caps)
  suppression = 6,  -- where the suppression section starts (0: none sent)
  preferences = 7,  -- where the preferences section starts (0: none sent)
  limits = 8,       -- where the limits section starts (0: no job meets limits)
  first_plan = 9,   -- the first plan
}
-- The plans, from ARG.first_plan: each 5 + 2n values. The jobs of one call mostly
-- share a plan (the same policy in the same time zone on the same local day), so
-- each distinct plan is sent once and every job names its plan by number: two
-- arguments per job instead of nine.
--   valid_from ms  } the local day the caller planned for: calendar starts below
--   valid_until ms } are only right while valid_from <= now < valid_until
--   calendar expiry ms: when a send made today stops counting (0 if no calendar rule)
--   shadow: 1 if the policy is in shadow mode (a refused job is recorded all the
--     same and answers `shadowed`), else 0
--   n, the number of rules, then n pairs (limit, bound): bound > 0 is the inclusive
--     start (ms) of a calendar window; bound < 0 is minus the length (ms) of a
--     rolling one
-- The jobs, right after the plans: for each job k in order, its member (the job
-- id's hash) and its plan's number (1..P); then the keys of jobs #KEYS + 1 ..
-- #KEYS + E, in order.
--
-- Section `layers` (only when some job of the call meets caps): Q, the number of
--   jobs that meet caps; then for each of them: k, its number in the call; L, its
--   number of layers; then L triples: key (the cap's sorted set, in the slot of the
--   job's key), plan number (1..P), holds (1: the cap may refuse the job; 0: it
--   only counts it). A job with layers is admitted only when its policy (unless in
--   shadow mode) and every layer that holds it pass; it is then recorded in its key
--   and every layer's.
-- Section `limits` (only when some job of the call meets limits): G, the number
--   of groups of buckets (a group: the buckets of one limit, or of limits alike);
--   then per group: interval (µs per unit of cost; 0: a quota's counter), burst
--   (units; a counter's count), a counter's period's end (ms; 0 for a bucket), N
--   its number of buckets, and N pairs: key (the bucket) and the total the call's
--   jobs would take from it (the sum of their costs; a counter: their number). The
--   buckets are numbered 1..D in that order. Then which jobs meet limits: one
--   byte per job of the call, in order, '1' when it does ('0' when not); then one
--   value: for each job that does, in order, its cost (units, taken from each of
--   its buckets; a counter counts one) and its buckets' numbers (1..D),
--   space-separated, one job from the next by ';'. A job with limits is admitted only when its policy and caps
--   pass and then every limit admits its cost; it then takes its cost from every
--   one. When a limit refuses, nothing is recorded or taken for it anywhere
--   (answer `limited`). Each bucket is read once and written once per call.
-- Section `suppression` (only while some recipient may be suppressed):
--   L, the length of the key prefix: a job's suppressions are the hash named by the
--   first L + 19 bytes of its key (`prefix:{tag}`) followed by `/suppressed`; field
--   = channel, value = kind:since_ms:until_ms (kind 1 bounced, 2 complained, 4
--   unsubscribed; until 0: until removed); then each plan's suppressed_by mask (the
--   sum of the kinds' bits); then each job's channel. A job whose channel's field
--   holds a kind in its plan's mask, with until 0 or after now, answers
--   `suppressed` before anything else is read or written for it.
-- Section `preferences` (only while the key `prefix:preferences` says some
--   recipient has a set): L, the key prefix's length: a job's preferences are the
--   hash named by the first L + 19 bytes of its key followed by `/prefs`; fields
--   `c:CATEGORY`, `h:CHANNEL`, `p:CATEGORY:CHANNEL` hold 1 when the recipient opted
--   out (`quiet` = the set's version while it has quiet hours, and `qa:PRIORITY`
--   for each priority they allow); then five values per job: its category, channel
--   and priority, and what the worker knows of its recipient's quiet hours: the
--   version it computed them for and the instant (ms) before which they do not
--   begin (0 0: nothing known); an empty category: the job's policy is required,
--   nothing is read for it.
--
-- The reply is one flat array (a flat reply spares Redis and the caller a table per
-- job): now (ms), then one answer per job, in order:
--   code, flags, [the quiet hours' version, when flags hold FLAG.quiet], n, then n
--   values (the payload; times are in ms); then, when the call carries limits,
--   each bucket's base, by number: the TAT its first take starts from (max(TAT,
--   now) in µs; a counter's count); then S, the number of buckets whose interval
--   in force is not the one sent (a throttled bucket's, stretched), and S pairs:
--   such a bucket's number and its interval in force. The TAT a job's take left
--   is the base plus the interval times the costs taken from the bucket's key by
--   the jobs up to it (a counter: the base plus their number): the worker works
--   it out.
local ANSWER = {
  admitted = 1,     -- recorded at now, in its key and every layer's
  refused = 2,      -- payload: the times of the other sends its key remembers
  shadowed = 3,     -- a shadow policy's rules would refuse it; recorded at now all
                    -- the same; payload as for `refused`
  duplicate = 4,    -- already dispatched (its own key says so; layers not read)
  reserved = 5,     -- another worker holds a live reservation; payload: reserved_at
  replan = 6,       -- now is outside [valid_from, valid_until): plan again with now
  wrong_type = 7,   -- the key holds something else than a sorted set
  elsewhere = 8,    -- the key is not on this node (a Redis Cluster whose slots
                    -- moved): nothing written; ask again with its key declared
  layered = 9,      -- a job with layers, refused by its policy or a cap that holds
                    -- it; nothing recorded; payload: n, then n blocks (m, t1 .. tm):
                    -- block 1 its policy's remembered sends, block 1 + i its i-th
                    -- layer's (m = 0 for a layer that only counts)
  suppressed = 10,  -- nothing written; payload: kind, since, until
  opted_out = 11,   -- nothing written; payload: what it opted out of (OPTED_OUT)
  quiet_hours = 12, -- its recipient has quiet hours that do not allow its priority,
                    -- and the worker's version is not the stored one or now is
                    -- past the instant it gave: nothing written; payload: the
                    -- version (the worker computes them, pure, and asks again)
  limited = 13,     -- its policy and caps pass, a limit does not: nothing written;
                    -- payload: the instant (ms) at which every limit that refused
                    -- allows (the latest), the number (1..L) of the limit that
                    -- allows last
}
local FLAG = {
  inherited = 1,    -- admitted or shadowed over its own abandoned reservation
                    -- (older than the lease): its earlier dispatch may have gone
                    -- out, so the worker keeps the reservation, never frees it
  quiet = 2,        -- refused or layered, and its recipient has quiet hours (of the
                    -- version that follows the flags) that do not allow it: the
                    -- worker pushes the instant the caps give past them
  taken = 4,        -- admitted or shadowed, and it took from its limits (the worker
                    -- works out the TAT each take left from the reply's tail, and
                    -- gives a take back with lua/refund.lua when the job is
                    -- released or parked)
}
-- What an `opted_out` answer's recipient opted out of.
local OPTED_OUT = {
  category = 1,     -- the job's category, on every channel
  channel = 2,      -- the job's channel, for every category
  pair = 3,         -- the job's category on its channel
}
