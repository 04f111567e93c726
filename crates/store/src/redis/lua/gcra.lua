-- GCRA (tollgate-core's gcra.rs): the state is the core's, the theoretical arrival time, stored as
-- decimal ns since the epoch (a double holds only 2^53: every instant is a string in Redis and a
-- difference from now in Lua; see prelude.lua). So are every algorithm's instants.
ALGS['gcra'] = {
  load = function(key)
    local v = redis.call('GET', key)
    if not v then return nil end
    return { tat = rel(key, v) }
  end,
  check = function(st, p, cost)
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

