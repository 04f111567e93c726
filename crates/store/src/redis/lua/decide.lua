-- The entry: one call applies refunds, records charges and decides checks, atomically.
--
-- KEYS: the state key of each check, then of each charge, then of each refund, then the marker
--       key of each charge and of each refund (its state key's `applied` hash: sending node ->
--       highest running total applied; `refunded`: the instant of its latest refund; `reset` while
--       a reset is recent), then the hold key of each check asking for its hold (in order), then
--       with a lease the key counting its lessees.
-- ARGV: a header (ARG_*: the layout's version, now as seconds and nanoseconds, both '' to use the
--       server's TIME, the TTL margin in ms, how many checks, charges and refunds), then
--       CHECK_ARGS per check (LIMIT_*: the limit, the cost; CHECK_HOLD: 1 if its hold applies, else
--       0), CHARGE_ARGS per charge (the same 8 LIMIT_*,
--       then CHARGE_*: its age in ns, the sending node ('': none), its running total, the key's
--       remaining as the sender knows it, this charge included (-1: nothing known), the snapshot
--       that follows from (its instant in decimal ns since the epoch, '': none; used; previous),
--       and 1 if the remaining is a view, else 0), REFUND_ARGS per refund (the same 8, then
--       REFUND_*: the admission's instant in decimal ns since the epoch, its reset_after_ns), and
--       with a lease LEASE_ARGS (LEASE_*: the lessee's id, the lease's lifetime in ms).
--
-- Refunds (admissions withdrawn: a reservation that did not count) are applied first, each exactly
-- where its admission was counted if the state still holds it (see tollgate-core's refund).
-- Charges (admissions made elsewhere, e.g. by a node's fallback while Redis was unreachable) are
-- recorded next, whatever the limit says, dated `age` ns before now, each unit at most once per
-- node (one riding on several calls, sent again after a lost reply, or merged with charges applied
-- before, counts only what the key's marker has not recorded); then the key's
-- remaining is lowered to what the sender knew (a no-op unless this server lost what the sender
-- saw: the key expired early, restarted empty, promoted without the last writes), unless the key
-- was reset or refunded since the sender's snapshot; a view only if the key's state at the
-- snapshot's instant is behind it. Then the checks are decided in order; their states are
-- written only if every check admitted (the charges are written anyway). A check whose hold is
-- in force (its hold key holds an instant after now: see `hold.lua`) is denied, consuming nothing,
-- its retry and reset the rest of the hold.
-- Returns REPLY_CHECK integers per check: allowed (1/0, 2: denied by a hold), limit, remaining, retry_after_ns,
-- reset_after_ns, and the key's snapshot after the call (used, previous; see tollgate-core's
-- Snapshot), then the server's now as seconds and nanoseconds.
-- A lease (hot keys, see the store's `lease` module) is one check whose cost is the most wanted:
-- the check is admitted at min(cost, what is left), as an ordinary admission of that cost (or
-- denied as a unit request when nothing is left), and two more integers follow the reply: the
-- units granted and how many lessees asked within a lifetime.

-- The call's version, now and margin; its limit at `b` (and cost). A malformed call fails before
-- anything is written.
local function begin(argv)
  if argv[ARG_VERSION] ~= VERSION then
    error({ err = 'TOLLGATE_VERSION the script reads layout ' .. VERSION .. ', the call is ' .. tostring(argv[ARG_VERSION]) })
  end
  if argv[ARG_NOW_SEC] == '' then
    local t = redis.call('TIME')
    S = tonumber(t[1]); N = tonumber(t[2]) * 1000
  else
    S = tonumber(argv[ARG_NOW_SEC]); N = tonumber(argv[ARG_NOW_NSEC])
  end
  MARGIN = tonumber(argv[ARG_MARGIN])
end

local function params(argv, b, key)
  local p = {
    alg = argv[b + LIMIT_ALGORITHM], count = tonumber(argv[b + LIMIT_COUNT]), period = tonumber(argv[b + LIMIT_PERIOD]),
    burst = tonumber(argv[b + LIMIT_BURST]), slices = tonumber(argv[b + LIMIT_SLICES]),
    T = tonumber(argv[b + LIMIT_EMISSION]), tol = tonumber(argv[b + LIMIT_TOLERANCE]), key = key,
  }
  -- A calendar period (see calendar.lua) is decided by its algorithm's calendar twin.
  if not p.period and p.alg and not string.find(p.alg, '@', 1, true) then
    calendar_params(p, argv[b + LIMIT_PERIOD] or '')
    p.alg = p.alg .. '@calendar'
  end
  if not ALGS[p.alg] or (p.B == nil) ~= (string.find(tostring(p.alg), '@', 1, true) == nil) then
    error({ err = 'TOLLGATE_ARGS unknown algorithm ' .. tostring(p.alg) })
  end
  return p, tonumber(argv[b + LIMIT_COST])
end

-- A refund that applied stamps the key's marker with its instant (the latest: on a clock gone
-- backwards, the one there stays), for as long as a node's view of the key can matter (so that a
-- view from before it is not given back: see the charges' views).
local function stamp(marker, field, value, p)
  local ms = math.ceil(math.max(p.tol, 2 * p.period) / 1000000) + 1000
  local old = redis.call('HGET', marker, field)
  if not old or rel(marker, old) < rel(marker, value) then redis.call('HSET', marker, field, value) end
  if redis.call('PTTL', marker) < ms then redis.call('PEXPIRE', marker, ms) end
end

-- The limits parsed by recent one-check calls, by their arguments (Lua's strings are interned:
-- comparing them is comparing pointers, cheaper than parsing seven numbers into a new table on
-- every call); at most 256, cleared when full. Under EVAL it is new each call.
local PARSED, PARSED_N = {}, 0
local function parsed(argv, b, key)
  local tolerance = argv[b + LIMIT_TOLERANCE]
  local c = PARSED[tolerance]
  if not (c and c[1] == argv[b + LIMIT_ALGORITHM] and c[2] == argv[b + LIMIT_COUNT] and c[3] == argv[b + LIMIT_PERIOD]
      and c[4] == argv[b + LIMIT_BURST] and c[5] == argv[b + LIMIT_SLICES] and c[6] == argv[b + LIMIT_EMISSION]) then
    if PARSED_N >= 256 then PARSED, PARSED_N = {}, 0 end
    PARSED_N = PARSED_N + 1
    c = { argv[b + LIMIT_ALGORITHM], argv[b + LIMIT_COUNT], argv[b + LIMIT_PERIOD], argv[b + LIMIT_BURST],
      argv[b + LIMIT_SLICES], argv[b + LIMIT_EMISSION], (params(argv, b, key)) }
    PARSED[tolerance] = c
  end
  local p = c[7]
  p.key = key
  return p, tonumber(argv[b + LIMIT_COST])
end

-- The ns left of the hold at `key` (its end, a decimal instant), or nil: none, or ended.
local function held(key)
  local ends = redis.call('GET', key)
  if not ends then return nil end
  local left = rel(key, ends)
  if left > 0 then return left end
  return nil
end

-- Check `i`'s hold key (its CHECK_HOLD is 1: the key is KEYS[at]), or nil (0).
local function hold_key(KEYS, argv, i, at)
  local flag = argv[HEADER_ARGS + (i - 1) * CHECK_ARGS + CHECK_HOLD]
  if flag == '0' then return nil end
  if flag ~= '1' then error({ err = 'TOLLGATE_ARGS a check hold of ' .. tostring(flag) }) end
  if not KEYS[at] then error({ err = 'TOLLGATE_ARGS a check asking for its hold without its hold key' }) end
  return KEYS[at]
end

-- A call naming other than the `want` keys its layout takes (a key missing would shift the ones
-- after it: the lessees' key read as a hold) fails before anything is read or written.
local function keys_are(KEYS, want)
  if #KEYS ~= want then
    error({ err = 'TOLLGATE_ARGS the call names ' .. #KEYS .. ' keys, its arguments take ' .. want })
  end
end

-- The usual call, one check and nothing else: only what it needs (no tables of keys, charges or
-- markers, the limit parsed once); `hold`: its hold key, if its hold applies.
local function decide_one(key, argv, hold)
  local p, cost = parsed(argv, HEADER_ARGS, key)
  local A = ALGS[p.alg]
  local st = A.load(key)
  local left = hold and held(hold)
  if left then
    local used, previous = A.snapshot(st, p)
    return { 2, A.check(st, p, 0)[2], 0, left, left, used, previous, S, N }
  end
  local d, new, idle, indebted = A.check(st, p, cost)
  if new then st = new end
  -- Read before anything is written (the log's view reads the list as it was).
  local used, previous = A.snapshot(st, p)
  if new then A.store(key, new, idle) end
  if indebted then outlive(key, d[5]) end
  return { d[1] and 1 or 0, d[2], d[3], d[4], d[5], used, previous, S, N }
end

local function decide(KEYS, ARGV)
  begin(ARGV)
  if #ARGV == HEADER_ARGS + CHECK_ARGS and ARGV[ARG_CHECKS] == '1' and ARGV[ARG_CHARGES] == '0' and ARGV[ARG_REFUNDS] == '0' then
    local hold = hold_key(KEYS, ARGV, 1, 2)
    keys_are(KEYS, hold and 2 or 1)
    return decide_one(KEYS[1], ARGV, hold)
  end
  local checks, charges, refunds = tonumber(ARGV[ARG_CHECKS]), tonumber(ARGV[ARG_CHARGES]), tonumber(ARGV[ARG_REFUNDS])
  local charges_at = HEADER_ARGS + checks * CHECK_ARGS
  local refunds_at = charges_at + charges * CHARGE_ARGS
  local lease_at = refunds_at + refunds * REFUND_ARGS
  local leasing = #ARGV > lease_at
  -- The keys: KEYS[i] the i-th check's; then the charges', the refunds', their markers.
  local charge_key, refund_key = checks, checks + charges
  local charge_marker, refund_marker = checks + charges + refunds, checks + charges + refunds + charges
  -- The hold keys follow the markers, one per check whose hold applies; the lessees' key, last.
  local hold_of, hold_keys = {}, refund_marker + refunds
  for i = 1, checks do
    hold_of[i] = hold_key(KEYS, ARGV, i, hold_keys + 1)
    if hold_of[i] then hold_keys = hold_keys + 1 end
  end
  keys_are(KEYS, hold_keys + (leasing and 1 or 0))

  local loaded, state, idle, algs = {}, {}, {}, {}
  local function current(key, p)
    algs[key] = p.alg
    if loaded[key] == nil then loaded[key] = ALGS[p.alg].load(key) or false end
    if state[key] == nil then return loaded[key] or nil end
    return state[key]
  end

  -- 0. Refunds, each read and written in turn (a refund never needs to meet a check of its call).
  for k = 1, refunds do
    local b = refunds_at + (k - 1) * REFUND_ARGS
    local key = KEYS[refund_key + k]
    local p, cost = params(ARGV, b, key)
    local at, reset = rel(key, ARGV[b + REFUND_AT]), tonumber(ARGV[b + REFUND_RESET])
    local A = ALGS[p.alg]
    local applied = false
    if cost > 0 then
      if A.refund_in_place then
        applied = A.refund_in_place(key, p, cost, at, reset)
      else
        local new, at_idle = A.refund(A.load(key), p, cost, at, reset, ARGV[b + REFUND_AT], ARGV[b + REFUND_RESET], key)
        if new then A.store(key, new, at_idle); applied = true end
      end
    end
    if applied then stamp(KEYS[refund_marker + k], 'refunded', abs(0), p) end
  end

  -- 1. Charges, recorded whatever the limit says, each unit once per node: a node numbers its
  -- charges to a key by their running total, and the marker keeps the highest total applied from
  -- it; of a charge only what lies above that counts (all of it; none, sent again; a part, when
  -- charges merged after some of them were applied: counted at now, never before its instant).
  local marks, marked = {}, {}
  for j = 1, charges do
    local b = charges_at + (j - 1) * CHARGE_ARGS
    local key = KEYS[charge_key + j]
    local p, cost = params(ARGV, b, key)
    local A = ALGS[p.alg]
    local node, part, at = ARGV[b + CHARGE_NODE], cost, -tonumber(ARGV[b + CHARGE_AGE])
    local marker = KEYS[charge_marker + j]
    if node ~= '' then
      local total = tonumber(ARGV[b + CHARGE_TOTAL])
      if not total or total < 0 or total > MAX_TOTAL or total ~= math.floor(total) then
        error({ err = 'TOLLGATE_ARGS a charge total of ' .. tostring(ARGV[b + CHARGE_TOTAL]) })
      end
      local id = marker .. ' ' .. node
      if marks[id] == nil then
        marks[id] = tonumber(redis.call('HGET', marker, node) or '0') or 0
        marked[#marked + 1] = { id = id, marker = marker, node = node, total = marks[id] }
      end
      part = math.min(cost, total - marks[id])
      if part < cost then at = 0 end
      if total > marks[id] then marks[id] = total end
    end
    if part > 0 then
      local new, at_idle = A.charge(current(key, p), p, part, at)
      state[key], idle[key] = new, at_idle
    end
    local known = tonumber(ARGV[b + CHARGE_KNOWN])
    if known and known >= 0 and ARGV[b + CHARGE_SEEN_AT] ~= '' then
      -- Not over a reset or refund at or after the sender's snapshot (each stamps the marker with
      -- its instant); a view only for a key this server lost (its state at the snapshot's instant
      -- is behind it).
      -- (A calendar limit's instants may lie further than FAR: compared exactly, as decimals.)
      local seen = ARGV[b + CHARGE_SEEN_AT]
      local at = rel(key, seen)
      local stamps = redis.call('HMGET', marker, 'reset', 'refunded')
      for i = 1, 2 do
        if stamps[i] and (p.B and cal_not_before(key, stamps[i], seen) or not p.B and rel(key, stamps[i]) >= at) then
          known = -1
        end
      end
      if known >= 0 and ARGV[b + CHARGE_VIEW] == '1' then
        local used, previous = A.snapshot(current(key, p), p, p.B and seen or at)
        if used >= tonumber(ARGV[b + CHARGE_SEEN_USED]) and previous >= tonumber(ARGV[b + CHARGE_SEEN_PREVIOUS]) then
          known = -1
        end
      end
    end
    if known and known >= 0 then
      local left = A.check(current(key, p), p, 0)[3]
      if left > known then state[key], idle[key] = A.charge(current(key, p), p, left - known, 0) end
    end
  end
  local charged = {}
  for k, v in pairs(state) do charged[k] = { v, idle[k] } end

  -- A lease: its lessee and lifetime follow every other argument.
  if leasing and checks ~= 1 then error({ err = 'TOLLGATE_ARGS a lease is one check' }) end
  local granted = 0

  -- 2. Checks, in order; a key checked twice sees its first check's pending state.
  local ps, decisions, by_hold, costs, outlived = {}, {}, {}, {}, {}
  local all = true
  for i = 1, checks do
    local key = KEYS[i]
    local p, cost = params(ARGV, HEADER_ARGS + (i - 1) * CHECK_ARGS, key)
    local left = hold_of[i] and held(hold_of[i])
    if left then
      -- Held: denied whatever the limit says, nothing consumed.
      decisions[i] = { false, ALGS[p.alg].check(current(key, p), p, 0)[2], 0, left, left }
      ps[i], by_hold[i], all, granted = p, true, false, 0
    else
      if leasing then
        -- As much of the wanted slice as is left (the peek's `remaining` is exactly the largest
        -- cost the algorithm admits now), or one unit, to be denied with that unit's retry.
        local rest = ALGS[p.alg].check(current(key, p), p, 0)[3]
        granted = math.min(cost, rest)
        cost = math.max(granted, 1)
      end
      local d, new, at_idle, indebted = ALGS[p.alg].check(current(key, p), p, cost)
      if new then state[key], idle[key] = new, at_idle end
      if indebted then outlived[key] = d[5] end
      if d[1] == false then all = false; granted = 0 end
      ps[i], decisions[i], costs[i] = p, d, cost
    end
  end

  -- 3. Everything is kept if every check admitted; otherwise only the charges, and the checks that
  -- did not block report the state as a peek would.
  if not all then
    state, idle = {}, {}
    for k, v in pairs(charged) do state[k], idle[k] = v[1], v[2] end
    for i = 1, checks do
      if decisions[i][1] then decisions[i] = ALGS[ps[i].alg].check(current(KEYS[i], ps[i]), ps[i], 0) end
    end
    -- A refusal under another rate still writes its bucket rescaled into the new rate (see the
    -- bucket scripts' check), as a single check does.
    for i = 1, checks do
      if not decisions[i][1] and not by_hold[i] and costs[i] > 0 then
        local d, new, at_idle = ALGS[ps[i].alg].check(current(KEYS[i], ps[i]), ps[i], costs[i])
        if new and not d[1] then state[KEYS[i]], idle[KEYS[i]] = new, at_idle end
      end
    end
  end

  -- 4. The reply, read before anything is written (the log's view reads the list as it was).
  local out = {}
  for i = 1, checks do
    local d = decisions[i]
    out[#out + 1] = by_hold[i] and 2 or (d[1] and 1 or 0)
    for j = 2, 5 do out[#out + 1] = d[j] end
    local used, previous = ALGS[ps[i].alg].snapshot(current(KEYS[i], ps[i]), ps[i])
    out[#out + 1] = used
    out[#out + 1] = previous
  end
  out[#out + 1] = S
  out[#out + 1] = N
  if leasing then
    local lessees = KEYS[hold_keys + 1]
    local now_ms = S * 1000 + math.floor(N / 1000000)
    local lifetime = tonumber(ARGV[lease_at + LEASE_LIFETIME])
    redis.call('ZREMRANGEBYSCORE', lessees, '-inf', now_ms)
    redis.call('ZADD', lessees, now_ms + lifetime, ARGV[lease_at + LEASE_LESSEE])
    -- The set lives as long as its longest-lived lessee (lessees may ask with other lifetimes).
    local last = redis.call('ZRANGE', lessees, -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', lessees, math.max(tonumber(last[2]) - now_ms, 1) + MARGIN)
    out[#out + 1] = granted
    out[#out + 1] = redis.call('ZCARD', lessees)
  end

  -- 5. Write; a marker lives REMEMBERED_MS after each charge it records, longer than its node
  -- sends the charge again, whatever the key's state meanwhile (a charge dated in a window long
  -- over lands in the live one; a bucket busy again takes it whole).
  for key, st in pairs(state) do ALGS[algs[key]].store(key, st, idle[key]) end
  for key, reset in pairs(outlived) do outlive(key, reset) end
  for _, m in ipairs(marked) do
    if marks[m.id] > m.total then
      redis.call('HSET', m.marker, m.node, string.format('%d', marks[m.id]))
      -- Never shortened: it may hold a refund's or a reset's stamp.
      local ms = REMEMBERED_MS + MARGIN
      if redis.call('PTTL', m.marker) < ms then redis.call('PEXPIRE', m.marker, ms) end
    end
  end
  return out
end
