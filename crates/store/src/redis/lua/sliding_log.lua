-- Sliding log (tollgate-core's sliding_log.rs). Unlike the core's in-memory log, the entries live
-- in a Redis list with running totals, so that a check reads O(log n) elements of a log of up to
-- `count` entries rather than the whole of it.
--
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
  check = function(st, p, cost)
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
      -- Nothing of the list is kept as is (O(expired) to free): a header, then the entries. A
      -- fresh view had no list to delete.
      if not st.fresh then redis.call('DEL', key) end
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

