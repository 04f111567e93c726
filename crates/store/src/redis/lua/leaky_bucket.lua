-- Leaky bucket as a meter (tollgate-core's leaky_bucket.rs): the level, when it was measured, and
-- the emission interval it was measured in (`level last interval`; a value of the first two,
-- written before the interval was recorded, is read as measured in the limit's own); it drains at
-- one unit per emission interval, as the token bucket refills (see token_bucket.lua).
local function leaky_level(st, at)
  if not st then return 0 end
  return math.max(st.last + st.level - at, 0)
end

-- The bucket seen at `at` measured in p.T (tollgate-core's `LeakyBucket::under`): empty at the
-- same instant, rescaled to p.T when measured in another interval.
local function leaky_under(st, p, at)
  if not st then return nil end
  local empty = st.last + st.level
  if st.T == 0 or st.T == p.T or empty <= at then return st end
  local last = math.max(st.last, at)
  return { level = math.max(rescaled_tat(empty, st.T, p, at) - last, 0), last = last, T = p.T }
end

ALGS['leaky-bucket'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key))
    if not f then return nil end
    if #f ~= 2 and #f ~= 3 then bad(key, 'a value of ' .. #f .. ' fields') end
    return { level = int(key, f[1]), last = rel(key, f[2]), T = f[3] and int(key, f[3]) or 0 }
  end,
  check = function(st, p, cost)
    local cap = p.tol
    local own = leaky_under(st, p, 0)
    local level = leaky_level(own, 0)
    local filled = level + cost * p.T
    local allowed = filled <= cap
    local after = allowed and filled or level
    local d = decision(allowed, p.burst, idiv(math.max(cap - after, 0), p.T), allowed and 0 or filled - cap, after)
    if allowed and cost > 0 then return d, { level = filled, last = 0, T = p.T }, filled end
    -- Refused on a level measured in another rate (leaky_under made a new one): written in the
    -- limit's, so it stops draining at the old rate (as the core's `check`).
    if cost > 0 and own ~= st then return d, own, level end
    return d
  end,
  charge = function(st, p, cost, at)
    local own = leaky_under(st, p, at)
    local empty = charged_tat(own and own.last + own.level or -FAR, at, cost * p.T)
    -- Measured from the later of the two instants (as tollgate-core).
    local last = math.max(own and own.last or -FAR, at)
    return { level = empty - last, last = last, T = p.T }, empty
  end,
  refund = function(st, p, cost, at, reset)
    -- Poured under another rate: not where it was counted (an under-grant, as the core's).
    if st and (st.T == 0 or st.T == p.T) and st.last + st.level == at + reset then
      local empty = at + reset - cost * p.T
      return { level = math.max(empty - at, 0), last = at, T = p.T }, empty
    end
  end,
  snapshot = function(st, p, at)
    return leaky_level(leaky_under(st, p, at or 0), at or 0), 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, string.format('%d ', st.level) .. abs(st.last) .. string.format(' %d', st.T), 'PX', px(idle))
  end,
}
