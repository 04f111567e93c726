-- The fourth entry: settles a reservation (the store's `Store::settle`), atomically and once.
--
-- KEYS: the reservation's record (`PREFIX:rsv:{SLOT-TAG}:TOKEN`, in the slot of the states it
--       settles), then the keys of a decision call (`decide`) of its corrections.
-- ARGV: the record as the caller read it and the deadline its id names, then the
--       decision call's arguments: no checks, a charge of each actual above its estimate, a
--       refund of each estimate above its actual.
-- The record must hold what the caller read (a record replaced in between is not settled), and
-- its own deadline (its header's, `tollgate-reservation 2 DEADLINE_MS`) must be the id's; that
-- recorded deadline, against the server's time, decides whether it expired. It then becomes the tombstone `settled` for the rest of its life, and the corrections are applied.
-- Returns { -1 }: no such record (never made, or expired and gone); { -2 }: settled already;
-- { -3 }: its deadline passed (the record is dropped: it expired as charged); otherwise the
-- decision call's reply (the server's now).
local function settle(KEYS, ARGV)
  local record = redis.call('GET', KEYS[1])
  if not record then return { -1 } end
  if record == 'settled' then return { -2 } end
  if record ~= ARGV[1] then return { -1 } end
  local keys, argv = {}, {}
  for i = 2, #KEYS do keys[i - 1] = KEYS[i] end
  for i = 3, #ARGV do argv[i - 2] = ARGV[i] end
  begin(argv)
  local deadline = tonumber(string.match(record, '^tollgate%-reservation 2 (%d+)\n'))
  if not deadline or deadline ~= tonumber(ARGV[2]) then return { -1 } end
  if S * 1000 + math.floor(N / 1000000) >= deadline then
    redis.call('DEL', KEYS[1])
    return { -3 }
  end
  local out = decide(keys, argv)
  -- The tombstone lives as long as the record would have.
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('SET', KEYS[1], 'settled', 'PX', ttl) else redis.call('DEL', KEYS[1]) end
  return out
end
