"""The Lua scripts Redis runs for ratedeck: one grant of a key's budget, one shared gate.

Each runs atomically in Redis, on Redis's clock (`TIME`), in whole
microseconds (Unix time in µs fits a Lua double exactly). See
`redis_shared.py` for what a grant means and why it is exact.
"""

from __future__ import annotations

#: Grant up to `count` send times of one budget, all its policies together.
#:
#: KEYS[2]: the store's epoch (set at the first grant after Redis starts empty; a restart
#: that lost the state shows as a new epoch). KEYS[1]: the budget's prefix, `ratedeck:{h:<host>}:b:<key>`; its keys are `<prefix>:m` (a hash: the last
#: slot, sequence, bucket levels), `<prefix>:s<i>` (a sorted set per sliding window: one
#: member per unit granted, scored by the time it stops counting) and `<prefix>:f<i>:<n>`
#: (a counter per fixed window n). All share the `{h:<host>}` hash tag (one slot of a cluster).
#: ARGV: count, cost, headroom_us, pace_us, spacing, horizon_us, hold_us, then four per
#: policy: kind (s|f|b), limit, window_us, drain (a bucket's units per window).
#: Returns {now_us, status, fresh, next_us, epoch, t1, t2, ...}: status 1 granted t1.. (maybe none,
#: when the next slot, `next_us`, is beyond the horizon), 0 never (a cost above a limit).
GRANT = r"""
local pre = KEYS[1]
local count = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local h = tonumber(ARGV[3])
local pace = tonumber(ARGV[4])
local spacing = tonumber(ARGV[5])
local horizon = tonumber(ARGV[6])
local hold = tonumber(ARGV[7])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local meta = pre .. ':m'

local function num(x) return string.format('%.0f', x) end

local policies = {}
local gap = 0
local longest = 0
for i = 1, (#ARGV - 7) / 4 do
  local b = 7 + (i - 1) * 4
  local p = {kind = ARGV[b + 1], limit = tonumber(ARGV[b + 2]), window = tonumber(ARGV[b + 3]),
             drain = tonumber(ARGV[b + 4]), i = i}
  policies[i] = p
  if p.kind == 'b' then
    p.rate = p.drain / p.window
    if cost > p.limit - p.rate * h then return {now, 0, 0, 0, ''} end
    local fill = math.ceil(p.limit / p.rate)
    if fill > longest then longest = fill end
  else
    if cost > p.limit then return {now, 0, 0, 0, ''} end
    -- even pacing: each slot at least (W + pace) * spacing * cost / N after the last
    local g = (p.window + pace) * spacing * cost / p.limit
    if g > gap then gap = g end
    if p.window > longest then longest = p.window end
  end
  if p.kind == 's' then
    redis.call('ZREMRANGEBYSCORE', pre .. ':s' .. i, '-inf', num(now))
  end
end

redis.call('SET', KEYS[2], num(now), 'NX')
local epoch = redis.call('GET', KEYS[2])
local fresh = 0
local last = redis.call('HGET', meta, 'last')
if last then
  last = tonumber(last)
else
  -- no record of this budget: first use, or its state was lost; the member says how long to wait
  fresh = 1
  last = now + hold - gap
end

local function level_at(p, s)
  local level = tonumber(redis.call('HGET', meta, 'l' .. p.i) or '0')
  local at = tonumber(redis.call('HGET', meta, 'a' .. p.i) or '0')
  if s > at then
    level = level - p.rate * (s - at)
    if level < 0 then level = 0 end
  end
  return level
end

-- the earliest time >= s at which policy p has room for `cost`
local function earliest(p, s)
  if p.kind == 's' then
    local zs = pre .. ':s' .. p.i
    local busy = redis.call('ZCOUNT', zs, '(' .. num(s), '+inf')
    local excess = busy + cost - p.limit
    if excess <= 0 then return s end
    local r = redis.call('ZRANGEBYSCORE', zs, '(' .. num(s), '+inf', 'WITHSCORES', 'LIMIT', excess - 1, 1)
    return tonumber(r[2])
  elseif p.kind == 'f' then
    local t = s
    for w = math.floor((s - h) / p.window), math.floor((s + h) / p.window) do
      local used = tonumber(redis.call('GET', pre .. ':f' .. p.i .. ':' .. num(w)) or '0')
      if used + cost > p.limit then
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

local function record(p, s)
  if p.kind == 's' then
    local zs = pre .. ':s' .. p.i
    for _ = 1, cost do
      local seq = redis.call('HINCRBY', meta, 'seq', 1)
      redis.call('ZADD', zs, num(s + p.window + h), seq)
    end
    redis.call('PEXPIRE', zs, math.ceil((s + p.window + h - now) / 1000) + 1000)
  elseif p.kind == 'f' then
    for w = math.floor((s - h) / p.window), math.floor((s + h) / p.window) do
      local k = pre .. ':f' .. p.i .. ':' .. num(w)
      redis.call('INCRBY', k, cost)
      redis.call('PEXPIRE', k, math.ceil(((w + 1) * p.window + h - now) / 1000) + 1000)
    end
  else
    local level = level_at(p, s) + cost
    redis.call('HSET', meta, 'l' .. p.i, tostring(level), 'a' .. p.i, num(s))
  end
end

local out = {now, 1, fresh, 0, epoch}
local s = math.ceil(last + gap)
if s < now then s = now end
for _ = 1, count do
  local settled = false
  for _ = 1, 64 do
    local s2 = s
    for i = 1, #policies do
      local e = earliest(policies[i], s2)
      if e > s2 then s2 = e end
    end
    if s2 == s then settled = true break end
    s = s2
  end
  if not settled or s > now + horizon then break end
  for i = 1, #policies do record(policies[i], s) end
  out[#out + 1] = s
  last = s
  s = math.ceil(s + gap)
end
out[4] = s
redis.call('HSET', meta, 'last', num(last))
redis.call('PEXPIRE', meta, math.ceil((last - now + longest + h) / 1000) + 1000)
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

#: Redis's clock, from the node that holds KEYS[1] (a cluster's masters each have their own).
TIME = "return redis.call('TIME')"
