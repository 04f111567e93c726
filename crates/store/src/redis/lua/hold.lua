-- The third entry: holds a key (the store's `Store::hold`), atomically.
--
-- KEYS: the hold key (`PREFIX:hold:@SCOPE:` and the key, in the slot of the key's states).
-- ARGV: the header (ARG_*; the counts of checks, charges and refunds are 0), then HOLD_NS: the
--       hold's length in ns from now.
-- The key holds the hold's end (a decimal instant, on the script's clock), unless it holds a later
-- one, and lives until that end plus the TTL margin: a decision reading it after the end, or a
-- hold expired, finds no hold.
-- Returns the server's now as seconds and nanoseconds.
local function hold(KEYS, ARGV)
  begin(ARGV)
  if #KEYS ~= 1 then error({ err = 'TOLLGATE_ARGS the hold script takes the hold key alone, not ' .. #KEYS .. ' keys' }) end
  local key = KEYS[1]
  local ns = tonumber(ARGV[HEADER_ARGS + HOLD_NS])
  if not ns or ns < 0 or ns ~= math.floor(ns) then
    error({ err = 'TOLLGATE_ARGS a hold of ' .. tostring(ARGV[HEADER_ARGS + HOLD_NS]) .. ' ns' })
  end
  local left = math.min(ns, FAR)
  local kept = held(key)
  if kept and kept >= left then return { S, N } end
  if left > 0 then redis.call('SET', key, abs(left), 'PX', px(left)) end
  return { S, N }
end
