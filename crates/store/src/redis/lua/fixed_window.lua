-- Fixed window (tollgate-core's fixed_window.rs): the core's state, the window's start and count.
--
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
  check = function(st, p, cost)
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

