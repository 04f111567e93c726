-- Token bucket (tollgate-core's token_bucket.rs): the core's state, tokens (ns of refill) and when
-- they were counted.
--
-- The token bucket and the leaky bucket keep their own two fields and make exactly GCRA's
-- decisions, debt and clocks going backwards included: the bucket is full (empty) again at
-- GCRA's theoretical arrival time.
local function bucket_tat(st, cap)
  if not st then return -FAR end
  return st.last + math.max(cap - st.tokens, 0)
end

ALGS['token-bucket'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return nil end
    return { tokens = int(key, f[1]), last = rel(key, f[2]) }
  end,
  check = function(st, p, cost)
    local cap, need = p.tol, cost * p.T
    -- Tokens at now: negative while in debt, or before `last` (a clock gone backwards).
    local available = cap
    if st then available = math.min(st.tokens - st.last, cap) end
    local allowed = available >= need
    local left = allowed and available - need or available
    local d = decision(allowed, p.burst, idiv(math.max(left, 0), p.T), allowed and 0 or need - available, cap - left)
    if allowed and cost > 0 then return d, { tokens = left, last = 0 }, cap - left end
    return d
  end,
  charge = function(st, p, cost, at)
    local cap = p.tol
    local tat = charged_tat(bucket_tat(st, cap), at, cost * p.T)
    local last = math.max(at, tat - cap)
    return { tokens = cap - (tat - last), last = last }, tat
  end,
  refund = function(st, p, cost, at, reset)
    if st and bucket_tat(st, p.tol) == at + reset then
      local tat = at + reset - cost * p.T
      return { tokens = p.tol - math.min(math.max(tat - at, 0), p.tol), last = at }, tat
    end
  end,
  snapshot = function(st, p, at)
    return math.max(bucket_tat(st, p.tol) - (at or 0), 0), 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, string.format('%d ', st.tokens) .. abs(st.last), 'PX', px(idle))
  end,
}

