//! The four Lua scripts. Each touches one key (so it runs unchanged on Redis Cluster), checks
//! its TTL argument before writing anything (so it is all-or-nothing), and fences every write
//! by the claim's token.

/// The claim script. `KEYS[1]` the record; `ARGV` token, fingerprint, lease in ms. Claims a
/// free key, or returns the record that holds it.
pub const CLAIM_SCRIPT: &str = r"
local ms = tonumber(ARGV[3])
if not ms or ms < 1 or ms > 3153600000000 then return redis.error_reply('bad lease') end
local r = redis.call('HMGET', KEYS[1], 's', 'f')
if not r[1] then
  redis.call('HSET', KEYS[1], 's', 'p', 't', ARGV[1], 'f', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'claimed'}
end
if r[1] == 'p' then
  return {'p', r[2], redis.call('PTTL', KEYS[1])}
end
if r[1] == 'c' then
  local c = redis.call('HMGET', KEYS[1], 'st', 'h', 'b', 'tr')
  return {'c', r[2], c[1], c[2], c[3], c[4]}
end
return {'n', r[2]}
";

/// The complete script. `KEYS[1]` the record; `ARGV` token, retention in ms, kind (`c` or
/// `n`), status, headers, body, trailers (empty when none). Fenced by the token.
pub const COMPLETE_SCRIPT: &str = r"
local ms = tonumber(ARGV[2])
if not ms or ms < 1 or ms > 3153600000000 then return redis.error_reply('bad retention') end
local r = redis.call('HMGET', KEYS[1], 's', 't')
if r[1] ~= 'p' or r[2] ~= ARGV[1] then return 0 end
if ARGV[3] == 'c' then
  redis.call('HSET', KEYS[1], 's', 'c', 'st', ARGV[4], 'h', ARGV[5], 'b', ARGV[6])
  if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'tr', ARGV[7]) end
else
  redis.call('HSET', KEYS[1], 's', 'n')
end
redis.call('HDEL', KEYS[1], 't')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// The release script. `KEYS[1]` the record; `ARGV` token. Fenced by the token.
pub const RELEASE_SCRIPT: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 't')
if r[1] == 'p' and r[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// The extend script. `KEYS[1]` the record; `ARGV` token, lease in ms. Fenced by the token.
pub const EXTEND_SCRIPT: &str = r"
local ms = tonumber(ARGV[2])
if not ms or ms < 1 or ms > 3153600000000 then return redis.error_reply('bad lease') end
local r = redis.call('HMGET', KEYS[1], 's', 't')
if r[1] == 'p' and r[2] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";
