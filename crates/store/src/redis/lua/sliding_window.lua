-- Sliding window counter (tollgate-core's sliding_window.rs): the current window's start, the
-- previous window's count and the current one's; the previous is weighted by its overlap.
--
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
  check = function(st, p, cost)
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

