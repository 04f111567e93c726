-- tollgate: the seven algorithms of SEMANTICS.md as one atomic Redis script.
--
-- KEYS[i]: the state key of check i.
-- ARGV: now_sec, now_nsec (both '' to use the server's TIME), ttl_margin_ms, n, then 8 values per
--       check: algorithm, count, period_ns, burst, slices, emission_ns, tolerance_ns, cost.
-- Returns 5 integers per check: allowed (1/0), limit, remaining, retry_after_ns, reset_after_ns.
-- The checks are decided in order; the states are written only if every check admitted.
--
-- Exact nanoseconds with Lua's doubles: instants are kept as decimal strings of ns since the
-- epoch and turned into ns relative to now (exact below 2^53), so every step works around now = 0.
-- Durations (period, burst * T) are below 2^52 ns (checked by the caller).

local S, N
if ARGV[1] == '' then
  local t = redis.call('TIME')
  S = tonumber(t[1]); N = tonumber(t[2]) * 1000
else
  S = tonumber(ARGV[1]); N = tonumber(ARGV[2])
end
local MARGIN = tonumber(ARGV[3])
local BILLION = 1000000000
local FAR = 4503599627370496 -- 2^52 ns: further than this from now counts as "long ago" or "far ahead"

local function bad(key, what)
  error({ err = 'TOLLGATE_BADSTATE key ' .. key .. ' holds ' .. what .. ', not state written by tollgate' })
end

-- Exact floor(a / b) for integers 0 <= a < 2^53, b > 0.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function imod(a, b) return a - idiv(a, b) * b end

-- Exact floor(a * b / m) and (a * b) mod m for integers below 2^52, by binary long multiplication.
local function muldiv(a, b, m)
  local qb = idiv(b, m)
  local rb = b - qb * m
  local bits, x = {}, a
  while x > 0 do
    local bit = x % 2
    bits[#bits + 1] = bit
    x = (x - bit) / 2
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q = q * 2; r = r * 2
    if r >= m then r = r - m; q = q + 1 end
    if bits[i] == 1 then
      r = r + rb
      if r >= m then r = r - m; q = q + 1 end
    end
  end
  return a * qb + q, r
end

-- now mod p, exactly: where the epoch-aligned window of length p holding now started, as -result.
local function now_mod(p)
  local _, r = muldiv(S, BILLION, p)
  return imod(r + N, p)
end

-- A stored instant (decimal ns since the epoch) as ns relative to now.
local function rel(key, text)
  if not text or not string.match(text, '^%d+$') then bad(key, 'a malformed instant') end
  local len = string.len(text)
  local sec, nsec = 0, tonumber(text)
  if len > 9 then
    sec = tonumber(string.sub(text, 1, len - 9)); nsec = tonumber(string.sub(text, len - 8))
  end
  local ds = sec - S
  if ds < -4000000 then return -FAR end
  if ds > 4000000 then return FAR end
  return ds * BILLION + (nsec - N)
end

-- ns relative to now as a stored instant.
local function abs(r)
  local total = N + r
  local ds = math.floor(total / BILLION)
  local nsec = total - ds * BILLION
  if nsec < 0 then ds = ds - 1; nsec = nsec + BILLION elseif nsec >= BILLION then ds = ds + 1; nsec = nsec - BILLION end
  return string.format('%d%09d', S + ds, nsec)
end

local function int(key, text)
  if not text or not string.match(text, '^%d+$') then bad(key, 'a malformed counter') end
  return tonumber(text)
end

local function fields(key, value, n)
  if type(value) ~= 'string' then return nil end
  local out = {}
  for word in string.gmatch(value, '%S+') do out[#out + 1] = word end
  if n and #out ~= n then bad(key, 'a value of ' .. #out .. ' fields') end
  return out
end

-- Milliseconds a key must live: until its state is idle again, plus the clock margin.
local function px(idle_ns)
  local ms = math.ceil(idle_ns / 1000000)
  if ms < 1 then ms = 1 end
  return ms + MARGIN
end

local function decision(allowed, limit, remaining, retry, reset)
  if remaining < 0 then remaining = 0 end
  return { allowed, limit, remaining, retry, reset }
end

local ALGS = {}

ALGS['gcra'] = {
  load = function(key)
    local v = redis.call('GET', key)
    if not v then return {} end
    return { tat = rel(key, v) }
  end,
  decide = function(st, p, cost)
    local tat = st.tat or 0
    if tat < 0 then tat = 0 end
    local new = tat + cost * p.T
    local allowed = new <= p.tol
    local ahead = allowed and new or tat
    local d = decision(allowed, p.burst, idiv(math.max(p.tol - ahead, 0), p.T), allowed and 0 or new - p.tol, ahead)
    if allowed and cost > 0 then return d, { tat = new }, new end
    return d
  end,
  store = function(key, st, idle)
    redis.call('SET', key, abs(st.tat), 'PX', px(idle))
  end,
}

ALGS['token-bucket'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return {} end
    return { tokens = int(key, f[1]), last = rel(key, f[2]) }
  end,
  decide = function(st, p, cost)
    local cap, need = p.tol, cost * p.T
    local tokens, last = st.tokens or cap, st.last or -FAR
    local available = math.min(tokens + math.max(-last, 0), cap)
    local allowed = available >= need
    local left = allowed and available - need or available
    local d = decision(allowed, p.burst, idiv(left, p.T), allowed and 0 or need - available, cap - left)
    if allowed and cost > 0 then
      local at = math.max(last, 0)
      return d, { tokens = left, last = at }, at + cap - left
    end
    return d
  end,
  store = function(key, st, idle)
    redis.call('SET', key, string.format('%d ', st.tokens) .. abs(st.last), 'PX', px(idle))
  end,
}

ALGS['leaky-bucket'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return {} end
    return { level = int(key, f[1]), last = rel(key, f[2]) }
  end,
  decide = function(st, p, cost)
    local cap = p.tol
    local last = st.last or -FAR
    local level = math.max((st.level or 0) - math.max(-last, 0), 0)
    local filled = level + cost * p.T
    local allowed = filled <= cap
    local after = allowed and filled or level
    local d = decision(allowed, p.burst, idiv(math.max(cap - after, 0), p.T), allowed and 0 or filled - cap, after)
    if allowed and cost > 0 then
      local at = math.max(last, 0)
      return d, { level = filled, last = at }, at + filled
    end
    return d
  end,
  store = function(key, st, idle)
    redis.call('SET', key, string.format('%d ', st.level) .. abs(st.last), 'PX', px(idle))
  end,
}

ALGS['fixed-window'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return {} end
    return { start = rel(key, f[1]), used = int(key, f[2]) }
  end,
  decide = function(st, p, cost)
    local current = -now_mod(p.period)
    local start, used = current, 0
    -- A stored window later than now's (a clock gone backwards) still counts.
    if st.start and st.start >= current and st.used > 0 then start, used = st.start, st.used end
    local finish = start + p.period
    local wanted = used + cost
    local allowed = wanted <= p.count
    local after = allowed and wanted or used
    local d = decision(allowed, p.count, p.count - after, allowed and 0 or finish, after > 0 and finish or 0)
    if allowed and cost > 0 then return d, { start = start, used = wanted }, finish end
    return d
  end,
  store = function(key, st, idle)
    redis.call('SET', key, abs(st.start) .. string.format(' %d', st.used), 'PX', px(idle))
  end,
}

ALGS['sliding-window'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 3)
    if not f then return {} end
    return { start = rel(key, f[1]), prev = int(key, f[2]), curr = int(key, f[3]) }
  end,
  decide = function(st, p, cost)
    local P, count = p.period, p.count
    local current = -now_mod(P)
    local start, prev, curr = current, 0, 0
    if st.start and st.start >= current then
      start, prev, curr = st.start, st.prev, st.curr
    elseif st.start and st.start + P == current then
      prev = st.curr
    end
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
  store = function(key, st, idle)
    redis.call('SET', key, abs(st.start) .. string.format(' %d %d', st.prev, st.curr), 'PX', px(idle))
  end,
}

ALGS['sub-window'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key))
    if not f then return {} end
    if #f < 2 then bad(key, 'a value of ' .. #f .. ' fields') end
    local counts = {}
    for i = 2, #f do counts[i - 1] = int(key, f[i]) end
    return { newest = rel(key, f[1]), counts = counts }
  end,
  decide = function(st, p, cost)
    local n, count = p.slices, p.count
    local L = idiv(p.period, n)
    local current = -now_mod(L)
    local newest, counts, d = current, {}, 0
    for i = 1, n do counts[i] = 0 end
    if st.newest then
      -- A changed slice count folds every count into the newest slice (never under-counts).
      if #st.counts == n then
        for i = 1, n do counts[i] = st.counts[i] end
      else
        local total = 0
        for i = 1, #st.counts do total = total + st.counts[i] end
        counts[n] = total
      end
      newest = st.newest
      -- A clock gone backwards counts from the newest slice written.
      current = math.max(current, newest)
      d = idiv(current - newest, L)
    end
    -- Slot i (n = newest) holds the slice starting at newest - (n - i)*L; live iff i > d.
    local used = 0
    for i = d + 1, n do used = used + counts[i] end
    local allowed = used + cost <= count
    local retry = 0
    if allowed and cost > 0 then
      local shifted = {}
      for i = 1, n do
        local from = i + d
        shifted[i] = from <= n and counts[from] or 0
      end
      counts, newest, d = shifted, current, 0
      counts[n] = counts[n] + cost
    elseif not allowed then
      local excess, freed = used + cost - count, 0
      for i = d + 1, n do
        freed = freed + counts[i]
        if freed >= excess then retry = newest + i * L; break end
      end
    end
    local reset = 0
    for i = n, d + 1, -1 do
      if counts[i] > 0 then reset = newest + i * L; break end
    end
    local after = allowed and used + cost or used
    local dec = decision(allowed, count, count - after, retry, reset)
    if allowed and cost > 0 then return dec, { newest = newest, counts = counts }, reset end
    return dec
  end,
  store = function(key, st, idle)
    local parts = { abs(st.newest) }
    for i = 1, #st.counts do parts[#parts + 1] = string.format('%d', st.counts[i]) end
    redis.call('SET', key, table.concat(parts, ' '), 'PX', px(idle))
  end,
}

ALGS['sliding-log'] = {
  load = function(key)
    local raw = redis.call('LRANGE', key, 0, -1)
    local entries = {}
    for i = 1, #raw do
      local f = fields(key, raw[i], 2)
      entries[i] = { t = rel(key, f[1]), c = int(key, f[2]) }
    end
    return { entries = entries }
  end,
  decide = function(st, p, cost)
    local P, count, e = p.period, p.count, st.entries or {}
    -- An entry stamped t is in the window (now - P, now] until t + P.
    local live = #e + 1
    for i = 1, #e do
      if e[i].t + P > 0 then live = i; break end
    end
    local used = 0
    for i = live, #e do used = used + e[i].c end
    local allowed = used + cost <= count
    local newest = live <= #e and e[#e].t or nil
    local reset = newest and newest + P or 0
    local retry = 0
    if allowed and cost > 0 then
      local kept = {}
      for i = live, #e do kept[#kept + 1] = { t = e[i].t, c = e[i].c } end
      -- A clock gone backwards stamps at the newest entry's time, keeping the log sorted.
      local stamp = newest and math.max(newest, 0) or 0
      if #kept > 0 and kept[#kept].t == stamp then
        kept[#kept].c = kept[#kept].c + cost
      else
        kept[#kept + 1] = { t = stamp, c = cost }
      end
      reset = stamp + P
      local after = used + cost
      return decision(true, count, count - after, 0, reset), { entries = kept }, reset
    elseif not allowed then
      local excess, freed = used + cost - count, 0
      for i = live, #e do
        freed = freed + e[i].c
        if freed >= excess then retry = e[i].t + P; break end
      end
    end
    local after = allowed and used + cost or used
    return decision(allowed, count, count - after, retry, reset)
  end,
  store = function(key, st, idle)
    redis.call('DEL', key)
    local values = {}
    for i = 1, #st.entries do values[i] = abs(st.entries[i].t) .. string.format(' %d', st.entries[i].c) end
    redis.call('RPUSH', key, unpack(values))
    redis.call('PEXPIRE', key, px(idle))
  end,
}

-- Decide every check in order; a key checked twice sees its first check's pending state.
local n = tonumber(ARGV[4])
local loaded, pending, writes, params, costs, decisions = {}, {}, {}, {}, {}, {}
local all = true
for i = 1, n do
  local b = 4 + (i - 1) * 8
  local p = {
    alg = ARGV[b + 1], count = tonumber(ARGV[b + 2]), period = tonumber(ARGV[b + 3]), burst = tonumber(ARGV[b + 4]),
    slices = tonumber(ARGV[b + 5]), T = tonumber(ARGV[b + 6]), tol = tonumber(ARGV[b + 7]),
  }
  local A = ALGS[p.alg]
  if not A then return redis.error_reply('TOLLGATE_ARGS unknown algorithm ' .. tostring(p.alg)) end
  local key, cost = KEYS[i], tonumber(ARGV[b + 8])
  if loaded[key] == nil then loaded[key] = A.load(key) end
  local st = pending[key] or loaded[key]
  local d, new, idle = A.decide(st, p, cost)
  if new then
    pending[key] = new
    writes[#writes + 1] = { A, key, new, idle }
  end
  if d[1] == false then all = false end
  params[i], costs[i], decisions[i] = p, cost, d
end

if all then
  for _, w in ipairs(writes) do w[1].store(w[2], w[3], w[4]) end
else
  -- Nothing is written; the checks that did not block report their state as a peek would.
  for i = 1, n do
    if decisions[i][1] then decisions[i] = ALGS[params[i].alg].decide(loaded[KEYS[i]], params[i], 0) end
  end
end

local out = {}
for i = 1, n do
  local d = decisions[i]
  out[#out + 1] = d[1] and 1 or 0
  for j = 2, 5 do out[#out + 1] = d[j] end
end
return out
