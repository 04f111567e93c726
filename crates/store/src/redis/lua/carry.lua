-- The second entry: carries a key's use from one algorithm's state to another's (a rule whose
-- algorithm changed on a reload), atomically.
--
-- KEYS: the old state key, then the new one (one key under two algorithms: one slot).
-- ARGV: the header (ARG_*; the counts of checks, charges and refunds are 0), then the old limit
--       and the new one (CHECK_ARGS each; their costs are not read).
-- The old state, if any, is read at now: what it used is its capacity less a peek's remaining (a
-- debt beyond the capacity is not carried). It is deleted, and that use, at most the new
-- capacity, is charged to the new state at now, on top of what it holds.
-- Returns the units carried, then the server's now as seconds and nanoseconds.
local function carry(KEYS, ARGV)
  begin(ARGV)
  local old, new = KEYS[1], KEYS[2]
  local from = params(ARGV, HEADER_ARGS, old)
  local to = params(ARGV, HEADER_ARGS + CHECK_ARGS, new)
  if from.alg == to.alg then return { 0, S, N } end
  local A, B = ALGS[from.alg], ALGS[to.alg]
  local st = A.load(old)
  if st == nil then return { 0, S, N } end
  local peek = A.check(st, from, 0)
  local into = B.load(new)
  local units = math.min(math.max(peek[2] - peek[3], 0), B.check(into, to, 0)[2])
  redis.call('DEL', old)
  if units > 0 then
    local charged, idle = B.charge(into, to, units, 0)
    B.store(new, charged, idle)
  end
  return { units, S, N }
end
