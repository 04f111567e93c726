-- tollgate: the seven algorithms of SEMANTICS.md as one atomic Redis call; this file holds what
-- they share, one file per algorithm follows (named as tollgate-core's, with its trait's names),
-- then `decide.lua`, the entry. The Rust side (`program.rs`) puts the layout of the arguments
-- and of the reply and the shared bounds before this file (`local ARG_... = n`, generated from
-- `layout.rs`, where each is defined once), and after the entry
-- either registers it as a Redis Function (loaded once per server: everything here runs once) or
-- calls it (EVAL, for servers without functions).
--
-- Exact nanoseconds with Lua's doubles: instants are kept as decimal strings of ns since the
-- epoch and turned into ns relative to now (exact below 2^53, 104 days), so every step works
-- around now = 0. Periods and burst * T are at most 50 days (tollgate-core's MAX_PERIOD_NS), so
-- the sliding window counter's two periods back stay exact; instants further than FAR are clamped.

-- The call's "now" (seconds and nanoseconds since the epoch) and its TTL margin, set by the entry.
local S, N, MARGIN
-- The bounds come before this file with the layout (`layout.rs` generates them from tollgate-core's
-- constants): MAX_AHEAD (MAX_AHEAD_NS: how far a charge may push a schedule), MAX_COUNTER (the most
-- a window counts) and FAR_SEC.
local BILLION = 1000000000
local FAR = FAR_SEC * BILLION -- 104 days: further than this from now counts as "long ago" or "far ahead"

-- How much of a charge of `cost` a window counting `used` records.
local function counted(used, cost) return math.min(cost, math.max(MAX_COUNTER - used, 0)) end

-- A window's debt (tollgate-core's algorithm/debt.rs): a window counted past its limit carries the
-- excess into the windows after it, `count` of it paid back per window, into those ending within
-- 52 days (MAX_AHEAD) of its start, and over calendar windows into the next one at most. p.D: how
-- many windows after its own; p.cap: the most a window counts.
local function debt(p)
  if not p.cap then
    local D = math.max(math.floor(MAX_AHEAD / p.period) - 1, 0)
    if p.B then D = math.min(D, 1) end
    p.D, p.cap = D, math.min(MAX_COUNTER, p.count * (D + 1))
  end
  return p
end

-- How much of a charge of `cost` a window counting `used` records (up to the window's cap).
local function window_counted(p, used, cost) return math.min(cost, math.max(debt(p).cap - used, 0)) end

-- What a window that counted `used` leaves spent in the `j`-th window after it.
local function carried(p, used, j)
  if j == 0 then return used end
  return math.max(math.min(used, debt(p).cap) - j * p.count, 0)
end

-- The last window after the one counting `used` (0: that one) that `used` leaves anything in.
local function last_indebted(p, used)
  if used <= p.count then return 0 end
  return math.floor((math.min(used, debt(p).cap) - 1) / p.count)
end

-- The bucket family's schedule end after charging `cost_ns` at `at` (see tollgate-core).
local function charged_tat(tat, at, cost_ns)
  local from = math.max(tat, at)
  return math.max(math.min(from + cost_ns, at + MAX_AHEAD), from)
end

local function bad(key, what)
  error({ err = 'TOLLGATE_BADSTATE key ' .. key .. ' holds ' .. what .. ', not state written by tollgate' })
end

-- Exact floor(a / b) for integers |a| < 2^53, b > 0.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function imod(a, b) return a - idiv(a, b) * b end

-- Exact floor(a * b / m) and (a * b) mod m for integers 0 <= a, b < 2^53, m > 0, by binary long
-- multiplication.
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

-- The bucket family's schedule end `tat` (relative ns) scheduled in emission interval `T`, seen at
-- `at` under p.T (tollgate-core's `rescaled_tat`): the units still ahead of `at` scheduled in
-- p.T, rounded up to the ns, at most MAX_AHEAD ahead, so a changed rate keeps what was spent.
-- `tat` itself when T is p.T, unknown (0: written before it was recorded) or nothing is ahead.
local function rescaled_tat(tat, T, p, at)
  if T == 0 or T == p.T or tat <= at then return tat end
  local q, r = muldiv(tat - at, p.T, T)
  if r > 0 then q = q + 1 end
  return at + math.min(q, MAX_AHEAD)
end

-- (S * BILLION) mod p, by window length, for the second S it was computed in: the long
-- multiplication runs once per second and length (a Function's library lives across calls; under
-- EVAL the table is new each call). Bounded: cleared when it holds 64 lengths.
local ALIGNED, ALIGNED_N = {}, 0
local function aligned(p)
  local a = ALIGNED[p]
  if a and a[1] == S then return a[2] end
  local _, m = muldiv(S, BILLION, p)
  if not a then
    if ALIGNED_N >= 64 then ALIGNED, ALIGNED_N = {}, 0 end
    ALIGNED_N = ALIGNED_N + 1
    a = {}
    ALIGNED[p] = a
  end
  a[1], a[2] = S, m
  return m
end

-- Start of the epoch-aligned window of length p holding the instant `r` (ns relative to now).
local function win(r, p)
  return r - imod(imod(aligned(p) + N, p) + r, p)
end

-- A stored instant (decimal ns since the epoch) as ns relative to now.
local function rel(key, text)
  -- One match splits the seconds from the nanoseconds (the last nine digits).
  local sec, nsec = string.match(text or '', '^(%d*)(%d%d%d%d%d%d%d%d%d)$')
  if not sec then
    if not text or not string.match(text, '^%d+$') then bad(key, 'a malformed instant') end
    sec, nsec = '', text
  end
  local ds = (tonumber(sec) or 0) - S
  nsec = tonumber(nsec)
  if ds < -FAR_SEC then return -FAR end
  if ds > FAR_SEC then return FAR end
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
local function px(idle)
  local ms = math.ceil(idle / 1000000)
  if ms < 1 then ms = 1 end
  return ms + MARGIN
end

-- Lengthens `key`'s TTL to `reset` (ns, a number or decimal text), never shortening it (PTTL
-- first: PEXPIRE's GT needs Redis 7, and the script also runs by EVALSHA on earlier servers).
local function outlive(key, reset)
  local ns = tonumber(reset)
  if not ns or ns <= 0 then return end
  local ms = px(ns)
  local ttl = redis.call('PTTL', key)
  if ttl >= 0 and ttl < ms then redis.call('PEXPIRE', key, ms) end
end

local function decision(allowed, limit, remaining, retry, reset)
  if remaining < 0 then remaining = 0 end
  if reset < 0 then reset = 0 end
  return { allowed, limit, remaining, retry, reset }
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- Each algorithm, as tollgate-core's `RateState`: load(key) reads the state (nil: no history);
-- check(st, p, cost) returns the decision at now and, when it consumed, the new state and when it
-- is idle (ns relative to now: tollgate-core's idle_at); charge(st, p, cost, at) returns the state
-- after a forced admission at `at` and when it is idle; refund(st, p, cost, at, reset) the state
-- with an admission withdrawn, if it still holds it; snapshot(st, p, at) the used and previous
-- counts at `at`; store(key, st, idle) writes. `check` and `charge` never modify `st`. A check
-- that writes nothing may return a fourth value, true when the key is in debt: its debt, read
-- under this limit (a count lowered since it was written), may outlast the key's TTL, which
-- `outlive` then lengthens to the reset the decision announces.
local ALGS = {}
