"""The Lua scripts Redis runs for ratedeck: a grant of budgets, a refund, a sync, a shared gate.

Each runs atomically in Redis, on Redis's clock (`TIME`), in whole
microseconds (Unix time in µs fits a Lua double exactly). See
`redis_shared.py` for what a grant means and why it is exact.
"""

from __future__ import annotations

#: Grant up to `count` send times of one or more budgets together, all their policies at once.
#:
#: Every Redis key the call touches is in KEYS (none is named inside the script), so a hash
#: tag shared by a host's budgets keeps a call in one slot of a Redis Cluster:
#: KEYS[1]: the store's epoch (set at the first grant after Redis starts empty; a restart that
#: lost the state shows as a new epoch); then per budget: its meta hash (`last` slot, `seq`)
#: and one key per policy: a sorted set for a sliding window (one member `seq:cost` per
#: grant, scored by the time it stops counting), a hash for a fixed window (window number ->
#: units), a hash for a bucket (`l` level, `a` as of).
#: ARGV: count, headroom_us, pace_us, spacing, horizon_us, hold_us, nbudgets, then per
#: budget: cost, npolicies, then four per policy: kind (s|f|b), limit, window_us, drain.
#: A slot is granted only when every budget has room for its cost: all or none.
#: Returns {now_us, status, fresh, next_us, epoch, nbudgets, t1, seq1_1..seq1_B, t2, ...}:
#: status 1 granted t1.. (maybe none, when the next slot, `next_us`, is beyond the horizon),
#: 0 never (a cost above a limit; the 6th value is the budget's index).
GRANT = r"""
local count = tonumber(ARGV[1])
local h = tonumber(ARGV[2])
local pace = tonumber(ARGV[3])
local spacing = tonumber(ARGV[4])
local horizon = tonumber(ARGV[5])
local hold = tonumber(ARGV[6])
local nb = tonumber(ARGV[7])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local function num(x) return string.format('%.0f', x) end

-- the budgets, their policies and what the lease costs in each
local budgets = {}
local a, k = 8, 2
local longest = 0
for b = 1, nb do
  local bud = {meta = KEYS[k], cost = tonumber(ARGV[a]), policies = {}, gap = 0}
  local np = tonumber(ARGV[a + 1])
  a, k = a + 2, k + 1
  for i = 1, np do
    local p = {kind = ARGV[a], limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]),
               drain = tonumber(ARGV[a + 3]), key = KEYS[k]}
    a, k = a + 4, k + 1
    local cost = bud.cost
    if p.kind == 'b' then
      p.rate = p.drain / p.window
      if cost > p.limit - p.rate * h then return {now, 0, 0, 0, '', b} end
      local fill = math.ceil(p.limit / p.rate)
      if fill > longest then longest = fill end
      local st = redis.call('HMGET', p.key, 'l', 'a')
      p.level, p.at = tonumber(st[1] or '0'), tonumber(st[2] or '0')
    else
      if cost > p.limit then return {now, 0, 0, 0, '', b} end
      -- even pacing: each slot at least (W + pace) * spacing * cost / N after the budget's last
      local g = (p.window + pace) * spacing * cost / p.limit
      if g > bud.gap then bud.gap = g end
      if p.window > longest then longest = p.window end
    end
    if p.kind == 's' then
      -- one member per grant, "seq:cost", scored by when it stops counting; kept in order here
      redis.call('ZREMRANGEBYSCORE', p.key, '-inf', num(now))
      local r = redis.call('ZRANGEBYSCORE', p.key, '(' .. num(now), '+inf', 'WITHSCORES')
      p.ends, p.costs = {}, {}
      for j = 1, #r, 2 do
        p.ends[#p.ends + 1] = tonumber(r[j + 1])
        p.costs[#p.costs + 1] = tonumber(string.match(r[j], ':(%d+)$') or '1')
      end
    elseif p.kind == 'f' then
      p.used = {}
      if redis.call('HLEN', p.key) > 8 then  -- forget windows long past
        local cur = math.floor((now - h) / p.window)
        for _, f in ipairs(redis.call('HKEYS', p.key)) do
          if tonumber(f) < cur - 1 then redis.call('HDEL', p.key, f) end
        end
      end
    end
    bud.policies[i] = p
  end
  budgets[b] = bud
end

redis.call('SET', KEYS[1], num(now), 'NX')
local epoch = redis.call('GET', KEYS[1])
local fresh = 0
local start = now
for _, bud in ipairs(budgets) do
  local last = redis.call('HGET', bud.meta, 'last')
  if last then
    bud.last = tonumber(last)
  else
    -- no record of this budget: first use, or its state was lost; the member says how long to wait
    fresh = 1
    bud.last = now + hold - bud.gap
  end
  local s0 = math.ceil(bud.last + bud.gap)
  if s0 > start then start = s0 end
end

local function fixed_used(p, w)
  local u = p.used[w]
  if u == nil then
    u = tonumber(redis.call('HGET', p.key, num(w)) or '0')
    p.used[w] = u
  end
  return u
end

local function level_at(p, s)
  local level = p.level
  if s > p.at then
    level = level - p.rate * (s - p.at)
    if level < 0 then level = 0 end
  end
  return level
end

-- the earliest time >= s at which policy p has room for `cost`
local function earliest(p, s, cost)
  if p.kind == 's' then
    local busy = 0
    for j = 1, #p.ends do
      if p.ends[j] > s then busy = busy + p.costs[j] end
    end
    local excess = busy + cost - p.limit
    if excess <= 0 then return s end
    for j = 1, #p.ends do
      if p.ends[j] > s then
        excess = excess - p.costs[j]
        if excess <= 0 then return p.ends[j] end
      end
    end
    return s  -- not reached: cost <= limit
  elseif p.kind == 'f' then
    local t = s
    for w = math.floor((s - h) / p.window), math.floor((s + h) / p.window) do
      if fixed_used(p, w) + cost > p.limit then
        local c = (w + 1) * p.window + h
        if c > t then t = c end
      end
    end
    return t
  else
    local room = p.limit - p.rate * h
    local level = level_at(p, s)
    if level + cost <= room then return s end
    return math.ceil(s + (level + cost - room) / p.rate)
  end
end

local function record(p, s, cost, seq)
  if p.kind == 's' then
    local e = s + p.window + h
    redis.call('ZADD', p.key, num(e), seq .. ':' .. cost)
    redis.call('PEXPIRE', p.key, math.ceil((e - now) / 1000) + 1000)
    local j = #p.ends
    while j >= 1 and p.ends[j] > e do j = j - 1 end
    table.insert(p.ends, j + 1, e)
    table.insert(p.costs, j + 1, cost)
  elseif p.kind == 'f' then
    local to = 0
    for w = math.floor((s - h) / p.window), math.floor((s + h) / p.window) do
      p.used[w] = fixed_used(p, w) + cost
      redis.call('HINCRBY', p.key, num(w), cost)
      to = (w + 1) * p.window + h
    end
    local ttl = redis.call('PTTL', p.key)
    local want = math.ceil((to - now) / 1000) + 1000
    if ttl < want then redis.call('PEXPIRE', p.key, want) end
  else
    p.level = level_at(p, s) + cost
    if s > p.at then p.at = s end
    redis.call('HSET', p.key, 'l', tostring(p.level), 'a', num(p.at))
    redis.call('PEXPIRE', p.key, math.ceil((p.at - now + p.level / p.rate) / 1000) + 1000)
  end
end

local out = {now, 1, fresh, 0, epoch, nb}
local s = start
if s < now then s = now end
for _ = 1, count do
  local settled = false
  for _ = 1, 64 do
    local s2 = s
    for _, bud in ipairs(budgets) do
      for _, p in ipairs(bud.policies) do
        local e = earliest(p, s2, bud.cost)
        if e > s2 then s2 = e end
      end
    end
    if s2 == s then settled = true break end
    s = s2
  end
  if not settled or s > now + horizon then break end
  out[#out + 1] = s
  for _, bud in ipairs(budgets) do
    local seq = redis.call('HINCRBY', bud.meta, 'seq', 1)
    for _, p in ipairs(bud.policies) do record(p, s, bud.cost, seq) end
    out[#out + 1] = seq
    bud.last = s
  end
  -- the next slot: every budget's pace after this one
  local nxt = s
  for _, bud in ipairs(budgets) do
    local c = math.ceil(s + bud.gap)
    if c > nxt then nxt = c end
  end
  s = nxt
end
out[4] = s
for _, bud in ipairs(budgets) do
  redis.call('HSET', bud.meta, 'last', num(bud.last))
  redis.call('PEXPIRE', bud.meta, math.ceil((bud.last - now + longest + h) / 1000) + 1000)
end
return out
"""

#: Close a shared gate until `until_us` (Redis clock) unless it is already closed longer.
#: KEYS[1]: the gate's key; ARGV: until_us, reason. The key expires when the gate opens.
CLOSE_GATE = r"""
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local until_us = tonumber(ARGV[1])
if until_us <= now then return 0 end
local cur = redis.call('GET', KEYS[1])
if cur then
  local held = tonumber(string.match(cur, '^%d+'))
  if held and held >= until_us then return 0 end
end
redis.call('SET', KEYS[1], string.format('%.0f', until_us) .. ' ' .. ARGV[2], 'PX', math.ceil((until_us - now) / 1000))
return 1
"""

#: Give back `back` units of one budget's granted slot (the server charged less: a settled
#: reservation, a free status). KEYS: the budget's policy keys (as the grant had them);
#: ARGV: seq, cost, back, s_us, h_us, then four per policy: kind, limit, window_us, drain.
#: Only what is still counted is given back; returns the units given back in the first policy.
REFUND = r"""
local seq, cost, back = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local s, h = tonumber(ARGV[4]), tonumber(ARGV[5])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local function num(x) return string.format('%.0f', x) end
if back > cost then back = cost end
local given = nil
for i = 1, #KEYS do
  local b = 6 + (i - 1) * 4
  local kind, limit, window, drain = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local key = KEYS[i]
  local done = 0
  if kind == 's' then
    local member = seq .. ':' .. cost
    local score = redis.call('ZSCORE', key, member)
    if score then
      redis.call('ZREM', key, member)
      if cost - back > 0 then redis.call('ZADD', key, score, seq .. ':' .. (cost - back)) end
      done = back
    end
  elseif kind == 'f' then
    for w = math.floor((s - h) / window), math.floor((s + h) / window) do
      local used = redis.call('HGET', key, num(w))
      if used then
        local left = tonumber(used) - back
        if left < 0 then left = 0 end
        redis.call('HSET', key, num(w), left)
        done = back
      end
    end
  else
    local st = redis.call('HMGET', key, 'l', 'a')
    if st[1] then
      local rate = drain / window
      local level, at = tonumber(st[1]), tonumber(st[2] or '0')
      if now > at then
        level = level - rate * (now - at)
        at = now
      end
      level = level - back
      if level < 0 then level = 0 end
      redis.call('HSET', key, 'l', tostring(level), 'a', num(at))
      done = back
    end
  end
  if given == nil then given = done end
end
return given or 0
"""

#: Count granted sends of sliding windows from their real send on: lower the score (when it
#: stops counting) of each named grant, never raise it. KEYS: the sliding windows' sorted sets;
#: ARGV: three per send: the index of its key in KEYS, its member (`seq:cost`), its new end (µs).
#: A member no longer there (expired, given back) is left alone. Returns how many moved.
TRIM = r"""
local moved = 0
for j = 1, #ARGV, 3 do
  local key, member, e = KEYS[tonumber(ARGV[j])], ARGV[j + 1], tonumber(ARGV[j + 2])
  local score = redis.call('ZSCORE', key, member)
  if score and tonumber(score) > e then
    redis.call('ZADD', key, 'XX', string.format('%.0f', e), member)
    moved = moved + 1
  end
end
return moved
"""

#: Raise one policy's shared count to what the server says it counted (never lower it: members
#: hold grants the server has not seen yet). KEYS[1]: the policy's key; ARGV: kind, limit,
#: window_us, drain, counted, until_us (when a sliding window's count stops, 0: a window from
#: now), at_us (when the counted send was made: a fixed window's count is that window's).
#: Returns the units added.
SYNC = r"""
local key = KEYS[1]
local kind, limit, window, drain = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local counted, until_us, at = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local function num(x) return string.format('%.0f', x) end
if kind == 'f' then
  if at <= 0 or at > now then at = now end
  local w = num(math.floor(at / window))
  local used = tonumber(redis.call('HGET', key, w) or '0')
  if counted <= used then return 0 end
  redis.call('HSET', key, w, counted)
  local want = math.ceil(((math.floor(at / window) + 1) * window - now) / 1000) + 1000
  if redis.call('PTTL', key) < want then redis.call('PEXPIRE', key, want) end
  return counted - used
elseif kind == 's' then
  local busy = 0
  local r = redis.call('ZRANGEBYSCORE', key, '(' .. num(now), '+inf')
  for j = 1, #r do busy = busy + tonumber(string.match(r[j], ':(%d+)$') or '1') end
  if counted <= busy then return 0 end
  local e = now + window
  if until_us > now and until_us < e then e = until_us end
  redis.call('ZADD', key, num(e), 'g' .. num(now) .. '-' .. busy .. ':' .. (counted - busy))
  if redis.call('PTTL', key) < math.ceil((e - now) / 1000) + 1000 then
    redis.call('PEXPIRE', key, math.ceil((e - now) / 1000) + 1000)
  end
  return counted - busy
else
  local rate = drain / window
  local st = redis.call('HMGET', key, 'l', 'a')
  local level, at = tonumber(st[1] or '0'), tonumber(st[2] or '0')
  if now > at then
    level = level - rate * (now - at)
    if level < 0 then level = 0 end
    at = now
  end
  if counted <= level then return 0 end
  redis.call('HSET', key, 'l', tostring(counted), 'a', num(at))
  redis.call('PEXPIRE', key, math.ceil(counted / rate / 1000) + 1000)
  return math.ceil(counted - level)
end
"""

#: Redis's clock, from the node that holds KEYS[1] (a cluster's masters each have their own).
TIME = "return redis.call('TIME')"

#: Every key of KEYS (one slot: a hash tag's epoch and gates), as `MGET` gives them (a pipeline
#: on a cluster takes a script where it takes no `MGET`).
READ = "return redis.call('MGET', unpack(KEYS))"
