-- Token bucket (tollgate-core's token_bucket.rs): the core's state, tokens (ns of refill), when
-- they were counted, and the emission interval and capacity they were counted in (`tokens last
-- interval capacity`; a value of the first two, written before the others were recorded, is read
-- as counted in the limit's own).
--
-- The token bucket and the leaky bucket keep their own fields and make exactly GCRA's decisions,
-- debt and clocks going backwards included: the bucket is full (empty) again at GCRA's
-- theoretical arrival time.
local function bucket_tat(st, cap)
  if not st then return -FAR end
  return st.last + math.max(cap - st.tokens, 0)
end

-- The bucket seen at `at` counted in p.T and p.tol (tollgate-core's `TokenBucket::under`): full at
-- the same instant, rescaled to p.T when counted in another interval.
local function token_under(st, p, at)
  if not st then return nil end
  if (st.T == 0 or st.T == p.T) and (st.cap == 0 or st.cap == p.tol) then return st end
  local old = st.cap == 0 and p.tol or st.cap
  local full = rescaled_tat(st.last + math.max(old - st.tokens, 0), st.T, p, at)
  local last = math.max(at, full - p.tol)
  return { tokens = p.tol - math.min(math.max(full - last, 0), p.tol), last = last, T = p.T, cap = p.tol }
end

ALGS['token-bucket'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key))
    if not f then return nil end
    if #f ~= 2 and #f ~= 4 then bad(key, 'a value of ' .. #f .. ' fields') end
    return { tokens = int(key, f[1]), last = rel(key, f[2]), T = f[3] and int(key, f[3]) or 0, cap = f[4] and int(key, f[4]) or 0 }
  end,
  check = function(st, p, cost)
    local cap, need = p.tol, cost * p.T
    local own = token_under(st, p, 0)
    -- Tokens at now: negative while in debt, or before `last` (a clock gone backwards).
    local available = cap
    if own then available = math.min(own.tokens - own.last, cap) end
    local allowed = available >= need
    local left = allowed and available - need or available
    local d = decision(allowed, p.burst, idiv(math.max(left, 0), p.T), allowed and 0 or need - available, cap - left)
    if allowed and cost > 0 then return d, { tokens = left, last = 0, T = p.T, cap = cap }, cap - left end
    -- Refused on a bucket counted in another interval or capacity (token_under made a new one):
    -- written in the limit's, so it stops refilling at the old rate (as the core's `check`).
    if cost > 0 and own ~= st then return d, own, cap - left end
    return d
  end,
  charge = function(st, p, cost, at)
    local cap = p.tol
    local tat = charged_tat(bucket_tat(token_under(st, p, at), cap), at, cost * p.T)
    local last = math.max(at, tat - cap)
    return { tokens = cap - (tat - last), last = last, T = p.T, cap = cap }, tat
  end,
  refund = function(st, p, cost, at, reset)
    -- Counted under another interval or capacity: not where it was counted (an under-grant).
    if st and (st.T == 0 or st.T == p.T) and (st.cap == 0 or st.cap == p.tol) and bucket_tat(st, p.tol) == at + reset then
      local tat = at + reset - cost * p.T
      return { tokens = p.tol - math.min(math.max(tat - at, 0), p.tol), last = at, T = p.T, cap = p.tol }, tat
    end
  end,
  snapshot = function(st, p, at)
    return math.max(bucket_tat(token_under(st, p, at or 0), p.tol) - (at or 0), 0), 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, string.format('%d ', st.tokens) .. abs(st.last) .. string.format(' %d %d', st.T, st.cap), 'PX', px(idle))
  end,
}
