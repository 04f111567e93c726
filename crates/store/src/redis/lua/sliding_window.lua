-- Sliding window counter (tollgate-core's sliding_window.rs): the current window's start, the
-- previous window's count and the current one's; the previous is weighted by its overlap.
--
-- The sliding window counter's counters as seen from the window holding `at`.
local function sliding_rolled(st, p, at)
  local current = win(at, p.period)
  if not st then return current, 0, 0 end
  if st.start >= current then return st.start, st.prev, st.curr end
  -- The j-th window after the stored one counts what its current window carries into it, and
  -- weighs at most `count` of what it carried into the window before.
  local j = math.max(idiv(current - st.start + p.period - 1, p.period), 1)
  return current, math.min(carried(p, st.curr, j - 1), p.count), carried(p, st.curr, j)
end

-- When a state whose current window starts at `start` and counts `curr` is idle.
local function sliding_idle(p, start, curr) return start + (last_indebted(p, curr) + 2) * p.period end

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
        -- The first later window whose carried count leaves room for `cost`, once its weighted
        -- previous one does too.
        local j = idiv(math.max(carried(p, curr, 1) + cost - count, 0) + count - 1, count) + 1
        local prev_j, curr_j = math.min(carried(p, curr, j - 1), count), carried(p, curr, j)
        retry = start + (j + 1) * P - math.min(muldiv(count - curr_j - cost, P, math.max(prev_j, 1)), P)
      end
    end
    local reset = 0
    if after > 0 then reset = sliding_idle(p, start, after) elseif prev > 0 then reset = finish end
    local d = decision(allowed, count, count - prev + q - after, retry, reset)
    if allowed and cost > 0 then return d, { start = start, prev = prev, curr = wanted }, start + 2 * P end
    return d, nil, nil, curr > count
  end,
  charge = function(st, p, cost, at)
    local start, prev, curr = sliding_rolled(st, p, at)
    local total = curr + window_counted(p, curr, cost)
    return { start = start, prev = prev, curr = total }, sliding_idle(p, start, total)
  end,
  refund = function(st, p, cost, at, reset)
    if not st then return end
    local start = at + reset - 2 * p.period
    if st.start == start then
      local curr = st.curr - math.min(cost, st.curr)
      return { start = st.start, prev = st.prev, curr = curr }, sliding_idle(p, st.start, curr)
    elseif st.start - p.period == start then
      return { start = st.start, prev = st.prev - math.min(cost, st.prev), curr = st.curr }, sliding_idle(p, st.start, st.curr)
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

