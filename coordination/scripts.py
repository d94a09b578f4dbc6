"""The Lua scripts, one named constant each.

State of a session (all keys hash-tagged ``{sid}``):

- ``tail`` hash: ``inc`` (incarnation of the header the state was built from), ``seq`` (last
  committed segment known to Redis; always <= the true tail in the object store), ``last``
  (id of the last entry of segment ``seq``, "" when empty), ``count`` (entries in segments
  1..seq), ``nids`` (ids in the index, which also holds a fork's inherited path), ``cseq``
  (the highest ``through_seq`` of a manifest Redis has been told of: segments 1..cseq are
  retired and GC may delete them, so no writer may be told to write, or be acknowledged for,
  one of those slots), ``mgen`` (the generation of the newest manifest Redis has been told
  of: a hint for readers, never trusted without a check), ``pseg``/``pbytes`` (pending
  compaction).
  ``iseq``/``tids``: ids of entries in segments 1..iseq (and a fork's inherited path) are
  *compacted*: they live only in the data, in the manifest's bases, and ``tids`` of them are
  not in ``ids`` (absent ``iseq``: -1, none; ``HLEN(ids) + tids == nids`` when the index is
  whole). COMPACTED and INSTALL set them; writers check their batch against the compacted
  ids themselves (store/protocol/id_index.py) and tell CHECK how far their copy reaches.
- ``ids`` hash: entry id -> "<seq>:<content hash>", for entries after ``iseq``.
- ``summary`` hash: what a listing shows, accounted through segment ``seq`` (see SUMMARY).
- ``recent`` hash: the segments no manifest covers yet, a cache for readers (see COMMIT).
- ``claim``, ``queue``, ``queue:leases`` and ``queue:<nonce>``: the advisory claim on the next
  slot and the first-come-first-served queue of writers waiting for it (see ``_QUEUE``).

A missing ``tail`` never means "empty session": the scripts answer HYDRATE and the client
rebuilds the state from the object store. Every script is safe to run twice (redis-py may
resend a command after a timeout): CHECK writes only the claim and the writer's place in the
queue (a second run finds them as the first left them), COMMIT only moves ``seq`` from n to
n+1, INSTALL only replaces the state with one built from the object store.

Return values are arrays whose first element is the code; ``coordination/redis.py`` maps
each code to a result or a typed error in one place.
"""

from __future__ import annotations

# Lua's unpack() is limited by the C stack (about 8,000 values): every bulk call is chunked.
_CHUNK = 500

_PRELUDE = """
local function state(tail_key, ids_key, inc)
  local t = redis.call('HMGET', tail_key, 'inc', 'seq', 'last', 'count', 'nids', 'cseq', 'iseq', 'tids',
                       'pseg', 'pbytes')
  if not t[1] then return nil, {'HYDRATE'} end
  if t[1] ~= inc then return nil, {'INCARNATION', t[1]} end
  local tids = tonumber(t[8] or '0')
  if redis.call('HLEN', ids_key) + tids ~= tonumber(t[5]) then
    -- The id index lost keys (eviction, expiry, partial loss): it is rebuilt, never trusted.
    -- (A process of a version that does not trim compacted ids sees HLEN ~= nids here and
    -- rebuilds a whole index, whose INSTALL drops iseq and tids: mixed versions stay right.)
    return nil, {'HYDRATE'}
  end
  return {seq = tonumber(t[2]), last = t[3], count = tonumber(t[4]), nids = tonumber(t[5]),
          cseq = tonumber(t[6] or '0'), iseq = tonumber(t[7] or '-1'), tids = tids,
          pseg = tonumber(t[9] or '0'), pbytes = tonumber(t[10] or '0')}, nil
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
-- Returns how many of the fields were new.
local function hset_chunked(key, list, first, last)
  local added = 0
  local i = first
  while i <= last do
    local j = math.min(i + 2 * %d - 1, last)
    added = added + redis.call('HSET', key, unpack(list, i, j))
    i = j + 1
  end
  return added
end
""" % (_CHUNK, _CHUNK)

_QUEUE = """
-- Fair appends: writers that find the claim on the next slot taken wait in a queue, first
-- come, first served, and the claim is handed to the first of them (by COMMIT, by CHECK when
-- the claim lapsed, by RELEASE) instead of going to whoever asks next. Like the claim, the
-- queue only orders writers: If-None-Match on the PUT stays the only arbiter.
-- queue: sorted set nonce -> ticket. leases: hash nonce -> "<deadline ms>:<lease ms>" by
-- Redis's clock (a waiter renews it each time it asks; one that stops asking, paused or
-- dead, is dropped at its deadline), and "#" -> the last ticket handed out.
-- <queue>:<nonce>: a list the waiter blocks on (BLPOP), pushed when the claim is handed to it,
-- or with "done" when its batch was committed in another writer's segment (group commit).
-- <queue>:<nonce>:offer: "<incarnation>\\n<segment body>", the batch a waiter offers to ride in
-- the segment of the writer that takes the claim next (group commit, see CHECK); it expires
-- with the waiter's lease, and CHECK takes it (deletes it) atomically, at most once.
redis.replicate_commands()
local function redis_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function leave_queue(queue, leases, nonce)
  redis.call('ZREM', queue, nonce)
  redis.call('HDEL', leases, nonce)
end
-- The first waiter whose lease still runs, and its lease (those past it are dropped).
local function first_waiter(queue, leases)
  if redis.call('EXISTS', queue) == 0 then return nil end
  local now = redis_ms()
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then return nil end
    local v = redis.call('HGET', leases, head)
    if v then
      local sep = string.find(v, ':', 1, true)
      if tonumber(string.sub(v, 1, sep - 1)) > now then return head, tonumber(string.sub(v, sep + 1)) end
    end
    leave_queue(queue, leases, head)
  end
end
-- Hand the claim on slot seq+1 to the first waiter and wake it. Returns its nonce, or nil
-- (nobody waits: the claim is left as it is).
local function hand_over(claim, queue, leases, seq)
  local head, lease = first_waiter(queue, leases)
  if not head then return nil end
  leave_queue(queue, leases, head)
  redis.call('SET', claim, seq .. ':' .. head, 'PX', lease)
  local turn = queue .. ':' .. head
  redis.call('RPUSH', turn, seq)
  redis.call('PEXPIRE', turn, lease)
  return head
end
-- Join the queue, or keep one's place in it with the lease renewed. Returns the ticket.
local function join_queue(queue, leases, nonce, lease)
  local ticket = redis.call('ZSCORE', queue, nonce)
  if not ticket then
    ticket = redis.call('HINCRBY', leases, '#', 1)
    redis.call('ZADD', queue, ticket, nonce)
  end
  redis.call('HSET', leases, nonce, (redis_ms() + lease) .. ':' .. lease)
  for _, key in ipairs({queue, leases}) do  -- an idle queue vanishes: no lease outlives it
    if redis.call('PTTL', key) < lease then redis.call('PEXPIRE', key, lease) end
  end
  return tonumber(ticket)
end
-- The holder of the claim on slot seq+1 ("<seq>:<nonce>"), or nil.
local function claim_holder(claim, seq)
  local c = redis.call('GET', claim)
  if not c then return nil end
  local sep = string.find(c, ':', 1, true)
  if tonumber(string.sub(c, 1, sep - 1)) ~= seq then return nil end
  return string.sub(c, sep + 1)
end
-- A writer goes away (refused, or giving up): out of the queue, its wake-up list dropped,
-- and a claim it holds goes to the first waiter (or is dropped).
local function step_aside(claim, queue, leases, nonce)
  leave_queue(queue, leases, nonce)
  redis.call('DEL', queue .. ':' .. nonce, queue .. ':' .. nonce .. ':offer')
  local c = redis.call('GET', claim)
  if not c then return end
  local sep = string.find(c, ':', 1, true)
  if string.sub(c, sep + 1) ~= nonce then return end
  redis.call('DEL', claim)
  hand_over(claim, queue, leases, tonumber(string.sub(c, 1, sep - 1)))
end
-- After a commit of slot seq: the claim on seq+1 goes to the first waiter, unless someone
-- holds it already, so the writer that committed cannot take it again ahead of them.
local function pass_on(claim, queue, leases, seq)
  if redis.call('EXISTS', queue) == 0 then return end  -- nobody waits: hand_over would do nothing
  local c = redis.call('GET', claim)
  if c and tonumber(string.sub(c, 1, string.find(c, ':', 1, true) - 1)) >= seq then return end
  hand_over(claim, queue, leases, seq)
end
"""

CHECK = _PRELUDE + _QUEUE + """
-- CHECK: may this batch be appended, and after which segment?
-- KEYS[1] tail, KEYS[2] ids
-- ARGV[1] inc, ARGV[2] "1" to check the expected tail else "0", ARGV[3] expected tail id
--   ("" = the session is empty), ARGV[4] n (entries), ARGV[5..4+n] ids,
--   ARGV[5+n..4+2n] content hashes, ARGV[5+2n] m (external parents),
--   then m pairs (entry id, parent id), then the writer's nonce and the claim's lease (ms;
--   0 = no claim), then group commit: r, the most riders to take, b, the most bytes of their
--   batches, and "1" to keep the claim and one's place when refused (the leader's CHECK of a
--   combined batch), then (optional) the writer's view of the compacted ids: w, the segment
--   through which its copy of them reaches (-1: it has none), then n values (what its copy
--   holds for each id: "<seq>:<hash>", or "" for none), then m values ("1" when its copy
--   holds the parent, else "")
-- KEYS[3] (optional) the claim: "<seq>:<nonce>" of the writer that was last told OK for
--   seq. A claim is advisory: it only keeps concurrent writers from all PUTting segment
--   seq+1 at once (all but one would lose the race, each at the price of a PUT and a GET);
--   If-None-Match on the PUT stays the only arbiter, and a claim of a dead writer expires.
-- KEYS[4], KEYS[5] (with KEYS[3]) the queue of writers waiting for the claim and their
--   leases, KEYS[6] the writer's wake-up list (see _QUEUE). A writer that finds the claim
--   held joins the queue (or keeps its place); a claim that is free while writers wait goes
--   to the first of them; a writer refused here (DUPLICATE .. UNKNOWN_PARENT) leaves the
--   queue and passes on a claim that was handed to it.
-- Returns:
--   {'OK', seq, last, kept, [nonce, offer]...}
--                                           append as segment seq+1; kept: 1 when the
--                                           caller's own offer was still there (now
--                                           withdrawn), else 0; with r > 0, the
--                                           batches of waiters taken to ride in it (each
--                                           out of the queue, its offer deleted), in
--                                           queue order: the caller CHECKs the combined
--                                           batch, PUTs it as its own segment and names
--                                           the riders to COMMIT, which wakes them
--   {'BUSY', seq, ttl, ticket}              another writer holds the claim on seq+1 for ttl
--                                           ms; the caller waits in the queue with ticket
--   {'DUPLICATE', seq}                      every id present with the same content: the batch
--                                           was committed as segment seq
--   {'COLLISION', id, why}                  an id exists with other content (or a partial re-send)
--   {'CONFLICT', last, seq}                 expected tail does not match
--   {'UNKNOWN_PARENT', id, parent}
--   {'HYDRATE'} / {'INCARNATION', inc}      state missing / built from another header
--   {'REINDEX', iseq}                       the ids of segments 1..iseq are compacted and
--                                           the writer's copy does not reach that far: load
--                                           it from the manifest's bases, then CHECK again
local s, err = state(KEYS[1], KEYS[2], ARGV[1])
if not s then return err end
-- A tail below a manifest's through_seq lags the object store (a stale rebuild, commits
-- that never reached Redis): segments up to cseq are retired and may be gone, so a writer
-- told OK here could re-create one. Rebuild first.
if s.seq < s.cseq then return {'HYDRATE'} end
local n = tonumber(ARGV[4])
local m = tonumber(ARGV[5 + 2 * n])
local nonce, lease = ARGV[6 + 2 * n + 2 * m], tonumber(ARGV[7 + 2 * n + 2 * m] or '0')
local claims = KEYS[3] and lease and lease > 0
-- Compacted ids are not in KEYS[2]: the writer's copy must reach at least as far. Decided in
-- this script, so a compaction that trims between the writer's lookup and here is caught.
local gc = 7 + 2 * n + 2 * m  -- ARGV[gc + 1..3]: group commit (riders, their bytes, keep)
local w = tonumber(ARGV[11 + 2 * n + 2 * m] or '-1')
if s.iseq >= 0 and s.iseq > w then return {'REINDEX', s.iseq} end
local wv = 11 + 2 * n + 2 * m  -- ARGV[wv + i]: the writer's value for id i, ARGV[wv + n + i]: parent i
local function theirs(i)
  local v = ARGV[wv + i]
  if v and v ~= '' then return v end
  return nil
end
local function refusal()
  local found = hmget_chunked(KEYS[2], ARGV, 5, 4 + n)
  local present, dup_seq = 0, nil
  for i = 1, n do
    local v = found[i] or theirs(i)
    if v then found[i] = v end
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
  if m > 0 then
    local parents = {}
    for i = 1, m do parents[i] = ARGV[5 + 2 * n + 2 * i] end
    local pf = hmget_chunked(KEYS[2], parents, 1, m)
    for i = 1, m do
      if not pf[i] and ARGV[wv + n + i] ~= '1' then
        return {'UNKNOWN_PARENT', ARGV[5 + 2 * n + 2 * i - 1], parents[i]}
      end
    end
  end
  return nil
end
local refused = refusal()
if refused then
  if claims and KEYS[4] and ARGV[gc + 3] ~= '1' then step_aside(KEYS[3], KEYS[4], KEYS[5], nonce) end
  return refused
end
if claims then
  local holder = claim_holder(KEYS[3], s.seq)
  if KEYS[4] then
    if not holder then
      -- The claim is free (committed, given up, or lapsed): writers waiting come first.
      local head = first_waiter(KEYS[4], KEYS[5])
      if head and head ~= nonce then holder = hand_over(KEYS[3], KEYS[4], KEYS[5], s.seq) end
    end
    if holder and holder ~= nonce then
      local ticket = join_queue(KEYS[4], KEYS[5], nonce, lease)
      return {'BUSY', s.seq, redis.call('PTTL', KEYS[3]), ticket}
    end
    if redis.call('EXISTS', KEYS[4]) == 1 then leave_queue(KEYS[4], KEYS[5], nonce) end
    redis.call('DEL', KEYS[6])
  elseif holder and holder ~= nonce then
    return {'BUSY', s.seq, redis.call('PTTL', KEYS[3]), 0}
  end
  redis.call('SET', KEYS[3], s.seq .. ':' .. nonce, 'PX', lease)
end
-- Our own offer, if we made one, is withdrawn: kept = 1 when it was still there (nobody
-- took it since it was last set), so the caller knows whether another writer holds it.
local kept = 0
if claims and KEYS[4] then kept = redis.call('DEL', KEYS[6] .. ':offer') end
local out = {'OK', s.seq, s.last, kept}
-- Group commit: take the offers of waiters (first come, first served; those without one keep
-- their place), each at most once and only of this incarnation, within the budget.
local maxr = tonumber(ARGV[gc + 1] or '0') or 0
if claims and KEYS[4] and maxr > 0 and redis.call('EXISTS', KEYS[4]) == 1 then
  local budget = tonumber(ARGV[gc + 2] or '0') or 0
  local now = redis_ms()
  local want = ARGV[1] .. '\\n'
  local taken = 0
  for _, h in ipairs(redis.call('ZRANGE', KEYS[4], 0, 4 * maxr - 1)) do
    if taken >= maxr then break end
    local lv = redis.call('HGET', KEYS[5], h)
    if lv and tonumber(string.sub(lv, 1, string.find(lv, ':', 1, true) - 1)) > now then
      local okey = KEYS[4] .. ':' .. h .. ':offer'
      local offer = redis.call('GET', okey)
      if offer and string.sub(offer, 1, #want) == want and #offer - #want <= budget then
        budget = budget - (#offer - #want)
        taken = taken + 1
        redis.call('DEL', okey)
        leave_queue(KEYS[4], KEYS[5], h)
        out[#out + 1] = h
        out[#out + 1] = string.sub(offer, #want + 1)
      end
    end
  end
end
return out
"""

COMMIT = _PRELUDE + _QUEUE + """
-- COMMIT: record that segment from+1 exists, index its ids, notify followers.
-- KEYS[1] tail, KEYS[2] ids
-- ARGV[1] inc, ARGV[2] from (seq the writer saw), ARGV[3] last id of the segment,
--   ARGV[4] n, ARGV[5..4+2n] pairs (id, "<from+1>:<hash>"), ARGV[5+2n] channel,
--   ARGV[6+2n] notification payload, ARGV[7+2n] the segment's size in bytes
-- Also counts segments and bytes not yet compacted (tail fields pseg, pbytes; the compactor
-- subtracts what it merges), so the writer can tell when a compaction job is due.
-- KEYS[3] (optional) the job marker: the reply says whether a compaction job is queued, so
-- the writer enqueues only when one is due and none is (no extra round trip per append).
-- ARGV[8+2n] "1" when the segment is the caller's own (a writer committing what it PUT),
--   "0" for a roll-forward of another writer's segment.
-- KEYS[4] the listing's summary, ARGV[9..11+2n] what the batch changes in it (see the
--   summary block below).
-- KEYS[5] the recent-segments cache, ARGV[12+2n] the value to cache for slot from+1
--   ("" = none), ARGV[13+2n] the most bytes pending compaction for which the cache still
--   takes segments. Cached only on OK: the caller's PUT created the slot and no manifest
--   retired it, so the value is the slot's one and only content (docs/design.md).
-- KEYS[6..8] the claim, the queue of waiting writers and their leases: with OK, the claim
--   on the next slot is handed to the first waiter (see _QUEUE).
-- ARGV[14+2n] (optional) how long (ms) the id index and the recent-segments cache live
--   after this commit ("0" or absent: for good). Only an idle session's state expires: each
--   commit renews it. An index that expired reads as lost keys (HLEN ~= nids: HYDRATE), so
--   the next append rebuilds it from the object store, which holds every entry: Redis
--   holds the index of active sessions only, and a re-send of any batch is still
--   recognised (docs/design.md, "Redis state").
-- ARGV[15+2n] "1": announce with SPUBLISH (sharded pub/sub, Redis >= 7.0: the channel has the
--   session's hash tag, so it is in this script's slot and the message stays on the shard
--   that owns it); anything else: PUBLISH (Redis 6.2; a Redis Cluster then broadcasts it to
--   every node). The caller decides from the servers' versions (Coordinator.sharded_pubsub).
--   A server that does not know SPUBLISH gets PUBLISH instead, so the script never stops
--   half-way after its writes.
-- ARGV[16+2n] (optional) r, then r nonces: waiters whose batches ride in this segment (group
--   commit, taken by CHECK), then how long (ms) their wake-ups live: with OK, each is woken
--   with "done" (its next CHECK finds its batch: DUPLICATE).
-- (KEYS[4..8] and their arguments are optional, in that order.)
-- Slot from+1 is *taken* when Redis's tail is past it, or when a manifest retired it
-- (from+1 <= cseq). The caller's PUT of from+1 succeeded, so if the slot is taken, either the
-- segment committed there is the caller's (a roll-forward by someone else: every id of the
-- batch is indexed at from+1 with the same content) or the caller re-created a slot that
-- compaction retired and GC deleted: a zombie, never to be acknowledged. When the slot's ids
-- are compacted (from+1 <= iseq: out of KEYS[2]) this script cannot tell the two apart: it
-- answers RETIRED, the caller removes its object from the retired slot (no reader looks
-- there; GC would) and CHECKs again, which finds its batch among the compacted ids
-- (DUPLICATE, with the slot it got) if it was the one committed there.
-- Returns {'OK', from+1, pseg, pbytes, queued} | {'ALREADY', seq} (committed already: the
--   caller's batch, for an own segment) | {'ZOMBIE', seq} (own segment in a taken slot) |
--   {'BEHIND', seq} (Redis is behind the writer's view: rebuild) | {'HYDRATE'} | {'INCARNATION', inc}
--   | {'RETIRED', seq} (own segment in a retired slot whose ids are compacted: CHECK decides)
local s, err = state(KEYS[1], KEYS[2], ARGV[1])
if not s then return err end
local from = tonumber(ARGV[2])
local n = tonumber(ARGV[4])
if s.seq > from or from + 1 <= s.cseq then
  if s.seq <= from then return {'HYDRATE'} end  -- the tail lags a manifest: rebuild, then decide
  if ARGV[8 + 2 * n] ~= '1' then return {'ALREADY', s.seq} end
  if from + 1 <= s.iseq then return {'RETIRED', s.seq} end
  local i = 5
  while i <= 4 + 2 * n do
    local j = math.min(i + 999, 4 + 2 * n)
    local ids = {}
    for k = i, j, 2 do ids[#ids + 1] = ARGV[k] end
    local got = redis.call('HMGET', KEYS[2], unpack(ids))
    for k = 1, #ids do
      if got[k] ~= ARGV[i + 2 * k - 1] then return {'ZOMBIE', s.seq} end
    end
    i = j + 1
  end
  return {'ALREADY', s.seq}
end
if s.seq < from then return {'BEHIND', s.seq} end
-- state() checked HLEN(ids) + tids == nids: the ids this HSET adds make the new nids. The
-- pending counters move in the same HSET (a read-modify-write: the script is atomic, and the
-- compactor's HINCRBYs in COMPACTED run before or after it, never within).
local nids = s.nids + hset_chunked(KEYS[2], ARGV, 5, 4 + 2 * n)
local pseg = s.pseg + 1
local pbytes = s.pbytes + tonumber(ARGV[7 + 2 * n])
redis.call('HSET', KEYS[1], 'seq', from + 1, 'last', ARGV[3], 'count', s.count + n, 'nids', nids,
           'pseg', pseg, 'pbytes', pbytes)
if ARGV[15 + 2 * n] == '1' then
  local sent = redis.pcall('SPUBLISH', ARGV[5 + 2 * n], ARGV[6 + 2 * n])
  if type(sent) == 'table' and sent.err then redis.call('PUBLISH', ARGV[5 + 2 * n], ARGV[6 + 2 * n]) end
else
  redis.call('PUBLISH', ARGV[5 + 2 * n], ARGV[6 + 2 * n])
end
-- recent-segments cache
if KEYS[5] and ARGV[12 + 2 * n] and ARGV[12 + 2 * n] ~= ''
   and pbytes <= tonumber(ARGV[13 + 2 * n] or '0') then
  redis.call('HSET', KEYS[5], from + 1, ARGV[12 + 2 * n])
end
local ttl = tonumber(ARGV[14 + 2 * n] or '0') or 0
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
  if KEYS[5] then redis.call('PEXPIRE', KEYS[5], ttl) end
end
local queued = 0
if KEYS[3] then queued = redis.call('EXISTS', KEYS[3]) end
-- >>> summary (store/protocol/listing.py): keep the listing's summary in step with the tail.
-- KEYS[4] (optional) the summary; ARGV[9+2n] "=" (the batch names the session: ARGV[10+2n],
--   "" for no name), "-" (it does not), "!" (it holds a redaction: drop the summary, the next
--   listing rebuilds it from what readers see), "" (no change: the caller sent none);
--   ARGV[11+2n] the batch's first user message
--   ("" for none). Only a summary accounted through `from` moves on to from+1; any other
--   stays behind (a listing then rebuilds it).
if KEYS[4] and ARGV[9 + 2 * n] and ARGV[9 + 2 * n] ~= '' then
  local sm = redis.call('HMGET', KEYS[4], 'inc', 'seq', 'bytes', 'first')
  if sm[1] == ARGV[1] and tonumber(sm[2]) == from then
    local op = ARGV[9 + 2 * n]
    if op == '!' then
      redis.call('DEL', KEYS[4])
    else
      -- One HSET: seq, updated, bytes (added to: atomic here), the name, and the first user
      -- message when the summary has none yet.
      local now = redis.call('TIME')
      local set = {'seq', from + 1,
                   'updated', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000),
                   'bytes', tonumber(sm[3] or '0') + tonumber(ARGV[7 + 2 * n])}
      if op == '=' then
        if ARGV[10 + 2 * n] == '' then redis.call('HDEL', KEYS[4], 'name')
        else set[#set + 1] = 'name'; set[#set + 1] = ARGV[10 + 2 * n] end
      end
      if ARGV[11 + 2 * n] ~= '' and not sm[4] then
        set[#set + 1] = 'first'; set[#set + 1] = ARGV[11 + 2 * n]
      end
      redis.call('HSET', KEYS[4], unpack(set))
    end
  end
end
-- <<< summary
-- Fair appends: the next slot's claim goes to the first waiting writer, not back to us.
if KEYS[8] then pass_on(KEYS[6], KEYS[7], KEYS[8], from + 1) end
local riders = tonumber(ARGV[16 + 2 * n] or '0') or 0
if riders > 0 and KEYS[7] then
  local wake_ms = tonumber(ARGV[17 + 2 * n + riders])
  for i = 1, riders do
    local turn = KEYS[7] .. ':' .. ARGV[16 + 2 * n + i]
    redis.call('RPUSH', turn, 'done')
    redis.call('PEXPIRE', turn, wake_ms)
  end
end
return {'OK', from + 1, pseg, pbytes, queued}
"""

INSTALL = """
-- INSTALL: replace a session's state with one rebuilt from the object store.
-- KEYS[1] tail, KEYS[2] ids, KEYS[3] the scratch hash holding the rebuilt ids,
-- KEYS[4] the session's deletion marker (see FORGET), KEYS[5] (optional) the
-- recent-segments cache (dropped when the state replaced was another incarnation's)
-- ARGV[1] inc, ARGV[2] seq, ARGV[3] last, ARGV[4] count, ARGV[5] nids,
--   ARGV[6] pseg, ARGV[7] pbytes (segments and bytes after the latest manifest),
--   ARGV[8] cseq (through_seq of the manifest the rebuild read), ARGV[9] when the rebuild
--   started reading (client clock, ms), ARGV[10] the oldest rebuild accepted (ms; 0 = any),
--   ARGV[11] (optional) the generation of the manifest the rebuild read (mgen),
--   ARGV[12] (optional) how long (ms) the installed id index lives unless a commit renews
--   it ("0" or absent: for good; see COMMIT), ARGV[13] (optional) tids: how many of the
--   nids ids are compacted and not in the scratch hash (those of segments 1..ARGV[14] and a
--   fork's inherited path), ARGV[14] (optional) iseq (-1 or absent: none compacted)
-- A rebuild is a snapshot of the object store taken at ARGV[9]. One that reaches Redis too
-- late (its process paused between reading and installing) may describe a session that
-- compaction or a delete has since moved on from: it is refused (STALE) and done again.
-- Measured on Redis's clock against a time taken *before* the reads, so a pause anywhere in
-- between only makes the rebuild look older. GC deletes nothing until a grace period after
-- the manifest that retired it, which must exceed ARGV[10] plus the clock skew.
-- Keeps a current state instead (same incarnation, seq at least as far, index whole):
-- a concurrent writer may have committed past what this rebuild saw.
-- Returns {'INSTALLED', seq} | {'KEPT', seq} | {'STALE'} | {'DELETED'} (a delete of this
--   incarnation was recorded after the rebuild read its header) | {'LOST'} (the scratch hash
--   vanished, e.g. a FLUSHALL while it was being filled: build it again)
redis.replicate_commands()
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local max_age = tonumber(ARGV[10] or '0')
if max_age > 0 and now_ms - tonumber(ARGV[9]) > max_age then
  redis.call('DEL', KEYS[3])
  return {'STALE'}
end
if KEYS[4] and redis.call('GET', KEYS[4]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
  return {'DELETED'}
end
local t = redis.call('HMGET', KEYS[1], 'inc', 'seq', 'nids', 'cseq', 'mgen', 'tids')
local cseq = tonumber(ARGV[8] or '0')
local mgen = tonumber(ARGV[11] or '0')
if t[1] == ARGV[1] and tonumber(t[4] or '0') > cseq then cseq = tonumber(t[4]) end
if t[1] == ARGV[1] and tonumber(t[5] or '0') > mgen then mgen = tonumber(t[5]) end
if t[1] == ARGV[1] and tonumber(t[2]) >= tonumber(ARGV[2])
   and redis.call('HLEN', KEYS[2]) + tonumber(t[6] or '0') == tonumber(t[3]) then
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[1], 'cseq', cseq, 'mgen', mgen)
  return {'KEPT', tonumber(t[2])}
end
local tids = tonumber(ARGV[13] or '0') or 0
local iseq = tonumber(ARGV[14] or '-1') or -1
local held = tonumber(ARGV[5]) - tids  -- the ids in the scratch hash
if redis.call('HLEN', KEYS[3]) ~= held then
  redis.call('DEL', KEYS[3])
  return {'LOST'}
end
if held > 0 then
  redis.call('RENAME', KEYS[3], KEYS[2])  -- keeps the scratch hash's expiry: set it anew
  local ttl = tonumber(ARGV[12] or '0') or 0
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) else redis.call('PERSIST', KEYS[2]) end
else
  redis.call('DEL', KEYS[2], KEYS[3])
end
if KEYS[5] and t[1] ~= ARGV[1] then redis.call('DEL', KEYS[5]) end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'inc', ARGV[1], 'seq', ARGV[2], 'last', ARGV[3],
           'count', ARGV[4], 'nids', ARGV[5], 'pseg', ARGV[6], 'pbytes', ARGV[7], 'cseq', cseq,
           'mgen', mgen, 'iseq', iseq, 'tids', tids)
return {'INSTALLED', tonumber(ARGV[2])}
"""

FORGET = """
-- FORGET: drop a session's state, but only the state of the given incarnation
-- ("*" = whatever is there).
-- KEYS[1] tail, KEYS[2] ids, KEYS[3] job marker, KEYS[4] (optional) claim,
-- KEYS[5] (optional) the deletion marker, KEYS[6] (optional) a stream's last access,
-- KEYS[7] (optional) the listing's summary, KEYS[8] (optional) the recent-segments cache;
--   ARGV[1] inc, ARGV[2] (optional) how long (ms) to
--   keep the marker "incarnation ARGV[1] was deleted", which makes INSTALL refuse a rebuild
--   of it that read the header before the delete (a rebuilder that paused).
-- Returns 1 if dropped, 0 if the state belonged to another incarnation.
if KEYS[5] and ARGV[1] ~= '*' and tonumber(ARGV[2] or '0') > 0 then
  redis.call('SET', KEYS[5], ARGV[1], 'PX', tonumber(ARGV[2]))
end
local inc = redis.call('HGET', KEYS[1], 'inc')
if ARGV[1] ~= '*' and inc and inc ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if KEYS[4] then redis.call('DEL', KEYS[4]) end
if KEYS[6] then redis.call('DEL', KEYS[6]) end
if KEYS[7] then redis.call('DEL', KEYS[7]) end
if KEYS[8] then redis.call('DEL', KEYS[8]) end
return 1
"""

COMPACTED = """
local function trim_recent(key, through)
  -- Drop cached segments a manifest retired (readers of that manifest start after them).
  local fields = redis.call('HKEYS', key)
  for i = 1, #fields do
    if tonumber(fields[i]) <= through then redis.call('HDEL', key, fields[i]) end
  end
end
-- COMPACTED: a manifest now covers segments the counters still count as pending.
-- KEYS[1] tail, KEYS[2] (optional) the recent-segments cache, KEYS[3] (optional) the id
--   index; ARGV[1] inc, ARGV[2] segments merged, ARGV[3] bytes merged,
--   ARGV[4] the manifest's through_seq (raises cseq: see RETIRED), ARGV[5] (optional) its
--   generation (raises mgen: where readers find the newest manifest without a LIST; a hint
--   they verify, see store/protocol/read.py)
-- With KEYS[3], the ids of segments 1..through_seq (and a fork's inherited path, seq 0) leave
-- the index: they live in the manifest's bases, where writers look them up (CHECK, REINDEX),
-- so Redis holds the ids of the uncompacted tail only, whatever the session's length. Only
-- a whole index is trimmed (one that lost keys is rebuilt by the next append anyway).
-- Returns {pseg, pbytes} after the subtraction (never below zero), or {} for another
-- incarnation or missing state (nothing to correct: a rebuild recounts from the manifest).
local inc = redis.call('HGET', KEYS[1], 'inc')
if inc ~= ARGV[1] then return {} end
local through = tonumber(ARGV[4] or '0')
if through > tonumber(redis.call('HGET', KEYS[1], 'cseq') or '0') then
  redis.call('HSET', KEYS[1], 'cseq', through)
end
local gen = tonumber(ARGV[5] or '0')
if gen > tonumber(redis.call('HGET', KEYS[1], 'mgen') or '0') then
  redis.call('HSET', KEYS[1], 'mgen', gen)
end
if KEYS[2] then trim_recent(KEYS[2], through) end
if KEYS[3] then
  local t = redis.call('HMGET', KEYS[1], 'nids', 'iseq', 'tids')
  local tids = tonumber(t[3] or '0')
  if through > tonumber(t[2] or '-1') and redis.call('HLEN', KEYS[3]) + tids == tonumber(t[1] or '-1') then
    local all = redis.call('HGETALL', KEYS[3])
    local drop = {}
    for i = 1, #all, 2 do
      local v = all[i + 1]
      if tonumber(string.sub(v, 1, string.find(v, ':', 1, true) - 1)) <= through then
        drop[#drop + 1] = all[i]
      end
    end
    local i = 1
    while i <= #drop do
      local j = math.min(i + 499, #drop)
      redis.call('HDEL', KEYS[3], unpack(drop, i, j))
      i = j + 1
    end
    redis.call('HSET', KEYS[1], 'iseq', through, 'tids', tids + #drop)
  end
end
local pseg = redis.call('HINCRBY', KEYS[1], 'pseg', -tonumber(ARGV[2]))
local pbytes = redis.call('HINCRBY', KEYS[1], 'pbytes', -tonumber(ARGV[3]))
if pseg < 0 then pseg = 0; redis.call('HSET', KEYS[1], 'pseg', 0) end
if pbytes < 0 then pbytes = 0; redis.call('HSET', KEYS[1], 'pbytes', 0) end
return {pseg, pbytes}
"""

RETIRED = """
local function trim_recent(key, through)
  -- Drop cached segments a manifest retired (readers of that manifest start after them).
  local fields = redis.call('HKEYS', key)
  for i = 1, #fields do
    if tonumber(fields[i]) <= through then redis.call('HDEL', key, fields[i]) end
  end
end
-- RETIRED: segments 1..ARGV[2] of incarnation ARGV[1] are merged into a manifest and about
-- to be deleted. Raises cseq (never lowers it), so that CHECK refuses to hand out, and COMMIT
-- to acknowledge, any of those slots: a writer that paused between CHECK and PUT and then
-- re-created a deleted slot is told ZOMBIE. GC runs it before every deletion of segments.
-- KEYS[1] tail, KEYS[2] (optional) the recent-segments cache; ARGV[1] inc, ARGV[2] through_seq
-- Returns 1 when recorded, 0 when there is no state of that incarnation (nothing to fence: a
-- rebuild reads the manifest and starts from its through_seq).
local inc = redis.call('HGET', KEYS[1], 'inc')
if inc ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > tonumber(redis.call('HGET', KEYS[1], 'cseq') or '0') then
  redis.call('HSET', KEYS[1], 'cseq', tonumber(ARGV[2]))
end
if KEYS[2] then trim_recent(KEYS[2], tonumber(ARGV[2])) end
return 1
"""

POSITION = """
-- POSITION: the segment of a committed entry of incarnation ARGV[1], as Redis's index knows
-- it: where a fork at that entry starts (store/lifecycle/sessions.py). A read: changes nothing.
-- KEYS[1] tail, KEYS[2] ids; ARGV[1] inc, ARGV[2] entry id
-- Returns {'AT', seq}: the entry is the tail's last (seq: the tail's; 0 for a fork that has
-- no segment of its own, whose last is its inherited fork point) or indexed at seq. Both
-- are committed: Redis hears of a segment only after it exists and is durable, and the
-- index only ever holds entries of committed segments of the tail's incarnation.
-- {'COMPACTED', iseq}: not there, but the ids of segments 1..iseq (and of a fork's inherited
-- path) live only in the data: the caller looks there (store/protocol/id_index.py).
-- {'UNKNOWN'}: no state of that incarnation, or an id it does not hold (a segment past
-- Redis's tail, an index that lost keys, no such entry): the caller reads the session.
local t = redis.call('HMGET', KEYS[1], 'inc', 'seq', 'last', 'iseq')
if t[1] ~= ARGV[1] then return {'UNKNOWN'} end
if ARGV[2] ~= '' and t[3] == ARGV[2] then return {'AT', tonumber(t[2])} end
local v = redis.call('HGET', KEYS[2], ARGV[2])
if v then return {'AT', tonumber(string.match(v, '^(%d+):'))} end
local iseq = tonumber(t[4] or '-1')
if iseq >= 0 then return {'COMPACTED', iseq} end
return {'UNKNOWN'}
"""

SUMMARY = """
-- SUMMARY: install a session's summary (what a listing shows) computed from the object store
-- through segment ARGV[2] of incarnation ARGV[1] (store/protocol/listing.py).
-- KEYS[1] tail, KEYS[2] summary; ARGV[3..] field/value pairs (besides inc and seq)
-- Installed only when Redis's tail names the same incarnation at the same segment: segments
-- are immutable and slots 1..seq of an incarnation are committed for good, so the summary
-- then describes exactly what Redis counts, however long the rebuild paused before getting
-- here (a delete drops the tail, a re-create names another incarnation: MOVED). From then
-- on COMMIT moves it along with the tail. A summary of the same incarnation at least as far
-- is kept; a delete's mark (DELETING) survives a replacement.
-- Returns 'INSTALLED' | 'KEPT' | 'MOVED' (the tail is elsewhere, or missing)
local t = redis.call('HMGET', KEYS[1], 'inc', 'seq')
if t[1] ~= ARGV[1] or tonumber(t[2]) ~= tonumber(ARGV[2]) then return 'MOVED' end
local sm = redis.call('HMGET', KEYS[2], 'inc', 'seq', 'deleting')
if sm[1] == ARGV[1] and tonumber(sm[2] or '-1') >= tonumber(ARGV[2]) then return 'KEPT' end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'inc', ARGV[1], 'seq', ARGV[2], unpack(ARGV, 3))
if sm[1] == ARGV[1] and sm[3] then redis.call('HSET', KEYS[2], 'deleting', sm[3]) end
return 'INSTALLED'
"""

DELETING = """
-- DELETING: a delete of incarnation ARGV[1] is about to remove its header. Marks the summary
-- so that listings read the header instead of trusting it, until FORGET drops it (a delete
-- that stops in between leaves the mark: those listings stay right, one GET slower).
-- KEYS[1] summary. Returns 1 if marked, 0 if there is no summary of that incarnation.
if redis.call('HGET', KEYS[1], 'inc') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'deleting', '1')
return 1
"""

RELEASE = _QUEUE + """
-- RELEASE: a writer gives up its append (an error after CHECK): it leaves the queue of
-- waiting writers, and a claim it holds goes to the first of them (see _QUEUE), so that
-- they need not wait out its lease.
-- KEYS[1] claim, KEYS[2] queue, KEYS[3] leases; ARGV[1] the writer's nonce
-- Returns 1 when the writer's offer to ride (group commit) was still there, now withdrawn:
-- no other writer holds its batch; else 0.
local kept = redis.call('EXISTS', KEYS[2] .. ':' .. ARGV[1] .. ':offer')
step_aside(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
return kept
"""

GC_CLAIM = """
-- GC_CLAIM: a worker takes sessions whose GC is due (compactor/schedule.py).
-- KEYS[1] due (session -> due ms), KEYS[2] leased (session -> lease deadline ms);
-- ARGV[1] now ms, ARGV[2] lease ms, ARGV[3] at most this many.
-- Leases that ran out (their worker died or paused) go back to due first, due at once. A
-- session taken moves from due to leased with deadline now + lease; it leaves leased only
-- through GC_DONE by the same lease. Returns {deadline, session, session, ...}.
local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)
for i = 1, #expired do
  redis.call('ZADD', KEYS[1], 'LT', now, expired[i])
  redis.call('ZREM', KEYS[2], expired[i])
end
local deadline = now + tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local out = {tostring(deadline)}
for i = 1, #due do
  redis.call('ZREM', KEYS[1], due[i])
  redis.call('ZADD', KEYS[2], deadline, due[i])
  out[#out + 1] = due[i]
end
return out
"""

GC_DONE = """
-- GC_DONE: the worker holding lease ARGV[2] on session ARGV[1] collected it.
-- KEYS[1] due, KEYS[2] leased; ARGV[3] "" or when to look again (ms; something waits).
-- A lease that ran out and was taken by another worker is not ours: nothing changes (that
-- worker finishes the entry). An entry due again meanwhile (a new manifest) stays in due.
-- Returns 1 when the lease was ours.
local held = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not held or tonumber(held) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[1], 'LT', tonumber(ARGV[3]), ARGV[1]) end
return 1
"""

SWEEP_LEASE = """
-- SWEEP_LEASE: take or extend the lease of the GC sweep (one sweeper at a time).
-- KEYS[1] the sweep hash; ARGV[1] worker, ARGV[2] now ms, ARGV[3] lease ms, ARGV[4] period ms.
-- Succeeds when nobody holds it, its holder's lease ran out, or we hold it, and a sweep is
-- under way (a cursor) or due (none finished within the period: a flushed Redis forgot the
-- last one, so a sweep starts at once). Returns {1, cursor, done}, {0} (another worker's),
-- or {2} (not due).
local s = redis.call('HMGET', KEYS[1], 'owner', 'until', 'cursor', 'done')
local now = tonumber(ARGV[2])
if s[1] and s[1] ~= ARGV[1] and tonumber(s[2] or '0') > now then return {0} end
if (s[3] or '') == '' and s[4] and now < tonumber(s[4]) + tonumber(ARGV[4]) then return {2} end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'until', now + tonumber(ARGV[3]))
return {1, s[3] or '', s[4] or ''}
"""

SWEEP_PROGRESS = """
-- SWEEP_PROGRESS: the sweeper holding the lease records how far it got.
-- KEYS[1] the sweep hash; ARGV[1] worker, ARGV[2] cursor ("" when the sweep finished),
-- ARGV[3] "" or the ms the sweep finished (it then gives the lease up), ARGV[4] now ms,
-- ARGV[5] lease ms (the lease is extended to now + lease).
-- Returns 1, or 0 when the lease is another worker's now (it carries on; we stop).
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'cursor', ARGV[2], 'until', tonumber(ARGV[4]) + tonumber(ARGV[5]))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'done', ARGV[3])
  redis.call('HDEL', KEYS[1], 'owner', 'until')
end
return 1
"""
