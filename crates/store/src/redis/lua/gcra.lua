-- GCRA (tollgate-core's gcra.rs): the state is the core's, the theoretical arrival time, stored as
-- decimal ns since the epoch (a double holds only 2^53: every instant is a string in Redis and a
-- difference from now in Lua; see prelude.lua). So are every algorithm's instants. Beside it, the
-- emission interval the TAT was scheduled in (`tat interval`; a value of `tat` alone, written
-- before it was recorded, is read as scheduled in the limit's own).

-- The TAT of `st` seen at `at` under the limit's interval.
local function gcra_tat(st, p, at) return rescaled_tat(st.tat, st.T, p, at) end

ALGS['gcra'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key))
    if not f then return nil end
    if #f ~= 1 and #f ~= 2 then bad(key, 'a value of ' .. #f .. ' fields') end
    return { tat = rel(key, f[1]), T = f[2] and int(key, f[2]) or 0 }
  end,
  check = function(st, p, cost)
    local tat = math.max(st and gcra_tat(st, p, 0) or 0, 0)
    local new = tat + cost * p.T
    local allowed = new <= p.tol
    local ahead = allowed and new or tat
    local d = decision(allowed, p.burst, idiv(math.max(p.tol - ahead, 0), p.T), allowed and 0 or new - p.tol, ahead)
    if allowed and cost > 0 then return d, { tat = new, T = p.T }, new end
    -- Refused under another rate: the schedule is written in the new one, so it stops draining at
    -- the old rate and the retry announced holds (as the core's `check`).
    if cost > 0 and st and st.T ~= 0 and st.T ~= p.T and st.tat > 0 then return d, { tat = tat, T = p.T }, tat end
    return d
  end,
  charge = function(st, p, cost, at)
    local tat = charged_tat(st and gcra_tat(st, p, at) or -FAR, at, cost * p.T)
    return { tat = tat, T = p.T }, tat
  end,
  refund = function(st, p, cost, at, reset)
    -- Admitted under another rate: not where it was counted (an under-grant, as the core's).
    if st and (st.T == 0 or st.T == p.T) and st.tat == at + reset then
      local tat = st.tat - cost * p.T
      return { tat = tat, T = p.T }, tat
    end
  end,
  snapshot = function(st, p, at)
    return math.max((st and gcra_tat(st, p, at or 0) or 0) - (at or 0), 0), 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, abs(st.tat) .. string.format(' %d', st.T), 'PX', px(idle))
  end,
}
