-- Calendar windows (tollgate-core's calendar.rs) for the fixed window and the sliding window
-- counter: a day, week, month or year of a time zone. Lua has no time zone database, so the
-- client computes the windows and sends their boundaries in the limit's period argument:
-- `cal LONGEST B1 .. B7 [C1 .. C7]`. LONGEST is the unit's longest length in ns (the period for
-- TTLs and markers); B, seven consecutive window starts around the client's now (in [B3, B4)), or
-- for a refund around its admission's instant; C, for a charge, seven around its instant. Each in
-- decimal ns since the epoch, on a whole second (every boundary is: offsets are whole seconds).
-- The script picks its window by the server's time among them: exact while the two clocks are
-- less than a window apart (the server's now in [B2, B5)); further apart the call is refused
-- (TOLLGATE_CLOCK), never decided on a guessed window.
--
-- A year is longer than the 104 days around now that a double holds in ns, so instants here are
-- whole seconds since the epoch beside now's (S, N), and the durations answered are decimal
-- strings of exact ns (the reply reads them as integers). The decisions are tollgate-core's,
-- digit for digit; a key's state is read on this calendar's windows (the core's `Limit::align`: a
-- start written under another period stands for the window holding it).

-- Seven boundaries (seconds since the epoch) from `words[from]`.
local function calendar_list(words, from)
  local list = {}
  for k = 1, 7 do
    local sec = string.match(words[from + k - 1], '^(%d+)000000000$')
    if not sec then error({ err = 'TOLLGATE_ARGS a calendar boundary not on a whole second: ' .. words[from + k - 1] }) end
    list[k] = tonumber(sec)
    if k > 1 and list[k] < list[k - 1] then error({ err = 'TOLLGATE_ARGS calendar boundaries out of order' }) end
  end
  return list
end

-- The limit's calendar (p.B, and p.C for a charge).
local function calendar_params(p, text)
  local words = {}
  for word in string.gmatch(text, '%S+') do words[#words + 1] = word end
  if (#words ~= 9 and #words ~= 16) or words[1] ~= 'cal' then
    error({ err = 'TOLLGATE_ARGS a period of ' .. #words .. ' words, neither a length nor a calendar' })
  end
  p.period = tonumber(words[2])
  if not p.period then error({ err = 'TOLLGATE_ARGS a calendar period without its length' }) end
  p.B = calendar_list(words, 3)
  if #words == 16 then p.C = calendar_list(words, 10) end
  -- How many boundaries past a window's start its decisions read.
  p.ahead = p.alg == 'sliding-window' and 2 or 1
end

local function clock_error(what)
  error({ err = 'TOLLGATE_CLOCK ' .. what .. ' lies outside the calendar windows the client sent: its clock and '
    .. "the server's differ by more than a window" })
end

-- A stored start or instant (decimal ns since the epoch) as seconds and the ns past them.
local function cal_start(key, text)
  local sec, nsec = string.match(text or '', '^(%d*)(%d%d%d%d%d%d%d%d%d)$')
  if not sec then bad(key, 'a malformed instant') end
  return tonumber(sec) or 0, tonumber(nsec)
end

-- Whether the instant `a` is at or after `b` (decimal ns since the epoch), exactly.
local function cal_not_before(key, a, b)
  local as, an = cal_start(key, a)
  local bs, bn = cal_start(key, b)
  return as > bs or (as == bs and an >= bn)
end

-- The window of `list` (index k: [list[k], list[k+1])) holding `s` seconds since the epoch (0:
-- before list[1]).
local function cal_of(list, s)
  local k = 0
  for j = 1, 7 do
    if list[j] <= s then k = j end
  end
  return k
end

-- The window of `list` holding the instant `at`: ns from now, or decimal ns since the epoch.
local function cal_index(key, list, at)
  if type(at) == 'string' then return cal_of(list, (cal_start(key, at))) end
  local i = 0
  for k = 1, 7 do
    if (list[k] - S) * BILLION <= at + N then i = k end
  end
  return i
end

-- The window holding now, which must have one window before it and one after it among B.
local function cal_now(p)
  local i = cal_index(p.key, p.B, 0)
  if i < 2 or i > 4 then clock_error("the server's now") end
  return i
end

-- The windows holding an instant at or before now (a charge's: among C, else B; what a charge
-- records at now, among B) and the window holding it, which must be one of them.
local function cal_at(p, at)
  for _, list in ipairs({ p.C or p.B, p.B }) do
    local i = cal_index(p.key, list, at)
    if i >= 1 and i + p.ahead <= 7 then return list, i end
  end
  clock_error('an instant')
end

-- A key's state located: the list and index of the window holding its start (0: older than
-- both lists), that window's end being known (for the sliding window counter, the next one's
-- too), and the state read on this calendar (its start that window's).
local function cal_locate(p, st, refunding)
  for _, list in ipairs({ p.B, p.C }) do
    local k = cal_of(list, st.start)
    if k >= 1 and k + p.ahead <= 7 then
      local aligned = copy(st)
      aligned.start, aligned.frac = list[k], 0
      return list, k, aligned
    end
  end
  if not refunding and st.start >= p.B[1] then clock_error("the key's window") end
  return p.B, 0, st
end

-- `sec` s + `ns` ns (ns in (-2e9, 1e9)) as a non-negative duration: a number below a second, else
-- its decimal string.
local function span(sec, ns)
  while ns < 0 do sec = sec - 1; ns = ns + BILLION end
  if sec < 0 then return 0 end
  if sec == 0 then return ns end
  return string.format('%d%09d', sec, ns)
end

-- The time from now to the boundary b (in the future).
local function until_b(b) return span(b - S, -N) end

-- Milliseconds a key must live: until the boundary b (seconds), plus the clock margin.
local function px_until(b)
  return math.max((b - S) * 1000 - math.floor(N / 1000000), 1) + MARGIN
end

-- A decision whose retry and reset may be decimal strings (never negative: see `span`).
local function cal_decision(allowed, limit, remaining, retry, reset)
  return { allowed, limit, math.max(remaining, 0), retry, reset }
end

local function cal_text(s, frac) return string.format('%d%09d', s, frac) end

-- The end of an admission (its instant plus its reset_after, both decimal ns) as seconds and ns.
local function cal_end(key, at_text, reset_text)
  local as, an = cal_start(key, at_text)
  local rs, rn = 0, tonumber(reset_text)
  local sec, nsec = string.match(reset_text or '', '^(%d*)(%d%d%d%d%d%d%d%d%d)$')
  if sec then rs, rn = tonumber(sec) or 0, tonumber(nsec) end
  if not rn then error({ err = 'TOLLGATE_ARGS a refund reset of ' .. tostring(reset_text) }) end
  local n = an + rn
  if n >= BILLION then return as + rs + 1, n - BILLION end
  return as + rs, n
end

-- The boundary `j` of `list`, which must be among the seven (a window far from now: refused).
local function cal_bound(list, j)
  if j > 7 then clock_error("a window's end") end
  return list[j]
end

-- How many windows from a stored window (located at `held`'s index k, 0: not located) to `list`'s
-- window i, which starts later: exact while both are among the boundaries sent, else at least
-- far enough that no debt reaches (a debt reaches p.D <= 1 windows; `reach` more for the sliding
-- window counter's weighted previous one), or refused as a clock error when it might.
local function cal_windows(p, held, k, list, i, reach, indebted)
  if k >= 1 then
    for m = k + 1, 7 do
      if held[m] == list[i] then return m - k end
    end
    -- list[i] is past held's last boundary: at least 8 - k windows (k + ahead <= 7).
    return 8 - k
  end
  -- Not located: before the first window of the lists, so at least i windows back, and at least
  -- two (as before debts were carried: an unlocated state is a window older than its neighbour).
  if indebted and i <= debt(p).D + reach then clock_error("the key's window") end
  return math.max(i, 2)
end

-- The fixed window over calendar windows: the window counting at the instant of `list`'s window
-- `i` (with what a stored earlier window's debt leaves spent in it), its use, its list and index.
local function cal_fixed_rolled(st, p, list, i)
  if st and st.used > 0 then
    if st.start >= list[i] then
      local held, k, aligned = cal_locate(p, st)
      return aligned, held, k
    end
    local held, k = cal_locate(p, st)
    local j = cal_windows(p, held, k, list, i, 0, st.used > p.count)
    return { start = list[i], frac = 0, used = carried(p, st.used, j) }, list, i
  end
  return { start = list[i], frac = 0, used = 0 }, list, i
end

ALGS['fixed-window@calendar'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 2)
    if not f then return nil end
    local s, frac = cal_start(key, f[1])
    return { start = s, frac = frac, used = int(key, f[2]) }
  end,
  check = function(st, p, cost)
    local w, list, k = cal_fixed_rolled(st, p, p.B, cal_now(p))
    local count = p.count
    local wanted = w.used + cost
    local allowed = wanted <= count
    local after = allowed and wanted or w.used
    local retry, reset = 0, 0
    if not allowed then
      -- The first window whose carried debt leaves room for `cost` (the next, unless in debt).
      local over = math.max(carried(p, w.used, 1) + cost - count, 0)
      retry = until_b(cal_bound(list, k + 1 + idiv(over + count - 1, count)))
    end
    if after > 0 then reset = until_b(cal_bound(list, k + 1 + last_indebted(p, after))) end
    local d = cal_decision(allowed, count, count - after, retry, reset)
    if allowed and cost > 0 then return d, { start = w.start, frac = w.frac, used = wanted }, list[k + 1] end
    return d, nil, nil, w.used > count
  end,
  charge = function(st, p, cost, at)
    local w, list, k = cal_fixed_rolled(st, p, cal_at(p, at))
    local total = w.used + window_counted(p, w.used, cost)
    return { start = w.start, frac = w.frac, used = total }, cal_bound(list, k + 1 + last_indebted(p, total))
  end,
  -- Counted in the window ending at the admission's reset, if the state still holds it.
  refund = function(st, p, cost, _, _, at_text, reset_text, key)
    if not (st and st.used > 0) then return end
    local es, en = cal_end(key, at_text, reset_text)
    local list, k = cal_locate(p, st, true)
    if k >= 1 and en == 0 and list[k + 1] == es then
      local used = st.used - math.min(cost, st.used)
      return { start = st.start, frac = st.frac, used = used }, cal_bound(list, k + 1 + last_indebted(p, used))
    end
  end,
  snapshot = function(st, p, at)
    local w = cal_fixed_rolled(st, p, p.B, type(at) == 'string' and math.max(cal_index(p.key, p.B, at), 1) or cal_now(p))
    return w.used, 0
  end,
  store = function(key, st, idle)
    redis.call('SET', key, cal_text(st.start, st.frac) .. string.format(' %d', st.used), 'PX', px_until(idle))
  end,
}

-- The sliding window counter over calendar windows: the previous window weighs the fraction of
-- the current window's own length still to come. Rolled to `list`'s window `i`: the state, its
-- window's list and index.
-- The j-th window after the stored one counts what its current window carries into it, and
-- weighs at most `count` of what it carried into the window before.
local function cal_sliding_rolled(st, p, list, i)
  local fresh = { start = list[i], frac = 0, prev = 0, curr = 0 }
  if not st then return fresh, list, i end
  local held, k, aligned = cal_locate(p, st)
  if st.start >= list[i] then return aligned, held, k end
  local j = cal_windows(p, held, k, list, i, 1, st.curr > p.count)
  fresh.prev, fresh.curr = math.min(carried(p, st.curr, j - 1), p.count), carried(p, st.curr, j)
  return fresh, list, i
end

-- When a state whose current window is `list`'s k-th and counts `curr` is idle (a boundary).
local function cal_sliding_idle(p, list, k, curr) return cal_bound(list, k + 2 + last_indebted(p, curr)) end

ALGS['sliding-window@calendar'] = {
  load = function(key)
    local f = fields(key, redis.call('GET', key), 3)
    if not f then return nil end
    local s, frac = cal_start(key, f[1])
    return { start = s, frac = frac, prev = int(key, f[2]), curr = int(key, f[3]) }
  end,
  check = function(st, p, cost)
    local count = p.count
    local w, list, k = cal_sliding_rolled(st, p, p.B, cal_now(p))
    local prev, curr = w.prev, w.curr
    local start, finish, next_end = list[k], list[k + 1], list[k + 2]
    local L = finish - start
    -- q = floor(prev * e / len), e = (S - start) s + N ns, len = L s: floor(prev*(S - start)/L)
    -- plus floor((its remainder + floor(prev*N/1e9)) / L) (the fraction left out never reaches L).
    local q = 0
    if S >= start then
      local q1, r1 = muldiv(prev, S - start, L)
      q = q1 + idiv(r1 + muldiv(prev, N, BILLION), L)
    end
    local wanted = curr + cost
    local allowed = prev + wanted - count <= q
    local after = allowed and wanted or curr
    local retry = 0
    if not allowed then
      if wanted <= count then
        -- At finish - floor((count - wanted) * len / prev): a s and c ns before finish.
        local a, ra = muldiv(count - wanted, L, prev)
        if a >= L then retry = until_b(start) else retry = span(finish - a - S, -muldiv(ra, BILLION, prev) - N) end
      else
        -- The first later window j whose carried count leaves room for `cost`, once its weighted
        -- previous one does too.
        local j = idiv(math.max(carried(p, curr, 1) + cost - count, 0) + count - 1, count) + 1
        local prev_j, curr_j = math.min(carried(p, curr, j - 1), count), carried(p, curr, j)
        local js, je = cal_bound(list, k + j), cal_bound(list, k + j + 1)
        local Lj = je - js
        local a, ra = muldiv(count - curr_j - cost, Lj, prev_j)
        if a >= Lj then retry = until_b(js) else retry = span(je - a - S, -muldiv(ra, BILLION, prev_j) - N) end
      end
    end
    local reset = 0
    if after > 0 then reset = until_b(cal_sliding_idle(p, list, k, after)) elseif prev > 0 then reset = until_b(finish) end
    local d = cal_decision(allowed, count, count - prev + q - after, retry, reset)
    if allowed and cost > 0 then return d, { start = w.start, frac = w.frac, prev = prev, curr = wanted }, next_end end
    return d, nil, nil, curr > count
  end,
  charge = function(st, p, cost, at)
    local w, list, k = cal_sliding_rolled(st, p, cal_at(p, at))
    local total = w.curr + window_counted(p, w.curr, cost)
    return { start = w.start, frac = w.frac, prev = w.prev, curr = total }, cal_sliding_idle(p, list, k, total)
  end,
  -- Counted in the window two before the one ending at the admission's reset.
  refund = function(st, p, cost, _, _, at_text, reset_text, key)
    if not st then return end
    local es, en = cal_end(key, at_text, reset_text)
    local last = 0
    for j = 1, 7 do
      if p.B[j] < es or (en > 0 and p.B[j] == es) then last = j end
    end
    if last < 2 then return end
    local start = p.B[last - 1]
    local list, k, aligned = cal_locate(p, st, true)
    if k == 0 then return end
    -- Only a refund that gives something back applies (and stamps the key's marker), as the core's.
    if aligned.start == start then
      if st.curr == 0 then return end
      local curr = st.curr - math.min(cost, st.curr)
      return { start = st.start, frac = st.frac, prev = st.prev, curr = curr }, cal_sliding_idle(p, list, k, curr)
    elseif list[k - 1] == start and st.prev > 0 then
      local prev = st.prev - math.min(cost, st.prev)
      return { start = st.start, frac = st.frac, prev = prev, curr = st.curr }, cal_sliding_idle(p, list, k, st.curr)
    end
  end,
  snapshot = function(st, p, at)
    local w = cal_sliding_rolled(st, p, p.B, type(at) == 'string' and math.max(cal_index(p.key, p.B, at), 1) or cal_now(p))
    return w.curr, w.prev
  end,
  store = function(key, st, idle)
    redis.call('SET', key, cal_text(st.start, st.frac) .. string.format(' %d %d', st.prev, st.curr), 'PX', px_until(idle))
  end,
}
