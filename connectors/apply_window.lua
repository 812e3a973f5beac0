-- Apply one window of a ledger partition: dedup, sums and watermark, atomically.
-- Called by costline.connectors.redis_apply (its comment lists the argument's fields).
local a = cmsgpack.unpack(ARGV[1])
local S = a[3]
local cur = redis.call('GET', KEYS[1]) or '-1'
if cur ~= a[1] then return {0, cur} end
local TTL, LOAD = a[4], a[5]
-- 2,000 arguments a call (an even number: field-value pairs are never split); Lua's unpack
-- takes fewer than 8,000.
local function chunked(cmd, key, list, from, to)
  local out = {}
  local first = from
  while first <= to do
    local last = math.min(first + 1999, to)
    local r = redis.call(cmd, key, unpack(list, first, last))
    if type(r) == 'table' then
      for j = 1, #r do out[#out + 1] = r[j] end
    end
    first = last + 1
  end
  return out
end

-- Dedup tables. A digest's selector is its top bits; set i of a table at level L with s sets
-- split this round holds the digests whose selector is i mod 2^L (mod 2^(L+1) for i < s).
local function selector(d) return math.floor(tonumber(d) / 2147483648) end
local function set_of(t, u)
  local i = u % 2 ^ t.L
  if i < t.s then i = u % 2 ^ (t.L + 1) end
  return i
end
local function split(t)
  local from = t.key .. ':' .. t.s
  local members = redis.call('SMEMBERS', from)
  local moving = {}
  for i = 1, #members do
    if selector(members[i]) % 2 ^ (t.L + 1) ~= t.s then moving[#moving + 1] = members[i] end
  end
  if #moving > 0 then
    local to = t.key .. ':' .. (t.s + 2 ^ t.L)
    chunked('SREM', from, moving, 1, #moving)
    chunked('SADD', to, moving, 1, #moving)
    redis.call('EXPIRE', to, TTL)
  end
  t.s = t.s + 1
  if t.s == 2 ^ t.L then
    t.L = t.L + 1
    t.s = 0
  end
  t.changed = true
end
-- A table ready for ``incoming`` more digests: split ahead, so no set outgrows a compact one.
local function table_of(key, incoming)
  local m = redis.call('HMGET', key, 'l', 's', 'n')
  local t = {key = key, L = tonumber(m[1]) or 0, s = tonumber(m[2]) or 0,
             n = tonumber(m[3]) or 0, changed = false}
  while t.n + incoming > LOAD * (2 ^ t.L + t.s) do split(t) end
  return t
end
local function save(t)
  redis.call('HSET', t.key, 'l', t.L, 's', t.s, 'n', t.n)
  redis.call('EXPIRE', t.key, TTL)
end

local dd = a[6]
local tables, dups, pos = {}, {}, 0
for i = 1, #dd, 2 do
  local digests = dd[i + 1]
  local t = table_of(S .. ':dd:' .. dd[i], #digests)
  local groups = {}  -- set → {digests, their positions}
  for j = 1, #digests do
    local at = set_of(t, selector(digests[j]))
    local g = groups[at]
    if not g then
      g = {{}, {}}
      groups[at] = g
    end
    g[1][#g[1] + 1] = digests[j]
    g[2][#g[2] + 1] = pos + j - 1
  end
  for at, g in pairs(groups) do
    local found = chunked('SMISMEMBER', t.key .. ':' .. at, g[1], 1, #g[1])
    for k = 1, #found do
      if found[k] == 1 then dups[#dups + 1] = g[2][k] end
    end
  end
  t.groups = groups
  t.incoming = #digests
  tables[#tables + 1] = t
  pos = pos + #digests
end
if #dups > 0 then
  for _, t in ipairs(tables) do
    if t.changed then save(t) end
  end
  return {1, dups}
end
-- From here on every write succeeds: the window is counted whole.

-- Exact sum of two decimal strings of non-negative integers.
local function dadd(x, y)
  local out, carry, i, j = {}, 0, #x, #y
  while i > 0 or j > 0 or carry > 0 do
    local d = carry
    if i > 0 then d = d + string.byte(x, i) - 48 end
    if j > 0 then d = d + string.byte(y, j) - 48 end
    out[#out + 1] = d % 10
    carry = (d - d % 10) / 10
    i, j = i - 1, j - 1
  end
  local digits = string.reverse(table.concat(out))
  return string.match(digits, '^0*(%d-%d)$')
end
-- Every number printed here is a whole number below 2^53. '%d' prints it exactly (Lua's
-- string.format passes it to C as a long); '%.0f' goes through the C library's floating-point
-- printing, 12-15 % of this script's CPU (bench/script_parts.py, both scripts in turn).
local function text(n)
  if type(n) == 'number' then return string.format('%d', n) end
  return n
end
-- A stored part (a decimal string, or false) plus an amount: doubles add integers exactly
-- below 2^53, so only sums from 10^15 on are added digit by digit.
local function plus(old, delta)
  if not old then return text(delta) end
  if type(delta) == 'number' and #old < 16 then
    local sum = tonumber(old) + delta
    if sum < 1e15 then return string.format('%d', sum) end
  end
  return dadd(old, text(delta))
end
-- A usage field holds "<gross> <quantity>", or "<gross> <quantity> <credits>" once it has
-- credits.
local function parts(was)
  if not was then return false, false, false end
  local g, q, k = string.match(was, '^(%d+) (%d+) ?(%d*)$')
  if k == '' then k = false end
  return g, q, k
end
local b = a[7]
for i = 1, #b, 4 do
  local key, usage, waste = b[i], b[i + 2], b[i + 3]
  local names = {}
  for j = 1, #usage, 4 do names[#names + 1] = usage[j] end
  for j = 1, #waste, 2 do names[#names + 1] = waste[j] end
  local olds = {}
  local first = 1
  while first <= #names do
    local last = math.min(first + 999, #names)
    local got = redis.call('HMGET', key, unpack(names, first, last))
    for j = first, last do olds[j] = got[j - first + 1] end
    first = last + 1
  end
  local out, n = {}, 0
  for j = 1, #usage, 4 do
    n = n + 1
    local was, dg, dq, dk = olds[n], usage[j + 1], usage[j + 2], usage[j + 3]
    local value
    -- The usual field: no credits, and sums a double holds exactly, in one format call.
    if dk == 0 and type(dg) == 'number' and type(dq) == 'number' then
      if not was then
        value = string.format('%d %d', dg, dq)
      else
        local g, q = string.match(was, '^(%d+) (%d+)$')
        if g and #g < 16 and #q < 16 then
          local sg, sq = tonumber(g) + dg, tonumber(q) + dq
          if sg < 1e15 and sq < 1e15 then value = string.format('%d %d', sg, sq) end
        end
      end
    end
    if not value then
      local g, q, k = parts(was)
      value = plus(g, dg) .. ' ' .. plus(q, dq)
      if k or dk ~= 0 then value = value .. ' ' .. plus(k, dk) end
    end
    out[#out + 1] = usage[j]
    out[#out + 1] = value
  end
  for j = 1, #waste, 2 do
    n = n + 1
    out[#out + 1] = waste[j]
    out[#out + 1] = plus(olds[n], waste[j + 1])
  end
  chunked('HSET', key, out, 1, #out)
  redis.call('EXPIRE', key, b[i + 1])
end

for _, t in ipairs(tables) do
  for at, g in pairs(t.groups) do
    local key = t.key .. ':' .. at
    chunked('SADD', key, g[1], 1, #g[1])
    redis.call('EXPIRE', key, TTL)
  end
  t.n = t.n + t.incoming
  save(t)
end

local tagsets = a[8]
if #tagsets > 0 then
  -- a tag set's id is the digest of its JSON, so setting it again writes the same value
  local ids, pairs_, lowered = {}, {}, {}
  for i = 1, #tagsets, 3 do
    ids[#ids + 1] = tagsets[i]
    pairs_[#pairs_ + 1] = tagsets[i]
    pairs_[#pairs_ + 1] = tagsets[i + 1]
  end
  chunked('HSET', S .. ':tagsets', pairs_, 1, #pairs_)
  local firsts = S .. ':first'
  local known = chunked('HMGET', firsts, ids, 1, #ids)
  for j = 1, #ids do
    local slot = tagsets[3 * j]
    if (not known[j]) or tonumber(known[j]) > slot then
      lowered[#lowered + 1] = ids[j]
      lowered[#lowered + 1] = string.format('%d', slot)
    end
  end
  chunked('HSET', firsts, lowered, 1, #lowered)
  if #lowered > 0 then
    -- a new token whenever the first buckets change, and an entry in their log saying what
    -- changed, numbered and bearing the token: readers keep what they derived from them and
    -- apply only the entries after the one they read last. The server's clock in
    -- microseconds: a Redis that lost writes and counts them again does not repeat a token
    -- it gave before (unless its clock went back).
    local LOG_ENTRIES, LOG_NAMED = tonumber(a[9][1]), tonumber(a[9][2])
    local now = redis.call('TIME')
    local token = now[1] .. '.' .. now[2]
    redis.call('SET', firsts .. ':version', token)
    local n = redis.call('INCR', firsts .. ':count')
    local log = firsts .. ':log'
    -- a window that changes more than the log may name (a worker's first windows) is
    -- logged as '*': read them all
    local named, changed = #lowered / 2, '*'
    if named <= LOG_NAMED then changed = table.concat(lowered, ' ') else named = 0 end
    redis.call('RPUSH', log, n .. ' ' .. token .. ' ' .. named .. ' ' .. changed)
    -- the oldest entries go while the log is longer or names more than it may
    local total = tonumber(redis.call('GET', log .. ':named') or '0') + named
    local len = redis.call('LLEN', log)
    while len > 1 and (len > LOG_ENTRIES or total > LOG_NAMED) do
      local oldest = redis.call('LPOP', log)
      total = total - (tonumber(string.match(oldest, '^%S+ %S+ (%d+)')) or 0)
      len = len - 1
    end
    -- with one entry left the count is that entry's: a count that drifted (its key lost
    -- while the log was not) is right again
    if len == 1 then total = named end
    redis.call('SET', log .. ':named', math.max(total, 0))
  end
end

local latest = a[10]
local util = S .. ':util'
for i = 1, #latest, 3 do
  local old = redis.call('HGET', util, latest[i])
  if (not old) or tonumber(string.match(old, '^[^|]+')) <= tonumber(latest[i + 1]) then
    redis.call('HSET', util, latest[i], latest[i + 1] .. '|' .. latest[i + 2])
  end
end
local history = a[11]
for i = 1, #history, 3 do
  local key = S .. ':uh:' .. history[i]
  chunked('ZADD', key, history[i + 2], 1, #history[i + 2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. history[i + 1])
  redis.call('EXPIRE', key, 172800)
end
local faults = a[12]
if #faults > 0 then
  local key = S .. ':faults'
  chunked('ZADD', key, faults[2], 1, #faults[2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. faults[1])
end
local records = a[13] or {}
for i = 1, #records, 3 do
  local key = S .. ':rec:' .. records[i]
  chunked('ZADD', key, records[i + 2], 1, #records[i + 2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. records[i + 1])
  -- a count of the writes to the set: readers read it again only when it moved
  redis.call('INCR', key .. ':n')
end
redis.call('SET', KEYS[1], a[2])
return {2}
