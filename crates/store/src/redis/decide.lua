-- tollgate: the seven algorithms of SEMANTICS.md as one atomic Redis script.
--
-- KEYS: the state key of each check, then of each charge, then of each refund, then the marker
--       key of each charge and of each refund (its state key's `applied` hash: sending node ->
--       highest sequence applied; `refunded`: the instant of its latest refund; `reset` while a
--       reset is recent).
-- ARGV: now_sec, now_nsec (both '' to use the server's TIME), ttl_margin_ms, checks, charges,
--       refunds, then 8 values per check: algorithm, count, period_ns, burst, slices, emission_ns,
--       tolerance_ns, cost; then 16 per charge: the same 8, its age in ns, the sending node ('':
--       none), its sequence, the key's remaining as the sender knows it, this charge
--       included (-1: nothing known), the snapshot that follows from (its instant in decimal ns
--       since the epoch, '': none; used; previous), and 1 if the remaining is a view (applied only
--       to a key this server lost), else 0;
--       then 10 per refund: the same 8, the admission's instant (decimal ns since the epoch) and
--       its reset_after_ns.
-- Refunds (admissions withdrawn: a reservation that did not count) are applied first, each exactly
-- where its admission was counted if the state still holds it (see tollgate-core's refund).
-- Charges (admissions made elsewhere, e.g. by a node's fallback while Redis was unreachable) are
-- recorded next, whatever the limit says, dated `age` ns before now, each at most once per node
-- (one riding on several calls, or sent again after a lost reply, is skipped); then the key's
-- remaining is lowered to what the sender knew (a no-op unless this server lost what the sender
-- saw: the key expired early, restarted empty, promoted without the last writes), unless the key
-- was reset or refunded since the sender's snapshot; a view only if the key's state at the
-- snapshot's instant is behind it. Then the checks are decided in order; their states are written only if every
-- check admitted (the charges are written anyway).
-- Returns 7 integers per check: allowed (1/0), limit, remaining, retry_after_ns, reset_after_ns,
-- and the key's snapshot after the call (used, previous; see tollgate-core's Snapshot), then the
-- server's now as seconds and nanoseconds.
-- A lease (hot keys, see the store's `lease` module) is one check whose cost is the most wanted,
-- followed in ARGV by the lessee's id and the lease's lifetime in ms, and in KEYS by the key that
-- counts the lessees: the check is admitted at min(cost, what is left), as an ordinary admission
-- of that cost (or denied as a unit request when nothing is left), and two more integers follow
-- the reply: the units granted and how many lessees asked within a lifetime.
--
-- Exact nanoseconds with Lua's doubles: instants are kept as decimal strings of ns since the
-- epoch and turned into ns relative to now (exact below 2^53, 104 days), so every step works
-- around now = 0. Periods and burst * T are at most 50 days (tollgate-core's MAX_PERIOD_NS), so
-- the sliding window counter's two periods back stay exact; instants further than FAR are clamped.

local S, N
if ARGV[1] == '' then
  local t = redis.call('TIME')
  S = tonumber(t[1]); N = tonumber(t[2]) * 1000
else
  S = tonumber(ARGV[1]); N = tonumber(ARGV[2])
end
local MARGIN = tonumber(ARGV[3])
local BILLION = 1000000000
local FAR_SEC = 9000000
local FAR = FAR_SEC * BILLION -- 104 days: further than this from now counts as "long ago" or "far ahead"
local MAX_AHEAD = 52 * 86400 * BILLION -- tollgate-core's MAX_AHEAD_NS: how far a charge may push a schedule

local MAX_COUNTER = 4503599627370496 -- 2^52, tollgate-core's MAX_COUNTER: the most a window counts

-- How much of a charge of `cost` a window counting `used` records.
local function counted(used, cost) return math.min(cost, math.max(MAX_COUNTER - used, 0)) end

-- The bucket family's schedule end after charging `cost_ns` at `at` (see tollgate-core).
local function charged_tat(tat, at, cost_ns)
  local from = math.max(tat, at)
  return math.max(math.min(from + cost_ns, at + MAX_AHEAD), from)
end

local function bad(key, what)
  error({ err = 'TOLLGATE_BADSTATE key ' .. key .. ' holds ' .. what .. ', not state written by tollgate' })
end

-- Exact floor(a / b) for integers |a| < 2^53, b > 0.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function imod(a, b) return a - idiv(a, b) * b end

-- Exact floor(a * b / m) and (a * b) mod m for integers 0 <= a, b < 2^53, m > 0, by binary long
-- multiplication.
local function muldiv(a, b, m)
  local qb = idiv(b, m)
  local rb = b - qb * m
  local bits, x = {}, a
  while x > 0 do
    local bit = x % 2
    bits[#bits + 1] = bit
    x = (x - bit) / 2
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q = q * 2; r = r * 2
    if r >= m then r = r - m; q = q + 1 end
    if bits[i] == 1 then
      r = r + rb
      if r >= m then r = r - m; q = q + 1 end
    end
  end
  return a * qb + q, r
end

-- Start of the epoch-aligned window of length p holding the instant `r` (ns relative to now).
local function win(r, p)
  local _, m = muldiv(S, BILLION, p)
  return r - imod(imod(m + N, p) + r, p)
end

-- A stored instant (decimal ns since the epoch) as ns relative to now.
local function rel(key, text)
  if not text or not string.match(text, '^%d+$') then bad(key, 'a malformed instant') end
  local len = string.len(text)
  local sec, nsec = 0, tonumber(text)
  if len > 9 then
    sec = tonumber(string.sub(text, 1, len - 9)); nsec = tonumber(string.sub(text, len - 8))
  end
  local ds = sec - S
  if ds < -FAR_SEC then return -FAR end
  if ds > FAR_SEC then return FAR end
  return ds * BILLION + (nsec - N)
end

-- ns relative to now as a stored instant.
local function abs(r)
  local total = N + r
  local ds = math.floor(total / BILLION)
  local nsec = total - ds * BILLION
  if nsec < 0 then ds = ds - 1; nsec = nsec + BILLION elseif nsec >= BILLION then ds = ds + 1; nsec = nsec - BILLION end
  return string.format('%d%09d', S + ds, nsec)
end

local function int(key, text)
  if not text or not string.match(text, '^%d+$') then bad(key, 'a malformed counter') end
  return tonumber(text)
end

local function fields(key, value, n)
  if type(value) ~= 'string' then return nil end
  local out = {}
  for word in string.gmatch(value, '%S+') do out[#out + 1] = word end
  if n and #out ~= n then bad(key, 'a value of ' .. #out .. ' fields') end
  return out
end

-- Milliseconds a key must live: until its state is idle again, plus the clock margin.
local function px(idle)
  local ms = math.ceil(idle / 1000000)
  if ms < 1 then ms = 1 end
  return ms + MARGIN
end

local function decision(allowed, limit, remaining, retry, reset)
  if remaining < 0 then remaining = 0 end
  if reset < 0 then reset = 0 end
  return { allowed, limit, remaining, retry, reset }
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- Each algorithm: load(key) reads the state (nil: no history); decide(st, p, cost) returns the
-- decision and, when it consumed, the new state and when it is idle (ns relative to now);
-- charge(st, p, cost, at) returns the state after a forced admission at `at` and when it is idle;
-- snapshot(st, p) the used and previous counts at now; store(key, st, idle) writes. `decide` and
-- `charge` never modify `st`.
local ALGS = {}

ALGS['gcra'] = {
  load = function(key)
    local v = redis.call('GET', key)
    if not v then return nil end
    return { tat = rel(key, v) }
  end,
  decide = function(st, p, cost)
    local tat = math.max(st and st.tat or 0, 0)
    local new = tat + cost * p.T
    local allowed = new <= p.tol
    local ahead = allowed and new or tat
    local d = decision(allowed, p.burst, idiv(math.max(p.tol - ahead, 0), p.T), allowed and 0 or new - p.tol, ahead)
    if allowed and cost > 0 then return d, { tat = new }, new end
    return d
  end,
  charge = function(st, p, cost, at)
    local tat = charged_tat(st and st.tat or -FAR, at, cost * p.T)
    return { tat = tat }, tat
  end,
  refund = function(st, p, cost, at, reset)
    if st and st.tat == at + reset then
      local tat = st.tat - cost * p.T
      return { tat = tat }, tat
    end
  end,
  snapshot = function(st, _, at)
    return math.max((st and st.tat or 0) - (at or 0), 0), 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, abs(st.tat), 'PX', px(idle))
  end,
}

-- The token bucket and the leaky bucket keep their own two fields and make exactly GCRA's
-- decisions, debt and clocks going backwards included: the bucket is full (empty) again at
-- GCRA's theoretical arrival time.
local function bucket_tat(st, cap)
  if not st then return -FAR end
  return st.last + math.max(cap - st.tokens, 0)
end

ALGS['token-bucket'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return nil end
    return { tokens = int(key, f[1]), last = rel(key, f[2]) }
  end,
  decide = function(st, p, cost)
    local cap, need = p.tol, cost * p.T
    -- Tokens at now: negative while in debt, or before `last` (a clock gone backwards).
    local available = cap
    if st then available = math.min(st.tokens - st.last, cap) end
    local allowed = available >= need
    local left = allowed and available - need or available
    local d = decision(allowed, p.burst, idiv(math.max(left, 0), p.T), allowed and 0 or need - available, cap - left)
    if allowed and cost > 0 then return d, { tokens = left, last = 0 }, cap - left end
    return d
  end,
  charge = function(st, p, cost, at)
    local cap = p.tol
    local tat = charged_tat(bucket_tat(st, cap), at, cost * p.T)
    local last = math.max(at, tat - cap)
    return { tokens = cap - (tat - last), last = last }, tat
  end,
  refund = function(st, p, cost, at, reset)
    if st and bucket_tat(st, p.tol) == at + reset then
      local tat = at + reset - cost * p.T
      return { tokens = p.tol - math.min(math.max(tat - at, 0), p.tol), last = at }, tat
    end
  end,
  snapshot = function(st, p, at)
    return math.max(bucket_tat(st, p.tol) - (at or 0), 0), 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, string.format('%d ', st.tokens) .. abs(st.last), 'PX', px(idle))
  end,
}

local function leaky_level(st, at)
  if not st then return 0 end
  return math.max(st.last + st.level - at, 0)
end

ALGS['leaky-bucket'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return nil end
    return { level = int(key, f[1]), last = rel(key, f[2]) }
  end,
  decide = function(st, p, cost)
    local cap = p.tol
    local level = leaky_level(st, 0)
    local filled = level + cost * p.T
    local allowed = filled <= cap
    local after = allowed and filled or level
    local d = decision(allowed, p.burst, idiv(math.max(cap - after, 0), p.T), allowed and 0 or filled - cap, after)
    if allowed and cost > 0 then return d, { level = filled, last = 0 }, filled end
    return d
  end,
  charge = function(st, p, cost, at)
    local empty = charged_tat(st and st.last + st.level or -FAR, at, cost * p.T)
    -- Measured from the later of the two instants (as tollgate-core).
    local last = math.max(st and st.last or -FAR, at)
    return { level = empty - last, last = last }, empty
  end,
  refund = function(st, p, cost, at, reset)
    if st and st.last + st.level == at + reset then
      local empty = at + reset - cost * p.T
      return { level = math.max(empty - at, 0), last = at }, empty
    end
  end,
  snapshot = function(st, _, at)
    return leaky_level(st, at or 0), 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, string.format('%d ', st.level) .. abs(st.last), 'PX', px(idle))
  end,
}

-- The fixed window counting at `at`: at's window, or the stored one if later (a clock gone
-- backwards, or a charge dated in an earlier window), which still counts.
local function fixed_rolled(st, p, at)
  local current = win(at, p.period)
  if st and st.start >= current and st.used > 0 then return st.start, st.used end
  return current, 0
end

ALGS['fixed-window'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return nil end
    return { start = rel(key, f[1]), used = int(key, f[2]) }
  end,
  decide = function(st, p, cost)
    local start, used = fixed_rolled(st, p, 0)
    local finish = start + p.period
    local wanted = used + cost
    local allowed = wanted <= p.count
    local after = allowed and wanted or used
    local d = decision(allowed, p.count, p.count - after, allowed and 0 or finish, after > 0 and finish or 0)
    if allowed and cost > 0 then return d, { start = start, used = wanted }, finish end
    return d
  end,
  charge = function(st, p, cost, at)
    local start, used = fixed_rolled(st, p, at)
    return { start = start, used = used + counted(used, cost) }, start + p.period
  end,
  refund = function(st, p, cost, at, reset)
    if st and st.used > 0 and st.start + p.period == at + reset then
      return { start = st.start, used = st.used - math.min(cost, st.used) }, st.start + p.period
    end
  end,
  snapshot = function(st, p, at)
    local _, used = fixed_rolled(st, p, at or 0)
    return used, 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, abs(st.start) .. string.format(' %d', st.used), 'PX', px(idle))
  end,
}

-- The sliding window counter's counters as seen from the window holding `at`.
local function sliding_rolled(st, p, at)
  local current = win(at, p.period)
  if not st then return current, 0, 0 end
  if st.start >= current then return st.start, st.prev, st.curr end
  if st.start + p.period == current then return current, st.curr, 0 end
  return current, 0, 0
end

ALGS['sliding-window'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 3)
    if not f then return nil end
    return { start = rel(key, f[1]), prev = int(key, f[2]), curr = int(key, f[3]) }
  end,
  decide = function(st, p, cost)
    local P, count = p.period, p.count
    local start, prev, curr = sliding_rolled(st, p, 0)
    local finish = start + P
    local elapsed = math.max(-start, 0)
    -- prev*(P - e) + wanted*P <= count*P  <=>  prev + wanted - count <= floor(prev*e / P)
    local q = muldiv(prev, elapsed, P)
    local wanted = curr + cost
    local allowed = prev + wanted - count <= q
    local after = allowed and wanted or curr
    local retry = 0
    if not allowed then
      if wanted <= count then
        retry = finish - math.min(muldiv(count - wanted, P, prev), P)
      else
        retry = finish + P - math.min(muldiv(count - cost, P, curr), P)
      end
    end
    local reset = 0
    if after > 0 then reset = finish + P elseif prev > 0 then reset = finish end
    local d = decision(allowed, count, count - prev + q - after, retry, reset)
    if allowed and cost > 0 then return d, { start = start, prev = prev, curr = wanted }, start + 2 * P end
    return d
  end,
  charge = function(st, p, cost, at)
    local start, prev, curr = sliding_rolled(st, p, at)
    return { start = start, prev = prev, curr = curr + counted(curr, cost) }, start + 2 * p.period
  end,
  refund = function(st, p, cost, at, reset)
    if not st then return end
    local start = at + reset - 2 * p.period
    if st.start == start then
      return { start = st.start, prev = st.prev, curr = st.curr - math.min(cost, st.curr) }, st.start + 2 * p.period
    elseif st.start - p.period == start then
      return { start = st.start, prev = st.prev - math.min(cost, st.prev), curr = st.curr }, st.start + 2 * p.period
    end
  end,
  snapshot = function(st, p, at)
    local _, prev, curr = sliding_rolled(st, p, at or 0)
    return curr, prev
  end,
  store = function(key, st, idle)
    redis.call('SET', key, abs(st.start) .. string.format(' %d %d', st.prev, st.curr), 'PX', px(idle))
  end,
}

-- Sub-window counter: `newest` is the start of the newest slice written, `slice` the length the
-- counts were taken in, counts[n] the newest slice and counts[i] the one (n - i) slices before.
-- A state taken under another slice count or length is folded into the slice holding its newest
-- one (as tollgate-core does).
local function sub_conform(st, p)
  if not st then return nil end
  local n, L = p.slices, idiv(p.period, p.slices)
  if #st.counts == n and st.slice == L then return st end
  local total, counts = 0, {}
  for i = 1, #st.counts do total = total + st.counts[i] end
  for i = 1, n do counts[i] = 0 end
  counts[n] = total
  return { newest = win(st.newest, L), slice = L, counts = counts }
end

-- The state conformed, the slice counting at `at`, and how many slices it is past the newest.
local function sub_at(st, p, at)
  local L = idiv(p.period, p.slices)
  local current = win(at, L)
  if not st then return nil, current, p.slices end
  st = sub_conform(st, p)
  current = math.max(current, st.newest)
  return st, current, idiv(current - st.newest, L)
end

-- The counts of `st` moved `d` slices on, to end at `current`, plus `cost` in the newest.
local function sub_count(st, p, current, d, cost)
  local n, counts = p.slices, {}
  for i = 1, n do
    local from = i + d
    counts[i] = (st and from <= n) and st.counts[from] or 0
  end
  counts[n] = counts[n] + cost
  return { newest = current, slice = idiv(p.period, n), counts = counts }
end

local function sub_used(st, n, d)
  local used = 0
  if st then for i = d + 1, n do used = used + st.counts[i] end end
  return used
end

ALGS['sub-window'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key))
    if not f then return nil end
    if #f < 3 then bad(key, 'a value of ' .. #f .. ' fields') end
    local counts = {}
    for i = 3, #f do counts[i - 2] = int(key, f[i]) end
    return { newest = rel(key, f[1]), slice = int(key, f[2]), counts = counts }
  end,
  decide = function(st, p, cost)
    local n, count = p.slices, p.count
    local cur, current, d = sub_at(st, p, 0)
    local used = sub_used(cur, n, d)
    local allowed = used + cost <= count
    local retry = 0
    if not allowed then
      -- Slot i (live iff i > d) holds the slice starting at newest - (n - i)*L; it leaves the
      -- window at newest + i*L.
      local excess, freed = used + cost - count, 0
      for i = d + 1, n do
        freed = freed + cur.counts[i]
        if freed >= excess then retry = cur.newest + i * cur.slice; break end
      end
    end
    local after = allowed and used + cost or used
    local final, fd = cur, d
    if allowed and cost > 0 then final, fd = sub_count(cur, p, current, d, cost), 0 end
    local reset = 0
    if final then
      for i = n, fd + 1, -1 do
        if final.counts[i] > 0 then reset = final.newest + i * final.slice; break end
      end
    end
    local dec = decision(allowed, count, count - after, retry, reset)
    if allowed and cost > 0 then return dec, final, reset end
    return dec
  end,
  charge = function(st, p, cost, at)
    local cur, current, d = sub_at(st, p, at)
    local counts = counted(sub_used(cur, p.slices, d), cost)
    if counts == 0 then
      -- Nothing counted: the state only re-laid out (as tollgate-core), idle when its newest
      -- counted slice leaves.
      if not cur then return nil, 0 end
      for i = p.slices, 1, -1 do
        if cur.counts[i] > 0 then return cur, cur.newest + i * cur.slice end
      end
      return cur, 0
    end
    local new = sub_count(cur, p, current, d, counts)
    return new, new.newest + p.slices * new.slice
  end,
  refund = function(st, p, cost, at, reset)
    local n, L = p.slices, idiv(p.period, p.slices)
    if not st or #st.counts ~= n or st.slice ~= L then return end
    -- Counted in the slice that leaves the window `reset` after the admission: the one starting
    -- n slices before that; slot i holds the slice starting at newest - (n - i)*L.
    local i = n - idiv(st.newest - (at + reset - n * L), L)
    if i < 1 or i > n or st.counts[i] == 0 then return end
    local counts = {}
    for j = 1, n do counts[j] = st.counts[j] end
    counts[i] = counts[i] - math.min(cost, counts[i])
    return { newest = st.newest, slice = L, counts = counts }, st.newest + n * L
  end,
  snapshot = function(st, p, at)
    local cur, _, d = sub_at(st, p, at or 0)
    return sub_used(cur, p.slices, d), 0
  end,
  store = function(key, st, idle)
    local parts = { abs(st.newest), string.format('%d', st.slice) }
    for i = 1, #st.counts do parts[#parts + 1] = string.format('%d', st.counts[i]) end
    redis.call('SET', key, table.concat(parts, ' '), 'PX', px(idle))
  end,
}

-- Sliding log: a list whose element 0 is `base` (the running total before the first entry) and
-- whose elements 1..n are "t total" entries, oldest first (total: the running total of the costs
-- logged up to and including the entry). The state read is a view of the list: entries are read
-- one at a time (binary search), pruned ones skipped (from `first` on), entries appended by this
-- call kept in `extra`, and the newest list entry possibly re-totalled (`tail`). Nothing is read
-- whole and nothing is rewritten whole: an admission trims the expired head and appends.
local REBASE_ABOVE = 1125899906842624 -- 2^50: totals count from 0 again past it (as tollgate-core)

local function log_entry(st, i)
  if i > st.n then
    local e = st.extra[i - st.n]
    return e[1], e[2]
  end
  if i == st.n and st.tail then return st.tail[1], st.tail[2] end
  local f = fields(st.key, redis.call('LINDEX', st.key, i), 2)
  if not f then bad(st.key, 'a log shorter than its length') end
  return rel(st.key, f[1]), int(st.key, f[2]) - st.shift
end

local function log_last(st) return st.n + #st.extra end

local function log_total_before(st, i)
  if i <= st.first then return st.base end
  local _, total = log_entry(st, i - 1)
  return total
end

-- The first index from `lo` on whose entry satisfies `pred` (entries are in order), or last + 1.
local function log_search(st, pred)
  local lo, hi = st.first, log_last(st) + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if pred(log_entry(st, mid)) then hi = mid else lo = mid + 1 end
  end
  return lo
end

local function log_view(st, key)
  return st or { key = key, n = 0, base = 0, first = 1, extra = {}, fresh = true, shift = 0 }
end

-- The view after pruning what left the window at `at` and logging `cost` at `at` (or at the newest
-- entry's time if later). Returns it and the stamp.
local function log_add(st, P, at, cost)
  local live = log_search(st, function(t) return t + P > at end)
  local new = copy(st)
  new.base = log_total_before(st, live)
  new.first = live
  new.extra = {}
  for i = 1, #st.extra do new.extra[i] = st.extra[i] end
  if new.base > REBASE_ABOVE then
    -- Count from 0 again: list entries are read shifted, and rewritten when stored.
    local by = new.base
    new.shift, new.base = st.shift + by, 0
    for i = 1, #new.extra do new.extra[i] = { new.extra[i][1], new.extra[i][2] - by } end
    if new.tail then new.tail = { new.tail[1], new.tail[2] - by } end
  end
  local last = log_last(new)
  if last < live then
    new.extra[#new.extra + 1] = { at, new.base + cost }
    return new, at
  end
  local t, total = log_entry(new, last)
  if t >= at then
    -- Same instant, or a clock gone backwards: add to the newest entry, keeping the log sorted.
    if last > new.n then new.extra[last - new.n] = { t, total + cost } else new.tail = { t, total + cost } end
    return new, t
  end
  new.extra[#new.extra + 1] = { at, total + cost }
  return new, at
end

ALGS['sliding-log'] = {
  load = function(key)
    local n = redis.call('LLEN', key)
    if n == 0 then return nil end
    return { key = key, n = n - 1, base = int(key, redis.call('LINDEX', key, 0)), first = 1, extra = {}, shift = 0 }
  end,
  decide = function(st, p, cost)
    local P, count = p.period, p.count
    local view = log_view(st, p.key)
    local live = log_search(view, function(t) return t + P > 0 end)
    local last = log_last(view)
    local from = log_total_before(view, live)
    local used, newest = 0, nil
    if last >= live then
      local t, total = log_entry(view, last)
      used, newest = total - from, t
    end
    local allowed = used + cost <= count
    local reset = newest and newest + P or 0
    if allowed and cost > 0 then
      local new, stamp = log_add(view, P, 0, cost)
      return decision(true, count, count - used - cost, 0, stamp + P), new, stamp + P
    end
    local retry = 0
    if not allowed then
      -- When the oldest entries holding at least the excess have left the window.
      local excess = used + cost - count
      local enough = log_search(view, function(_, total) return total >= from + excess end)
      if enough <= last then retry = select(1, log_entry(view, enough)) + P end
    end
    return decision(allowed, count, count - (allowed and used + cost or used), retry, reset)
  end,
  charge = function(st, p, cost, at)
    local view = log_view(st, p.key)
    local live = log_search(view, function(t) return t + p.period > at end)
    local last = log_last(view)
    local used = 0
    if last >= live then used = select(2, log_entry(view, last)) - log_total_before(view, live) end
    cost = counted(used, cost)
    if cost == 0 then
      if last < view.first then return view, 0 end
      return view, select(1, log_entry(view, last)) + p.period
    end
    local new, stamp = log_add(view, p.period, at, cost)
    return new, stamp + p.period
  end,
  -- In place (the list is edited, not rebuilt): the entries after the refunded one are re-totalled,
  -- O(entries after it); an emptied entry goes.
  refund_in_place = function(key, p, cost, at, reset)
    local st = ALGS['sliding-log'].load(key)
    if not st then return end
    local stamp = at + reset - p.period
    local i = log_search(st, function(t) return t >= stamp end)
    if i > st.n or select(1, log_entry(st, i)) ~= stamp then return end
    local t, total = log_entry(st, i)
    local logged = total - log_total_before(st, i)
    local refunded = math.min(cost, logged)
    if refunded == 0 then return end
    local updates = {}
    for j = i, st.n do
      local tj, totalj = log_entry(st, j)
      updates[#updates + 1] = { j, abs(tj) .. string.format(' %d', totalj - refunded) }
    end
    for _, u in ipairs(updates) do redis.call('LSET', key, u[1], u[2]) end
    if refunded == logged then redis.call('LREM', key, -1, updates[1][2]) end
    return true
  end,
  snapshot = function(st, p, at)
    if not st then return 0, 0 end
    local live = log_search(st, function(t) return t + p.period > (at or 0) end)
    local last = log_last(st)
    if last < live then return 0, 0 end
    local _, total = log_entry(st, last)
    return total - log_total_before(st, live), 0
  end,
  store = function(key, st, idle)
    local base = string.format('%d', st.base)
    local pruned = math.min(st.first - 1, st.n)
    local entries = {}
    if st.shift > 0 then
      -- A rebase (once per 2^50 units): every kept entry is rewritten, read before anything is.
      for i = st.first, st.n do
        local t, total = log_entry(st, i)
        entries[#entries + 1] = { t, total }
      end
    end
    if st.fresh or pruned == st.n or st.shift > 0 then
      -- Nothing of the list is kept as is (O(expired) to free): a header, then the entries.
      redis.call('DEL', key)
      redis.call('RPUSH', key, base)
    elseif pruned > 0 then
      -- The last expired entry becomes the header; everything before it goes.
      redis.call('LSET', key, pruned, base)
      redis.call('LTRIM', key, pruned, -1)
    end
    if st.shift == 0 and st.tail and st.n >= st.first then
      redis.call('LSET', key, -1, abs(st.tail[1]) .. string.format(' %d', st.tail[2]))
    end
    for i = 1, #st.extra do
      if st.n + i >= st.first then entries[#entries + 1] = st.extra[i] end
    end
    for i = 1, #entries do
      redis.call('RPUSH', key, abs(entries[i][1]) .. string.format(' %d', entries[i][2]))
    end
    redis.call('PEXPIRE', key, px(idle))
  end,
}

-- Read every argument first: a malformed call fails before anything is written.
local checks, charges, refunds = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local function params(b, key)
  local p = {
    alg = ARGV[b + 1], count = tonumber(ARGV[b + 2]), period = tonumber(ARGV[b + 3]), burst = tonumber(ARGV[b + 4]),
    slices = tonumber(ARGV[b + 5]), T = tonumber(ARGV[b + 6]), tol = tonumber(ARGV[b + 7]), key = key,
  }
  if not ALGS[p.alg] then error({ err = 'TOLLGATE_ARGS unknown algorithm ' .. tostring(p.alg) }) end
  return p, tonumber(ARGV[b + 8])
end

local loaded, state, idle, algs = {}, {}, {}, {}
local function current(key, p)
  algs[key] = p.alg
  if loaded[key] == nil then loaded[key] = ALGS[p.alg].load(key) or false end
  if state[key] == nil then return loaded[key] or nil end
  return state[key]
end

-- 0. Refunds, each read and written in turn (a refund never needs to meet a check of its call);
-- one that applied stamps the key's marker, for as long as a node's view of the key can matter
-- (so that a view from before it is not given back: see the charges' views).
local function stamp(marker, field, value, p)
  local ms = math.ceil(math.max(p.tol, 2 * p.period) / 1000000) + 1000
  redis.call('HSET', marker, field, value)
  if redis.call('PTTL', marker) < ms then redis.call('PEXPIRE', marker, ms) end
end
for k = 1, refunds do
  local b = 6 + checks * 8 + charges * 16 + (k - 1) * 10
  local key = KEYS[checks + charges + k]
  local p, cost = params(b, key)
  local at, reset = rel(key, ARGV[b + 9]), tonumber(ARGV[b + 10])
  local A = ALGS[p.alg]
  local applied = false
  if cost > 0 then
    if A.refund_in_place then
      applied = A.refund_in_place(key, p, cost, at, reset)
    else
      local new, at_idle = A.refund(A.load(key), p, cost, at, reset)
      if new then A.store(key, new, at_idle); applied = true end
    end
  end
  if applied then stamp(KEYS[checks + charges + refunds + charges + k], 'refunded', abs(0), p) end
end

-- 1. Charges, recorded whatever the limit says, each once per node.
local marks, marked = {}, {}
for j = 1, charges do
  local b = 6 + checks * 8 + (j - 1) * 16
  local key = KEYS[checks + j]
  local p, cost = params(b, key)
  local A = ALGS[p.alg]
  local node, seq, fresh = ARGV[b + 10], tonumber(ARGV[b + 11]), true
  if node ~= '' then
    local marker = KEYS[checks + charges + refunds + j]
    local id = marker .. ' ' .. node
    if marks[id] == nil then
      marks[id] = tonumber(redis.call('HGET', marker, node) or '0') or 0
      marked[#marked + 1] = { id = id, marker = marker, node = node, key = key, seq = marks[id] }
    end
    fresh = seq > marks[id]
    if fresh then marks[id] = seq end
  end
  if fresh and cost > 0 then
    local new, at_idle = A.charge(current(key, p), p, cost, -tonumber(ARGV[b + 9]))
    state[key], idle[key] = new, at_idle
  end
  local known = tonumber(ARGV[b + 12])
  if known and known >= 0 and ARGV[b + 13] ~= '' then
    -- Not over a reset or refund at or after the sender's snapshot (each stamps the marker with
    -- its instant); a view only for a key this server lost (its state at the snapshot's instant
    -- is behind it).
    local at = rel(key, ARGV[b + 13])
    local stamps = redis.call('HMGET', KEYS[checks + charges + refunds + j], 'reset', 'refunded')
    for i = 1, 2 do
      if stamps[i] and rel(key, stamps[i]) >= at then known = -1 end
    end
    if known >= 0 and ARGV[b + 16] == '1' then
      local used, previous = A.snapshot(current(key, p), p, at)
      if used >= tonumber(ARGV[b + 14]) and previous >= tonumber(ARGV[b + 15]) then known = -1 end
    end
  end
  if known and known >= 0 then
    local left = A.decide(current(key, p), p, 0)[3]
    if left > known then state[key], idle[key] = A.charge(current(key, p), p, left - known, 0) end
  end
end
local charged = {}
for k, v in pairs(state) do charged[k] = { v, idle[k] } end

-- A lease: its lessee and lifetime follow every other argument.
local lease_at = 6 + checks * 8 + charges * 16 + refunds * 10
local leasing = #ARGV > lease_at
if leasing and checks ~= 1 then error({ err = 'TOLLGATE_ARGS a lease is one check' }) end
local granted = 0

-- 2. Checks, in order; a key checked twice sees its first check's pending state.
local ps, decisions = {}, {}
local all = true
for i = 1, checks do
  local key = KEYS[i]
  local p, cost = params(6 + (i - 1) * 8, key)
  if leasing then
    -- As much of the wanted slice as is left (the peek's `remaining` is exactly the largest cost
    -- the algorithm admits now), or one unit, to be denied with that unit's retry.
    local left = ALGS[p.alg].decide(current(key, p), p, 0)[3]
    granted = math.min(cost, left)
    cost = math.max(granted, 1)
  end
  local d, new, at_idle = ALGS[p.alg].decide(current(key, p), p, cost)
  if new then state[key], idle[key] = new, at_idle end
  if d[1] == false then all = false; granted = 0 end
  ps[i], decisions[i] = p, d
end

-- 3. Everything is kept if every check admitted; otherwise only the charges, and the checks that
-- did not block report the state as a peek would.
if not all then
  state, idle = {}, {}
  for k, v in pairs(charged) do state[k], idle[k] = v[1], v[2] end
  for i = 1, checks do
    if decisions[i][1] then decisions[i] = ALGS[ps[i].alg].decide(current(KEYS[i], ps[i]), ps[i], 0) end
  end
end

-- 4. The reply, read before anything is written (the log's view reads the list as it was).
local out = {}
for i = 1, checks do
  local d = decisions[i]
  out[#out + 1] = d[1] and 1 or 0
  for j = 2, 5 do out[#out + 1] = d[j] end
  local used, previous = ALGS[ps[i].alg].snapshot(current(KEYS[i], ps[i]), ps[i])
  out[#out + 1] = used
  out[#out + 1] = previous
end
out[#out + 1] = S
out[#out + 1] = N
if leasing then
  local lessees = KEYS[checks + charges + refunds + charges + refunds + 1]
  local now_ms = S * 1000 + math.floor(N / 1000000)
  local lifetime = tonumber(ARGV[lease_at + 2])
  redis.call('ZREMRANGEBYSCORE', lessees, '-inf', now_ms)
  redis.call('ZADD', lessees, now_ms + lifetime, ARGV[lease_at + 1])
  -- The set lives as long as its longest-lived lessee (lessees may ask with other lifetimes).
  local last = redis.call('ZRANGE', lessees, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', lessees, math.max(tonumber(last[2]) - now_ms, 1) + MARGIN)
  out[#out + 1] = granted
  out[#out + 1] = redis.call('ZCARD', lessees)
end

-- 5. Write; a marker lives as long as its key's charges count (sent again after that, a charge
-- changes no decision).
for key, st in pairs(state) do ALGS[algs[key]].store(key, st, idle[key]) end
for _, m in ipairs(marked) do
  if marks[m.id] > m.seq then
    redis.call('HSET', m.marker, m.node, string.format('%d', marks[m.id]))
    -- Never shortened: it may hold a refund's or a reset's stamp.
    local ms = px(charged[m.key] and charged[m.key][2] or 0)
    if redis.call('PTTL', m.marker) < ms then redis.call('PEXPIRE', m.marker, ms) end
  end
end
return out
