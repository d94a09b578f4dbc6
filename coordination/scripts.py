"""The Lua scripts, one named constant each.

State of a session (all keys hash-tagged ``{sid}``):

- ``tail`` hash: ``inc`` (incarnation of the header the state was built from), ``seq`` (last
  committed segment known to Redis; always <= the true tail in the object store), ``last``
  (id of the last entry of segment ``seq``, "" when empty), ``count`` (entries in segments
  1..seq), ``nids`` (ids in the index, which also holds a fork's inherited path).
- ``ids`` hash: entry id -> "<seq>:<content hash>".

A missing ``tail`` never means "empty session": the scripts answer HYDRATE and the client
rebuilds the state from the object store. Every script is safe to run twice (redis-py may
resend a command after a timeout): CHECK writes nothing, COMMIT only moves ``seq`` from n to
n+1, INSTALL only replaces the state with one built from the object store.

Return values are arrays whose first element is the code; ``coordination/redis.py`` maps
each code to a result or a typed error in one place.
"""

from __future__ import annotations

# Lua's unpack() is limited by the C stack (about 8,000 values): every bulk call is chunked.
_CHUNK = 500

_PRELUDE = """
local function state(tail_key, ids_key, inc)
  local t = redis.call('HMGET', tail_key, 'inc', 'seq', 'last', 'count', 'nids')
  if not t[1] then return nil, {'HYDRATE'} end
  if t[1] ~= inc then return nil, {'INCARNATION', t[1]} end
  if redis.call('HLEN', ids_key) ~= tonumber(t[5]) then
    -- The id index lost keys (eviction, partial loss): it is rebuilt, never trusted.
    return nil, {'HYDRATE'}
  end
  return {seq = tonumber(t[2]), last = t[3], count = tonumber(t[4]), nids = tonumber(t[5])}, nil
end
local function hmget_chunked(key, list, first, last)
  local out = {}
  local i = first
  while i <= last do
    local j = math.min(i + %d - 1, last)
    local part = redis.call('HMGET', key, unpack(list, i, j))
    for k = 1, #part do out[#out + 1] = part[k] end
    i = j + 1
  end
  return out
end
local function hset_chunked(key, list, first, last)
  local i = first
  while i <= last do
    local j = math.min(i + 2 * %d - 1, last)
    redis.call('HSET', key, unpack(list, i, j))
    i = j + 1
  end
end
""" % (_CHUNK, _CHUNK)

CHECK = _PRELUDE + """
-- CHECK: may this batch be appended, and after which segment?
-- KEYS[1] tail, KEYS[2] ids
-- ARGV[1] inc, ARGV[2] "1" to check the expected tail else "0", ARGV[3] expected tail id
--   ("" = the session is empty), ARGV[4] n (entries), ARGV[5..4+n] ids,
--   ARGV[5+n..4+2n] content hashes, ARGV[5+2n] m (external parents),
--   then m pairs (entry id, parent id), then the writer's nonce and the claim's lease (ms;
--   0 = no claim)
-- KEYS[3] (optional) the claim: "<seq>:<nonce>" of the writer that was last told OK for
--   seq. A claim is advisory: it only keeps concurrent writers from all PUTting segment
--   seq+1 at once (all but one would lose the race, each at the price of a PUT and a GET);
--   If-None-Match on the PUT stays the only arbiter, and a claim of a dead writer expires.
-- Returns:
--   {'OK', seq, last}                       append as segment seq+1
--   {'BUSY', seq, ttl}                      another writer holds the claim on seq+1 for ttl ms
--   {'DUPLICATE', seq}                      every id present with the same content: the batch
--                                           was committed as segment seq
--   {'COLLISION', id, why}                  an id exists with other content (or a partial re-send)
--   {'CONFLICT', last, seq}                 expected tail does not match
--   {'UNKNOWN_PARENT', id, parent}
--   {'HYDRATE'} / {'INCARNATION', inc}      state missing / built from another header
local s, err = state(KEYS[1], KEYS[2], ARGV[1])
if not s then return err end
local n = tonumber(ARGV[4])
local found = hmget_chunked(KEYS[2], ARGV, 5, 4 + n)
local present, dup_seq = 0, nil
for i = 1, n do
  local v = found[i]
  if v then
    local sep = string.find(v, ':', 1, true)
    local seq, h = string.sub(v, 1, sep - 1), string.sub(v, sep + 1)
    if h ~= ARGV[4 + n + i] then return {'COLLISION', ARGV[4 + i], 'different content'} end
    present = present + 1
    dup_seq = seq
  end
end
if present == n then return {'DUPLICATE', dup_seq} end
if present > 0 then
  for i = 1, n do
    if found[i] then return {'COLLISION', ARGV[4 + i], 'part of the batch is already stored'} end
  end
end
if ARGV[2] == '1' and s.last ~= ARGV[3] then return {'CONFLICT', s.last, s.seq} end
local m = tonumber(ARGV[5 + 2 * n])
if m > 0 then
  local parents = {}
  for i = 1, m do parents[i] = ARGV[5 + 2 * n + 2 * i] end
  local pf = hmget_chunked(KEYS[2], parents, 1, m)
  for i = 1, m do
    if not pf[i] then return {'UNKNOWN_PARENT', ARGV[5 + 2 * n + 2 * i - 1], parents[i]} end
  end
end
local nonce, lease = ARGV[6 + 2 * n + 2 * m], tonumber(ARGV[7 + 2 * n + 2 * m] or '0')
if KEYS[3] and lease and lease > 0 then
  local claim = redis.call('GET', KEYS[3])
  if claim then
    local sep = string.find(claim, ':', 1, true)
    if tonumber(string.sub(claim, 1, sep - 1)) == s.seq and string.sub(claim, sep + 1) ~= nonce then
      return {'BUSY', s.seq, redis.call('PTTL', KEYS[3])}
    end
  end
  redis.call('SET', KEYS[3], s.seq .. ':' .. nonce, 'PX', lease)
end
return {'OK', s.seq, s.last}
"""

COMMIT = _PRELUDE + """
-- COMMIT: record that segment from+1 exists, index its ids, notify followers.
-- KEYS[1] tail, KEYS[2] ids
-- ARGV[1] inc, ARGV[2] from (seq the writer saw), ARGV[3] last id of the segment,
--   ARGV[4] n, ARGV[5..4+2n] pairs (id, "<from+1>:<hash>"), ARGV[5+2n] channel,
--   ARGV[6+2n] notification payload, ARGV[7+2n] the segment's size in bytes
-- Also counts segments and bytes not yet compacted (tail fields pseg, pbytes; the compactor
-- subtracts what it merges), so the writer can tell when a compaction job is due.
-- KEYS[3] (optional) the job marker: the reply says whether a compaction job is queued, so
-- the writer enqueues only when one is due and none is (no extra round trip per append).
-- Returns {'OK', from+1, pseg, pbytes, queued} | {'ALREADY', seq} (someone rolled it forward) |
--   {'BEHIND', seq} (Redis is behind the writer's view: rebuild) | {'HYDRATE'} | {'INCARNATION', inc}
local s, err = state(KEYS[1], KEYS[2], ARGV[1])
if not s then return err end
local from = tonumber(ARGV[2])
if s.seq > from then return {'ALREADY', s.seq} end
if s.seq < from then return {'BEHIND', s.seq} end
local n = tonumber(ARGV[4])
local before = redis.call('HLEN', KEYS[2])
hset_chunked(KEYS[2], ARGV, 5, 4 + 2 * n)
local nids = redis.call('HLEN', KEYS[2])
redis.call('HSET', KEYS[1], 'seq', from + 1, 'last', ARGV[3], 'count', s.count + n, 'nids', nids)
local pseg = redis.call('HINCRBY', KEYS[1], 'pseg', 1)
local pbytes = redis.call('HINCRBY', KEYS[1], 'pbytes', tonumber(ARGV[7 + 2 * n]))
redis.call('PUBLISH', ARGV[5 + 2 * n], ARGV[6 + 2 * n])
local queued = 0
if KEYS[3] then queued = redis.call('EXISTS', KEYS[3]) end
return {'OK', from + 1, pseg, pbytes, queued}
"""

INSTALL = """
-- INSTALL: replace a session's state with one rebuilt from the object store.
-- KEYS[1] tail, KEYS[2] ids, KEYS[3] the scratch hash holding the rebuilt ids
-- ARGV[1] inc, ARGV[2] seq, ARGV[3] last, ARGV[4] count, ARGV[5] nids,
--   ARGV[6] pseg, ARGV[7] pbytes (segments and bytes after the latest manifest)
-- Keeps a current state instead (same incarnation, seq at least as far, index whole):
-- a concurrent writer may have committed past what this rebuild saw.
-- Returns {'INSTALLED', seq} | {'KEPT', seq} | {'LOST'} (the scratch hash vanished, e.g. a
--   FLUSHALL while it was being filled: build it again)
local t = redis.call('HMGET', KEYS[1], 'inc', 'seq', 'nids')
if t[1] == ARGV[1] and tonumber(t[2]) >= tonumber(ARGV[2])
   and redis.call('HLEN', KEYS[2]) == tonumber(t[3]) then
  redis.call('DEL', KEYS[3])
  return {'KEPT', tonumber(t[2])}
end
if redis.call('HLEN', KEYS[3]) ~= tonumber(ARGV[5]) then
  redis.call('DEL', KEYS[3])
  return {'LOST'}
end
if tonumber(ARGV[5]) > 0 then
  redis.call('RENAME', KEYS[3], KEYS[2])
else
  redis.call('DEL', KEYS[2], KEYS[3])
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'inc', ARGV[1], 'seq', ARGV[2], 'last', ARGV[3],
           'count', ARGV[4], 'nids', ARGV[5], 'pseg', ARGV[6], 'pbytes', ARGV[7])
return {'INSTALLED', tonumber(ARGV[2])}
"""

FORGET = """
-- FORGET: drop a session's state, but only the state of the given incarnation
-- ("*" = whatever is there).
-- KEYS[1] tail, KEYS[2] ids, KEYS[3] job marker, KEYS[4] (optional) claim; ARGV[1] inc
-- Returns 1 if dropped, 0 if the state belonged to another incarnation.
local inc = redis.call('HGET', KEYS[1], 'inc')
if ARGV[1] ~= '*' and inc and inc ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if KEYS[4] then redis.call('DEL', KEYS[4]) end
return 1
"""

COMPACTED = """
-- COMPACTED: a manifest now covers segments the counters still count as pending.
-- KEYS[1] tail; ARGV[1] inc, ARGV[2] segments merged, ARGV[3] bytes merged
-- Returns {pseg, pbytes} after the subtraction (never below zero), or {} for another
-- incarnation or missing state (nothing to correct: a rebuild recounts from the manifest).
local inc = redis.call('HGET', KEYS[1], 'inc')
if inc ~= ARGV[1] then return {} end
local pseg = redis.call('HINCRBY', KEYS[1], 'pseg', -tonumber(ARGV[2]))
local pbytes = redis.call('HINCRBY', KEYS[1], 'pbytes', -tonumber(ARGV[3]))
if pseg < 0 then pseg = 0; redis.call('HSET', KEYS[1], 'pseg', 0) end
if pbytes < 0 then pbytes = 0; redis.call('HSET', KEYS[1], 'pbytes', 0) end
return {pseg, pbytes}
"""
