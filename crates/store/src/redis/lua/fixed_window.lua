-- Fixed window (tollgate-core's fixed_window.rs): the core's state, the window's start and count.
--
-- The fixed window counting at `at`: at's window, or the stored one if later (a clock gone
-- backwards, or a charge dated in an earlier window), which still counts.
local function fixed_rolled(st, p, at)
  local current = win(at, p.period)
  if not st or st.used == 0 then return current, 0 end
  if st.start >= current then return st.start, st.used end
  -- What its debt leaves spent in now's window, the windows between rounded up (at least one).
  local j = math.max(idiv(current - st.start + p.period - 1, p.period), 1)
  return current, carried(p, st.used, j)
end

-- The end of the window counting `used` that starts at `start`, or of the last one its debt reaches.
local function fixed_idle(p, start, used) return start + (last_indebted(p, used) + 1) * p.period end

ALGS['fixed-window'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return nil end
    return { start = rel(key, f[1]), used = int(key, f[2]) }
  end,
  check = function(st, p, cost)
    local start, used = fixed_rolled(st, p, 0)
    local P, count = p.period, p.count
    local finish = start + P
    local wanted = used + cost
    local allowed = wanted <= count
    local after = allowed and wanted or used
    local retry = 0
    if not allowed then
      -- The first window whose carried debt leaves room for `cost` (the next, unless in debt).
      local over = math.max(carried(p, used, 1) + cost - count, 0)
      retry = start + (idiv(over + count - 1, count) + 1) * P
    end
    local d = decision(allowed, count, count - after, retry, after > 0 and fixed_idle(p, start, after) or 0)
    if allowed and cost > 0 then return d, { start = start, used = wanted }, finish end
    return d, nil, nil, used > count
  end,
  charge = function(st, p, cost, at)
    local start, used = fixed_rolled(st, p, at)
    local total = used + window_counted(p, used, cost)
    return { start = start, used = total }, fixed_idle(p, start, total)
  end,
  refund = function(st, p, cost, at, reset)
    if st and st.used > 0 and st.start + p.period == at + reset then
      local used = st.used - math.min(cost, st.used)
      return { start = st.start, used = used }, fixed_idle(p, st.start, used)
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

