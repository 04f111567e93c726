-- Leaky bucket as a meter (tollgate-core's leaky_bucket.rs): the level and when it was measured;
-- it drains at one unit per emission interval, as the token bucket refills (see token_bucket.lua).
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
  check = function(st, p, cost)
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

