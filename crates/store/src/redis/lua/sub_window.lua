-- Sub-window counter (tollgate-core's sub_window.rs). Its state is the core's (the newest slice's
-- start, the slice length, one count per slice), but the counts are stored oldest first where the
-- core keeps a ring indexed by slice number: a value read from Redis is parsed whole anyway, and
-- in order it needs no index arithmetic per slice.
--
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
  check = function(st, p, cost)
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

